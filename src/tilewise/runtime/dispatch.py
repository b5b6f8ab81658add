"""The one place that decides whether an op runs its Triton kernel or its PyTorch reference.

Rules, in order:
1. Tensors on different devices, or of different dtypes where an op needs one dtype: ``ValueError``
   naming the argument (never a silent wrong answer).
2. CUDA tensors run the kernel, if Triton imports and the dtype is one the kernel supports.
3. CPU tensors run the same kernel through the Triton interpreter when ``TRITON_INTERPRET=1`` was
   set before tilewise was imported (the tests do this), except bf16, which the interpreter gets
   wrong; otherwise the reference runs.
4. Anything else runs the reference, and the reason is logged once per (op, reason).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable

import torch

log = logging.getLogger("tilewise")

#: The interpreter is chosen when ``triton.jit`` decorates a kernel, i.e. at import time.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_force_reference = os.environ.get("TILEWISE_FORCE_REFERENCE", "0") == "1"


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the machine
        log.warning("tilewise: triton unavailable (%s); every op runs its PyTorch reference", exc)
        return False
    return True


@functools.cache
def _log_once(op: str, reason: str) -> None:
    log.warning("tilewise.%s: falling back to the PyTorch reference: %s", op, reason)


def fallback(op: str, reason: str) -> bool:
    """Record (once) why ``op`` runs its reference; always returns False for ``use_kernel``."""
    _log_once(op, reason)
    return False


def check_same_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """Raise ``ValueError`` naming the first argument whose device differs from the first one."""
    items = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(
                f"tilewise.{op}: argument '{name}' is on {t.device} but '{first_name}' is on "
                f"{first.device}; all tensors must be on one device"
            )
    return first.device


def check_same_dtype(op: str, **tensors: torch.Tensor | None) -> torch.dtype:
    """Raise ``ValueError`` naming the first argument whose dtype differs from the first one."""
    items = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise ValueError(
                f"tilewise.{op}: argument '{name}' has dtype {t.dtype} but '{first_name}' has "
                f"{first.dtype}; use one dtype (or autocast)"
            )
    return first.dtype


def check_param_dtype(op: str, x: torch.Tensor, **params: torch.Tensor | None) -> None:
    """Parameters must share ``x``'s dtype or be fp32 (mixed precision); else ``ValueError``."""
    for name, p in params.items():
        if p is not None and p.dtype not in (x.dtype, torch.float32):
            raise ValueError(
                f"tilewise.{op}: argument '{name}' has dtype {p.dtype}; expected {x.dtype} "
                f"(the input's) or torch.float32"
            )


def use_kernel(op: str, tensors: Iterable[torch.Tensor]) -> bool:
    """Decide kernel (True) or reference (False) for tensors already checked for device/dtype."""
    tensors = list(tensors)
    if _force_reference:
        return fallback(op, "TILEWISE_FORCE_REFERENCE=1")
    t = tensors[0]
    if t.dtype not in KERNEL_DTYPES:
        return fallback(op, f"dtype {t.dtype} has no kernel")
    if any(x.numel() == 0 for x in tensors):
        return False  # nothing to compute: the reference handles empty tensors exactly
    if not triton_available():
        return False
    if t.device.type == "cuda":
        return True
    if t.device.type == "cpu":
        if not INTERPRET:
            return fallback(op, "CPU tensors and TRITON_INTERPRET is not 1")
        if t.dtype == torch.bfloat16:
            return fallback(op, "bf16 on the Triton interpreter is unreliable")
        return True
    return fallback(op, f"device type {t.device.type} has no kernel")
