"""Fused optimizer updates: one kernel per step over a flat buffer holding every parameter.

``tilewise.optim`` packs a param group's fp32 master weights, fp32 state and gradients into flat
buffers (one segment per group); these kernels update a segment in one launch:

- ``sgd_step``: ``torch.optim.SGD`` (weight decay, momentum with dampening, Nesterov);
- ``adamw_step``: ``torch.optim.AdamW`` (decoupled weight decay, bias correction).

Everything that may change between steps lives on the device, so a CUDA-graph-captured step
stays correct across replays: ``hyper`` (fp64: lr, weight decay, ...) is read by the kernel, and
``counter`` (int32 ``[steps taken, arrivals]``) is advanced by the kernel itself: every program
reads the step count first and, when done, adds one to ``arrivals``; the last program to arrive
writes ``steps + 1`` and resets ``arrivals``. Bias corrections ``1 - beta**step`` are computed per
program in fp64 by repeated squaring (exact to ~1e-15; host-computed in torch's eager AdamW).

When the model weights are fp16/bf16 the kernel also writes ``model = master.to(model dtype)``.
The ``reference_*`` functions do the same with torch ops on the same device tensors (the fallback
when dispatch says no kernel); the tests judge both against ``torch.optim`` in fp64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilewise.ops._common import cdiv, num_sms
from tilewise.runtime import dispatch

#: Order of the values in a group's ``hyper`` row.
SGD_HYPER = ("lr", "weight_decay", "momentum", "dampening")
ADAMW_HYPER = ("lr", "weight_decay", "beta1", "beta2", "eps")

#: Launch shape: elements per block, warps, persistent programs per SM (tests shrink BLOCK).
BLOCK = 2048
NUM_WARPS = 8
PROGS_PER_SM = 4


@triton.jit
def _pow_int(base, e):
    """``base ** e`` for an fp64 scalar ``base`` and int32 ``e >= 0``, by repeated squaring."""
    result = base * 0.0 + 1.0
    for _ in tl.static_range(31):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    return result


@triton.jit
def _finish_step(counter_ptr, t):
    """The last program to arrive advances the step count and resets the arrival count."""
    tl.debug_barrier()  # every warp of this program has read the step count (and stored)
    arrived = tl.atomic_add(counter_ptr + 1, 1)  # acq_rel: orders those reads before the add
    last = arrived == tl.num_programs(0) - 1
    tl.store(counter_ptr, t + 1, mask=last)
    tl.store(counter_ptr + 1, arrived * 0, mask=last)


@triton.jit
def _sgd_kernel(
    master_ptr,
    grad_ptr,
    buf_ptr,
    model_ptr,
    hyper_ptr,
    counter_ptr,
    n,
    HAS_MOMENTUM: tl.constexpr,
    NESTEROV: tl.constexpr,
    HAS_MODEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.load(counter_ptr)  # steps taken before this one; 0 means the momentum buffer is new
    lr = tl.load(hyper_ptr).to(tl.float32)
    wd = tl.load(hyper_ptr + 1).to(tl.float32)
    momentum = tl.load(hyper_ptr + 2).to(tl.float32)
    keep = (1.0 - tl.load(hyper_ptr + 3)).to(tl.float32)  # 1 - dampening, as torch's alpha
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = tl.cast(blk, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        p = tl.load(master_ptr + offs, mask=mask, other=0.0)
        d = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(wd != 0.0, d + wd * p, d)
        if HAS_MOMENTUM:
            buf = tl.load(buf_ptr + offs, mask=mask, other=0.0)
            buf = tl.where(t == 0, d, buf * momentum + keep * d)
            tl.store(buf_ptr + offs, buf, mask=mask)
            if NESTEROV:
                d = d + momentum * buf
            else:
                d = buf
        p = p - lr * d
        tl.store(master_ptr + offs, p, mask=mask)
        if HAS_MODEL:
            tl.store(model_ptr + offs, p.to(model_ptr.dtype.element_ty), mask=mask)
    _finish_step(counter_ptr, t)


@triton.jit
def _adamw_kernel(
    master_ptr,
    grad_ptr,
    exp_avg_ptr,
    exp_avg_sq_ptr,
    model_ptr,
    hyper_ptr,
    counter_ptr,
    n,
    HAS_MODEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.load(counter_ptr)
    lr = tl.load(hyper_ptr)  # fp64 scalars: the per-step constants are formed as torch does
    wd = tl.load(hyper_ptr + 1)
    beta1 = tl.load(hyper_ptr + 2)
    beta2 = tl.load(hyper_ptr + 3)
    eps = tl.load(hyper_ptr + 4).to(tl.float32)
    bc1 = 1.0 - _pow_int(beta1, t + 1)
    bc2 = 1.0 - _pow_int(beta2, t + 1)
    step_size = (lr / bc1).to(tl.float32)
    bc2_sqrt = tl.sqrt_rn(bc2.to(tl.float32))
    decay = (1.0 - lr * wd).to(tl.float32)
    w1 = (1.0 - beta1).to(tl.float32)
    b2 = beta2.to(tl.float32)
    w2 = (1.0 - beta2).to(tl.float32)
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = tl.cast(blk, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        p = tl.load(master_ptr + offs, mask=mask, other=0.0)
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(exp_avg_ptr + offs, mask=mask, other=0.0)
        v = tl.load(exp_avg_sq_ptr + offs, mask=mask, other=0.0)
        p = p * decay
        m = m + w1 * (g - m)  # torch's lerp for weights < 0.5
        v = v * b2 + w2 * (g * g)
        denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
        p = p - step_size * tl.div_rn(m, denom)
        tl.store(master_ptr + offs, p, mask=mask)
        tl.store(exp_avg_ptr + offs, m, mask=mask)
        tl.store(exp_avg_sq_ptr + offs, v, mask=mask)
        if HAS_MODEL:
            tl.store(model_ptr + offs, p.to(model_ptr.dtype.element_ty), mask=mask)
    _finish_step(counter_ptr, t)


def reference_sgd_(
    master: torch.Tensor,
    grad: torch.Tensor,
    momentum_buffer: torch.Tensor | None,
    model: torch.Tensor | None,
    hyper: torch.Tensor,
    counter: torch.Tensor,
    nesterov: bool,
) -> None:
    """``_sgd_kernel`` in torch ops on the same device tensors (no host sync, capturable)."""
    lr, wd, momentum, _ = (h.float() for h in hyper.unbind())
    keep = (1 - hyper[3]).float()
    d = grad.float()
    d = torch.where(wd != 0, d + wd * master, d)
    if momentum_buffer is not None:
        new = torch.where(counter[0] == 0, d, momentum_buffer * momentum + keep * d)
        momentum_buffer.copy_(new)
        d = d + momentum * momentum_buffer if nesterov else momentum_buffer
    master.sub_(lr * d)
    if model is not None:
        model.copy_(master)
    counter[:1].add_(1)


def reference_adamw_(
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    model: torch.Tensor | None,
    hyper: torch.Tensor,
    counter: torch.Tensor,
) -> None:
    """``_adamw_kernel`` in torch ops on the same device tensors (no host sync, capturable)."""
    lr, wd, beta1, beta2, eps = hyper.unbind()
    step = (counter[0] + 1).to(hyper.dtype)
    step_size = (lr / (1 - beta1**step)).float()
    bc2_sqrt = (1 - beta2**step).float().sqrt()
    g = grad.float()
    master.mul_((1 - lr * wd).float())
    exp_avg.lerp_(g, (1 - beta1).float())
    exp_avg_sq.mul_(beta2.float()).add_((1 - beta2).float() * (g * g))
    denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps.float())
    master.sub_(step_size * (exp_avg / denom))
    if model is not None:
        model.copy_(master)
    counter[:1].add_(1)


def _grid(n: int, device: torch.device) -> tuple[int]:
    return (max(1, min(cdiv(n, BLOCK), PROGS_PER_SM * num_sms(device))),)


def _check(op: str, master: torch.Tensor, grad: torch.Tensor, hyper: torch.Tensor, counter):
    dispatch.check_same_device(op, master=master, grad=grad, hyper=hyper, counter=counter)
    if (
        master.dtype != torch.float32
        or hyper.dtype != torch.float64
        or counter.dtype != torch.int32
    ):
        raise ValueError(
            f"tilewise.{op}: expected fp32 'master', fp64 'hyper' and int32 'counter', got "
            f"{master.dtype}, {hyper.dtype}, {counter.dtype}"
        )
    if grad.numel() != master.numel():
        raise ValueError(
            f"tilewise.{op}: argument 'grad' has {grad.numel()} elements, expected "
            f"{master.numel()} (as 'master')"
        )


def sgd_step(
    master: torch.Tensor,
    grad: torch.Tensor,
    momentum_buffer: torch.Tensor | None,
    model: torch.Tensor | None,
    hyper: torch.Tensor,
    counter: torch.Tensor,
    nesterov: bool = False,
) -> None:
    """One SGD step in place over flat buffers; ``model`` (fp16/bf16 copy) may be None."""
    _check("sgd", master, grad, hyper, counter)
    if not dispatch.use_kernel("sgd", [grad, master]):
        return reference_sgd_(master, grad, momentum_buffer, model, hyper, counter, nesterov)
    n = master.numel()
    _sgd_kernel[_grid(n, master.device)](
        master,
        grad,
        master if momentum_buffer is None else momentum_buffer,
        master if model is None else model,
        hyper,
        counter,
        n,
        HAS_MOMENTUM=momentum_buffer is not None,
        NESTEROV=nesterov,
        HAS_MODEL=model is not None,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )


def adamw_step(
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    model: torch.Tensor | None,
    hyper: torch.Tensor,
    counter: torch.Tensor,
) -> None:
    """One AdamW step in place over flat buffers; ``model`` (fp16/bf16 copy) may be None."""
    _check("adamw", master, grad, hyper, counter)
    if not dispatch.use_kernel("adamw", [grad, master]):
        return reference_adamw_(master, grad, exp_avg, exp_avg_sq, model, hyper, counter)
    n = master.numel()
    _adamw_kernel[_grid(n, master.device)](
        master,
        grad,
        exp_avg,
        exp_avg_sq,
        master if model is None else model,
        hyper,
        counter,
        n,
        HAS_MODEL=model is not None,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
