"""The Triton GEMM behind tilewise's linear layer: ``C = A @ B`` with a fused epilogue and prologue.

A [M, K] and B [K, N] of arbitrary strides (the transposed operands of the forward and backward
are views, never copies), fp32 accumulation, and constexpr options:

* epilogue: bias add along N, activation (``act_fwd``) and, when the backward needs it, a store of
  the pre-bias product ``g = A @ B`` next to ``y``;
* prologue (backward): ``A`` becomes ``act'(saved [+ bias]) * A`` as it is loaded, so the
  derivative is never stored; optionally the row sums of the prologued ``A`` (the bias gradient);
* split-K (forwards with few output tiles): program (tile, j) sums the j-th K slice into an fp32
  slot, the tile's last program adds the slots in a fixed order and runs the epilogue.

``launch`` runs it with a ``GemmConfig``; ``ops.linear`` decides which config (or a cuBLAS
backend) each GEMM uses. fp32 is true fp32 (``input_precision="ieee"``) unless TF32 is allowed, or
3xTF32 on tensor cores with a ``Tf32x3Config`` (fp32-accurate, offered for true-fp32 forwards).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from tilewise.ops._common import (
    act_bwd,
    act_fwd,
    activation_code,
    cdiv,
    grouped_tile,
    next_pow2,
    num_sms,
)
from tilewise.runtime import alloc, workspace


@triton.jit
def _gemm_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    g_ptr,
    s_ptr,
    sb_ptr,
    db_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    s_cm,
    s_cn,
    s_sm,
    s_sk,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    STORE_G: tl.constexpr,
    DACT: tl.constexpr,
    DACT_BIAS: tl.constexpr,
    STORE_DB: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """``C = epilogue(prologue(A) @ B)``. The prologue (backward GEMMs) turns the incoming
    gradient A into ``dz = act'(s + bias) * A`` as it is loaded (``s``: the forward's saved tensor
    with strides ``s_sm, s_sk``; ``DACT_BIAS`` 1 adds a bias along K, 2 along M) and with
    ``STORE_DB`` sums dz over K into ``db_ptr[M]`` (the bias gradient; programs of column block 0
    store it). The epilogue (forward) adds the bias along N, applies ``ACT`` and may store the
    pre-bias product into ``g_ptr``. With ``SPLIT_K`` > 1 (forward only: no prologue, no db),
    program (tile, j) sums the j-th slice of K into fp32 slot j of ``ws_ptr`` [SPLIT_K, M, N] and
    takes a ticket from the tile's counter in ``cnt_ptr``; the last one adds the slots in order
    (deterministic), runs the epilogue and re-zeroes the counter (a self-cleaning workspace)."""
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # this program's slice of K: all of it, or with SPLIT_K the (program_id(1))-th of whole
    # BLOCK_K steps
    k_step = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * k_step
    k_hi = tl.minimum(K, k_lo + k_step)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * s_am + (k_lo + rk)[None, :].to(tl.int64) * s_ak
    b_ptrs = b_ptr + (k_lo + rk)[:, None].to(tl.int64) * s_bk + rn[None, :].to(tl.int64) * s_bn
    if DACT != 0:
        s_ptrs = s_ptr + rm[:, None].to(tl.int64) * s_sm + rk[None, :].to(tl.int64) * s_sk
    if DACT_BIAS == 2:
        bias_m = tl.load(sb_ptr + rm, mask=m_ok, other=0.0).to(tl.float32)
    if STORE_DB:
        db_acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k0 + rk) < k_hi
        a_mask = m_ok[:, None] & k_ok[None, :]
        # masked lanes load exact zeros, so padding never adds (or NaN-poisons) a product
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DACT != 0:
            z = tl.load(s_ptrs, mask=a_mask, other=0.0).to(tl.float32)
            if DACT_BIAS == 1:
                z += tl.load(sb_ptr + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            if DACT_BIAS == 2:
                z += bias_m[:, None]
            # rounded to A's dtype, as PyTorch's separate activation backward stores it
            a = act_bwd(a.to(tl.float32), z, DACT).to(a_ptr.dtype.element_ty)
            s_ptrs += BLOCK_K * s_sk
        if STORE_DB:
            db_acc += tl.sum(a.to(tl.float32), axis=1)
        if PRECISION == "ieee":
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif PRECISION == "tf32x3":  # fp32-accurate on tensor cores (``Tf32x3Config``)
            acc = tl.dot(a, b, acc, input_precision="tf32x3")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    if STORE_DB:
        if pid_n == 0:
            tl.store(db_ptr + rm, db_acc.to(db_ptr.dtype.element_ty), mask=m_ok)
    mask = m_ok[:, None] & n_ok[None, :]
    c_offs = rm[:, None].to(tl.int64) * s_cm + rn[None, :].to(tl.int64) * s_cn
    if SPLIT_K == 1:
        _gemm_epilogue(acc, bias_ptr, c_ptr, g_ptr, c_offs, rn, n_ok, mask, HAS_BIAS, ACT, STORE_G)
    else:
        w_offs = rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(ws_ptr + w_offs + tl.program_id(1) * (M * N), acc, mask=mask)
        tl.debug_barrier()  # every thread's slice of the partial is stored
        ticket = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:  # the others' partials are in: sum them in a fixed order
            tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):  # .cg: from L2, where the other SMs wrote
                part = ws_ptr + w_offs + j * (M * N)  # SPLIT_K * M * N < 2**31 (host)
                tot += tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            _gemm_epilogue(
                tot, bias_ptr, c_ptr, g_ptr, c_offs, rn, n_ok, mask, HAS_BIAS, ACT, STORE_G
            )
            tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed")


@triton.jit
def _gemm_epilogue(
    acc,
    bias_ptr,
    c_ptr,
    g_ptr,
    c_offs,
    rn,
    n_ok,
    mask,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    STORE_G: tl.constexpr,
):
    """Store ``act(acc + bias)`` (and, with ``STORE_G``, the pre-bias ``acc``) at ``c_offs``."""
    if STORE_G:  # g has c's strides
        tl.store(g_ptr + c_offs, acc.to(g_ptr.dtype.element_ty), mask=mask)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = act_fwd(acc, ACT)
    tl.store(c_ptr + c_offs, y.to(c_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class GemmConfig:
    """Launch shape of ``_gemm_kernel``: output tile, K step, L2 group height, warps, stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # forward only: K in this many slices, summed by the tile's last program


