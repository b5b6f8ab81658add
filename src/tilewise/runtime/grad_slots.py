"""Gradient slots: a backward kernel writes a parameter's gradient straight into its fused
optimizer's flat gradient buffer, instead of a fresh tensor that autograd then adds into it.

``FusedSGD``/``FusedAdamW`` give each parameter a slot (its view of the flat buffer).
``zero_grad(set_to_none=True)`` sets every ``.grad`` to None and arms the slots instead of
zeroing the buffer. A backward (``tilewise.functional.linear``'s) calls :func:`claim`: while
the slot is armed, the parameter's ``.grad`` is None and this backward's gradient will reach the
parameter's ``AccumulateGrad`` node, ``claim`` disarms the slot and returns the view. The kernel
writes the gradient there and autograd, finding ``.grad`` None, installs that tensor as
``.grad`` without a copy. The memset of ``zero_grad`` and one read-add-write pass per parameter
disappear from a training step (session 5: 41 us of adds and ~12 us of memset in a 453 us MLP
step).

Why each condition: a second use of the parameter in the same backward gets ``None`` (its
gradient must not overwrite the first one's in the shared view); ``autograd.grad`` calls get
``None`` (their result must be a tensor of their own); so do parameters with gradient hooks (a
hook may keep the tensor it is given, which the next backward would overwrite) and compiled graphs
(a write outside the traced outputs). With ``None`` the op allocates as before and the optimizer
copies the gradient in at ``step``. Under ``create_graph`` autograd copies a claimed gradient
before installing it (correct, one extra write). The slots live in a weak table here, not on the
parameters, so models stay picklable.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

_SLOTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


@dataclass(eq=False)
class GradSlot:
    """One parameter's view of a flat gradient buffer.

    It holds no ``AccumulateGrad`` node: one kept alive across iterations keeps the stream it
    was made on, and a backward captured on another stream then syncs with the legacy stream
    (``cudaErrorStreamCaptureImplicit``, session 8). ``claim`` takes the node of this backward."""

    param: weakref.ref
    view: torch.Tensor
    armed: bool = False
    claims: int = 0  # how many gradients were written in place


def install(p: torch.Tensor, view: torch.Tensor) -> GradSlot:
    """Give ``p`` a slot on ``view`` (same shape, strides and dtype as ``p``), disarmed."""
    if view.shape != p.shape or view.stride() != p.stride() or view.dtype != p.dtype:
        raise ValueError("grad_slots.install: argument 'view' must match the parameter's layout")
    slot = GradSlot(weakref.ref(p), view)
    _SLOTS[p] = slot
    return slot


def slot_of(p: torch.Tensor | None) -> GradSlot | None:
    """``p``'s slot, or None (also for fake, functional or other non-parameter tensors)."""
    return None if p is None or not _SLOTS else _SLOTS.get(p)


def claim(
    slot: GradSlot | None, node: Any, shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor | None:
    """A contiguous view to write this backward's gradient into, or None to allocate as usual.

    Call it from inside a backward, with the slot looked up while the forward ran and ``node``
    the next function this gradient flows to (``ctx.next_functions[i][0]``). The result
    is a new tensor object on the slot's memory: autograd installs a gradient as ``.grad``
    without a copy only when nothing else holds that object."""
    if slot is None or not slot.armed:
        return None
    p, view = slot.param(), slot.view
    if p is None or p.grad is not None or view.shape != shape or view.dtype != dtype:
        return None
    if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None):
        return None
    if node is None or not view.is_contiguous() or torch.compiler.is_compiling():
        return None
    try:
        if not torch._C._will_engine_execute_node(node):  # autograd.grad, p not reached
            return None
    except RuntimeError:  # not inside a backward pass
        return None
    slot.armed = False
    slot.claims += 1
    return view.view(view.shape)
