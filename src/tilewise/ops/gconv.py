"""Grouped conv2d with group width 8 (C_in == C_out == C, groups = C/8), stride 1, NHWC.

fprop: a program computes a ``block_p x block_q`` tile of output pixels of one image times
``block_c`` channels (``block_c / 8`` groups). Per tap (r, s), a runtime loop that Triton
software-pipelines, it loads the shifted input tile [pixels, block_c] (masked at the borders; the
channel runs are contiguous in NHWC) and multiplies it by a block-diagonal [block_c, block_c]
weight tile (each group's 8x8 block, zeros elsewhere, masked in-kernel from PyTorch's
[C, 8, R, S] layout, any strides) into an fp32 accumulator; the epilogue adds the bias and stores
NHWC. The zeros would turn another group's NaN or Inf into NaN, so a tile whose accumulator is not
all finite is recomputed one group at a time (two taps per 16-lane dot), which propagates NaN and
Inf exactly as PyTorch does. dgrad is the same kernel reading the weights flipped and per-group
transposed (index arithmetic, no copy) with the transposed padding. wgrad is in ``gconv_wgrad``.
Problems, configs and heuristics are in ``gconv_config``; block sizes are launch parameters,
chosen by ``tilewise.runtime.autotune``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tilewise.ops import gconv_cuda, gconv_library, gconv_plan, gconv_wgrad
from tilewise.ops._common import cdiv, l2_bytes, num_sms
from tilewise.ops.gconv_config import (
    GROUP_WIDTH,
    MAX_KERNEL,
    OP,
    GConvConfig,
    GConvProblem,
    candidate_configs,
    candidate_tuple,
    channels_last_copy,
    check_conv_args,
    default_config,
    dw_format,
    timing_mode,
)
from tilewise.runtime import alloc, autotune, dispatch

__all__ = [
    "GConvConfig",
    "GConvProblem",
    "backward",
    "candidate_configs",
    "check_conv_args",
    "default_config",
    "forward",
    "reference",
    "reference_backward",
    "validate",
]

OP_BWD = OP + "_backward"


@triton.jit
def _exact_groups_store(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    n,
    p,
    q,
    out_ok,
    c_start,
    C,
    H,
    W,
    pad_h,
    pad_w,
    sxn,
    sxc,
    sxh,
    sxw,
    swo,
    swi,
    swr,
    sws,
    syn,
    syc,
    syh,
    syw,
    R: tl.constexpr,
    S: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    DGRAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Compute and store the tile one group at a time, so no product mixes groups: the 16 K lanes
    of each tl.dot hold two taps' 8 channels of one group, output lanes 8-15 are padding. Twice
    the tensor-core work of the block-diagonal path; run only for tiles that met a NaN or Inf."""
    j = tl.arange(0, 16)
    real = j < 8
    lane_c = j % 8
    second = j >= 8
    for g in range(BLOCK_C // 8):  # runtime loops: this rare path stays small in code size
        c0 = c_start + g * 8
        group_ok = c0 + lane_c < C  # [16]; C is a multiple of 8: a group is all in or all out
        x_base = x_ptr + n * sxn + (c0 + lane_c)[None, :] * sxc
        w_cols_ok = (real & group_ok)[None, :]
        acc = tl.zeros((BLOCK_M, 16), dtype=tl.float32)
        for i in range((R * S + 1) // 2):
            t = 2 * i + second.to(tl.int32)  # lanes 0-7: tap 2i, lanes 8-15: tap 2i + 1
            dr = t // S
            ds = t % S
            lane_ok = t < R * S
            ih = p[:, None] + (dr - pad_h)[None, :]
            iw = q[:, None] + (ds - pad_w)[None, :]
            ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & (lane_ok & group_ok)[None, :]
            xt = tl.load(x_base + ih * sxh + iw * sxw, mask=ok, other=0.0)
            if DGRAD:  # rows: forward output channel c0 + lane_c; columns: its input lane j
                w_offs = (c0 + lane_c)[:, None] * swo + j[None, :] * swi
                w_offs += ((R - 1 - dr) * swr + (S - 1 - ds) * sws)[:, None]
            else:  # rows: input lane lane_c of the tap; columns: output channel c0 + j
                w_offs = (c0 + j[None, :]) * swo + (lane_c * swi + dr * swr + ds * sws)[:, None]
            wt = tl.load(w_ptr + w_offs, mask=lane_ok[:, None] & w_cols_ok, other=0.0)
            if IEEE:
                acc = tl.dot(xt, wt, acc, input_precision="ieee")
            else:
                acc = tl.dot(xt, wt, acc)
        c = c0 + j
        cmask = real & group_ok
        if HAS_BIAS:
            acc += tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        y_offs = n * syn + (p * syh + q * syw)[:, None] + c[None, :] * syc
        tl.store(
            y_ptr + y_offs,
            acc.to(y_ptr.dtype.element_ty),
            mask=out_ok[:, None] & cmask[None, :],
        )


@triton.jit
def _gconv_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    C,
    H,
    W,
    P,
    Q,
    pad_h,
    pad_w,
    tiles_q,
    tiles_per_image,
    sxn,
    sxc,
    sxh,
    sxw,
    swo,
    swi,
    swr,
    sws,
    syn,
    syc,
    syh,
    syw,
    R: tl.constexpr,
    S: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    DGRAD: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    n = (pid // tiles_per_image).to(tl.int64)
    tile = pid % tiles_per_image
    m = tl.arange(0, BLOCK_P * BLOCK_Q)
    p = (tile // tiles_q) * BLOCK_P + m // BLOCK_Q
    q = (tile % tiles_q) * BLOCK_Q + m % BLOCK_Q
    out_ok = (p < P) & (q < Q)
    c_start = tl.program_id(1) * BLOCK_C
    c = c_start + tl.arange(0, BLOCK_C)
    cmask = c < C
    # Fast path: per tap, the shifted [pixels, BLOCK_C] input tile times a block-diagonal
    # [BLOCK_C, BLOCK_C] weight tile (each group's 8x8 block, zeros elsewhere). The tap loop is a
    # runtime loop, so Triton pipelines the loads through shared memory (num_stages).
    k = tl.arange(0, BLOCK_C)
    if DGRAD:  # w_t[c, k] = w[c_start + k, c % 8, R-1-r, S-1-s]: no flipped copy of the weights
        w_offs = (c_start + k)[:, None] * swo + (c % 8)[None, :] * swi
    else:
        w_offs = c[None, :] * swo + (k % 8)[:, None] * swi
    w_mask = (k[:, None] // 8 == k[None, :] // 8) & cmask[None, :]
    x_base = x_ptr + n * sxn + c[None, :] * sxc
    acc = tl.zeros((BLOCK_P * BLOCK_Q, BLOCK_C), dtype=tl.float32)
    for t in range(0, R * S):
        r = t // S
        s = t % S
        ih = p + (r - pad_h)
        iw = q + (s - pad_w)
        ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        xt = tl.load(
            x_base + (ih * sxh + iw * sxw)[:, None], mask=ok[:, None] & cmask[None, :], other=0.0
        )
        if DGRAD:
            wt = tl.load(
                w_ptr + w_offs + (R - 1 - r) * swr + (S - 1 - s) * sws, mask=w_mask, other=0.0
            )
        else:
            wt = tl.load(w_ptr + w_offs + r * swr + s * sws, mask=w_mask, other=0.0)
        if IEEE:
            acc = tl.dot(xt, wt, acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, wt, acc)
    # The zeros of the block-diagonal tile meet other groups' inputs: a NaN or Inf there turns
    # into NaN (x * 0) in every group of the tile. Any non-finite product leaves a non-finite sum,
    # so a fully finite accumulator proves the fast result exact; otherwise redo the tile one
    # group at a time, which propagates NaN and Inf exactly as PyTorch does.
    bad = tl.sum(((acc != acc) | (tl.abs(acc) == float("inf"))).to(tl.int32))
    if bad > 0:
        _exact_groups_store(
            x_ptr,
            w_ptr,
            b_ptr,
            y_ptr,
            n,
            p,
            q,
            out_ok,
            c_start,
            C,
            H,
            W,
            pad_h,
            pad_w,
            sxn,
            sxc,
            sxh,
            sxw,
            swo,
            swi,
            swr,
            sws,
            syn,
            syc,
            syh,
            syw,
            R,
            S,
            HAS_BIAS,
            IEEE,
            DGRAD,
            BLOCK_P * BLOCK_Q,
            BLOCK_C,
        )
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        y_offs = n * syn + (p * syh + q * syw)[:, None] + c[None, :] * syc
        tl.store(
            y_ptr + y_offs, acc.to(y_ptr.dtype.element_ty), mask=out_ok[:, None] & cmask[None, :]
        )


def launch_fprop(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pad_h: int,
    pad_w: int,
    cfg: GConvConfig,
    dgrad: bool = False,
) -> None:
    """Run the fprop kernel: ``out = conv(x, weight) + bias``; ``out``'s size sets P and Q.

    ``dgrad=True`` reads ``weight`` (the forward's) flipped and per-group transposed in-kernel,
    i.e. convolves with ``w_t[ci, co_local, r, s] = w[co, ci_local, R-1-r, S-1-s]`` without making
    it. Padding may be negative (dgrad with padding > R - 1): it is only an offset with masks.
    """
    n, c, h, w = x.shape
    r, s = weight.shape[2], weight.shape[3]
    p, q = out.shape[2], out.shape[3]
    tiles_q = cdiv(q, cfg.block_q)
    tiles_per_image = cdiv(p, cfg.block_p) * tiles_q
    grid = (n * tiles_per_image, cdiv(c, cfg.block_c))
    _gconv_fwd_kernel[grid](
        x,
        weight,
        weight if bias is None else bias,
        out,
        c,
        h,
        w,
        p,
        q,
        pad_h,
        pad_w,
        tiles_q,
        tiles_per_image,
        *x.stride(),
        *weight.stride(),
        *out.stride(),
        R=r,
        S=s,
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        DGRAD=dgrad,
        BLOCK_P=cfg.block_p,
        BLOCK_Q=cfg.block_q,
        BLOCK_C=cfg.block_c,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


# --- references ---------------------------------------------------------------------------------


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding: tuple[int, int] | int = 0,
) -> torch.Tensor:
    """PyTorch's grouped conv (groups = C/8): the numerical reference and the eager baseline."""
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    groups = x.shape[1] // weight.shape[1]
    return torch.nn.functional.conv2d(x, weight, bias, padding=padding, groups=groups)


def reference_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding: tuple[int, int],
    need: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """PyTorch's (dx, dweight, dbias) for ``reference``; entries not in ``need`` are None."""
    groups = x.shape[1] // weight.shape[1]
    grad = grad.to(x.dtype)
    dx = dw = db = None
    if need[0]:
        dx = torch.nn.grad.conv2d_input(x.shape, weight, grad, padding=padding, groups=groups)
    if need[1]:
        dw = torch.nn.grad.conv2d_weight(x, weight.shape, grad, padding=padding, groups=groups)
    if need[2] and bias is not None:
        db = grad.sum((0, 2, 3), dtype=torch.float32).to(bias.dtype)
    return dx, dw, db


# --- argument checks ----------------------------------------------------------------------------


def output_size(h: int, w: int, r: int, s: int, pad_h: int, pad_w: int) -> tuple[int, int]:
    return h + 2 * pad_h - r + 1, w + 2 * pad_w - s + 1


def validate(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad_h: int, pad_w: int
) -> None:
    """Raise ``ValueError`` naming the bad argument of a group-width-8 conv."""
    if x.ndim != 4:
        raise ValueError(f"tilewise.{OP}: argument 'x' must be 4-D [N, C, H, W], got {x.ndim}-D")
    c = x.shape[1]
    if c % GROUP_WIDTH != 0 or c == 0:
        raise ValueError(
            f"tilewise.{OP}: argument 'x' has {c} channels; a group-width-8 conv needs a "
            f"positive multiple of 8"
        )
    if weight.ndim != 4 or tuple(weight.shape[:2]) != (c, GROUP_WIDTH) or min(weight.shape) < 1:
        raise ValueError(
            f"tilewise.{OP}: argument 'weight' has shape {tuple(weight.shape)}, expected "
            f"({c}, {GROUP_WIDTH}, R, S) with R, S >= 1"
        )
    if pad_h < 0 or pad_w < 0:
        raise ValueError(f"tilewise.{OP}: argument 'padding'=({pad_h}, {pad_w}) is negative")
    dispatch.check_same_device(OP, x=x, weight=weight, bias=bias)
    dispatch.check_same_dtype(OP, x=x, weight=weight)
    if bias is not None:
        dispatch.check_param_dtype(OP, x, bias=bias)
        if bias.ndim != 1 or bias.shape[0] != c:
            raise ValueError(
                f"tilewise.{OP}: argument 'bias' has shape {tuple(bias.shape)}, expected ({c},)"
            )
    p, q = output_size(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], pad_h, pad_w)
    if p < 1 or q < 1:
        raise ValueError(
            f"tilewise.{OP}: argument 'x' of size {x.shape[2]}x{x.shape[3]} with padding "
            f"({pad_h}, {pad_w}) is smaller than the {weight.shape[2]}x{weight.shape[3]} kernel"
        )


def layout_reason(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> str | None:
    """Why these tensors cannot take the kernel path (layout or size), or None if they can."""
    if weight.shape[2] > MAX_KERNEL or weight.shape[3] > MAX_KERNEL:
        return f"kernel {weight.shape[2]}x{weight.shape[3]} is larger than 7x7"
    if not x.is_contiguous(memory_format=torch.channels_last):
        return "input is not channels_last (NHWC) contiguous"
    return None


def _dense_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The kernels index the bias densely; weights of any layout are read through their strides
    (a model moved to channels_last has channels_last weights, and a per-call copy would cost a
    launch per layer)."""
    return bias.contiguous() if bias is not None else None


def dw_channels_last(weight: torch.Tensor) -> bool:
    """Whether the weight gradient is written channels_last: for a channels_last weight (a model
    moved to channels_last), so that autograd's AccumulateGrad keeps it as the parameter's
    ``.grad`` instead of copying it into the parameter's layout (one kernel per conv per step).
    Any other layout (a 1x1 weight is both) gets a contiguous one."""
    return weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()


def empty_weight_grad(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized weight gradient in the layout ``backward`` returns (shared with the fake
    kernel)."""
    fmt = dw_format(dw_channels_last(weight))
    return torch.empty(weight.shape, dtype=dtype, device=weight.device, memory_format=fmt)


def empty_output(x: torch.Tensor, weight: torch.Tensor, pad_h: int, pad_w: int) -> torch.Tensor:
    """An uninitialized channels_last output of the right size (shared with the fake kernel)."""
    p, q = output_size(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], pad_h, pad_w)
    return torch.empty(
        (x.shape[0], x.shape[1], p, q),
        dtype=x.dtype,
        device=x.device,
        memory_format=torch.channels_last,
    )


# --- host functions -----------------------------------------------------------------------------


def _kernel_ok(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    reason = layout_reason(x, weight, bias)
    if reason is not None:
        return dispatch.fallback(op, reason)
    return dispatch.use_kernel(op, [x, weight])


def _choose(
    op: str,
    pass_: str,
    problem: GConvProblem,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pad_h: int,
    pad_w: int,
    dgrad: bool = False,
    deterministic: bool = False,
):
    """The config of an fprop or dgrad (autotuned on CUDA: the Triton configs and, in half
    precision, the NVRTC kernel's tiles and cuDNN), timed on these tensors on first use."""
    sms = num_sms(x.device)
    cold, warm_too = timing_mode(problem, pass_, l2_bytes(x.device))
    # cuDNN: not where it would round an fp32 bias to half, nor for a deterministic dgrad
    library = gconv_library.offered(x, deterministic) and (bias is None or bias.dtype == x.dtype)
    level = _cuda_level(x, out)
    wide = gconv_cuda.rowpair_fragments(problem.r, problem.s) > gconv_cuda.ROWPAIR_MAX_FRAGMENTS
    # kernels past 5x5 key whether the wide-kernel row-pair tiles were offered (a pick cached
    # before session 22 offered them, or with TILEWISE_GCONV_WIDE_TILES=0, is not theirs)
    wide_tiles = gconv_cuda.wide_tiles_offered()
    wide_tag = ("+wide" if wide_tiles else "+nowide") if level and wide else ""
    tag = gconv_library.cache_tag(weight, library) + wide_tag
    return autotune.choose_config(
        f"{op}.{pass_}{tag}@{gconv_cuda.SOURCE_DIGEST}",
        problem,
        _candidates(problem, pass_, sms, level, library, wide_tiles),
        lambda c: _launch(x, weight, bias, out, pad_h, pad_w, c, dgrad),
        device=x.device,
        default=default_config(problem, pass_, sms),
        cold_l2=cold,
        warm_too=warm_too,
        screen=True,  # 28 candidates for a 3x3 fprop: a brief reading first (session 19)
    )


def _cuda_level(x: torch.Tensor, out: torch.Tensor) -> int:
    """0: Triton configs only; 1: and the NVRTC tiles; 2: and the NVRTC TMA tiles; 3: and the
    warpgroup-MMA tiles (compute capability 9.0)."""
    if not gconv_cuda.usable(x, out):
        return 0
    if not gconv_cuda.tma_usable(x):
        return 1
    return 3 if gconv_cuda.wgmma_usable(x) else 2


@functools.lru_cache(maxsize=4096)
def _candidates(
    problem: GConvProblem,
    pass_: str,
    sms: int,
    cuda_level: int,
    library: bool = False,
    wide_tiles: bool = True,
) -> tuple:
    base = candidate_tuple(problem, pass_, sms)
    if cuda_level:
        c, r, s = problem.c, problem.r, problem.s
        tiles = gconv_cuda.candidates(c, r, s, cuda_level >= 2, wide_tiles, cuda_level >= 3)
        base = tiles + base
    return base + (gconv_library.CUDNN,) if library else base


def _launch(x, weight, bias, out, pad_h: int, pad_w: int, cfg, dgrad: bool) -> torch.Tensor:
    """Run ``cfg`` (for dgrad: ``x`` is dy, the padding ``R - 1 - pad``); returns ``out``, or
    cuDNN's own output where its strides are ``out``'s."""
    if isinstance(cfg, gconv_library.LibraryConv):
        r, s = weight.shape[2], weight.shape[3]
        if dgrad:
            res = gconv_library.dgrad(x, weight, out, r - 1 - pad_h, s - 1 - pad_w)
        else:
            res = gconv_library.fprop(x, weight, bias, pad_h, pad_w)
        if res.stride() == out.stride():
            return res
        return out.copy_(res)
    if isinstance(cfg, gconv_cuda.CudaTile):
        gconv_cuda.fprop(x, weight, bias, out, pad_h, pad_w, cfg, dgrad)
    else:
        launch_fprop(x, weight, bias, out, pad_h, pad_w, cfg, dgrad)
    return out


def forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad_h: int, pad_w: int
) -> torch.Tensor:
    """``conv2d(x, weight, bias, padding=(pad_h, pad_w), groups=C/8)``, channels_last output.
    A problem seen before runs its plan (``gconv_plan``): checks and choices were made once."""
    key = gconv_plan.forward_key(x, weight, bias, pad_h, pad_w)
    plan = gconv_plan.PLANS.get(key) if key is not None else None
    if plan is not None:
        return plan(x, weight, bias)
    token = gconv_plan.PLANS.token()  # the switches the full path below reads
    validate(x, weight, bias, pad_h, pad_w)
    bias = _dense_bias(bias)
    if not _kernel_ok(OP, x, weight, bias):
        return channels_last_copy(reference(x, weight, bias, (pad_h, pad_w)))
    problem = GConvProblem.from_tensors(x, weight, bias, pad_h, pad_w)
    out = alloc.empty(
        x.shape[0],
        x.shape[1],
        problem.p,
        problem.q,
        dtype=x.dtype,
        device=x.device,
        memory_format=torch.channels_last,
    )
    cfg = _choose(OP, "fprop", problem, x, weight, bias, out, pad_h, pad_w)
    conv = gconv_plan.ConvPass(cfg, _launch, x, weight, bias, out, pad_h, pad_w, False)
    result = conv(x, weight, bias, out)
    if key is not None:  # stored once it has run: a call that fails leaves no plan
        gconv_plan.PLANS.put(key, gconv_plan.ForwardPlan(conv, out.shape), token)
    return result


def backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pad_h: int,
    pad_w: int,
    need: tuple[bool, bool, bool] = (True, True, True),
    deterministic: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx channels_last, dweight [C, 8, R, S] (channels_last for a channels_last weight, else
    contiguous: ``dw_channels_last``), dbias) for the entries in ``need``.

    ``deterministic=False`` lets wgrad add its partial sums with fp32 atomics (run-to-run bit
    differences on the GPU); True reduces per-chunk partials with a PyTorch sum. A problem seen
    before runs its plan (``gconv_plan``).
    """
    key = gconv_plan.backward_key(grad, x, weight, bias, pad_h, pad_w, need, deterministic)
    plan = gconv_plan.PLANS.get(key) if key is not None else None
    if plan is not None:
        return plan(grad, x, weight, bias)
    token = gconv_plan.PLANS.token()
    validate(x, weight, bias, pad_h, pad_w)
    bias = _dense_bias(bias)
    dispatch.check_same_device(OP_BWD, x=x, grad=grad)
    p, q = output_size(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], pad_h, pad_w)
    if tuple(grad.shape) != (x.shape[0], x.shape[1], p, q):
        raise ValueError(
            f"tilewise.{OP}: argument 'grad' has shape {tuple(grad.shape)}, expected "
            f"{(x.shape[0], x.shape[1], p, q)}"
        )
    need_db = need[2] and bias is not None
    cast_grad = grad.dtype != x.dtype or grad.stride(1) != 1
    if cast_grad:
        grad = channels_last_copy(grad, x.dtype)
    if not _kernel_ok(OP_BWD, x, weight, bias):
        dx, dw, db = reference_backward(grad, x, weight, bias, (pad_h, pad_w), need)
        return (
            channels_last_copy(dx) if dx is not None else None,
            empty_weight_grad(weight, weight.dtype).copy_(dw) if dw is not None else None,
            db,
        )
    problem = GConvProblem.from_tensors(x, weight, bias, pad_h, pad_w)
    r, s = weight.shape[2], weight.shape[3]
    dgrad = wgrad = None
    if need[0]:
        dx = alloc.empty(
            *x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last
        )
        pads = (r - 1 - pad_h, s - 1 - pad_w)
        cfg = _choose(OP, "dgrad", problem, grad, weight, None, dx, *pads, True, deterministic)
        dgrad = gconv_plan.ConvPass(cfg, _launch, grad, weight, None, dx, *pads, True)
    if need[1]:
        db_dtype = bias.dtype if need_db else torch.float32
        args = (grad, x, problem, need_db, deterministic, db_dtype, dw_channels_last(weight))
        wgrad = gconv_wgrad.bind(gconv_wgrad.choose(*args), *args)
    bias_dtype = bias.dtype if bias is not None else None
    plan = gconv_plan.BackwardPlan(cast_grad, dgrad, wgrad, need_db, bias_dtype)
    result = plan.run(grad, x, weight)
    if key is not None:
        gconv_plan.PLANS.put(key, plan, token)
    return result
