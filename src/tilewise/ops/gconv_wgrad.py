"""Weight (and bias) gradient of the group-width-8 conv.

``dW[co, ci_local, r, s] = sum_{n,p,q} dy[n, p, q, co] * x[n, p + r - pad_h, q + s - pad_w, ci]``.

A program owns one chunk of ``chunk_steps * block_m`` output pixels (flattened over n, p, q), one
block of ``block_c`` channels and ``tap_block`` taps. It walks its chunk ``block_m`` pixels at a
time: it loads ``dy`` [block_m, block_c] once, gathers the shifted inputs of all its taps into one
[block_m, tap_block * block_c] operand, and accumulates ``tl.dot(x_taps^T, dy)`` ->
[tap_block * block_c, block_c] in fp32, of which it keeps the 8x8 diagonal blocks (same group).
A single chunk stores the final [C, 8, R, S] gradient in x's dtype. Otherwise, deterministic mode
stores per-chunk partials [chunks, R, S, C, 8] that a PyTorch sum reduces; fast mode finishes in
its one launch: the chunks add fp32 partials with atomics into the stream's self-cleaning
workspace (``runtime.workspace``), and the last chunk of each (channel block, tap block) writes
the final gradient and re-zeroes what it used (``_common.atomic_row_sum``), so there is no memset
before the kernel and no reduction or cast after it. The bias gradient is fused: the programs of
the first tap block also sum the ``dy`` they load, reduced the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from tilewise.ops import gconv_cuda, gconv_library
from tilewise.ops._common import atomic_row_sum, cdiv, l2_bytes, num_sms
from tilewise.ops.gconv_config import (
    GROUP_WIDTH,
    GConvProblem,
    WgradConfig,
    candidate_tuple,
    dw_format,
    timing_mode,
)
from tilewise.runtime import alloc, autotune, workspace

OP = "grouped_conv2d_backward.wgrad"


@triton.jit
def _gconv_wgrad_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    db_ptr,
    out_w_ptr,
    out_b_ptr,
    count_ptr,
    M,
    C,
    H,
    W,
    P,
    Q,
    pad_h,
    pad_w,
    steps,
    sxn,
    sxc,
    sxh,
    sxw,
    sdn,
    sdc,
    sdh,
    sdw,
    R: tl.constexpr,
    S: tl.constexpr,
    HAS_DB: tl.constexpr,
    MODE: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    TAP_BLOCK: tl.constexpr,
    DW_CL: tl.constexpr = False,
):
    chunk = tl.program_id(0)
    tap0 = tl.program_id(2) * TAP_BLOCK
    c_blk = tl.program_id(1) * BLOCK_C
    c = c_blk + tl.arange(0, BLOCK_C)
    cmask = c < C
    # Row k of the accumulator pairs tap tap0 + k // BLOCK_C and input channel c_blk + k % BLOCK_C
    # with the output channels c (columns): one tl.dot covers TAP_BLOCK taps, and dy is loaded once
    # per pixel step for all of them.
    k = tl.arange(0, TAP_BLOCK * BLOCK_C)
    tap = tap0 + k // BLOCK_C
    ck = c_blk + k % BLOCK_C
    k_ok = (tap < R * S) & (ck < C)
    dh = tap // S - pad_h
    dwid = tap % S - pad_w
    m0 = chunk * steps * BLOCK_M
    PQ = P * Q
    acc = tl.zeros((TAP_BLOCK * BLOCK_C, BLOCK_C), dtype=tl.float32)
    # The bias gradient is summed over rows once, after the loop: a tl.sum inside the pipelined
    # loop (a cross-warp reduction through shared memory) corrupted dw on the H100 in half
    # precision whenever a program's tap block was full (5x5, 7x7; scripts/wgrad_diag.py).
    db = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    for step in range(steps):
        m = m0 + step * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = m < M
        n = (m // PQ).to(tl.int64)
        p = (m % PQ) // Q
        q = m % Q
        dy = tl.load(
            dy_ptr + (n * sdn + p * sdh + q * sdw)[:, None] + c[None, :] * sdc,
            mask=m_ok[:, None] & cmask[None, :],
            other=0.0,
        )
        if HAS_DB:
            db += dy.to(tl.float32)
        ih = p[:, None] + dh[None, :]
        iw = q[:, None] + dwid[None, :]
        x_ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & m_ok[:, None] & k_ok[None, :]
        xs = tl.load(
            x_ptr + (n * sxn)[:, None] + ih * sxh + iw * sxw + ck[None, :] * sxc,
            mask=x_ok,
            other=0.0,
        )
        if IEEE:
            acc = tl.dot(tl.trans(xs), dy, acc, input_precision="ieee")
        else:
            acc = tl.dot(tl.trans(xs), dy, acc)
    # keep the diagonal 8x8 blocks (same group); the rest paired channels of different groups
    keep = (ck[:, None] // 8 == c[None, :] // 8) & k_ok[:, None] & cmask[None, :]
    # offsets in the final [C, 8, R, S] weight gradient: contiguous, or with DW_CL in a
    # channels_last weight's layout (the atomic mode's workspace takes the same offsets)
    if DW_CL:
        direct_offs = c[None, :] * 8 * R * S + tap[:, None] * 8 + (ck % 8)[:, None]
    else:
        direct_offs = c[None, :] * 8 * R * S + (ck % 8)[:, None] * R * S + tap[:, None]
    if MODE == 0:  # one chunk: the final gradient in its own dtype
        tl.store(dw_ptr + direct_offs, acc.to(dw_ptr.dtype.element_ty), mask=keep)
        if HAS_DB:
            if tap0 == 0:
                tl.store(db_ptr + c, tl.sum(db, axis=0), mask=cmask)
    elif MODE == 1:  # one launch: atomics into the workspace, the last chunk finishes
        chunks = tl.num_programs(0)
        tile = tl.program_id(1) * tl.num_programs(2) + tl.program_id(2)
        atomic_row_sum(
            dw_ptr, dw_ptr, acc, acc, out_w_ptr, out_w_ptr, count_ptr + tile, chunks, 0, 0,
            direct_offs, keep, HAS_A=True, HAS_B=False, SLOTS=1,
        )  # fmt: skip
        if HAS_DB:
            if tap0 == 0:
                part = tl.sum(db, axis=0)
                counter = count_ptr + tl.num_programs(1) * tl.num_programs(2) + tl.program_id(1)
                atomic_row_sum(
                    db_ptr, db_ptr, part, part, out_b_ptr, out_b_ptr, counter, chunks, 0, 0,
                    c, cmask, HAS_A=True, HAS_B=False, SLOTS=1,
                )  # fmt: skip
    else:  # deterministic: per-chunk partials that the host sums in a fixed order
        out_offs = tap[:, None] * C * 8 + c[None, :] * 8 + (ck % 8)[:, None]  # [R*S, C, 8] slab
        tl.store(dw_ptr + chunk.to(tl.int64) * R * S * C * 8 + out_offs, acc, mask=keep)
        if HAS_DB:
            if tap0 == 0:
                tl.store(db_ptr + chunk * C + c, tl.sum(db, axis=0), mask=cmask)


def launch_wgrad(
    grad: torch.Tensor,
    x: torch.Tensor,
    problem: GConvProblem,
    cfg: WgradConfig,
    need_db: bool,
    deterministic: bool,
    dw_cl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One wgrad run with ``cfg``: (weight gradient [C, 8, R, S] in x's dtype, contiguous or
    with ``dw_cl`` channels_last, fp32 [C] bias gradient or None).

    One launch unless ``deterministic`` with more than one chunk (then a PyTorch sum of the
    per-chunk partials and a cast follow): at batch 1 extra launches cost more than the kernel."""
    n, c, h, w = x.shape
    p, q, r, s = problem.p, problem.q, problem.r, problem.s
    m = n * p * q
    chunks = cdiv(m, cfg.block_m * cfg.chunk_steps)
    grid = (chunks, cdiv(c, cfg.block_c), cdiv(r * s, cfg.tap_block))
    dev = x.device
    fmt = dw_format(dw_cl)
    dw = alloc.empty(c, GROUP_WIDTH, r, s, device=dev, dtype=x.dtype, memory_format=fmt)
    db = alloc.empty(c, device=dev, dtype=torch.float32) if need_db else None
    sums, db_sums, counters = dw, db if need_db else dw, dw
    if chunks == 1:
        mode = 0
    elif not deterministic:
        mode = 1
        sums, db_sums, counters = workspace.zeroed(
            dev, (r * s * c * GROUP_WIDTH, c, grid[1] * grid[2] + grid[1])
        )
        counters = counters.view(torch.int32)
    else:
        mode = 2
        sums = alloc.empty(chunks, r, s, c, GROUP_WIDTH, device=dev, dtype=torch.float32)
        db_sums = alloc.empty(chunks, c, device=dev, dtype=torch.float32) if need_db else sums
    with workspace.guarded(dev):  # a failed launch must not leave a dirty workspace
        _gconv_wgrad_kernel[grid](
            x,
            grad,
            sums,
            db_sums,
            dw,
            db if need_db else dw,
            counters,
            m,
            c,
            h,
            w,
            p,
            q,
            problem.pad_h,
            problem.pad_w,
            cfg.chunk_steps,
            *x.stride(),
            *grad.stride(),
            R=r,
            S=s,
            HAS_DB=need_db,
            MODE=mode,
            IEEE=x.dtype == torch.float32,
            BLOCK_M=cfg.block_m,
            BLOCK_C=cfg.block_c,
            TAP_BLOCK=cfg.tap_block,
            DW_CL=dw_cl,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    if mode == 2:
        dw.copy_(sums.sum(0).permute(2, 3, 0, 1))
        if need_db:
            torch.sum(db_sums, 0, out=db)
    return dw, db


@functools.lru_cache(maxsize=4096)
def wgrad_candidates(problem: GConvProblem, sms: int) -> tuple:
    """The configs ``wgrad`` may time and launch, in both reduction modes, the heuristic default
    (``gconv_config.default_config``) first.

    All launch unpipelined (``num_stages=1``). Pipelined (2 or 3 stages), several configs returned
    wrong dw in half precision on the H100 (Triton 3.6), differently from run to run: 32-pixel
    steps, 32-channel blocks, 8 warps, and at 3 stages 64 x 16 x 4-warp configs too. Unpipelined,
    every candidate was exact in every run (``scripts/wgrad_diag.py --all --stages 1``: 24 configs
    on 3 shapes, 0 wrong). A race in the pipelined tensor-core loop is the likely cause (Triton PR
    #8139 describes one of this kind); ``tests/test_gconv.py`` runs every candidate twice per mode.
    """
    return candidate_tuple(problem, "wgrad", sms)


def wgrad(
    grad: torch.Tensor,
    x: torch.Tensor,
    problem: GConvProblem,
    need_db: bool,
    deterministic: bool,
    db_dtype: torch.dtype = torch.float32,
    dw_cl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dweight [C, 8, R, S] in x's dtype, contiguous or with ``dw_cl`` in a channels_last
    weight's layout, dbias or None: fp32, or ``db_dtype`` where a kernel writes it directly);
    config autotuned among the Triton configs and, in half precision without determinism, the
    NVRTC kernel's tiles and cuDNN (``gconv_library``). The layout is part of the cache key: it
    moves cost between candidates (cuDNN's dw is channels_last; the others write either)."""
    cfg = choose(grad, x, problem, need_db, deterministic, db_dtype, dw_cl)
    return _launch(grad, x, problem, cfg, need_db, deterministic, db_dtype, dw_cl)


def choose(
    grad: torch.Tensor,
    x: torch.Tensor,
    problem: GConvProblem,
    need_db: bool,
    deterministic: bool,
    db_dtype: torch.dtype = torch.float32,
    dw_cl: bool = False,
):
    """``wgrad``'s config for this problem (timed on first use, then cached)."""
    sms = num_sms(x.device)
    cuda = gconv_cuda.usable(x, grad)
    with_cuda = not deterministic and cuda
    library = gconv_library.offered(x, deterministic)
    tma = cuda and gconv_cuda.tma_usable(x)
    wgmma = tma and gconv_cuda.wgmma_usable(x)  # the GPU takes the warpgroup wgrad
    slots = deterministic and cuda  # the NVRTC tiles whose sums run in a fixed order
    candidates = _candidates(problem, sms, with_cuda, tma, library, wgmma, slots)
    cold, warm_too = timing_mode(problem, "wgrad", l2_bytes(x.device))
    mode = "det" if deterministic else "one-launch"
    tag = gconv_library.cache_tag(None, library) + (".dwcl" if dw_cl else "")
    if any(getattr(t, "wgmma", False) for t in candidates):  # a choice made before they were
        tag += f"+wg{gconv_cuda.WGRAD_WG_DIGEST}"  # candidates is timed again
    return autotune.choose_config(
        f"{OP}.{mode}{tag}@{gconv_cuda.SOURCE_DIGEST}",
        problem,
        candidates,
        lambda k: _launch(grad, x, problem, k, need_db, deterministic, db_dtype, dw_cl),
        device=x.device,
        default=wgrad_candidates(problem, sms)[0],
        cold_l2=cold,
        warm_too=warm_too,
        screen=True,  # Triton configs and NVRTC tiles: a brief reading first (session 19)
    )


def bind(
    cfg,
    grad: torch.Tensor,
    x: torch.Tensor,
    problem: GConvProblem,
    need_db: bool,
    deterministic: bool,
    db_dtype: torch.dtype = torch.float32,
    dw_cl: bool = False,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]:
    """``(grad, x) -> (dweight, dbias or None)`` with ``cfg`` for tensors of this problem's
    metadata: an NVRTC tile's launch worked out once (``gconv_cuda.bind_wgrad``), else the
    config's launch (a per-problem plan's wgrad, ``gconv.backward``)."""
    if isinstance(cfg, gconv_cuda.CudaTile):
        return gconv_cuda.bind_wgrad(
            grad, x, problem.r, problem.s, problem.pad_h, problem.pad_w, need_db, cfg, db_dtype,
            dw_cl, planned=True,
        )  # fmt: skip
    return lambda g, t: _launch(g, t, problem, cfg, need_db, deterministic, db_dtype, dw_cl)


@functools.lru_cache(maxsize=4096)
def _candidates(
    problem: GConvProblem,
    sms: int,
    with_cuda: bool,
    tma: bool = False,
    library: bool = False,
    wgmma: bool = False,
    slots: bool = False,
) -> tuple:
    base = wgrad_candidates(problem, sms)
    c, r, s = problem.c, problem.r, problem.s
    if slots:  # deterministic: the slot tiles (gconv_slots) before the Triton configs
        base = gconv_cuda.slot_wgrad_candidates(c, r, s, tma, wgmma) + base
    if with_cuda:
        small = problem.n * problem.p * problem.q <= gconv_cuda.CLUSTER_MAX_PIXELS
        tiles = gconv_cuda.wgrad_candidates(c, r, s, small, tma, wgmma)
        base = tiles + base
    return base + (gconv_library.CUDNN,) if library else base


def _launch(
    grad,
    x,
    problem: GConvProblem,
    cfg,
    need_db: bool,
    deterministic: bool,
    db_dtype=torch.float32,
    dw_cl: bool = False,
):
    """(dweight [C, 8, R, S] in x's dtype, dbias or None) with ``cfg``; whatever follows the
    kernel (the deterministic mode's sum and cast) is part of what the autotuner times. The NVRTC
    kernel finishes in its one launch (dbias in ``db_dtype``, fp32 or x's dtype as ``validate``
    allows)."""
    if isinstance(cfg, gconv_library.LibraryConv):
        return gconv_library.wgrad(
            grad, x, problem.r, problem.s, problem.pad_h, problem.pad_w, need_db, db_dtype, dw_cl
        )
    if isinstance(cfg, gconv_cuda.CudaTile):
        return gconv_cuda.wgrad(
            grad, x, problem.r, problem.s, problem.pad_h, problem.pad_w, need_db, cfg, db_dtype,
            dw_cl,
        )  # fmt: skip
    return launch_wgrad(grad, x, problem, cfg, need_db, deterministic, dw_cl)
