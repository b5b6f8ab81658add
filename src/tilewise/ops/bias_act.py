"""Fused bias + activation: ``y = act(x + b)`` with ``b`` broadcast along one dim of ``x``.

Forward is one pass over ``x`` (read) and ``y`` (write). Backward is one pass that reads ``dy`` and
``x``, writes ``dx`` and reduces the bias gradient on chip per program; the per-program sums are
added with fp32 atomics and cast by the last program (one launch in all), or, in PyTorch's
deterministic mode, stored as partial rows that a second reduction sums in a fixed order.

Layouts with a kernel: the bias dim is the innermost in memory, i.e. ``x`` contiguous with the
bias on its last dim, or a 4-D channels_last ``x`` with the bias on dim 1 (conv outputs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilewise.ops._common import (
    TileConfig,
    act_bwd,
    act_fwd,
    act_grad_reference,
    act_reference,
    activation_code,
    atomic_row_sum,
    atomic_slots,
    backward_launch_args,
    cdiv,
    fast_act_level,
    load_once,
    next_pow2,
    num_sms,
    persistent_rows,
    pick_config,
    pipeline_smem_budget,
    store_once,
    unit_stride,
    use_atomics,
    zeroed_accumulators,
)
from tilewise.runtime import alloc, dispatch, workspace

OP = "bias_act"


@triton.jit
def _bias_act_fwd_kernel(
    x_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    ROWS_PER_PROG,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    FAST_ACT: tl.constexpr,
    STREAM: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile per step over this program's ``ROWS_PER_PROG`` rows (one step
    unless a config asks for a persistent, software-pipelined grid)."""
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    row0 = tl.program_id(0) * ROWS_PER_PROG
    row_end = tl.minimum(row0 + ROWS_PER_PROG, M)
    for r in tl.range(row0, row_end, BLOCK_M, num_stages=STAGES):
        rows = r + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < row_end) & cmask[None, :]
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        z = load_once(x_ptr + offs, mask, STREAM).to(tl.float32)
        if HAS_BIAS:
            z = z + b[None, :]
        y = act_fwd(z, ACT, FAST_ACT)
        store_once(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask, STREAM)


@triton.jit
def _bias_act_bwd_kernel(
    dy_ptr,
    x_ptr,
    b_ptr,
    dx_ptr,
    dbp_ptr,
    db_ptr,
    count_ptr,
    M,
    N,
    ROWS_PER_PROG,
    HAS_BIAS: tl.constexpr,
    ADD_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    FAST_ACT: tl.constexpr,
    ATOMIC: tl.constexpr,
    SLOTS: tl.constexpr,
    PREFETCH: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STREAM: tl.constexpr,
):
    """dx for a column block of this program's rows; the bias gradient summed over those rows is
    stored as a partial row (deterministic) or added with atomics, the last program of the column
    block casting the sum into ``db_ptr``."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    if ADD_BIAS:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # reduced over rows once, at the end
    row0 = pid_m * ROWS_PER_PROG
    row_end = tl.minimum(row0 + ROWS_PER_PROG, M)
    if PREFETCH:  # the next step's tile is loaded before this step's math and store
        offs = (row0 + tl.arange(0, BLOCK_M))[:, None].to(tl.int64) * N + cols[None, :]
        nmask = ((row0 + tl.arange(0, BLOCK_M)) < row_end)[:, None] & cmask[None, :]
        dy_n = load_once(dy_ptr + offs, nmask, STREAM)
        x_n = load_once(x_ptr + offs, nmask, STREAM)
    for r in tl.range(row0, row_end, BLOCK_M, num_stages=STAGES):
        rows = r + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < row_end) & cmask[None, :]
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        if PREFETCH:
            dy_c, x_c = dy_n, x_n
            nmask = ((rows + BLOCK_M) < row_end)[:, None] & cmask[None, :]
            dy_n = load_once(dy_ptr + offs + BLOCK_M * N, nmask, STREAM)
            x_n = load_once(x_ptr + offs + BLOCK_M * N, nmask, STREAM)
        else:
            dy_c = load_once(dy_ptr + offs, mask, STREAM)
            x_c = load_once(x_ptr + offs, mask, STREAM)
        z = x_c.to(tl.float32)
        if ADD_BIAS:
            z = z + b[None, :]
        dz = act_bwd(dy_c.to(tl.float32), z, ACT, FAST_ACT)
        dz = tl.where(mask, dz, 0.0)
        store_once(dx_ptr + offs, dz.to(dx_ptr.dtype.element_ty), mask, STREAM)
        acc += dz
    if HAS_BIAS:
        part = tl.sum(acc, axis=0)
        if ATOMIC:
            atomic_row_sum(
                dbp_ptr,
                dbp_ptr,
                part,
                part,
                db_ptr,
                db_ptr,
                count_ptr + pid_n,
                tl.num_programs(0),
                pid_m % SLOTS,
                N,
                cols,
                cmask,
                True,
                False,
                SLOTS,
            )
        else:
            tl.store(dbp_ptr + pid_m * N + cols, part, mask=cmask)


def reference(x: torch.Tensor, bias: torch.Tensor | None, activation: str, dim: int = -1):
    """Plain PyTorch ``act(x + b)``: the numerical reference and the eager baseline. An fp32
    bias with half ``x`` gives fp32 math and, as the kernels do, an output in ``x``'s dtype."""
    z = x if bias is None else x + _broadcast(bias, x, dim)
    return act_reference(z, activation).to(x.dtype)


