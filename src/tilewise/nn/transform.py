"""``transform(model)``: swap eligible layers for parameter-sharing tilewise modules.

- Every eligible ``nn.Conv2d`` (group width 8, ...) becomes a ``GroupedConv2d``.
- Every ``nn.Linear`` directly followed by ``nn.ReLU`` / ``nn.GELU()`` (erf form) / ``nn.SiLU``
  inside an ``nn.Sequential`` (the one container whose child order is its execution order) becomes a
  ``tilewise.nn.Linear(activation=...)`` and the activation an ``nn.Identity``: one fused kernel.
  Pairs elsewhere (a custom forward) are invisible to a module walk, and are not reported.

Works on any module tree (timm models included): candidates come from ``named_modules``, swaps
are ``setattr`` on every parent that holds the module (shared modules stay shared). Only exact
``nn.Conv2d`` / ``nn.Linear`` instances are swapped: subclasses (e.g. timm's ``Conv2dSame``,
``StdConv2d``) have their own forward, so they are reported and left alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from torch import nn

from tilewise.nn.gconv import GroupedConv2d, conv_unsupported_reason
from tilewise.nn.linear import Linear as FusedLinear

_ACTIVATIONS = {nn.ReLU: "relu", nn.SiLU: "silu", nn.GELU: "gelu"}


def _activation_name(module: nn.Module) -> str | None:
    """The fused-epilogue name of an exact ReLU / SiLU / erf-GELU module, else None."""
    name = _ACTIVATIONS.get(type(module))
    if name == "gelu" and getattr(module, "approximate", "none") != "none":
        return None
    return name


def _fuse_linear_pairs(model: nn.Module, report: TransformReport, prefix: str = "") -> None:
    """Fuse Linear -> activation pairs in every ``nn.Sequential`` of ``model`` (in place)."""
    for seq_name, seq in list(model.named_modules()):
        if type(seq) is not nn.Sequential:
            continue
        names = list(seq._modules)
        for first, second in zip(names, names[1:], strict=False):
            lin, act = seq._modules[first], seq._modules[second]
            if type(lin) is not nn.Linear or act is None:
                continue
            if any(
                m._forward_hooks
                or m._forward_pre_hooks
                or m._backward_hooks
                or m._backward_pre_hooks
                for m in (lin, act)
            ):
                continue  # a hook would see the fused output, or never run
            act_name = _activation_name(act)
            if act_name is None:
                continue
            full = f"{seq_name}.{first}" if seq_name else first
            seq._modules[first] = FusedLinear.from_linear(lin, activation=act_name)
            seq._modules[second] = nn.Identity()
            report.swapped.append(
                (full, f"Linear({lin.in_features}, {lin.out_features}) + {type(act).__name__} "
                 f"-> tilewise Linear(activation={act_name!r})")
            )  # fmt: skip


@dataclass
class TransformReport:
    """What ``transform`` did: (name, what) per swapped module, (name, reason) per conv left."""

    model: nn.Module
    swapped: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"tilewise.nn.transform: {len(self.swapped)} swapped, {len(self.left)} left"]
        lines += [f"  swapped {name or '<root>'}: {what}" for name, what in self.swapped]
        lines += [f"  left    {name or '<root>'}: {why}" for name, why in self.left]
        return "\n".join(lines)


def _describe(conv: nn.Conv2d) -> str:
    r, s = conv.kernel_size
    return (
        f"Conv2d({conv.in_channels}, {conv.out_channels}, {r}x{s}, groups={conv.groups}, "
        f"padding={conv.padding}) -> GroupedConv2d"
    )


def transform(
    model: nn.Module,
    *,
    inplace: bool = True,
    deterministic: bool | None = None,
    fuse_linear: bool = True,
) -> TransformReport:
    """Replace each eligible ``nn.Conv2d`` in ``model`` by ``GroupedConv2d.from_conv`` and (with
    ``fuse_linear``) each Linear -> ReLU/GELU/SiLU pair of an ``nn.Sequential`` by one fused
    ``tilewise.nn.Linear``.

    Eligible convs: C_in == C_out, groups == C / 8, stride 1, dilation 1, zero padding
    (symmetric), kernel up to 7x7. ``inplace=False`` transforms a deep copy. The transformed model
    is ``report.model`` (the same object as ``model`` when in place, unless ``model`` itself is an
    eligible conv, which cannot be replaced in its caller).
    """
    if not inplace:
        model = copy.deepcopy(model)
    report = TransformReport(model=model)
    replacements: dict[int, GroupedConv2d] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Conv2d) or isinstance(module, GroupedConv2d):
            continue
        if type(module) is not nn.Conv2d:
            report.left.append((name, f"{type(module).__name__} subclasses nn.Conv2d"))
            continue
        reason = conv_unsupported_reason(module)
        if reason is not None:
            report.left.append((name, reason))
            continue
        replacements[id(module)] = GroupedConv2d.from_conv(module, deterministic=deterministic)
        report.swapped.append((name, _describe(module)))
    if fuse_linear:
        _fuse_linear_pairs(model, report)
    if id(model) in replacements:
        report.model = replacements[id(model)]
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if id(child) in replacements:
                setattr(parent, child_name, replacements[id(child)])
    return report
