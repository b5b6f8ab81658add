"""Fused linear layer: ``y = act(x @ W^T + b)`` with ``W`` in ``nn.Linear``'s [N, K] layout.

One Triton GEMM kernel, ``C = A @ B`` for A [M, K] and B [K, N] of arbitrary strides (so the
transposed operands of the forward and backward are views, never copies), fp32 accumulation, and a
constexpr epilogue: bias add along N, activation (``act_fwd``) and, when the backward will need
it, a store of the pre-bias product ``g = A @ B`` next to ``y``.

What the backward keeps (``saved``):

* gelu / silu: ``g = x @ W^T`` (pre-bias, input dtype). ``tilewise.ops.bias_act.backward`` on
  ``(dy, g, bias)`` then gives ``dz = dy * act'(g + b)`` and ``db = colsum(dz)`` in one pass.
* relu: nothing extra; ``y`` itself (``y > 0`` exactly where ``z > 0``, NaN included). The same
  bias_act backward kernel runs on ``(dy, y, zeros)``: ``dz = dy where y > 0``, ``db = colsum(dz)``.
* none: nothing; ``dz = dy`` and ``db`` is one fp32 column sum of ``dy``.

Then ``dx = dz @ W`` and ``dW = dz^T @ x`` run the same GEMM kernel with no epilogue.

Each GEMM also has a cuBLAS backend (``torch.mm``, then bias_act's one-pass epilogue kernel when
there is a bias or activation to fuse); ``_backend`` times both on first use per shape and caches
the winner like any kernel config. True fp32 defaults to cuBLAS: Triton's IEEE path runs on CUDA
cores at about a third of cuBLAS SGEMM on an H100.

fp32 is true fp32 by default (``tl.dot(..., input_precision="ieee")``); ``allow_tf32=True`` lets
fp32 products use TF32 tensor cores. fp16 / bf16 accumulate in fp32 (the cuBLAS backend follows
PyTorch's reduced-precision-reduction flags, exactly as ``F.linear`` does). The bias may be fp32
with a half-precision ``x``; ``x`` and ``weight`` share one dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilewise.ops import bias_act as _bias_act
from tilewise.ops._common import act_fwd, act_reference, activation_code, cdiv, next_pow2, num_sms
from tilewise.runtime import alloc, autotune, dispatch

OP = "linear"

#: Activations whose backward needs the pre-activation, which the forward then also stores.
SAVES_PRE_ACTIVATION = frozenset({"gelu", "silu"})


@triton.jit
def _gemm_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    g_ptr,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    s_cm,
    s_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    STORE_G: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering: GROUP_M row-blocks share each column block of B while it is in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_m = (pid // pids_per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % pids_per_group) % group_m
    pid_n = (pid % pids_per_group) // group_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * s_am + rk[None, :].to(tl.int64) * s_ak
    b_ptrs = b_ptr + rk[:, None].to(tl.int64) * s_bk + rn[None, :].to(tl.int64) * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        # masked lanes load exact zeros, so padding never adds (or NaN-poisons) a product
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    mask = m_ok[:, None] & n_ok[None, :]
    c_offs = rm[:, None].to(tl.int64) * s_cm + rn[None, :].to(tl.int64) * s_cn
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


#: A tuning hook: ``(m, n, k, elem_bytes) -> GemmConfig | None`` replaces the default when set.
CONFIG_OVERRIDE: Callable[[int, int, int, int], GemmConfig | None] | None = None


def gemm_config(m: int, n: int, k: int, elem_bytes: int, device: torch.device) -> GemmConfig:
    """Heuristic default (not yet tuned on a GPU): 128x128 tiles when they alone fill the SMs,
    else 64x64; tiles shrink to the problem (>= 16, what ``tl.dot`` needs)."""
    if CONFIG_OVERRIDE is not None:
        cfg = CONFIG_OVERRIDE(m, n, k, elem_bytes)
        if cfg is not None:
            return cfg
    block_k = 32 if elem_bytes >= 4 else 64
    if cdiv(m, 128) * cdiv(n, 128) >= num_sms(device):
        return GemmConfig(128, 128, block_k, num_warps=8, num_stages=3)

    def fit(size: int, block: int) -> int:
        return max(16, min(block, next_pow2(size)))

    return GemmConfig(fit(m, 64), fit(n, 64), fit(k, block_k), num_warps=4, num_stages=3)


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype,
    allow_tf32: bool,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    store_g: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``act(a @ b + bias)`` [M, N] (contiguous) and optionally the pre-bias ``a @ b``."""
    m, k = a.shape
    n = b.shape[1]
    c = alloc.empty((m, n), device=a.device, dtype=out_dtype)
    g = alloc.empty((m, n), device=a.device, dtype=out_dtype) if store_g else None
    cfg = gemm_config(m, n, k, a.element_size(), a.device)
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)
    _gemm_kernel[grid](
        a,
        b,
        c if bias is None else bias,
        c,
        c if g is None else g,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        HAS_BIAS=bias is not None,
        ACT=activation_code(activation),
        STORE_G=store_g,
        IEEE=a.dtype == torch.float32 and not allow_tf32,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return c, g


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM of the linear family: a cache key for the backend choice."""

    m: int
    n: int
    k: int
    dtype: str
    allow_tf32: bool
    epilogue: str  # "none", or the activation/bias fused after the product


@dataclass(frozen=True)
class Backend:
    """Where a GEMM runs: ``triton`` (this module's kernel, epilogue fused) or ``cublas``
    (``torch.mm``, then bias_act's fused epilogue kernel when there is one)."""

    name: str


TRITON, CUBLAS = Backend("triton"), Backend("cublas")
#: candidate orders (one tuple each, so the autotuner's per-call memo skips hashing them)
_CUBLAS_FIRST, _TRITON_FIRST = (CUBLAS, TRITON), (TRITON, CUBLAS)


def _cublas_legal(a: torch.Tensor, allow_tf32: bool) -> bool:
    """cuBLAS honours the process-wide TF32 flag, so fp32 may use it only when that flag says
    what the caller asked for."""
    if a.device.type != "cuda":
        return False
    return a.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 == allow_tf32


def _backend(
    a: torch.Tensor, b: torch.Tensor, allow_tf32: bool, epilogue: str, run: Callable
) -> Backend:
    """The faster backend for this GEMM, timed on first use and cached like every config.

    Default without timing: cuBLAS for true fp32 (the Triton kernel's IEEE path runs on CUDA
    cores at ~1/3 of cuBLAS SGEMM on an H100, ``mlp-quick-fp32`` results), Triton otherwise."""
    if not _cublas_legal(a, allow_tf32):
        return TRITON
    m, k = a.shape
    prob = GemmProblem(m, b.shape[1], k, str(a.dtype).removeprefix("torch."), allow_tf32, epilogue)
    ieee = a.dtype == torch.float32 and not allow_tf32
    candidates = _CUBLAS_FIRST if ieee else _TRITON_FIRST
    return autotune.choose_config(OP + ".backend", prob, candidates, run, device=a.device)


def matmul(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, allow_tf32: bool = False
) -> torch.Tensor:
    """``a @ b`` for 2-D operands of any strides, fp32 accumulation, output in ``out_dtype``."""
    if not dispatch.use_kernel(OP + "_backward", [a, b]):
        return torch.matmul(a, b).to(out_dtype)

    def run(be: Backend) -> torch.Tensor:
        if be == CUBLAS:
            return torch.mm(a, b).to(out_dtype)
        return _launch(a, b, out_dtype, allow_tf32)[0]

    return run(_backend(a, b, allow_tf32, "none", run))


def reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none"
) -> torch.Tensor:
    """Plain PyTorch ``act(F.linear(x, W, b))``: the numerical reference and the eager baseline."""
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return act_reference(torch.nn.functional.linear(x, weight, bias), activation)


def validate(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> None:
    """Raise ``ValueError`` naming the bad argument."""
    activation_code(activation)
    if weight.ndim != 2:
        raise ValueError(
            f"tilewise.{OP}: argument 'weight' must be 2-D [out_features, in_features], "
            f"got shape {tuple(weight.shape)}"
        )
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"tilewise.{OP}: argument 'x' has shape {tuple(x.shape)}; its last dim must be "
            f"in_features={weight.shape[1]} (weight.shape[1])"
        )
    dispatch.check_same_device(OP, x=x, weight=weight, bias=bias)
    dispatch.check_same_dtype(OP, x=x, weight=weight)
    if bias is not None:
        dispatch.check_param_dtype(OP, x, bias=bias)
        if bias.ndim != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"tilewise.{OP}: argument 'bias' has shape {tuple(bias.shape)}, expected "
                f"({weight.shape[0]},) to match weight.shape[0]"
            )


def output_shape(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, ...]:
    return (*x.shape[:-1], weight.shape[0])


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    allow_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(y, saved)``: ``y = act(x @ W^T + b)`` of shape [..., N] and what ``backward`` needs
    (the pre-bias ``x @ W^T`` for gelu/silu, ``y`` itself for relu, None for none)."""
    validate(x, weight, bias, activation)
    shape = output_shape(x, weight)
    x2 = x.reshape(-1, weight.shape[1])
    if not dispatch.use_kernel(OP, [x2, weight]):
        b = None if bias is None else bias.to(x.dtype)
        if activation in SAVES_PRE_ACTIVATION:
            g = torch.nn.functional.linear(x2, weight)
            y = act_reference(g if b is None else g + b, activation).view(shape)
            pre = g.view(shape)
        else:
            # bias inside F.linear's GEMM, as PyTorch does: one rounding, so the ReLU mask is
            # PyTorch's element for element (a separate add rounded twice and flipped the mask
            # of near-zero outputs in bf16, ~1 run in 20)
            y = act_reference(torch.nn.functional.linear(x2, weight, b), activation).view(shape)
            pre = None
    else:
        store_g = activation in SAVES_PRE_ACTIVATION
        wt = weight.t()

        def run(be: Backend) -> tuple[torch.Tensor, torch.Tensor | None]:
            if be == CUBLAS:
                if activation in ("none", "relu"):
                    # bias added in cuBLAS's fp32 epilogue, before rounding, exactly as F.linear
                    # does: the ReLU mask (y > 0) then matches PyTorch's element for element.
                    # The ReLU is PyTorch's, in place on the fresh product: a Triton launch costs
                    # 15-25 us of host time against ~6, for the same device work.
                    b = None if bias is None else bias.to(x.dtype)
                    z = torch.mm(x2, wt) if b is None else torch.addmm(b, x2, wt)
                    return (z if activation == "none" else torch.relu_(z)), None
                g = torch.mm(x2, wt)
                return _bias_act.forward(g, bias, activation, -1), g
            return _launch(x2, wt, x.dtype, allow_tf32, bias, activation, store_g)

        epilogue = f"{activation}{'+bias' if bias is not None else ''}"
        y2, g2 = run(_backend(x2, wt, allow_tf32, epilogue, run))
        y, pre = y2.view(shape), (g2.view(shape) if store_g else None)
    return y, (y if activation == "relu" else pre)


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    saved: torch.Tensor | None,
    activation: str = "none",
    allow_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dx, dweight, dbias)`` from ``dy`` and ``forward``'s ``saved``; dbias None without bias."""
    validate(x, weight, bias, activation)
    shape = output_shape(x, weight)
    if tuple(dy.shape) != shape:
        raise ValueError(
            f"tilewise.{OP}: argument 'grad' has shape {tuple(dy.shape)}, expected {shape}"
        )
    if activation != "none" and (saved is None or tuple(saved.shape) != shape):
        raise ValueError(f"tilewise.{OP}: argument 'saved' must have shape {shape}")
    dispatch.check_same_device(OP + "_backward", x=x, grad=dy, saved=saved)
    n, k = weight.shape
    dy2 = dy.reshape(-1, n)
    if dy2.dtype != x.dtype:
        dy2 = dy2.to(x.dtype)
    db = None
    if activation == "none":
        dz = dy2
        if bias is not None:
            db = dy2.sum(0, dtype=torch.promote_types(dy2.dtype, torch.float32)).to(bias.dtype)
    else:
        s2 = saved.reshape(-1, n)
        if activation == "relu":  # dz = dy where y > 0: bias_act's relu rule on y, zero bias
            b = None if bias is None else torch.zeros_like(bias)
        else:
            b = bias
        dz, db = _bias_act.backward(dy2, s2, b, activation, -1)
    x2 = x.reshape(-1, k)
    dx = matmul(dz, weight, x.dtype, allow_tf32).view(x.shape)
    dw = matmul(dz.t(), x2, weight.dtype, allow_tf32)
    return dx, dw, db
