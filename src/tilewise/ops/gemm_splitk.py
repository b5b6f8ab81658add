"""Split-K on cuBLAS for true-fp32 linear forwards whose output is too small to fill the GPU.

An fp32 (TF32 off) ``x @ W^T`` with few rows, e.g. batch 64 x hidden 1024, gives cuBLAS's SGEMM
8 output tiles of 128 x 128: 8 of the 132 SMs of an H100 work through all of K while the others
idle (session 13: ~13-15 us per layer for 134 MFLOP, PyTorch's ``addmm`` ~27 us). tilewise's own
split-K tiles spread K over the SMs but run the true-fp32 ``tl.dot`` on CUDA cores at a fraction
of cuBLAS's rate. Here cuBLAS does the split: K is cut into ``split`` equal slices and one
``torch.bmm`` over strided views (no copies) writes ``split`` fp32 partial products, then one
Triton kernel adds them in a fixed order (deterministic), adds the bias, applies the activation
and writes the output: two launches. Offered per shape to the linear autotuner
(``CublasSplitK``), which keeps it only where it wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilewise.ops._common import act_fwd, activation_code, cdiv, unit_stride
from tilewise.runtime import alloc

#: slice counts offered; each slice keeps at least ``MIN_SLICE_K`` of K
SPLITS = (4, 8, 16)
MIN_SLICE_K = 64
#: partial products are fp32 [split, M, N]: a bound on that workspace (and int32 offsets)
MAX_PARTIAL_BYTES = 64 << 20
#: offered where cuBLAS's 128 x 128 output tiles would number fewer than the SMs
_CUBLAS_TILE = 128
#: below ``MIN_ROWS`` rows only for K x N <= ``SMALL_M_MAX_WEIGHTS`` or K >= ``SMALL_M_MIN_K``.
#: Session 14's fp32 MLP grid, tilewise over PyTorch + CUDA graph at M = 2-8, the split offered
#: everywhere (call 4) against only from K = 8192 (call 5): K = N = 1024 1.05-1.40x against
#: 0.83-1.31x, K = N = 2048-4096 0.86-1.30x against 1.03-1.16x (the autotuner's cold-L2 timing
#: picked splits that ran slower in the study), K = N = 8192 1.10-1.18x either way; M >= 16
#: 1.05-2.7x
MIN_ROWS = 16
SMALL_M_MAX_WEIGHTS = 1024 * 1024
SMALL_M_MIN_K = 8192
EPILOGUE_BLOCK = 1024


@dataclass(frozen=True)
class CublasSplitK:
    """A linear-forward GEMM choice: ``torch.bmm`` over ``split`` K slices, then the fused
    sum + bias + activation kernel."""

    split: int


def candidates(m: int, n: int, k: int, sms: int) -> tuple[CublasSplitK, ...]:
    """The splits worth timing for an [m, k] x [k, n] fp32 product: none unless the output
    leaves SMs idle, none below ``MIN_ROWS`` rows for weights between ``SMALL_M_MAX_WEIGHTS``
    elements and K = ``SMALL_M_MIN_K``; only splits that divide K into slices of at least
    ``MIN_SLICE_K``."""
    if sms <= 0 or cdiv(m, _CUBLAS_TILE) * cdiv(n, _CUBLAS_TILE) >= sms:
        return ()
    if m < MIN_ROWS and k * n > SMALL_M_MAX_WEIGHTS and k < SMALL_M_MIN_K:
        return ()
    return tuple(
        CublasSplitK(s)
        for s in SPLITS
        if k % s == 0 and k // s >= MIN_SLICE_K and s * m * n * 4 <= MAX_PARTIAL_BYTES
    )


@triton.jit
def _sum_bias_act_kernel(
    part_ptr,
    bias_ptr,
    out_ptr,
    numel,
    n,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):  # a fixed order: the same sum on every run
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, act_fwd(acc, ACT).to(out_ptr.dtype.element_ty), mask=mask)


def forward(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    choice: CublasSplitK,
) -> torch.Tensor:
    """``act(a @ b + bias)`` for fp32 ``a`` [M, K], ``b`` [K, N] (any strides) with K split as
    ``choice`` says; a contiguous [M, N] output in ``a``'s dtype."""
    m, k = a.shape
    n = b.shape[1]
    split = choice.split
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"tilewise.linear: cuBLAS split-K takes fp32 operands, got {a.dtype}")
    if split < 1 or k % split or split * m * n >= 2**31:  # the kernel's offsets are int32
        raise ValueError(
            f"tilewise.linear: argument 'choice' splits K={k} into {split} slices of an "
            f"[{m}, {n}] output"
        )
    bias = unit_stride(bias)
    ks = k // split
    # slice j of K: a[:, j*ks:(j+1)*ks] and b[j*ks:(j+1)*ks, :], as batches of strided views
    a3 = a.as_strided((split, m, ks), (ks * a.stride(1), a.stride(0), a.stride(1)))
    b3 = b.as_strided((split, ks, n), (ks * b.stride(0), b.stride(0), b.stride(1)))
    part = alloc.empty((split, m, n), device=a.device, dtype=torch.float32)
    torch.bmm(a3, b3, out=part)
    out = alloc.empty((m, n), device=a.device, dtype=a.dtype)
    numel = m * n
    if numel == 0:
        return out
    _sum_bias_act_kernel[(cdiv(numel, EPILOGUE_BLOCK),)](
        part,
        part if bias is None else bias,
        out,
        numel,
        n,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        ACT=activation_code(activation),
        BLOCK=EPILOGUE_BLOCK,
        num_warps=4,
    )
    return out