def reference_backward(dy, x, bias, activation: str, dim: int = -1):
    """Plain PyTorch gradients of ``reference`` (fp32 math), returns (dx, dbias or None)."""
    z = x.float() if bias is None else x.float() + _broadcast(bias.float(), x, dim)
    dz = act_grad_reference(dy.float(), z, activation)
    db = None
    if bias is not None:
        d = dim % x.ndim
        db = dz.sum(dim=[i for i in range(x.ndim) if i != d]).to(bias.dtype)
    return dz.to(x.dtype), db


def _broadcast(bias: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    shape = [1] * x.ndim
    shape[dim % x.ndim] = -1
    return bias.view(shape)


def _rows_view(t: torch.Tensor, dim: int) -> torch.Tensor | None:
    """[M, N] view of ``t`` with the bias dim innermost in memory, or None if there is none."""
    d = dim % t.ndim
    n = t.shape[d]
    if d == t.ndim - 1 and t.is_contiguous():
        return t.view(-1, n)
    if t.ndim == 4 and d == 1 and t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).reshape(-1, n)  # a view: this permutation is contiguous
    return None


def validate(x: torch.Tensor, bias: torch.Tensor | None, activation: str, dim: int) -> None:
    """Raise ``ValueError`` naming the bad argument."""
    activation_code(activation)
    if not -x.ndim <= dim < x.ndim or x.ndim == 0:
        raise ValueError(f"tilewise.{OP}: argument 'dim'={dim} is out of range for x.ndim={x.ndim}")
    if bias is not None:
        dispatch.check_same_device(OP, x=x, bias=bias)
        dispatch.check_param_dtype(OP, x, bias=bias)
        if bias.ndim != 1 or bias.shape[0] != x.shape[dim]:
            raise ValueError(
                f"tilewise.{OP}: argument 'bias' has shape {tuple(bias.shape)}, expected "
                f"({x.shape[dim]},) to match x.shape[{dim}]"
            )


