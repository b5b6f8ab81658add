"""Weight (and bias) gradient of the group-width-8 conv.

``dW[co, ci_local, r, s] = sum_{n,p,q} dy[n, p, q, co] * x[n, p + r - pad_h, q + s - pad_w, ci]``.

A program owns one chunk of ``chunk_steps * block_m`` output pixels (flattened over n, p, q) and
one block of ``block_c`` channels. For each tap it walks its chunk ``block_m`` pixels at a time,
loads the shifted input [block_m, block_c] and ``dy`` [block_m, block_c] (channels innermost) and
accumulates ``tl.dot(x_shifted^T, dy)`` -> [block_c, block_c] in fp32, of which it keeps the 8x8
diagonal blocks. Deterministic mode stores per-chunk partials [chunks, R, S, C, 8] that a PyTorch
sum reduces; fast mode adds them with fp32 atomics into a zeroed [R, S, C, 8] buffer.
The bias gradient is fused: before the tap loop, each program sums ``dy`` over its chunk into
per-chunk fp32 partials [chunks, C] (reduced by a PyTorch sum in both modes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilewise.ops._common import num_sms
from tilewise.ops.gconv_config import (
    GROUP_WIDTH,
    GConvProblem,
    WgradConfig,
    candidate_configs,
    default_config,
)
from tilewise.runtime import alloc, autotune

OP = "grouped_conv2d_backward.wgrad"


@triton.jit
def _gconv_wgrad_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    db_ptr,
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
    ATOMIC: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    chunk = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    # acc[i, j] pairs input channel c[i] with output channel c[j]; keep the diagonal 8x8 blocks.
    keep = (c[:, None] // 8 == c[None, :] // 8) & cmask[:, None] & cmask[None, :]
    out_offs = c[None, :] * 8 + c[:, None] % 8  # -> [co, ci_local] of a [C, 8] slab
    m0 = chunk * steps * BLOCK_M
    PQ = P * Q
    if HAS_DB:
        db = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for k in range(steps):
            m = m0 + k * BLOCK_M + tl.arange(0, BLOCK_M)
            n = m // PQ
            p = (m % PQ) // Q
            q = m % Q
            offs = n.to(tl.int64) * sdn + p * sdh + q * sdw
            ok = (m < M)[:, None] & cmask[None, :]
            dy = tl.load(dy_ptr + offs[:, None] + c[None, :] * sdc, mask=ok, other=0.0)
            db += tl.sum(dy.to(tl.float32), axis=0)
        tl.store(db_ptr + chunk * C + c, db, mask=cmask)
    for t in range(R * S):
        r = t // S
        s = t % S
        acc = tl.zeros((BLOCK_C, BLOCK_C), dtype=tl.float32)
        for k in range(steps):
            m = m0 + k * BLOCK_M + tl.arange(0, BLOCK_M)
            m_ok = m < M
            n = (m // PQ).to(tl.int64)
            p = (m % PQ) // Q
            q = m % Q
            dy = tl.load(
                dy_ptr + (n * sdn + p * sdh + q * sdw)[:, None] + c[None, :] * sdc,
                mask=m_ok[:, None] & cmask[None, :],
                other=0.0,
            )
            ih = p + r - pad_h
            iw = q + s - pad_w
            x_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            xs = tl.load(
                x_ptr + (n * sxn + ih * sxh + iw * sxw)[:, None] + c[None, :] * sxc,
                mask=x_ok[:, None] & cmask[None, :],
                other=0.0,
            )
            if IEEE:
                acc = tl.dot(tl.trans(xs), dy, acc, input_precision="ieee")
            else:
                acc = tl.dot(tl.trans(xs), dy, acc)
        if ATOMIC:
            tl.atomic_add(dw_ptr + t * C * 8 + out_offs, acc, mask=keep)
        else:
            tl.store(dw_ptr + (chunk * R * S + t) * C * 8 + out_offs, acc, mask=keep)


def launch_wgrad(
    grad: torch.Tensor,
    x: torch.Tensor,
    problem: GConvProblem,
    cfg: WgradConfig,
    need_db: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One wgrad run with ``cfg``: (fp32 [R, S, C, 8] weight gradient, fp32 [C] bias gradient)."""
    n, c, h, w = x.shape
    p, q, r, s = problem.p, problem.q, problem.r, problem.s
    m = n * p * q
    chunks = triton.cdiv(m, cfg.block_m * cfg.chunk_steps)
    dev = x.device
    if deterministic:
        dw = alloc.empty(chunks, r, s, c, GROUP_WIDTH, device=dev, dtype=torch.float32)
    else:
        dw = torch.zeros(r, s, c, GROUP_WIDTH, device=dev, dtype=torch.float32)
    dbp = alloc.empty(chunks, c, device=dev, dtype=torch.float32) if need_db else dw
    _gconv_wgrad_kernel[(chunks, triton.cdiv(c, cfg.block_c))](
        x,
        grad,
        dw,
        dbp,
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
        ATOMIC=not deterministic,
        IEEE=x.dtype == torch.float32,
        BLOCK_M=cfg.block_m,
        BLOCK_C=cfg.block_c,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if deterministic:
        dw = dw.sum(0)
    return dw, (dbp.sum(0) if need_db else None)


def wgrad(
    grad: torch.Tensor,
    x: torch.Tensor,
    problem: GConvProblem,
    need_db: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dweight [C, 8, R, S] contiguous in x's dtype, fp32 dbias or None); config autotuned."""
    cfg = autotune.choose_config(
        f"{OP}.{'det' if deterministic else 'atomic'}",
        problem,
        candidate_configs(problem, "wgrad", num_sms(x.device)),
        lambda k: launch_wgrad(grad, x, problem, k, need_db, deterministic),
        device=x.device,
        default=default_config(problem, "wgrad", num_sms(x.device)),
    )
    dw32, db = launch_wgrad(grad, x, problem, cfg, need_db, deterministic)
    dw = alloc.empty(problem.c, GROUP_WIDTH, problem.r, problem.s, device=x.device, dtype=x.dtype)
    dw.copy_(dw32.permute(2, 3, 0, 1))
    return dw, db