@dataclass(frozen=True)
class Tf32x3Config(GemmConfig):
    """A ``GemmConfig`` whose fp32 product runs as 3xTF32 on tensor cores (Triton's
    ``input_precision="tf32x3"``): fp32-accurate where TF32 is off (``ops.gemm_fp32tc`` has the
    split and its measured error: a third of cuBLAS SGEMM's at 1.45x its speed, session 27).
    Offered for true-fp32 forwards; its own type, so cached choices never mix with plain tiles."""


#: Pipeline the half-precision backward GEMMs as their configs say (``_launch``: off, after a
#: suspected Triton race; ``scripts/linear_dw_diag.py`` turns it on to reproduce)
PIPELINE_HALF_BACKWARD = False

#: A tuning hook: ``(m, n, k, elem_bytes) -> GemmConfig | None`` replaces the tile candidates
#: (split-K ones included) when set; the cuBLAS candidates stay.
CONFIG_OVERRIDE: Callable[[int, int, int, int], GemmConfig | None] | None = None

# Candidate tiles (block_m, block_n, block_k, warps, stages), timed per shape on first use.
# Half precision and TF32 run on tensor cores. True fp32 (IEEE) runs on CUDA cores, where the
# kernel trails cuBLAS SGEMM by 2-10x at batch 64 (scripts/gemm_candidates_probe.py on an H100)
# except for the weight-gradient GEMM (K = batch), which the fused prologue then makes worth it:
# a short list.
_TILES_TC = (
    (128, 128, 64, 8, 3),
    (64, 64, 64, 4, 3),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 256, 64, 8, 3),
    (32, 64, 64, 4, 4),
    (16, 64, 128, 4, 4),
)
_TILES_IEEE = (
    (64, 64, 32, 4, 3),
    (128, 64, 32, 8, 3),
    (32, 32, 32, 4, 3),
    (16, 64, 64, 4, 3),
)
#: tiles with fewer rows than this are candidates only for problems of at most 4x their rows
_SMALL_TILE_ROWS = 64
#: split-K bases (block_m, block_n, block_k, warps, stages) for forwards whose output tiles
#: cannot fill the SMs (an fp32 8-layer MLP at batch 64, hidden 1024: cuBLAS's SGEMM took 13 us of
#: a 2.6 us compute floor per layer, session 13): each tile's K is split until the programs cover
#: the SMs about once
_SPLIT_TILES_IEEE = ((64, 64, 32, 4, 3), (32, 64, 32, 4, 3), (16, 64, 64, 4, 3))
_SPLIT_TILES_TC = ((64, 64, 64, 4, 3), (32, 64, 64, 4, 4), (16, 64, 128, 4, 4))
_SPLIT_MAX = 16


