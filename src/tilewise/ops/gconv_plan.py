"""Per-problem launch plans of the grouped conv (``runtime.plans``).

A grouped conv called outside a CUDA graph paid host time for its checks and choices on every
call. Session 28 (H100 host, ``scripts/host_breakdown.py``, N = 32, C = 1024, 16x16, fp16):
``gconv.forward`` took 68.7 us and ``gconv.backward`` 139.7 us, against 21 us for the chosen
kernel's own launch and cuDNN's whole forward of 42 us. ``gconv.forward`` and
``gconv.backward`` now work out a pass once per problem (validation, the fallback decision, the
config, the NVRTC kernel, its grid and scalar arguments) into a plan, and a later call with the
same key runs the plan: an output allocation, the tensor pointers, the launch.

The key holds everything those steps read from the tensors: shapes, strides, dtypes, devices,
16-byte alignment of the tensors the NVRTC kernels read as 16-byte chunks, the padding and the
passes asked for. The switches (``_switches``) hold what they read elsewhere: the environment
variables the grouped conv and the autotuner read, the cuDNN flags, the reference switch, and
the autotuner's generation (``runtime.plans.PlanCache``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilewise.ops import gconv_cuda, gconv_library
from tilewise.ops.gconv_config import channels_last_copy
from tilewise.runtime import alloc, autotune, dispatch, plans

#: the environment variables whose values a plan depends on
SWITCH_ENV = (
    gconv_library.ENV,
    gconv_cuda.ENV_WIDE_TILES,
    gconv_cuda.ENV_PDL,
    gconv_cuda.ENV_OCCUPANCY_CAP,
    gconv_cuda.ENV_EXPERIMENTAL_WGRAD,
    autotune.ENV_AUTOTUNE,
    autotune.ENV_CACHE_DIR,
)


def _switches() -> tuple:
    cudnn = torch.backends.cudnn
    return (*plans.environment(SWITCH_ENV), cudnn.enabled, cudnn.benchmark,
            dispatch._force_reference)  # fmt: skip


PLANS = plans.PlanCache(_switches)


#: devices whose tensors have addresses (meta tensors do not; fake ones raise when asked)
_PLANNED_DEVICES = ("cuda", "cpu")


def _tensor_key(t: torch.Tensor) -> tuple:
    """What a pass reads from a tensor it streams: shape, strides, dtype, device, alignment."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def _param_key(t: torch.Tensor | None) -> tuple | None:
    """What a pass reads from a weight or bias (indexed through its strides, any alignment)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _plannable(x: torch.Tensor, pad_h, pad_w) -> bool:
    """Whether a call may have a plan: tensors with addresses, paddings that are plain ints (1.0
    or True would find an int's plan)."""
    return x.device.type in _PLANNED_DEVICES and type(pad_h) is int and type(pad_w) is int


def forward_key(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad_h: int, pad_w: int
) -> tuple | None:
    """The forward plan's key, or None where there is no plan (``_plannable``; fake tensors,
    which raise when asked for their address)."""
    if not _plannable(x, pad_h, pad_w):
        return None
    try:
        return ("fprop", _tensor_key(x), _param_key(weight), _param_key(bias), pad_h, pad_w)
    except (RuntimeError, NotImplementedError):  # no storage to point at (fake or meta)
        return None


def backward_key(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pad_h: int,
    pad_w: int,
    need: tuple[bool, bool, bool],
    deterministic: bool,
) -> tuple | None:
    """The backward plan's key (as ``forward_key``)."""
    if not _plannable(x, pad_h, pad_w):
        return None
    try:
        return ("bwd", _tensor_key(grad), _tensor_key(x), _param_key(weight), _param_key(bias),
                pad_h, pad_w, tuple(need), bool(deterministic))  # fmt: skip
    except (RuntimeError, NotImplementedError):
        return None


class ConvPass:
    """fprop or dgrad of one problem with its config chosen: ``(x, weight, bias, out)`` to the
    result (``out``, or cuDNN's own output). An NVRTC tile's launch is worked out once
    (``gconv_cuda.bind_fprop``); any other config goes through ``launch`` (``gconv._launch``)."""

    __slots__ = ("cfg", "launch", "pads", "dgrad", "bound")

    def __init__(self, cfg, launch: Callable, x, weight, bias, out, pad_h: int, pad_w: int,
                 dgrad: bool) -> None:  # fmt: skip
        self.cfg, self.launch, self.pads, self.dgrad = cfg, launch, (pad_h, pad_w), dgrad
        self.bound = None
        if isinstance(cfg, gconv_cuda.CudaTile):
            self.bound = gconv_cuda.bind_fprop(
                x, weight, bias, out, pad_h, pad_w, cfg, dgrad, planned=True
            )

    def __call__(self, x, weight, bias, out) -> torch.Tensor:
        if self.bound is not None:
            self.bound(x, weight, bias, out)
            return out
        return self.launch(x, weight, bias, out, *self.pads, self.cfg, self.dgrad)


class ForwardPlan:
    """The forward of one problem: a channels_last output of ``out_size`` and its pass."""

    __slots__ = ("conv", "out_size")

    def __init__(self, conv: ConvPass, out_size: tuple[int, ...]) -> None:
        self.conv, self.out_size = conv, tuple(out_size)

    def __call__(self, x, weight, bias) -> torch.Tensor:
        out = alloc.empty(*self.out_size, dtype=x.dtype, device=x.device,
                          memory_format=torch.channels_last)  # fmt: skip
        return self.conv(x, weight, bias.contiguous() if bias is not None else None, out)


class BackwardPlan:
    """The backward of one problem: the passes asked for, each with its config chosen.

    ``cast_grad``: this problem's gradient arrives in another dtype or without unit channel
    stride and is copied channels_last in the input's dtype first. ``dgrad``: a ``ConvPass`` or
    None; ``wgrad``: ``(grad, x) -> (dweight, dbias or None)`` or None; ``need_db``: the bias
    gradient is wanted (summed here where the wgrad does not give it), in ``bias_dtype``.
    """

    __slots__ = ("cast_grad", "dgrad", "wgrad", "need_db", "bias_dtype")

    def __init__(self, cast_grad: bool, dgrad: ConvPass | None, wgrad: Callable | None,
                 need_db: bool, bias_dtype: torch.dtype | None) -> None:  # fmt: skip
        self.cast_grad, self.dgrad, self.wgrad = cast_grad, dgrad, wgrad
        self.need_db, self.bias_dtype = need_db, bias_dtype

    def __call__(self, grad, x, weight, bias):
        if self.cast_grad:
            grad = channels_last_copy(grad, x.dtype)
        return self.run(grad, x, weight)

    def run(self, grad, x, weight):
        """(dx, dweight, dbias) from a gradient already in the input's dtype and layout."""
        dx = dw = db = None
        if self.dgrad is not None:
            dx = alloc.empty(*x.shape, dtype=x.dtype, device=x.device,
                             memory_format=torch.channels_last)  # fmt: skip
            dx = self.dgrad(grad, weight, None, dx)
        if self.wgrad is not None:
            dw, db = self.wgrad(grad, x)
        if self.need_db and db is None:
            db = grad.sum((0, 2, 3), dtype=torch.float32)
        if db is not None:
            db = db.to(self.bias_dtype)
        return dx, dw, db
