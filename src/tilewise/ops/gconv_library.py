"""PyTorch's own convolution (cuDNN on CUDA) as one more autotune candidate of the grouped conv.

The issue's floor is "never slower than cuDNN at any size". tilewise's kernels lose at a few
shapes where the work is too small to hide a kernel's ramp (session 20, CUDA-graph replay: 7x7
fprop/dgrad at batch 1, 0.81-0.83x; 5x5 wgrad at batch 8, 0.86-0.87x). Offering cuDNN to the
autotuner beside the Triton configs and NVRTC tiles makes the per-shape choice the faster of the
two, the way torch.compile's max-autotune offers ATen's kernels beside its own.

Offered in half precision only (fp32 cuDNN would run TF32 where tilewise computes true fp32), on
CUDA only, and not for the deterministic wgrad (cuDNN's weight-gradient algorithms need not be).
``TILEWISE_GCONV_LIBRARY=0`` takes it out of the choice (its picks are keyed apart, see
``cache_tag``). Nor is it offered for a deterministic dgrad (cuDNN's input-gradient algorithms
need not be deterministic either), or for a forward with an fp32 bias on half inputs (cuDNN
would add the bias rounded to half; tilewise's kernels add it in fp32).

The weight layout matters to cuDNN: with a channels_last weight (a model moved to channels_last)
it runs as it is; with a contiguous one PyTorch copies it to channels_last first, one more small
kernel per call. The autotune key carries the layout (``cache_tag``), so a pick made for one
layout is not reused for the other.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from tilewise.ops.gconv_config import GROUP_WIDTH, dw_format

ENV = "TILEWISE_GCONV_LIBRARY"
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LibraryConv:
    """Run the pass through ``torch.ops.aten`` (cuDNN on CUDA) instead of a tilewise kernel."""

    library: str = "cudnn"

    @property
    def name(self) -> str:
        return self.library


CUDNN = LibraryConv()


def enabled() -> bool:
    """Whether cuDNN may be offered (``TILEWISE_GCONV_LIBRARY=0`` says no)."""
    return os.environ.get(ENV, "1") != "0"


def offered(x: torch.Tensor, deterministic: bool = False) -> bool:
    """cuDNN is a candidate for half-precision CUDA tensors, unless determinism is asked for."""
    return (  # cheapest first: this runs on every call of every pass
        x.is_cuda
        and not deterministic
        and x.dtype in _HALF
        and enabled()
        and torch.backends.cudnn.enabled
        and torch.backends.cudnn.is_available()
    )


def cache_tag(weight: torch.Tensor | None, with_library: bool) -> str:
    """A suffix for the autotune key: '' without cuDNN in the choice, else '+cudnn', '.bm' when
    ``torch.backends.cudnn.benchmark`` is on (cuDNN then runs the algorithm it timed, else its
    heuristic's) and '.wcl' for a channels_last weight (a contiguous one costs cuDNN a copy)."""
    if not with_library:
        return ""
    tag = "+cudnn.bm" if torch.backends.cudnn.benchmark else "+cudnn"
    # channels_last: the channel stride is 1 (a 1x1 weight is both layouts: no suffix)
    if weight is not None and weight.stride(1) == 1 and weight.shape[2] * weight.shape[3] > 1:
        tag += ".wcl"
    return tag


def _no_autocast(device: torch.device):
    """The inputs already have the dtype the pass runs in; an enclosing autocast of another
    dtype must not recast them (checked first: entering the context costs host time)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def fprop(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad_h: int, pad_w: int
) -> torch.Tensor:
    """``conv2d(x, weight, bias, padding, groups=C/8)`` in cuDNN's layout (``gconv._launch``
    puts it in the op's); ``bias`` in x's dtype."""
    groups = x.shape[1] // GROUP_WIDTH
    with _no_autocast(x.device):
        out = torch.ops.aten.convolution.default(
            x, weight, bias, [1, 1], [pad_h, pad_w], [1, 1], False, [0, 0], groups
        )
    return out


def dgrad(
    grad: torch.Tensor, weight: torch.Tensor, like: torch.Tensor, pad_h: int, pad_w: int
) -> torch.Tensor:
    """The input gradient of ``fprop`` with the forward's padding, in cuDNN's layout; ``like`` is
    a tensor of the input's shape and layout (only its metadata is read)."""
    groups = like.shape[1] // GROUP_WIDTH
    mask = [True, False, False]
    with _no_autocast(grad.device):
        dx = torch.ops.aten.convolution_backward.default(
            grad, like, weight, None, [1, 1], [pad_h, pad_w], [1, 1], False, [0, 0], groups, mask
        )[0]
    return dx


def wgrad(
    grad: torch.Tensor,
    x: torch.Tensor,
    r: int,
    s: int,
    pad_h: int,
    pad_w: int,
    need_db: bool,
    db_dtype: torch.dtype = torch.float32,
    dw_cl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight gradient [C, 8, R, S] in x's dtype, contiguous or with ``dw_cl`` channels_last,
    bias gradient or None). cuDNN writes it channels_last for a channels_last input: for a
    contiguous one, a copy follows (~3 us at C = 64 5x5, session 22).

    cuDNN's bias gradient comes in x's dtype; where an fp32 one is wanted it is summed in fp32
    apart, so the precision is never below tilewise's own."""
    c = x.shape[1]
    weight = x.new_empty((c, GROUP_WIDTH, r, s))  # only its shape is read
    fused_db = need_db and db_dtype == x.dtype
    mask = [False, True, fused_db]
    with _no_autocast(x.device):
        _, dw, db = torch.ops.aten.convolution_backward.default(
            grad,
            x,
            weight,
            [c] if fused_db else None,
            [1, 1],
            [pad_h, pad_w],
            [1, 1],
            False,
            [0, 0],
            c // GROUP_WIDTH,
            mask,
        )
    if need_db and not fused_db:
        db = grad.sum((0, 2, 3), dtype=torch.float32)
    return dw.contiguous(memory_format=dw_format(dw_cl)), db if need_db else None