def _config(
    kernel: str,
    m: int,
    n: int,
    elem_bytes: int,
    device: torch.device | None = None,
    activation: str = "relu",
) -> TileConfig:
    # H100 sweep (benchmarks/tune_pointwise.py): the backward likes [8 x 512] fp16 tiles, 4 warps;
    # the forward is fastest when a program's tile is one contiguous run of memory (whole rows),
    # as with n=64 (0.98 of copy) against 512-wide column blocks of n=4096 rows (0.93).
    # Backward, session 6 (tune_pointwise --stages, 64 MB fp16): 16 x 512 tiles, the row loop
    # pipelined 3 deep, 4 programs per SM: 0.848 of copy against 0.842 for 8 x 512 register
    # prefetched at 8 per SM (within run-to-run noise; kept for its larger loads in flight).
    # fp32 (and a GPU with too little shared memory for 2 stages) keeps the register-prefetched
    # loop (not measured pipelined).
    pipelined_bwd = kernel.endswith("bwd") and elem_bytes < 4
    if pipelined_bwd:
        block_n = min(next_pow2(n), 512)
        block_m = max(1, min(next_pow2(m), 8192 // block_n))
        stages = min(3, pipeline_smem_budget(device) // (2 * block_m * block_n * elem_bytes))
        pipelined_bwd = stages >= 2  # dy and x tiles staged at least twice
    if pipelined_bwd and n % 1024 == 0:  # rows of whole 1024-value blocks
        # Session 17 (tune_pointwise --wide, 64 MB fp16, n = 4096, with the one-instruction
        # ex2/rcp forms): column blocks of 1024 values, 4 rows per step, pipelined 3 deep at 4 per
        # SM: SiLU 0.874 of copy (the 8 x 512 default 0.852), GELU 0.865 (best 0.869 at 2 per SM;
        # 8 x 512 0.861). 4 KB runs per row instead of 1 KB (bias_act's n = 64 rows, one 16 KB
        # run per tile, had read 0.89 against 0.87 at n = 4096).
        # GELU (tune_pointwise --stages --quick around that, same call pair): 2 rows per step, 4
        # stages, 2 per SM 0.881 (4 rows: 0.859-0.864).
        # Session 18 (benchmarks/pointwise_ab.py --wide, in turns, fp16 64 MB, n = 4096): one
        # row per step. GELU and SiLU 3 per SM, 4 stages: 0.901 both (those defaults: 0.867,
        # 0.868); ReLU 4 per SM, 3 stages: 0.900 (4 rows: 0.884). An eager add with the same
        # traffic (2 reads, 1 write) read 0.957-0.961 in those turns.
        block_n, rows, progs, deepest = 1024, 1, 4, 3
        if activation in ("gelu", "silu"):
            progs, deepest = 3, 4
        block_m = max(1, min(next_pow2(m), rows))
        per_stage = 2 * block_m * block_n * elem_bytes
        stages = min(deepest, pipeline_smem_budget(device) // per_stage)
        default = TileConfig(block_m, block_n, 4, progs, prefetch=False, stages=stages)
    elif pipelined_bwd:
        # Session 10 (tune_pointwise --stages --quick, 64 MB fp16): short rows (n = 64, a
        # 128 x 64 tile) want 8 warps (108-128 registers per thread against 182-255 at 4 warps,
        # triton_regs.py): SiLU 0.844 -> 0.876, ReLU 0.877 -> 0.876-0.878. 16 x 512 tiles stay
        # at 4 warps (8: 0.77-0.79).
        warps = 8 if block_n <= 128 else 4
        progs = 4
        if activation in ("gelu", "silu"):
            # Session 11 (tune_pointwise --stages --quick --act gelu, 64 MB fp16, 3 input sets):
            # the transcendental derivatives want half the rows per step at 2 programs per SM:
            # n = 64 64 x 64 0.868 (128 x 64: 0.846). Session 17, with the one-instruction
            # forms, 3 per SM and 2 stages: GELU 0.875 (tune_pointwise --stages; 2 per SM, 3
            # stages: 0.844), SiLU at 4 warps 0.881 (benchmarks/pointwise_ab.py, in turns;
            # the previous default 0.853)
            block_m, progs = max(1, block_m // 2), 2
            if block_n <= 128:
                progs, stages = 3, 2
                warps = 4 if activation == "silu" else warps
        default = TileConfig(
            block_m, block_n, warps, progs_per_sm=progs, prefetch=False, stages=stages
        )
    elif kernel.endswith("bwd"):
        block_n = min(next_pow2(n), 256 if elem_bytes >= 4 else 512)
        block_m = max(1, min(next_pow2(m), 4096 // block_n))
        default = TileConfig(block_m, block_n, 4, progs_per_sm=8)
    else:
        # Forward, session 10 (tune_pointwise --only bias_act_fwd, 64 MB fp16): one 16-byte
        # vector per thread wins (1 x 4096 / 16 warps 0.923 of copy, 32 x 64 / 8 warps 0.922)
        # over two (the previous 4096-value tiles at 8 warps: 0.902 / 0.909; torch.compile
        # 0.905-0.915 in the same calls). Evict-first loads and streaming stores lose: session
        # 17, in rotating turns that start from L2 read out (benchmarks/pointwise_ab.py, fp16
        # 64 MB, ReLU) n = 4096 0.900 against 0.915 plain (torch.compile 0.914), n = 64 0.903
        # against 0.915 (0.911). Session 12's sweep, which had them 0.1-0.8 points ahead, let
        # evict-first loads hit on lines the plain runs before them had left in L2.
        block_n = min(next_pow2(n), 16384 // elem_bytes)
        block_m = max(1, min(next_pow2(m), 2048 // block_n))
        warps = max(4, min(16, block_m * block_n * elem_bytes // (32 * 16)))
        default = TileConfig(block_m, block_n, warps, progs_per_sm=8)
    return pick_config(kernel, m, n, elem_bytes, default)


def _kernel_views(op: str, x: torch.Tensor, dim: int, *others: torch.Tensor):
    if not dispatch.use_kernel(op, [x, *others]):
        return None
    views = [_rows_view(t, dim) for t in (x, *others)]
    if any(v is None for v in views) or any(t.stride() != x.stride() for t in others):
        dispatch.fallback(
            op,
            "layout: the bias dim must be innermost in memory "
            "(contiguous with bias on the last dim, or channels_last with dim=1)",
        )
        return None
    return views


def forward(x: torch.Tensor, bias: torch.Tensor | None, activation: str = "relu", dim: int = -1):
    """``act(x + bias)``, bias broadcast along ``dim``; kernel or reference as dispatch decides."""
    validate(x, bias, activation, dim)
    bias = unit_stride(bias)
    views = _kernel_views(OP, x, dim)
    if views is None:
        return reference(x, bias, activation, dim)
    y = alloc.empty_like(x)
    xv, yv = views[0], _rows_view(y, dim)
    m, n = xv.shape
    cfg = _config("bias_act_fwd", m, n, x.element_size())
    n_blocks = cdiv(n, cfg.block_n)
    rows_per_prog = persistent_rows(m, cfg, n_blocks, x.device)
    _bias_act_fwd_kernel[(cdiv(m, rows_per_prog), n_blocks)](
        xv,
        xv if bias is None else bias,
        yv,
        m,
        n,
        rows_per_prog,
        HAS_BIAS=bias is not None,
        ACT=activation_code(activation),
        FAST_ACT=fast_act_level(x.dtype, x.device),  # approximate forms for half outputs
        STREAM=cfg.streaming,
        STAGES=cfg.stages,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps,
    )
    return y


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    dim: int = -1,
    add_bias: bool = True,
):
    """Returns ``(dx, dbias)``; ``dbias`` is None when ``bias`` is None. With ``add_bias=False``
    the derivative is taken at ``x`` itself and ``bias`` only gives the bias gradient its dtype
    and shape (a linear layer's ReLU, whose saved output already holds the bias)."""
    validate(x, bias, activation, dim)
    bias = unit_stride(bias)
    dispatch.check_same_device(OP + "_backward", x=x, grad=dy)
    if dy.shape != x.shape:
        raise ValueError(
            f"tilewise.{OP}: argument 'grad' has shape {tuple(dy.shape)}, expected {tuple(x.shape)}"
        )
    if dy.dtype != x.dtype or dy.stride() != x.stride():
        dy = alloc.empty_like(x).copy_(dy)  # x's dtype and memory layout
    views = _kernel_views(OP + "_backward", x, dim, dy)
    if views is None:
        b = bias if add_bias or bias is None else torch.zeros_like(bias)
        return reference_backward(dy, x, b, activation, dim)
    xv, dyv = views
    dx = alloc.empty_like(x)
    dxv = _rows_view(dx, dim)
    m, n = xv.shape
    cfg = _config("bias_act_bwd", m, n, x.element_size(), x.device, activation)
    n_blocks = cdiv(n, cfg.block_n)
    progs_m = min(cdiv(m, cfg.block_m), max(1, cfg.progs_per_sm * num_sms(x.device) // n_blocks))
    rows_per_prog = cdiv(cdiv(m, progs_m), cfg.block_m) * cfg.block_m
    progs_m = cdiv(m, rows_per_prog)
    atomic, slots = use_atomics(), atomic_slots(progs_m, cfg.block_n)
    db = alloc.empty(n, device=x.device, dtype=bias.dtype) if bias is not None else None
    if bias is None:
        partial = count = dxv  # unused
    elif atomic:
        partial, count = zeroed_accumulators(slots * n, n_blocks, x.device)
    else:
        partial = alloc.empty((progs_m, n), device=x.device, dtype=torch.float32)
        count = partial
    with workspace.guarded(x.device):  # the atomic mode's accumulators
        _bias_act_bwd_kernel[(progs_m, n_blocks)](
            dyv,
            xv,
            xv if bias is None else bias,
            dxv,
            partial,
            partial if db is None else db,
            count,
            m,
            n,
            rows_per_prog,
            HAS_BIAS=bias is not None,
            ADD_BIAS=bias is not None and add_bias,
            ACT=activation_code(activation),
            # the approximate GELU/SiLU forms only where every output is half precision (an
            # fp32 bias gradient with half x sums the dz values in fp32)
            FAST_ACT=fast_act_level(
                x.dtype if db is None else torch.promote_types(x.dtype, db.dtype), x.device
            ),
            ATOMIC=atomic,
            SLOTS=slots,
            **backward_launch_args(cfg),
        )
    if db is not None and not atomic:
        db.copy_(partial.sum(0))  # torch's reduction of the partial rows, in a fixed order
    return dx, db
