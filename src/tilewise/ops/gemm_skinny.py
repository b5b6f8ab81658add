"""Few-row linear forwards on CUDA cores: ``y = act(x @ W^T + b)`` for ``x`` of at most 16 rows.

At small batch a linear layer is a stream of its weights: [16, 1024] x [1024, 1024] in fp32 is
4 MB to read for 17 M fused multiply-adds, which 132 SMs finish in ~0.5 us while the bytes take
~1.3 us from DRAM. A tiled GEMM wastes most of that: ``tl.dot`` pads the rows to 16 and its
true-fp32 path stages both operands through shared memory, and cuBLAS's SGEMM gives the few output
tiles to a few SMs (session 14: 8.9 us per layer at 16 x 1024 x 1024 with cuBLAS split over K and
an epilogue kernel, two launches). Here each program owns ``block_n`` output columns for every
row and one slice of K: it reads its weight rows along K (contiguous in ``nn.Linear``'s [N, K]
layout, 16-byte loads), multiplies them against the rows of ``x`` in registers (a broadcast
product reduced over K, plain fp32 FMAs: true fp32 for fp32 operands) and, with ``split_k`` > 1,
writes its partial into an fp32 slot; the column block's last program adds the slots in a fixed
order (deterministic), adds the bias, applies the activation: one launch.

Offered per shape to the linear autotuner (``SkinnyConfig``), which keeps it only where it wins.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilewise.ops._common import activation_code, cdiv, next_pow2, unit_stride
from tilewise.ops.gemm import _busy_slices, _gemm_epilogue
from tilewise.runtime import alloc, workspace

#: the most rows it takes: all of them sit in each program's registers
MAX_ROWS = 16
#: elements of the per-step broadcast product [rows, block_n, block_k] per thread, at most
_PRODUCT_PER_THREAD = 64
_WARPS = 4
_SPLIT_MAX = 32


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch shape: output columns per program, K per step, K slices (one program each)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = _WARPS
    num_stages: int = 3


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    g_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    s_xm,
    s_xk,
    s_wn,
    s_wk,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    STORE_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """Program (column block, j): ``sum_k x[m, k] * w[n, k]`` over the j-th slice of K for all
    rows m and its columns n; ``y``/``g`` are contiguous [M, N]. With ``SPLIT_K`` > 1 the
    partial goes to fp32 slot j of ``ws_ptr`` [SPLIT_K, M, N] and a ticket from the column
    block's counter; the last program adds the slots in order, runs the epilogue and re-zeroes
    the counter (a self-cleaning workspace)."""
    pid_n = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    k_step = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * k_step
    k_hi = tl.minimum(K, k_lo + k_step)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * s_xm + (k_lo + rk)[None, :].to(tl.int64) * s_xk
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * s_wn + (k_lo + rk)[None, :].to(tl.int64) * s_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k0 + rk) < k_hi
        # masked lanes load exact zeros: padding never adds (or NaN-poisons) a product
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        x_ptrs += BLOCK_K * s_xk
        w_ptrs += BLOCK_K * s_wk

    mask = m_ok[:, None] & n_ok[None, :]
    offs = rm[:, None] * N + rn[None, :]  # M * N < 2**31 (host)
    if SPLIT_K == 1:
        _gemm_epilogue(acc, bias_ptr, y_ptr, g_ptr, offs, rn, n_ok, mask, HAS_BIAS, ACT, STORE_G)
    else:
        tl.store(ws_ptr + offs + tl.program_id(1) * (M * N), acc, mask=mask)
        tl.debug_barrier()  # every thread's slice of the partial is stored
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:  # the others' partials are in: sum them in a fixed order
            tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):  # .cg: from L2, where the other SMs wrote
                tot += tl.load(
                    ws_ptr + offs + j * (M * N), mask=mask, other=0.0, cache_modifier=".cg"
                )
            _gemm_epilogue(
                tot, bias_ptr, y_ptr, g_ptr, offs, rn, n_ok, mask, HAS_BIAS, ACT, STORE_G
            )
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed")


def _block_k(rows: int, block_n: int, warps: int) -> int:
    """The K step that keeps the broadcast product at ``_PRODUCT_PER_THREAD`` per thread."""
    return max(16, _PRODUCT_PER_THREAD * 32 * warps // (next_pow2(max(rows, 1)) * block_n))


def candidates(m: int, n: int, k: int, sms: int) -> tuple[SkinnyConfig, ...]:
    """Configs worth timing for an [m, k] x [k, n] forward: none above ``MAX_ROWS`` rows or
    without SMs to fill; per column-block width the K split that gives the SMs about two
    programs each (and half of it), every slice at least two K steps."""
    if sms <= 0 or not 0 < m <= MAX_ROWS or n <= 0 or k <= 0:
        return ()
    out = []
    for bn in (16, 32, 64):
        if bn > max(16, next_pow2(n)):
            continue
        bk = min(_block_k(m, bn, _WARPS), max(16, next_pow2(k)))
        blocks = cdiv(n, bn)
        split = min(_SPLIT_MAX, next_pow2(cdiv(2 * sms, blocks)))
        while split > 1 and k < 2 * split * bk:
            split //= 2
        if split * m * n >= 2**31:
            continue
        for sp in dict.fromkeys((split, max(1, split // 2))):
            out.append(SkinnyConfig(bn, bk, _busy_slices(k, bk, sp)))
    return tuple(dict.fromkeys(out))


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    cfg: SkinnyConfig,
    store_g: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(act(x @ weight^T + bias), x @ weight^T or None)`` for ``x`` [M <= 16, K] and ``weight``
    [N, K] of any strides; contiguous [M, N] outputs in ``x``'s dtype."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS:
        raise ValueError(
            f"tilewise.linear: argument 'x' has {m} rows; the few-row GEMM takes at most {MAX_ROWS}"
        )
    if cfg.split_k < 1 or cfg.split_k * m * n >= 2**31:
        raise ValueError(
            f"tilewise.linear: argument 'cfg' splits K into {cfg.split_k} slices "
            f"of an [{m}, {n}] output"
        )
    bias = unit_stride(bias)
    y = alloc.empty((m, n), device=x.device, dtype=x.dtype)
    g = alloc.empty((m, n), device=x.device, dtype=x.dtype) if store_g else None
    if m == 0 or n == 0:
        return y, g
    blocks = cdiv(n, cfg.block_n)
    ws = counters = y
    guard = contextlib.nullcontext()
    if cfg.split_k > 1:
        ws = alloc.empty((cfg.split_k, m, n), device=x.device, dtype=torch.float32)
        counters = workspace.zeroed(x.device, (blocks,))[0].view(torch.int32)
        guard = workspace.guarded(x.device)
    with guard:
        _skinny_kernel[(blocks, cfg.split_k)](
            x,
            weight,
            y if bias is None else bias,
            y,
            y if g is None else g,
            ws,
            counters,
            m,
            n,
            k,
            x.stride(0),
            x.stride(1),
            weight.stride(0),
            weight.stride(1),
            HAS_BIAS=bias is not None,
            ACT=activation_code(activation),
            STORE_G=store_g,
            BLOCK_M=next_pow2(m),
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            SPLIT_K=cfg.split_k,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y, g
