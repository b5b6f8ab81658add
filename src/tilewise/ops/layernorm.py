"""LayerNorm over the trailing dims with an optional fused ReLU, forward and backward.

Rows of up to ``MAX_FUSED_N`` elements are held on chip: forward is one read of ``x`` and one write
of ``y``; backward one read of ``x`` and ``dy``, one write of ``dx``, with the weight and bias
gradients reduced on chip per program, then either added with fp32 atomics and cast by the last
program (one launch) or, in PyTorch's deterministic mode, stored as per-program partials summed in
a fixed order. Longer rows loop over chunks (``x`` is read twice per pass; the weight/bias
gradients then use PyTorch reductions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from tilewise.ops._common import (
    TileConfig,
    atomic_row_sum,
    atomic_slots,
    backward_launch_args,
    cdiv,
    load_once,
    next_pow2,
    num_sms,
    persistent_rows,
    pick_config,
    pipeline_smem_budget,
    store_once,
    use_atomics,
    zeroed_accumulators,
)
from tilewise.runtime import alloc, dispatch, workspace

OP = "layer_norm"
MAX_FUSED_N = 16384
CHUNK_N = 4096


@triton.jit
def _ln_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    M,
    N,
    eps,
    ROWS_PER_PROG,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    RELU: tl.constexpr,
    STREAM: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """BLOCK_M whole rows per step over this program's ``ROWS_PER_PROG`` rows (one step unless a
    config asks for a persistent, software-pipelined grid)."""
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    row0 = tl.program_id(0) * ROWS_PER_PROG
    row_end = tl.minimum(row0 + ROWS_PER_PROG, M)
    for r in tl.range(row0, row_end, BLOCK_M, num_stages=STAGES):
        rows = r + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        mask = rmask[:, None] & cmask[None, :]
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        x = load_once(x_ptr + offs, mask, STREAM).to(tl.float32)
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
        y = xc * rstd[:, None]
        if HAS_W:
            y = y * w[None, :]
        if HAS_B:
            y = y + b[None, :]
        if RELU:  # max.NaN: one instruction; tl.where spilled the 64-value rows (ptxas, sm_90)
            y = tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL)
        store_once(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask, STREAM)
        tl.store(mean_ptr + rows, mean, mask=rmask)
        tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def _ln_fwd_looped_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    N,
    eps,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    RELU: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    shift = tl.load(x_ptr + base).to(tl.float32)  # shifted sums keep the variance accurate
    s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + base + cols, mask=cols < N, other=0.0).to(tl.float32)
        d = tl.where(cols < N, x - shift, 0.0)
        s1 += d
        s2 += d * d
    m1 = tl.sum(s1, axis=0) / N
    # NaN-propagating: with an Inf in the row the difference is Inf - Inf = NaN, which a plain
    # maximum would turn into 0 (finite rstd, Inf outputs where PyTorch gives NaN)
    var = tl.maximum(tl.sum(s2, axis=0) / N - m1 * m1, 0.0, propagate_nan=tl.PropagateNan.ALL)
    mean = shift + m1
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        x = tl.load(x_ptr + base + cols, mask=cmask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        if RELU:
            y = tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(y_ptr + base + cols, y.to(y_ptr.dtype.element_ty), mask=cmask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _ln_grad_tile(
    dy,
    x,
    mean,
    rstd,
    w,
    b,
    mask,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    RELU: tl.constexpr,
    Y_DTYPE: tl.constexpr,
):
    """Per-tile pieces of the backward: (dy after the ReLU mask, xhat, dy * w)."""
    xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    if RELU:
        y = xhat
        if HAS_W:
            y = y * w[None, :]
        if HAS_B:
            y = y + b[None, :]
        # the mask of the stored output (PyTorch's ReLU backward reads y): a pre-activation that
        # rounds to zero in y's dtype passes no gradient
        dy = tl.where(y.to(Y_DTYPE) <= 0.0, 0.0, dy)
    g = dy
    if HAS_W:
        g = dy * w[None, :]
    return dy, xhat, g


@triton.jit
def _add_pairs(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _ln_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    b_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dwp_ptr,
    dbp_ptr,
    dw_ptr,
    db_ptr,
    count_ptr,
    M,
    N,
    ROWS_PER_PROG,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    RELU: tl.constexpr,
    ATOMIC: tl.constexpr,
    SLOTS: tl.constexpr,
    PREFETCH: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STREAM: tl.constexpr,
):
    """dx per row; dw/db summed over this program's rows, then either stored as one fp32 partial
    row per program (deterministic) or added into fp32 accumulators with atomics, the last program
    to finish casting them into ``dw_ptr``/``db_ptr``."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_W else None
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_B else None
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # reduced over rows at the end
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    row0 = pid * ROWS_PER_PROG
    row_end = tl.minimum(row0 + ROWS_PER_PROG, M)
    # the next step's rows are loaded before this step's reductions, so a program always has
    # loads in flight (Triton does not pipeline loads that feed no dot)
    if PREFETCH:
        rows = row0 + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        dy_n = load_once(dy_ptr + offs, rmask[:, None] & cmask[None, :], STREAM)
        x_n = load_once(x_ptr + offs, rmask[:, None] & cmask[None, :], STREAM)
        mean_n = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd_n = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    for r in tl.range(row0, row_end, BLOCK_M, num_stages=STAGES):
        rows = r + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        mask = rmask[:, None] & cmask[None, :]
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        if PREFETCH:
            dy_c, x_c, mean, rstd = dy_n, x_n, mean_n, rstd_n
            nrows = rows + BLOCK_M
            nmask = nrows < row_end
            noffs = offs + BLOCK_M * N
            dy_n = load_once(dy_ptr + noffs, nmask[:, None] & cmask[None, :], STREAM)
            x_n = load_once(x_ptr + noffs, nmask[:, None] & cmask[None, :], STREAM)
            mean_n = tl.load(mean_ptr + nrows, mask=nmask, other=0.0)
            rstd_n = tl.load(rstd_ptr + nrows, mask=nmask, other=0.0)
        else:
            dy_c = load_once(dy_ptr + offs, mask, STREAM)
            x_c = load_once(x_ptr + offs, mask, STREAM)
            mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        dy, xhat, g = _ln_grad_tile(
            dy_c.to(tl.float32),
            x_c.to(tl.float32),
            mean,
            rstd,
            w,
            b,
            mask,
            HAS_W,
            HAS_B,
            RELU,
            x_ptr.dtype.element_ty,
        )
        s1, s2 = tl.reduce((xhat * g, g), 1, _add_pairs)  # one cross-warp exchange, not two
        dx = (g - xhat * (s1 / N)[:, None] - (s2 / N)[:, None]) * rstd[:, None]
        store_once(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask, STREAM)
        if HAS_W:
            dw_acc += dy * xhat
        if HAS_B:
            db_acc += dy
    dw_part = tl.sum(dw_acc, axis=0)
    db_part = tl.sum(db_acc, axis=0)
    if ATOMIC:
        atomic_row_sum(
            dwp_ptr,
            dbp_ptr,
            dw_part,
            db_part,
            dw_ptr,
            db_ptr,
            count_ptr,
            tl.num_programs(0),
            pid % SLOTS,
            N,
            cols,
            cmask,
            HAS_W,
            HAS_B,
            SLOTS,
        )
    else:
        if HAS_W:
            tl.store(dwp_ptr + pid * N + cols, dw_part, mask=cmask)
        if HAS_B:
            tl.store(dbp_ptr + pid * N + cols, db_part, mask=cmask)


