"""Fused one-level Strassen for inference chains of ``act(x @ W^T + b)`` (``nn.Linear`` layout).

With ``A = x`` [M, K] and ``B = W^T`` [K, N] split into 2x2 blocks (M, K, N zero-padded to even),
Strassen's seven products ``M1..M7`` give ``C = A @ B`` from 7 half-size GEMMs instead of 8:

* ``format_weights(W)``, once per layer: the B-side sums, shaped like ``W`` as [7, N/2, K/2]:
  W11+W22, W11, W21-W22, W12-W11, W22, W11+W21, W12+W22 (``Wij`` blocks of W); stored "nn" (N
  fastest, so cuBLAS runs NN GEMMs) or "nt" (K fastest, what the 3xTF32 products need).
* ``_prefix_kernel``: the A-side sums of the first layer's input, [7, M/2, K/2]:
  A11+A22, A21+A22, A11, A22, A11+A12, A21-A11, A12-A22 (the padding is written as exact zeros).
* per layer one ``torch.bmm`` (cuBLAS; TF32 as ``torch.backends.cuda.matmul.allow_tf32`` says):
  ``Mi = P[i] @ F[i]^T``, [7, M/2, N/2]; or, where timing says so per shape, seven ``torch.mm``
  launches into the same tensor, in a row or on parallel streams (``ProductsPlan``); fp32 with
  TF32 off, also one fp32-accurate tensor-core GEMM (``gemm_fp32tc``: 3xTF32), timed likewise.
* ``_suffix_kernel``: C11 = M1+M4-M5+M7, C12 = M3+M5, C21 = M2+M4, C22 = M1-M2+M3+M6, then bias and
  activation, then either the unpadded ``y`` (last layer) or directly the next layer's 7 prefix
  operands: block (r, c) of C is block (r, c) of the next A, so no C tensor is ever stored.

N layers are 2N+1 kernels. Sums are fp32 in registers; operands and products are in the input
dtype. Strassen mixes rows r and r+M/2 (and columns likewise): a NaN or Inf in one input row can
turn up in its partner row too, and Inf can become NaN (Inf - Inf), unlike a plain GEMM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilewise.ops import gemm_fp32tc
from tilewise.ops._common import (
    TileConfig,
    act_fwd,
    act_reference,
    activation_code,
    cdiv,
    next_pow2,
    pick_config,
    unit_stride,
)
from tilewise.ops.gemm_fp32tc import Fp32TcConfig
from tilewise.ops.linear import COLD_L2_MIN_BYTES
from tilewise.runtime import alloc, autotune, dispatch

OP = "strassen"


@triton.jit
def _prefix_kernel(
    x_ptr, p_ptr, M, K, MH, KH, plane, s_xm, s_xk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = (r[:, None] < MH) & (c[None, :] < KH)
    top, bot = r[:, None].to(tl.int64), r[:, None].to(tl.int64) + MH
    lft, rgt = c[None, :].to(tl.int64), c[None, :].to(tl.int64) + KH
    # rows >= M and columns >= K are the zero padding
    a11 = tl.load(x_ptr + top * s_xm + lft * s_xk, mask=tile & (top < M) & (lft < K), other=0.0)
    a12 = tl.load(x_ptr + top * s_xm + rgt * s_xk, mask=tile & (top < M) & (rgt < K), other=0.0)
    a21 = tl.load(x_ptr + bot * s_xm + lft * s_xk, mask=tile & (bot < M) & (lft < K), other=0.0)
    a22 = tl.load(x_ptr + bot * s_xm + rgt * s_xk, mask=tile & (bot < M) & (rgt < K), other=0.0)
    a11, a12 = a11.to(tl.float32), a12.to(tl.float32)
    a21, a22 = a21.to(tl.float32), a22.to(tl.float32)
    p = p_ptr + r[:, None].to(tl.int64) * KH + c[None, :]
    _store_prefix(p, plane, tile, a11, a12, a21, a22)


@triton.jit
def _store_prefix(p, plane, tile, a11, a12, a21, a22):
    """The 7 A-side Strassen operands of one block of the half grid; ``p`` points at operand 0,
    operand i is ``i * plane`` further (pointer steps, so no 32-bit ``i * plane`` overflow)."""
    ty = p.dtype.element_ty
    tl.store(p, (a11 + a22).to(ty), mask=tile)
    p += plane
    tl.store(p, (a21 + a22).to(ty), mask=tile)
    p += plane
    tl.store(p, a11.to(ty), mask=tile)
    p += plane
    tl.store(p, a22.to(ty), mask=tile)
    p += plane
    tl.store(p, (a11 + a12).to(ty), mask=tile)
    p += plane
    tl.store(p, (a21 - a11).to(ty), mask=tile)
    p += plane
    tl.store(p, (a12 - a22).to(ty), mask=tile)


@triton.jit
def _suffix_kernel(
    m_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    MH,
    NH,
    plane,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    TO_PREFIX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = (r[:, None] < MH) & (c[None, :] < NH)
    offs = r[:, None].to(tl.int64) * NH + c[None, :]
    mp = m_ptr + offs
    m1 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    mp += plane
    m2 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    mp += plane
    m3 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    mp += plane
    m4 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    mp += plane
    m5 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    mp += plane
    m6 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    mp += plane
    m7 = tl.load(mp, mask=tile, other=0.0).to(tl.float32)
    c11 = m1 + m4 - m5 + m7
    c12 = m3 + m5
    c21 = m2 + m4
    c22 = m1 - m2 + m3 + m6
    bot_ok = (r[:, None] + MH) < M  # the top rows r < MH are always real rows
    rgt_ok = (c[None, :] + NH) < N  # likewise the left columns
    if HAS_BIAS:
        b_lft = tl.load(bias_ptr + c, mask=c < NH, other=0.0).to(tl.float32)[None, :]
        b_rgt = tl.load(bias_ptr + c + NH, mask=(c + NH) < N, other=0.0).to(tl.float32)[None, :]
        c11, c21 = c11 + b_lft, c21 + b_lft
        c12, c22 = c12 + b_rgt, c22 + b_rgt
    c11, c12 = act_fwd(c11, ACT), act_fwd(c12, ACT)
    c21, c22 = act_fwd(c21, ACT), act_fwd(c22, ACT)
    if TO_PREFIX:
        # the next layer's padding must hold exact zeros (not act(bias)), so that padded rows and
        # columns add nothing, not even rounding, to the real ones
        c12 = tl.where(rgt_ok, c12, 0.0)
        c21 = tl.where(bot_ok, c21, 0.0)
        c22 = tl.where(bot_ok & rgt_ok, c22, 0.0)
        _store_prefix(out_ptr + offs, plane, tile, c11, c12, c21, c22)
    else:
        ty = out_ptr.dtype.element_ty
        top, bot = r[:, None].to(tl.int64) * N, (r[:, None].to(tl.int64) + MH) * N
        lft, rgt = c[None, :], c[None, :] + NH
        tl.store(out_ptr + top + lft, c11.to(ty), mask=tile)
        tl.store(out_ptr + top + rgt, c12.to(ty), mask=tile & rgt_ok)
        tl.store(out_ptr + bot + lft, c21.to(ty), mask=tile & bot_ok)
        tl.store(out_ptr + bot + rgt, c22.to(ty), mask=tile & bot_ok & rgt_ok)


def _half(n: int) -> int:
    return (n + 1) // 2


def _tile_config(kernel: str, mh: int, nh: int, elem_bytes: int) -> TileConfig:
    """Untuned default: ~2K-element tiles, rows up to 128 wide (a hook via ``CONFIG_OVERRIDES``)."""
    block_n = min(128, next_pow2(nh))
    block_m = min(next_pow2(mh), max(1, 2048 // block_n))
    return pick_config(kernel, mh, nh, elem_bytes, TileConfig(block_m, block_n, num_warps=4))


def _launch_2d(kernel, cfg: TileConfig, mh: int, nh: int, *args, **meta) -> None:
    grid = (cdiv(mh, cfg.block_m), cdiv(nh, cfg.block_n))
    kernel[grid](*args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **meta)


# --- host pieces (kernels) ---------------------------------------------------------------------


def format_weights(
    weight: torch.Tensor, dtype: torch.dtype | None = None, layout: str | None = None
) -> torch.Tensor:
    """The B-side Strassen sums of ``weight`` [N, K], zero-padded to even: [7, ceil(N/2),
    ceil(K/2)] in ``dtype`` (default ``weight``'s); sums computed in >= fp32. ``layout`` "nn": a
    transposed view of contiguous [7, ceil(K/2), ceil(N/2)] storage (cuBLAS's faster layout);
    "nt": contiguous, K fastest, which the tensor-core fp32 products need (Hopper's TF32 wgmma
    reads both operands K-major: with "nn" blocks they ran 331.5 us against 239.7, session 27).
    Default: "nt" where those products are offered (``fp32_tc_offered``), else "nn"."""
    if weight.ndim != 2:
        raise ValueError(f"tilewise.{OP}: argument 'weight' must be 2-D, got {tuple(weight.shape)}")
    out_dtype = dtype or weight.dtype
    layout = layout or ("nt" if fp32_tc_offered(out_dtype) else "nn")
    if layout not in ("nn", "nt"):
        raise ValueError(f"tilewise.{OP}: argument 'layout' must be 'nn' or 'nt', got {layout!r}")
    n, k = weight.shape
    nh, kh = _half(n), _half(k)
    acc = torch.promote_types(weight.dtype, torch.float32)
    w = torch.zeros(2 * nh, 2 * kh, device=weight.device, dtype=acc)
    w[:n, :k] = weight.detach()
    w11, w12, w21, w22 = w[:nh, :kh], w[:nh, kh:], w[nh:, :kh], w[nh:, kh:]
    sums = (w11 + w22, w11, w21 - w22, w12 - w11, w22, w11 + w21, w12 + w22)
    # "nn": [7, K/2, N/2] contiguous (N fastest), returned as its transposed view: the products
    # are then NN GEMMs for cuBLAS, which ran them at 0.89-0.91x the full product's rate at
    # M = 512-2048 where the NT layout of a contiguous [7, N/2, K/2] ran at 0.87-0.88x (fp32, H100,
    # ``scripts/strassen_wave_probe.py``, session 14)
    if layout == "nt":
        return torch.stack(sums).to(out_dtype).contiguous()
    stored = torch.stack([t.t() for t in sums]).to(out_dtype).contiguous()
    return stored.transpose(1, 2)


def prefix(x2: torch.Tensor) -> torch.Tensor:
    """Kernel: the 7 A-side operands [7, ceil(M/2), ceil(K/2)] of a 2-D ``x`` (any strides)."""
    m, k = x2.shape
    mh, kh = _half(m), _half(k)
    p = alloc.empty((7, mh, kh), device=x2.device, dtype=x2.dtype)
    cfg = _tile_config("strassen_prefix", mh, kh, x2.element_size())
    _launch_2d(
        _prefix_kernel, cfg, mh, kh, x2, p, m, k, mh, kh, mh * kh, x2.stride(0), x2.stride(1)
    )
    return p


@dataclass(frozen=True)
class ProductsPlan:
    """How the 7 products run: one batched GEMM (``torch.bmm``) or 7 ``torch.mm`` launches, for
    which cuBLAS picks other kernels, in a row or spread over ``streams`` CUDA streams (forked from
    and joined back to the current stream, so CUDA-graph capture records them as parallel
    branches). fp32 on an H100, K-major blocks, rate against the full product's
    (``scripts/strassen_wave_probe.py``, session 14): at 512 x 8192 bmm 0.89x, 7 launches in a
    row 0.96x, on 7 streams 1.00x; at 512 x 4096 0.90x / 0.82x / 0.87x (each half-size product
    alone leaves SMs idle). Chosen per shape by timing."""

    launches: int = 1
    streams: int = 1
    #: fp32 with TF32 off: the 7 products as one fp32-accurate tensor-core batched GEMM
    #: (``gemm_fp32tc``, Triton's 3xTF32 split) of this tile instead of cuBLAS
    tc: Fp32TcConfig | None = None


BMM, MM7 = ProductsPlan(1), ProductsPlan(7)
MM7_STREAMS = ProductsPlan(7, streams=7)
PLANS = (BMM, MM7, MM7_STREAMS)
#: what fp32 products with TF32 off are also timed against (session 27,
#: ``scripts/fp32_tc_probe.py``: at 7 x [256 x 2048] x [2048 x 2048] 239.7 us against cuBLAS's
#: bmm 351.2 us, at a quarter of its RMS error against fp64)
TC_PLANS = tuple(ProductsPlan(1, tc=cfg) for cfg in gemm_fp32tc.CONFIGS)
FP32_PLANS = PLANS + TC_PLANS

_side_streams: dict[tuple, list[torch.cuda.Stream]] = {}


def _streams(
    device: torch.device, count: int, owner: torch.cuda.Stream | None = None
) -> list[torch.cuda.Stream]:
    """``count`` side streams of ``device``, made once per process (graph capture needs the same
    streams to stay alive; creating them per call would also cost host time); a set of its own
    per ``owner`` stream, so that row groups on different lanes do not queue their products on
    one set of side streams."""
    key = (device, count, owner)  # streams hash and compare by the CUDA stream they wrap
    if key not in _side_streams:
        _side_streams[key] = [torch.cuda.Stream(device) for _ in range(count)]
    return _side_streams[key]


def run_products(
    plan: ProductsPlan, p: torch.Tensor, blocks: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``out[i] = p[i] @ blocks[i]^T`` for the 7 products, as ``plan`` says."""
    if plan.tc is not None:
        return gemm_fp32tc.bmm(p, blocks.transpose(1, 2), out, plan.tc)
    if plan.launches == 1:
        return torch.bmm(p, blocks.transpose(1, 2), out=out)
    if plan.streams <= 1 or p.device.type != "cuda":
        for i in range(7):
            torch.mm(p[i], blocks[i].t(), out=out[i])
        return out
    # Fork: every side stream waits for the work queued so far; join: the current stream waits
    # for every side stream before anything later (or a free of p, blocks, out) runs.
    # PyTorch hands out streams from a pool of 32 per device, so a side stream can be the
    # current one: it is left out, and its products go to the other lanes.
    current = torch.cuda.current_stream(p.device)
    side = _streams(p.device, plan.streams - 1, owner=current)
    lanes = [current, *(s for s in side if s != current)]
    for lane in lanes[1:]:
        lane.wait_stream(current)
    try:
        for i in range(7):
            with torch.cuda.stream(lanes[i % len(lanes)]):
                torch.mm(p[i], blocks[i].t(), out=out[i])
    finally:  # joined even if a launch raises: a capture must not end with unjoined streams
        for lane in lanes[1:]:
            current.wait_stream(lane)
    return out


@dataclass(frozen=True)
class ProductsProblem:
    """Autotune key of one layer's products: half sizes, dtype, TF32."""

    mh: int
    kh: int
    nh: int
    dtype: str
    tf32: bool
    layout: str = "nn"  # ``format_weights``' "nn" (N fastest) or "nt" (contiguous, K fastest)
    fp32_tc: bool = False  # the tensor-core split offered (fp32, TF32 off; ``fp32_tc_offered``)


def products(p: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The 7 Strassen products ``Mi = P[i] @ F[i]^T``, [7, M/2, N/2]: one ``torch.bmm``, seven
    ``torch.mm`` or, fp32 with TF32 off, one tensor-core 3xTF32 batched GEMM (``ProductsPlan``,
    timed per shape on CUDA)."""
    out = alloc.empty((7, p.shape[1], blocks.shape[1]), device=p.device, dtype=p.dtype)

    def run(plan: ProductsPlan) -> torch.Tensor:
        return run_products(plan, p, blocks, out)

    if p.device.type != "cuda":
        return run(BMM)
    mh, kh, nh = p.shape[1], p.shape[2], blocks.shape[1]
    layout = "nn" if blocks.stride(1) == 1 else "nt"
    dtype = str(p.dtype).removeprefix("torch.")
    tc = fp32_tc_offered(p.dtype)
    prob = ProductsProblem(mh, kh, nh, dtype, tf32_enabled(), layout, tc)
    # operands past linear's threshold are timed with L2 flushed, as its GEMMs are
    cold = 7 * (mh * kh + kh * nh + mh * nh) * p.element_size() >= COLD_L2_MIN_BYTES
    plans = FP32_PLANS if tc else PLANS
    plan = autotune.choose_config(OP + ".products", prob, plans, run, device=p.device, cold_l2=cold)
    return run(plan)


def suffix(
    mprod: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    m: int,
    n: int,
    to_prefix: bool,
) -> torch.Tensor:
    """Kernel: ``act(C + bias)`` from the products; ``y`` [m, n] or, with ``to_prefix``, the next
    layer's 7 operands [7, M/2, N/2] (padding as exact zeros)."""
    _, mh, nh = mprod.shape
    shape = (7, mh, nh) if to_prefix else (m, n)
    out = alloc.empty(shape, device=mprod.device, dtype=mprod.dtype)
    cfg = _tile_config("strassen_suffix", mh, nh, mprod.element_size())
    bias = unit_stride(bias)  # the kernel indexes the bias element by element
    args = (mprod, mprod if bias is None else bias, out, m, n, mh, nh, mh * nh)
    meta = {"HAS_BIAS": bias is not None, "ACT": activation_code(activation)}
    _launch_2d(_suffix_kernel, cfg, mh, nh, *args, TO_PREFIX=to_prefix, **meta)
    return out


# --- references (plain PyTorch) ----------------------------------------------------------------


def reference(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activations: Sequence[str],
) -> torch.Tensor:
    """The ordinary chain ``act(x @ W^T + b)`` layer by layer: the numerical reference."""
    for w, b, act in zip(weights, biases, activations, strict=True):
        x = act_reference(
            torch.nn.functional.linear(x, w, None if b is None else b.to(x.dtype)), act
        )
    return x


def prefix_reference(x2: torch.Tensor) -> torch.Tensor:
    """``prefix`` in torch ops (sums in >= fp32, stored in ``x2``'s dtype)."""
    m, k = x2.shape
    mh, kh = _half(m), _half(k)
    acc = torch.promote_types(x2.dtype, torch.float32)
    a = torch.zeros(2 * mh, 2 * kh, device=x2.device, dtype=acc)
    a[:m, :k] = x2
    return _prefix_sums(a[:mh, :kh], a[:mh, kh:], a[mh:, :kh], a[mh:, kh:]).to(x2.dtype)


def _prefix_sums(a11, a12, a21, a22) -> torch.Tensor:
    return torch.stack([a11 + a22, a21 + a22, a11, a22, a11 + a12, a21 - a11, a12 - a22])


def suffix_reference(
    mprod: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    m: int,
    n: int,
    to_prefix: bool,
) -> torch.Tensor:
    """``suffix`` in torch ops, same operation order (sums in >= fp32)."""
    _, mh, nh = mprod.shape
    acc = torch.promote_types(mprod.dtype, torch.float32)
    m1, m2, m3, m4, m5, m6, m7 = mprod.to(acc).unbind(0)
    c = torch.cat(
        [torch.cat([m1 + m4 - m5 + m7, m3 + m5], 1), torch.cat([m2 + m4, m1 - m2 + m3 + m6], 1)]
    )
    if bias is not None:
        c[:, :n] += bias.to(acc)
    c = act_reference(c, activation)
    if not to_prefix:
        return c[:m, :n].to(mprod.dtype).contiguous()
    c[m:], c[:, n:] = 0.0, 0.0
    return _prefix_sums(c[:mh, :nh], c[:mh, nh:], c[mh:, :nh], c[mh:, nh:]).to(mprod.dtype)


def strassen_reference(
    x: torch.Tensor,
    blocks: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activations: Sequence[str],
    sizes: Sequence[int],
) -> torch.Tensor:
    """The fused Strassen chain in torch ops (what ``forward`` falls back to; for debugging)."""
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    p = prefix_reference(x2)
    last = len(blocks) - 1
    for i, (f, b, act, n) in enumerate(zip(blocks, biases, activations, sizes[1:], strict=True)):
        p = suffix_reference(torch.bmm(p, f.transpose(1, 2)), b, act, m, n, i < last)
    return p.view(*x.shape[:-1], sizes[-1])


# --- validation, forward, selection ------------------------------------------------------------


def validate(
    x: torch.Tensor,
    blocks: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activations: Sequence[str],
    sizes: Sequence[int],
) -> None:
    """Raise ``ValueError`` naming the bad argument."""
    count = len(blocks)
    if count == 0:
        raise ValueError(f"tilewise.{OP}: argument 'blocks' is empty; need at least one layer")
    for name, seq, want in (
        ("biases", biases, count),
        ("activations", activations, count),
        ("sizes", sizes, count + 1),
    ):
        if len(seq) != want:
            raise ValueError(
                f"tilewise.{OP}: argument '{name}' has {len(seq)} entries, expected {want} "
                f"for {count} layers"
            )
    if x.ndim == 0 or x.shape[-1] != sizes[0]:
        raise ValueError(
            f"tilewise.{OP}: argument 'x' has shape {tuple(x.shape)}; its last dim must be "
            f"sizes[0]={sizes[0]}"
        )
    for i, (f, b, act) in enumerate(zip(blocks, biases, activations, strict=True)):
        activation_code(act)
        k, n = sizes[i], sizes[i + 1]
        if tuple(f.shape) != (7, _half(n), _half(k)):
            raise ValueError(
                f"tilewise.{OP}: argument 'blocks[{i}]' has shape {tuple(f.shape)}; "
                f"format_weights of a [{n}, {k}] weight is {(7, _half(n), _half(k))}"
            )
        dispatch.check_same_device(OP, x=x, **{f"blocks[{i}]": f, f"biases[{i}]": b})
        dispatch.check_same_dtype(OP, x=x, **{f"blocks[{i}]": f})
        if b is not None:
            dispatch.check_param_dtype(OP, x, **{f"biases[{i}]": b})
            if tuple(b.shape) != (n,):
                raise ValueError(
                    f"tilewise.{OP}: argument 'biases[{i}]' has shape {tuple(b.shape)}, "
                    f"expected ({n},)"
                )


def forward(
    x: torch.Tensor,
    blocks: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    activations: Sequence[str],
    sizes: Sequence[int],
    groups: int | None = None,
) -> torch.Tensor:
    """The chain ``act_i(... @ W_i^T + b_i)`` through fused Strassen: ``y`` [..., sizes[-1]].

    ``blocks[i] = format_weights(W_i)``, ``W_i`` of shape [sizes[i + 1], sizes[i]] (the sizes
    are needed: formatting pads odd sizes, so blocks alone cannot tell 5 from 6). 2N+1 kernels
    for N layers: 1 prefix, N ``torch.bmm``, N suffix; per row group (``ROW_GROUPS``: ``groups``,
    or None to let timing choose on CUDA), plus one gather of the groups' rows.
    """
    validate(x, blocks, biases, activations, sizes)
    x2 = x.reshape(-1, x.shape[-1])
    if groups is not None and x2.shape[0]:
        _row_bounds(x2.shape[0], groups)  # a bad count raises on every path, before any launch
    if not dispatch.use_kernel(OP, [x2, *blocks]):
        return strassen_reference(x, blocks, biases, activations, sizes)
    layers = (blocks, biases, activations, sizes)
    if groups is None:
        groups = _choose_row_groups(x2, layers)
    return _chain_in_row_groups(x2, layers, groups).view(*x.shape[:-1], sizes[-1])


def _chain(x2: torch.Tensor, layers: tuple) -> torch.Tensor:
    """The 2N+1 kernels on a 2-D input: ``y`` [M, sizes[-1]]."""
    blocks, biases, activations, sizes = layers
    m = x2.shape[0]
    p = prefix(x2)
    last = len(blocks) - 1
    for i, (f, b, act, n) in enumerate(zip(blocks, biases, activations, sizes[1:], strict=True)):
        p = suffix(products(p, f), b, act, m, n, to_prefix=i < last)
    return p


#: Row groups (``forward(groups=)``): the rows split into G independent chains on G CUDA streams,
#: forked and joined once, so that one chain's tiles fill the SMs another's last wave of a layer
#: leaves idle (and hide each suffix kernel), at the cost of reading each layer's weights once per
#: group. fp32, TF32 off, 8 layers, H100, whole chains against one chain (session 25,
#: ``scripts/mlp_cell_probe.py --row-groups``): 1024 x 4096 two groups of 512 rows 1.152x PyTorch
#: + graph against 1.052x; groups of 256 rows lose (512 x 4096: 0.972x against 1.047x; 1024 x
#: 4096 in four: 0.759x), and so do 4096 x 4096 in two or four (1.076x, 1.056x against 1.122x).
#: Offered where every group keeps ``MIN_GROUP_ROWS`` rows; chosen per chain shape by timing.
ROW_GROUPS = (1, 2, 4)
MIN_GROUP_ROWS = 512


@dataclass(frozen=True)
class ChainProblem:
    """Autotune key of a whole chain's choices (its row-group count here, ``StrassenMLP``'s
    path): rows, feature sizes, dtype, TF32."""

    batch: int
    sizes: tuple[int, ...]
    dtype: str
    tf32: bool
    fp32_tc: bool = False  # products may run the tensor-core split (``fp32_tc_offered``)


def _row_bounds(m: int, groups: int) -> list[tuple[int, int]]:
    """``groups`` consecutive, non-empty row ranges covering ``m`` rows: all but the last of the
    same even length (no padded row), the last taking the rest."""
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"tilewise.{OP}: argument 'groups' must be an int >= 1, got {groups!r}")
    if groups == 1:
        return [(0, m)]
    size = max(2, m // groups // 2 * 2)
    if (groups - 1) * size >= m:
        raise ValueError(f"tilewise.{OP}: argument 'groups'={groups} is too many for {m} rows")
    return [(g * size, (g + 1) * size) for g in range(groups - 1)] + [((groups - 1) * size, m)]


def _chain_in_row_groups(x2: torch.Tensor, layers: tuple, groups: int) -> torch.Tensor:
    """The chain on each row group, group g on lane g modulo the lanes (the current stream and
    up to ``groups - 1`` side streams, forked from and joined back to it, so a CUDA-graph capture
    records parallel branches); ``y`` gathered on the current stream after the join. Off CUDA,
    the groups in a row; one group is the plain chain."""
    if groups == 1:
        return _chain(x2, layers)
    bounds = _row_bounds(x2.shape[0], groups)
    if x2.device.type != "cuda":
        return torch.cat([_chain(x2[lo:hi], layers) for lo, hi in bounds])
    current = torch.cuda.current_stream(x2.device)
    # PyTorch hands out streams from a pool (32 per device): a side stream can be the current one
    # (left out) or repeat; lanes are then shared round-robin, groups on one lane run in a row
    side = list(dict.fromkeys(s for s in _streams(x2.device, groups) if s != current))
    side = side[: groups - 1]  # one spare made, for the current stream being one of them
    lanes = [current, *side]
    for lane in side:
        lane.wait_stream(current)
    ys = []
    try:
        for g, (lo, hi) in enumerate(bounds):
            with torch.cuda.stream(lanes[g % len(lanes)]):
                ys.append(_chain(x2[lo:hi], layers))
    finally:  # joined even if a launch raises: a capture must not end with unjoined streams
        for lane in side:
            current.wait_stream(lane)
    y = torch.cat(ys)  # on the current stream, after the join
    for part in ys:  # made on a lane, last read here: no lane reuses its memory before the gather
        part.record_stream(current)
    return y


@dataclass(frozen=True)
class RowGroups:
    """A row-group count, as the autotuner stores candidates (dataclasses)."""

    count: int


#: the candidate tuples by largest group count (the same tuple objects on every call keep the
#: autotuner's per-call fast path)
_GROUP_CANDIDATES = {g: tuple(RowGroups(c) for c in ROW_GROUPS if c <= g) for g in ROW_GROUPS}


def _choose_row_groups(x2: torch.Tensor, layers: tuple) -> int:
    """1 (one chain) unless timing says a split into row groups is faster (the autotuner times
    only on CUDA; elsewhere, and during capture without a cached choice, it answers 1)."""
    m = x2.shape[0]
    most = max(g for g in ROW_GROUPS if g == 1 or m >= g * MIN_GROUP_ROWS)
    if most == 1:
        return 1
    sizes = layers[3]
    key = chain_problem(m, sizes, x2.dtype)

    def run(g: RowGroups) -> torch.Tensor:
        return _chain_in_row_groups(x2, layers, g.count)

    choice = autotune.choose_config(
        OP + ".row_groups", key, _GROUP_CANDIDATES[most], run, device=x2.device
    )
    return choice.count


def tf32_enabled() -> bool:
    """Whether fp32 matmuls may use TF32 (PyTorch's global switch, which ``torch.bmm`` obeys)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def fp32_tc_offered(dtype: torch.dtype) -> bool:
    """Whether the products may run as fp32-accurate tensor-core GEMMs: fp32 with TF32 off (with
    TF32 on, cuBLAS's TF32 GEMM is faster and what the user asked for), unless
    ``TILEWISE_FP32_TENSOR_CORES=0``."""
    return dtype == torch.float32 and not tf32_enabled() and gemm_fp32tc.enabled()


def chain_problem(batch: int, sizes: Sequence[int], dtype: torch.dtype) -> ChainProblem:
    """The autotune key of a chain's whole-chain choices (row groups, ``StrassenMLP``'s path)."""
    name = str(dtype).removeprefix("torch.")
    sizes = tuple(int(n) for n in sizes)
    return ChainProblem(int(batch), sizes, name, tf32_enabled(), fp32_tc_offered(dtype))


#: A hook for measured data: ``(batch, hidden, dtype, device) -> bool | None``; None defers to the
#: default rule. ``tilewise``'s Strassen benchmark installs one from its results.
SELECTION_OVERRIDE: Callable[[int, int, torch.dtype, torch.device], bool | None] | None = None

#: The default rule's thresholds (conservative, from seed 001 and the H100 target; unmeasured).
MIN_BATCH = 512
MIN_HIDDEN = 4096


def strassen_wins(batch: int, hidden: int, dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether fused Strassen should beat the fused Linear chain for this shape.

    ``hidden`` is the smallest feature size in the chain. Default rule (until measured data
    replaces it through ``SELECTION_OVERRIDE``): CUDA, fp32 with TF32 off, ``batch >= 512`` and
    ``hidden >= 4096``. One level of Strassen saves at most 1/8 of the GEMM flops, and on tensor
    cores (fp16/bf16/TF32) the extra passes over memory weigh more, so those are not chosen.
    """
    device = torch.device(device)
    if SELECTION_OVERRIDE is not None:
        verdict = SELECTION_OVERRIDE(batch, hidden, dtype, device)
        if verdict is not None:
            return bool(verdict)
    return (
        device.type == "cuda"
        and dtype == torch.float32
        and not tf32_enabled()
        and batch >= MIN_BATCH
        and hidden >= MIN_HIDDEN
    )