def _split_configs(m: int, n: int, k: int, ieee: bool, sms: int) -> list[GemmConfig]:
    """Split-K configs for a forward GEMM of too few output tiles: per base tile the split that
    about fills the SMs (up to twice over) and half of it, each slice at least two K steps and
    none empty."""
    out = []
    for bm, bn, bk, w, st in _SPLIT_TILES_IEEE if ieee else _SPLIT_TILES_TC:
        cfg = _fit(GemmConfig(bm, bn, bk, num_warps=w, num_stages=st), m, n, k)
        tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
        split = min(_SPLIT_MAX, next_pow2(cdiv(sms, tiles)))
        while split > 1 and k < 2 * split * cfg.block_k:
            split //= 2
        if tiles >= sms or split * m * n >= 2**31:
            continue
        for sp in dict.fromkeys(_busy_slices(k, cfg.block_k, v) for v in (split, split // 2)):
            if sp > 1:
                out.append(replace(cfg, split_k=sp))
    return out


def _busy_slices(k: int, block_k: int, split: int) -> int:
    """The kernel gives each slice whole ``block_k`` steps (``cdiv(steps, split)`` of them), so
    a split that does not divide the steps leaves trailing slices empty: the number of slices
    that get work, the split to launch (no program without work)."""
    steps = cdiv(k, block_k)
    return cdiv(steps, cdiv(steps, max(1, split)))


def _precision(dtype: torch.dtype, allow_tf32: bool, cfg: GemmConfig) -> str:
    """``tl.dot``'s input precision: fp32 as 3xTF32 for a ``Tf32x3Config``, else IEEE fp32 unless
    TF32 is allowed; half precision takes the default (its tensor cores)."""
    if dtype != torch.float32:
        return "tf32"
    if isinstance(cfg, Tf32x3Config):
        return "tf32x3"
    return "tf32" if allow_tf32 else "ieee"


def gemm_config(m: int, n: int, k: int, elem_bytes: int, device: torch.device) -> GemmConfig:
    """The untimed default (CPU, interpreter, ``TILEWISE_AUTOTUNE=0``): 128x128 tiles when they
    alone fill the SMs, else 64x64; tiles shrink to the problem (>= 16, what ``tl.dot`` needs)."""
    if CONFIG_OVERRIDE is not None:
        cfg = CONFIG_OVERRIDE(m, n, k, elem_bytes)
        if cfg is not None:
            return cfg
    block_k = 32 if elem_bytes >= 4 else 64
    if cdiv(m, 128) * cdiv(n, 128) >= num_sms(device):
        return GemmConfig(128, 128, block_k, num_warps=8, num_stages=3)
    return _fit(GemmConfig(64, 64, block_k, num_warps=4, num_stages=3), m, n, k)


def _fit(cfg: GemmConfig, m: int, n: int, k: int) -> GemmConfig:
    def fit(size: int, block: int) -> int:
        return max(16, min(block, next_pow2(size)))

    return replace(
        cfg, block_m=fit(m, cfg.block_m), block_n=fit(n, cfg.block_n), block_k=fit(k, cfg.block_k)
    )


def launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype,
    allow_tf32: bool,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    store_g: bool = False,
    cfg: GemmConfig | None = None,
    dact: tuple[str, torch.Tensor, torch.Tensor | None, int] | None = None,
    db: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``act(prologue(a) @ b + bias)`` [M, N] (contiguous) and optionally the pre-bias ``a @ b``.

    ``dact = (activation, saved, saved_bias, bias_axis)`` turns ``a`` into ``act'(saved + bias)
    * a`` on load (``saved`` shaped like ``a``; ``bias_axis`` 1: along K, 2: along M); ``db``
    [M] receives the row sums of the (prologued) ``a``; ``out`` (contiguous [M, N]) is written
    instead of a new ``c``."""
    m, k = a.shape
    n = b.shape[1]
    c = alloc.empty((m, n), device=a.device, dtype=out_dtype) if out is None else out
    g = alloc.empty((m, n), device=a.device, dtype=out_dtype) if store_g else None
    cfg = cfg or gemm_config(m, n, k, a.element_size(), a.device)
    stages = cfg.num_stages
    half = a.dtype in (torch.float16, torch.bfloat16)
    if (dact is not None or db is not None) and half and not PIPELINE_HALF_BACKWARD:
        # Half-precision backward GEMMs (A also used in registers: the derivative prologue, the
        # bias-gradient sum) run unpipelined. Session 8, H100, Triton 3.6: the pipelined dW + db
        # GEMM left 135 of 16.7M fp16 elements off by about one K block's partial sum
        # (test_linear's x [2048, 4096], n = 4096), the symptom of the pipelining race that made
        # the grouped conv's Triton wgrad unpipelined (gconv_wgrad.wgrad_candidates). Session 9
        # (scripts/linear_dw_diag.py): no wrong element in 6 runs per config pipelined or not, so
        # the race is rare and unconfirmed; test_linear passed with this default. Cost at that
        # shape: 602 against 467 us (+29%), while cuBLAS's mm took 99 us, so the autotuner's
        # cuBLAS candidate is what runs there.
        stages = 1
    d_act, s, sb, s_axis = dact if dact is not None else ("none", a, None, 0)
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    ws = counters = c
    if cfg.split_k > 1:
        if dact is not None or db is not None:
            raise ValueError(f"argument 'cfg': split_k={cfg.split_k} is for forward GEMMs only")
        if cfg.split_k * m * n >= 2**31:  # the kernel's slot offsets are int32
            raise ValueError(f"argument 'cfg': split_k={cfg.split_k} x {m} x {n} is too large")
        ws = alloc.empty((cfg.split_k, m, n), device=a.device, dtype=torch.float32)
        counters = workspace.zeroed(a.device, (tiles,))[0].view(torch.int32)
    # a launch that raises must not leave a half-used workspace (split-K's counters) behind;
    # launches without one skip the context manager's cost
    guard = workspace.guarded(a.device) if cfg.split_k > 1 else contextlib.nullcontext()
    grid = (tiles, cfg.split_k)
    with guard:
        _gemm_kernel[grid](
            a,
            b,
            c if bias is None else bias,
            c,
            c if g is None else g,
            s,
            c if sb is None else sb,
            c if db is None else db,
            ws,
            counters,
            m,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
            s.stride(0),
            s.stride(1),
            HAS_BIAS=bias is not None,
            ACT=activation_code(activation),
            STORE_G=store_g,
            DACT=activation_code(d_act),
            DACT_BIAS=s_axis if sb is not None else 0,
            STORE_DB=db is not None,
            PRECISION=_precision(a.dtype, allow_tf32, cfg),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            SPLIT_K=cfg.split_k,
            num_warps=cfg.num_warps,
            num_stages=stages,
        )
    return c, g