@triton.jit
def _ln_bwd_looped_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    b_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dwr_ptr,
    dbr_ptr,
    N,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    RELU: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Rows wider than ``MAX_FUSED_N``, one program per row, read twice: dx, and this row's fp32
    terms of dweight (``dwr_ptr``) and dbias (``dbr_ptr``), summed over rows by the host. They
    come from the ReLU mask dx used: until session 23 PyTorch recomputed them with a mask of its
    own, which can differ from the kernel's where the pre-activation is within rounding of 0
    (the GPU tests caught one such element: dbias without a row that dx had)."""
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    mean = tl.load(mean_ptr + row + tl.arange(0, 1))
    rstd = tl.load(rstd_ptr + row + tl.arange(0, 1))
    a1 = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    a2 = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = cmask[None, :]
        dy = tl.load(dy_ptr + base + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        x = tl.load(x_ptr + base + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_W else None
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_B else None
        dy, xhat, g = _ln_grad_tile(
            dy, x, mean, rstd, w, b, mask, HAS_W, HAS_B, RELU, x_ptr.dtype.element_ty
        )
        a1 += xhat * g
        a2 += g
    c1 = tl.sum(a1, axis=1) / N
    c2 = tl.sum(a2, axis=1) / N
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = cmask[None, :]
        dy = tl.load(dy_ptr + base + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        x = tl.load(x_ptr + base + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_W else None
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_B else None
        dy, xhat, g = _ln_grad_tile(
            dy, x, mean, rstd, w, b, mask, HAS_W, HAS_B, RELU, x_ptr.dtype.element_ty
        )
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + base + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_W:
            tl.store(dwr_ptr + base + cols[None, :], dy * xhat, mask=mask)
        if HAS_B:
            tl.store(dbr_ptr + base + cols[None, :], dy, mask=mask)


def row_size(normalized_shape: Sequence[int]) -> int:
    return math.prod([int(s) for s in normalized_shape])  # a list: Dynamo traces it in transforms


def validate(x, normalized_shape, weight, bias) -> None:
    """Raise ``ValueError`` naming the bad argument."""
    shape = tuple(int(s) for s in normalized_shape)
    if len(shape) == 0 or len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape) :]) != shape:
        raise ValueError(
            f"tilewise.{OP}: argument 'normalized_shape'={list(shape)} must be the trailing dims "
            f"of x, whose shape is {tuple(x.shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(
                f"tilewise.{OP}: argument '{name}' has shape {tuple(p.shape)}, expected {shape}"
            )
    dispatch.check_same_device(OP, x=x, weight=weight, bias=bias)
    dispatch.check_param_dtype(OP, x, weight=weight, bias=bias)


def _affine_relu(xhat, weight, bias, relu):
    y = xhat if weight is None else xhat * weight.float()
    y = y if bias is None else y + bias.float()
    return torch.relu(y) if relu else y


def _as_rows(t: torch.Tensor, normalized_shape: Sequence[int]) -> torch.Tensor:
    """``t`` as [rows, row_size]; unlike ``reshape(-1, n)`` also for an empty normalized shape
    (``F.layer_norm`` takes one and returns an empty output)."""
    lead = t.shape[: t.ndim - len(tuple(normalized_shape))]
    return t.reshape(math.prod(lead), row_size(normalized_shape))


def reference(x, normalized_shape, weight, bias, eps: float, relu: bool):
    """fp32-math PyTorch LayerNorm (+ReLU) returning (y, mean, rstd) like the kernel."""
    xf = _as_rows(x.float(), normalized_shape)
    mean = xf.mean(dim=1)
    rstd = torch.rsqrt(((xf - mean[:, None]) ** 2).mean(dim=1) + eps)
    xhat = ((xf - mean[:, None]) * rstd[:, None]).view(x.shape)
    y = _affine_relu(xhat, weight, bias, relu)
    return y.to(x.dtype).contiguous(), mean, rstd


def reference_backward(dy, x, normalized_shape, weight, bias, mean, rstd, relu: bool):
    """PyTorch (fp32 math) gradients of ``reference``: (dx, dweight, dbias)."""
    xf = _as_rows(x.float(), normalized_shape)
    xhat = (xf - mean[:, None]) * rstd[:, None]
    w = weight.float().reshape(-1) if weight is not None else None
    b = bias.float().reshape(-1) if bias is not None else None
    g = _as_rows(dy.float(), normalized_shape)
    if relu:
        g = torch.where(_affine_relu(xhat, w, b, False) <= 0, torch.zeros_like(g), g)
    dw = (g * xhat).sum(0).view(weight.shape).to(weight.dtype) if weight is not None else None
    db = g.sum(0).view(bias.shape).to(bias.dtype) if bias is not None else None
    gw = g * w if w is not None else g
    c1 = (xhat * gw).mean(dim=1, keepdim=True)
    c2 = gw.mean(dim=1, keepdim=True)
    dx = ((gw - xhat * c1 - c2) * rstd[:, None]).view(x.shape).to(x.dtype)
    return dx, dw, db


def _config(
    kernel: str,
    m: int,
    n: int,
    elem_bytes: int,
    device: torch.device | None = None,
    affine: bool = True,
) -> TileConfig:
    # Measured on an H100 (benchmarks/tune_pointwise.py, fp16): the forward likes ~8K elements
    # per program. The backward (tune_pointwise --stages, 64 MB, session 6): two rows per step,
    # 8 elements per thread, the row loop software-pipelined 3-4 deep (cp.async into shared
    # memory) and only 2 programs per SM: 0.82-0.84 of copy, against 0.54-0.68 for one row per
    # step, register-resident, 8 programs per SM.
    block_n = next_pow2(n)
    if kernel.endswith("bwd"):
        warps = min(16, max(4, block_n // 256))
        rows = max(2, 2048 // block_n)  # short rows: several per step, >= 2048 elements in flight
        progs, deepest = 2, 4 if block_n <= 2048 else 3
        # Session 17 (tune_pointwise --wide, 64 MB fp16): n = 1024 4 rows per step, 3 stages, 4
        # per SM 0.872 of copy (2 rows, 4 stages, 2 per SM: 0.850); n = 4096 one program per SM
        # 0.851 (two: 0.821-0.827)
        if block_n == 1024 and elem_bytes <= 2:
            rows, progs, deepest = 4, 4, 3
        elif block_n >= 4096:
            progs = 1
        per_stage = 2 * rows * block_n * elem_bytes  # dy and x tiles
        stages = min(deepest, pipeline_smem_budget(device) // per_stage)
        if not affine and elem_bytes <= 2 and block_n in (1024, 4096):
            # Session 18 (benchmarks/pointwise_ab.py --wide --all-no-affine, fp16 64 MB, in
            # turns): without dw/db accumulators the register loop needs fewer registers (n =
            # 4096: 60 against 124, ptxas offline), so two 16-warp programs fit an SM and one
            # computes while the other waits at its row-reduction barrier. Grids of 16 (n = 1024:
            # 4 rows, 4 warps) or 4 (n = 4096: 2 rows, 16 warps) programs per SM, more than fit
            # at once: 0.903 / 0.911 of copy against the affine config's 0.859 / 0.887. bf16
            # takes the same config (not measured); other widths the affine one.
            warps = 4 if block_n == 1024 else 16
            rows = 4 if block_n == 1024 else 2
            default = TileConfig(rows, block_n, warps, 64 // warps, prefetch=False)
        elif stages >= 2:
            default = TileConfig(rows, block_n, warps, progs, prefetch=False, stages=stages)
        else:  # rows too long to stage twice: one row per step, 8 programs per SM (session 4)
            default = TileConfig(1, block_n, warps, progs_per_sm=8, prefetch=False)
    else:
        # session 10 (tune_pointwise --only layer_norm_fwd, 64 MB fp16): rows of 1024-4096 values
        # two per program (n = 1024: 0.902 of copy against 0.891 for 8 rows; n = 4096 unchanged);
        # longer rows one per program, as before (not measured with two)
        rows = 8192 // block_n if block_n < 1024 else (2 if block_n <= 4096 else 1)
        block_m = max(1, min(next_pow2(m), rows))
        warps = min(16, max(4, next_pow2(block_m * block_n // 2048)))
        # evict-first loads and streaming stores lose (session 17, benchmarks/pointwise_ab.py,
        # turns from L2 read out, fp16 64 MB, n = 1024: 0.878 against 0.891 plain)
        default = TileConfig(block_m, block_n, num_warps=warps, progs_per_sm=8, prefetch=False)
    cfg = pick_config(kernel, m, n, elem_bytes, default)
    if cfg.block_n < n:
        raise ValueError(f"config for {kernel}: block_n={cfg.block_n} must cover n={n}")
    return cfg


def forward(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, relu: bool = False):
    """Returns (y, mean, rstd); ``mean``/``rstd`` are fp32 per row, saved for the backward."""
    validate(x, normalized_shape, weight, bias)
    if not dispatch.use_kernel(OP, [x]):
        return reference(x, normalized_shape, weight, bias, eps, relu)
    n = row_size(normalized_shape)
    xv = x.contiguous().view(-1, n)
    m = xv.shape[0]
    y = alloc.empty_like(xv)
    mean = alloc.empty(m, device=x.device, dtype=torch.float32)
    rstd = alloc.empty_like(mean)
    w = weight.contiguous() if weight is not None else xv
    b = bias.contiguous() if bias is not None else xv
    flags = dict(HAS_W=weight is not None, HAS_B=bias is not None, RELU=bool(relu))
    if n <= MAX_FUSED_N:
        cfg = _config("layer_norm_fwd", m, n, x.element_size())
        rows_per_prog = persistent_rows(m, cfg, 1, x.device)
        _ln_fwd_kernel[(cdiv(m, rows_per_prog),)](
            xv,
            w,
            b,
            y,
            mean,
            rstd,
            m,
            n,
            eps,
            rows_per_prog,
            **flags,
            STREAM=cfg.streaming,
            STAGES=cfg.stages,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            num_warps=cfg.num_warps,
        )
    else:
        _ln_fwd_looped_kernel[(m,)](
            xv, w, b, y, mean, rstd, n, eps, **flags, BLOCK_N=CHUNK_N, num_warps=8
        )
    return y.view(x.shape), mean, rstd


def backward(dy, x, normalized_shape, weight, bias, mean, rstd, relu: bool = False):
    """Returns (dx, dweight or None, dbias or None)."""
    validate(x, normalized_shape, weight, bias)
    dispatch.check_same_device(OP + "_backward", x=x, grad=dy)
    if dy.shape != x.shape:
        raise ValueError(
            f"tilewise.{OP}: argument 'grad' has shape {tuple(dy.shape)}, expected {tuple(x.shape)}"
        )
    if not dispatch.use_kernel(OP + "_backward", [x, dy]):
        return reference_backward(dy, x, normalized_shape, weight, bias, mean, rstd, relu)
    n = row_size(normalized_shape)
    xv = x.contiguous().view(-1, n)
    dyv = dy.to(x.dtype).contiguous().view(-1, n)
    m = xv.shape[0]
    dx = alloc.empty_like(xv)
    w = weight.contiguous() if weight is not None else xv
    b = bias.contiguous() if bias is not None else xv
    flags = dict(HAS_W=weight is not None, HAS_B=bias is not None, RELU=bool(relu))
    if n > MAX_FUSED_N:
        # per-row fp32 terms of dweight and dbias, summed in a fixed order (deterministic)
        dwr = (
            alloc.empty((m, n), device=x.device, dtype=torch.float32) if weight is not None else dx
        )
        dbr = alloc.empty((m, n), device=x.device, dtype=torch.float32) if bias is not None else dx
        _ln_bwd_looped_kernel[(m,)](
            dyv, xv, w, b, mean, rstd, dx, dwr, dbr, n, **flags, BLOCK_N=CHUNK_N, num_warps=8
        )
        dw = dwr.sum(0).to(weight.dtype).view(weight.shape) if weight is not None else None
        db = dbr.sum(0).to(bias.dtype).view(bias.shape) if bias is not None else None
        return dx.view(x.shape), dw, db
    affine = weight is not None or bias is not None
    cfg = _config("layer_norm_bwd", m, n, x.element_size(), x.device, affine)
    progs = min(cdiv(m, cfg.block_m), cfg.progs_per_sm * num_sms(x.device))
    rows_per_prog = cdiv(cdiv(m, progs), cfg.block_m) * cfg.block_m
    progs = cdiv(m, rows_per_prog)
    atomic = use_atomics() and affine  # without weight and bias there is nothing to reduce
    dw = alloc.empty(n, device=x.device, dtype=weight.dtype) if weight is not None else None
    db = alloc.empty(n, device=x.device, dtype=bias.dtype) if bias is not None else None
    slots = atomic_slots(progs, cfg.block_n)
    if atomic:
        acc, count = zeroed_accumulators(2 * slots * n, 1, x.device)
        dwp, dbp = acc[: slots * n], acc[slots * n :]
    else:  # per-program partial rows (deterministic mode), none without weight and bias
        partial_shape = (progs, n) if affine else (1,)
        dwp = alloc.empty(partial_shape, device=x.device, dtype=torch.float32)
        dbp = alloc.empty(partial_shape, device=x.device, dtype=torch.float32)
        count = dwp
    with workspace.guarded(x.device):  # the atomic mode's accumulators
        _ln_bwd_kernel[(progs,)](
            dyv,
            xv,
            w,
            b,
            mean,
            rstd,
            dx,
            dwp,
            dbp,
            dw if dw is not None else dwp,
            db if db is not None else dbp,
            count,
            m,
            n,
            rows_per_prog,
            **flags,
            ATOMIC=atomic,
            SLOTS=slots,
            **backward_launch_args(cfg),
        )
    if not atomic:
        if dw is not None:
            dw.copy_(dwp.sum(0))
        if db is not None:
            db.copy_(dbp.sum(0))
    dw = dw.view(weight.shape) if dw is not None else None
    db = db.view(bias.shape) if db is not None else None
    return dx.view(x.shape), dw, db
