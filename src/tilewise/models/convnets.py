"""Convnet blocks of Spio's in-situ grouped-conv benchmark (docs: anchors.md, section 1).

Plain ``torch.nn`` modules: the grouped convs are ``nn.Conv2d(C, C, k, padding=k // 2,
groups=C / 8, bias=False)``, so ``tilewise.transform`` swaps exactly them and leaves the 1x1 convs.

- ``ConvFirstBlock``: grouped kxk conv -> BN -> 1x1 expand -> BN -> SiLU -> 1x1 project -> BN,
  plus the residual (Spio's figures: C=64, 64x64, 3x3, expansion 6).
- ``MBConvBlock``: 1x1 expand -> BN -> SiLU -> grouped kxk conv -> BN -> SiLU -> 1x1 project -> BN,
  plus the residual; the grouped conv runs on the C * expansion expanded channels (Spio's
  figures: C=256, 16x16, expansion 4).
- ``MLPBlock``: the "extra" blocks Spio puts around a stack (1x1 expand -> BN -> SiLU -> 1x1
  project -> BN, plus the residual), so the first grouped conv's input needs a gradient too.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn

from tilewise.ops.gconv_config import GROUP_WIDTH

BLOCK_KINDS = ("convfirst", "mbconv")
DEFAULT_EXPANSION = {"convfirst": 6, "mbconv": 4}


def _check_channels(c: int, name: str = "c") -> None:
    if not isinstance(c, int) or c < GROUP_WIDTH or c % GROUP_WIDTH:
        raise ValueError(f"argument '{name}' must be a positive multiple of 8, got {c!r}")


def _check_kernel(kernel: int) -> None:
    if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"argument 'kernel' must be a positive odd int, got {kernel!r}")


def grouped_conv(c: int, kernel: int = 3) -> nn.Conv2d:
    """The group-width-8 conv of the blocks: C -> C, groups C / 8, 'same' padding, no bias."""
    _check_channels(c)
    _check_kernel(kernel)
    return nn.Conv2d(c, c, kernel, padding=kernel // 2, groups=c // GROUP_WIDTH, bias=False)


def is_grouped_conv(module: nn.Module) -> bool:
    """True for an ``nn.Conv2d`` (or subclass) with C_in == C_out and group width 8."""
    return (
        isinstance(module, nn.Conv2d)
        and module.groups > 1
        and module.in_channels == module.out_channels
        and module.in_channels == module.groups * GROUP_WIDTH
    )


def grouped_convs(model: nn.Module) -> list[tuple[str, nn.Conv2d]]:
    """(name, module) of every group-width-8 conv in ``model``, in module order."""
    return [(name, m) for name, m in model.named_modules() if is_grouped_conv(m)]


def _pointwise(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, bias=False)


class ConvFirstBlock(nn.Module):
    """Grouped kxk conv -> BN -> 1x1 expand -> BN -> SiLU -> 1x1 project -> BN, plus x."""

    def __init__(self, c: int, kernel: int = 3, expansion: int = 6) -> None:
        super().__init__()
        mid = c * expansion
        self.conv = grouped_conv(c, kernel)
        self.conv_bn = nn.BatchNorm2d(c)
        self.expand = _pointwise(c, mid)
        self.expand_bn = nn.BatchNorm2d(mid)
        self.act = nn.SiLU()
        self.project = _pointwise(mid, c)
        self.project_bn = nn.BatchNorm2d(c)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv_bn(self.conv(x))
        y = self.act(self.expand_bn(self.expand(y)))
        return x + self.project_bn(self.project(y))


class MBConvBlock(nn.Module):
    """1x1 expand -> BN -> SiLU -> grouped kxk conv -> BN -> SiLU -> 1x1 project -> BN, plus x."""

    def __init__(self, c: int, kernel: int = 3, expansion: int = 4) -> None:
        super().__init__()
        _check_channels(c)
        mid = c * expansion
        self.expand = _pointwise(c, mid)
        self.expand_bn = nn.BatchNorm2d(mid)
        self.expand_act = nn.SiLU()
        self.conv = grouped_conv(mid, kernel)
        self.conv_bn = nn.BatchNorm2d(mid)
        self.conv_act = nn.SiLU()
        self.project = _pointwise(mid, c)
        self.project_bn = nn.BatchNorm2d(c)

    def forward(self, x: Tensor) -> Tensor:
        y = self.expand_act(self.expand_bn(self.expand(x)))
        y = self.conv_act(self.conv_bn(self.conv(y)))
        return x + self.project_bn(self.project(y))


class MLPBlock(nn.Module):
    """1x1 expand -> BN -> SiLU -> 1x1 project -> BN, plus x (Spio's extra blocks)."""

    def __init__(self, c: int, expansion: int = 4) -> None:
        super().__init__()
        mid = c * expansion
        self.expand = _pointwise(c, mid)
        self.expand_bn = nn.BatchNorm2d(mid)
        self.act = nn.SiLU()
        self.project = _pointwise(mid, c)
        self.project_bn = nn.BatchNorm2d(c)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.project_bn(self.project(self.act(self.expand_bn(self.expand(x)))))


def grouped_channels(kind: str, c: int, expansion: int | None = None) -> int:
    """Channels of the grouped conv in a block: C for ConvFirst, C * expansion for MBConv."""
    kind = _kind(kind)
    e = DEFAULT_EXPANSION[kind] if expansion is None else expansion
    return c if kind == "convfirst" else c * e


def _kind(kind: str) -> str:
    k = str(kind).lower()
    if k not in BLOCK_KINDS:
        raise ValueError(f"argument 'kind' must be one of {BLOCK_KINDS}, got {kind!r}")
    return k


def make_block(kind: str, c: int, kernel: int = 3, expansion: int | None = None) -> nn.Module:
    """A ConvFirst or MBConv block (``expansion`` defaults to 6 and 4 respectively)."""
    kind = _kind(kind)
    e = DEFAULT_EXPANSION[kind] if expansion is None else expansion
    if not isinstance(e, int) or e < 1:
        raise ValueError(f"argument 'expansion' must be a positive int, got {expansion!r}")
    cls = ConvFirstBlock if kind == "convfirst" else MBConvBlock
    return cls(c, kernel, e)


def block_stack(
    kind: str,
    c: int,
    depth: int,
    kernel: int = 3,
    expansion: int | None = None,
    extra: int = 2,
    pool: bool = True,
) -> nn.Sequential:
    """Spio's stack: ``extra - extra // 2`` MLP blocks, ``depth`` blocks of ``kind``, ``extra // 2``
    MLP blocks, then (``pool``) global average pooling and flatten to [N, C].

    Children: ``pre``, ``blocks``, ``post`` (and ``pool``, ``flatten``); the MLP blocks use the
    stack's expansion.
    """
    _check_channels(c)
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"argument 'depth' must be a positive int, got {depth!r}")
    if not isinstance(extra, int) or extra < 0:
        raise ValueError(f"argument 'extra' must be a non-negative int, got {extra!r}")
    kind = _kind(kind)
    e = DEFAULT_EXPANSION[kind] if expansion is None else expansion
    n_post = extra // 2
    parts: OrderedDict[str, nn.Module] = OrderedDict(
        pre=nn.Sequential(*[MLPBlock(c, e) for _ in range(extra - n_post)]),
        blocks=nn.Sequential(*[make_block(kind, c, kernel, e) for _ in range(depth)]),
        post=nn.Sequential(*[MLPBlock(c, e) for _ in range(n_post)]),
    )
    if pool:
        parts["pool"] = nn.AdaptiveAvgPool2d(1)
        parts["flatten"] = nn.Flatten()
    return nn.Sequential(parts)
