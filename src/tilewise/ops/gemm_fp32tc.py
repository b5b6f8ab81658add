"""fp32-accurate batched GEMM on tensor cores: ``out[i] = a[i] @ b[i]`` from fp32 operands.

Triton's ``tl.dot(input_precision="tf32x3")`` splits each fp32 operand into a TF32 head and a
TF32 tail and sums head*head + head*tail + tail*head on tensor cores (fp32 accumulation); the
tail products' NaNs (from Inf - Inf in the split) are zeroed, so Inf propagates through the head
product as in an IEEE GEMM. Why: with TF32 off, PyTorch's fp32 GEMMs run cuBLAS's SIMT SGEMM at
~49 TFLOP/s on an H100; this runs ~1.45x faster there at a third of its error against fp64
(``scripts/fp32_tc_probe.py``, session 27: [512 x 4096] x [4096 x 4096] 237.9 us against 350.3,
RMS error 2.4e-7 against 8.1e-7 of the output's RMS). Strassen's products are its user
(``ops.strassen``, where timing picks it per shape); ``TILEWISE_FP32_TENSOR_CORES=0`` keeps fp32
on cuBLAS's IEEE path.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilewise.ops._common import grouped_tile

#: "0" keeps fp32 GEMMs with TF32 off on cuBLAS's IEEE SGEMM (no tensor-core split offered)
ENV_FP32_TC = "TILEWISE_FP32_TENSOR_CORES"


#: the oldest Triton whose tf32x3 split was checked (Inf placement, accuracy) on an H100
MIN_TRITON = (3, 6)


@functools.cache  # asked on every fp32 forward's and Strassen product's choice
def _triton_version() -> tuple[int, ...]:
    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())


def enabled() -> bool:
    """Whether fp32 GEMMs with TF32 off may run the tensor-core split (read per choice): not with
    ``TILEWISE_FP32_TENSOR_CORES=0``, nor on a Triton older than the one it was checked on."""
    return os.environ.get(ENV_FP32_TC, "1") != "0" and _triton_version() >= MIN_TRITON


@triton.jit
def _bmm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    s_ab,
    s_am,
    s_ak,
    s_bb,
    s_bk,
    s_bn,
    s_cb,
    s_cm,
    s_cn,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Program (tile, i): one output tile of ``c[i] = a[i] @ b[i]``, tiles in L2-grouped order."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_ptrs = a_ptr + batch * s_ab + rm[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + batch * s_bb + rk[:, None] * s_bk + rn[None, :].to(tl.int64) * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        # masked lanes load exact zeros: padding never adds (or NaN-poisons) a product
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    c_ptrs = c_ptr + batch * s_cb + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc, mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class Fp32TcConfig:
    """Launch shape of the batched kernel: output tile, K step, warps, stages, and the split."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    precision: str = "tf32x3"
    group_m: int = 8


#: CUDA's limit on a launch grid's second axis, where the batch goes
MAX_BATCH = 65535

#: Timed per shape by the caller's autotune choice. The first two won every shape of session 27's
#: probe (128 x 64 at Strassen's 7 x [256 x 2048] x [2048 x 2048] and at the full
#: [512 x 4096] x [4096 x 4096], 128 x 128 close behind); the rest cover other aspect ratios.
CONFIGS = (
    Fp32TcConfig(128, 64, 32, 4, 4),
    Fp32TcConfig(128, 128, 32, 8, 3),
    Fp32TcConfig(64, 128, 32, 4, 4),
    Fp32TcConfig(128, 128, 32, 4, 3),
    Fp32TcConfig(64, 64, 32, 4, 4),
)


def bmm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: Fp32TcConfig) -> torch.Tensor:
    """``out[i] = a[i] @ b[i]`` for fp32 ``a`` [B, M, K], ``b`` [B, K, N] and ``out`` [B, M, N],
    any strides (a transposed view is read in place). Raises ``ValueError`` naming the argument."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.dtype != torch.float32 or t.ndim != 3:
            raise ValueError(
                f"tilewise.fp32_tc_bmm: argument '{name}' must be a 3-D fp32 tensor, got "
                f"{t.dtype} of shape {tuple(t.shape)}"
            )
    if not (a.device == b.device == out.device):
        raise ValueError(
            f"tilewise.fp32_tc_bmm: arguments 'a', 'b', 'out' are on {a.device}, {b.device}, "
            f"{out.device}; they must share one device"
        )
    batch, m, k = a.shape
    n = b.shape[2]
    if batch > MAX_BATCH:
        raise ValueError(
            f"tilewise.fp32_tc_bmm: argument 'a' has a batch of {batch}; at most {MAX_BATCH} "
            "(the batch is the launch grid's second axis)"
        )
    if b.shape[:2] != (batch, k) or out.shape != (batch, m, n):
        raise ValueError(
            f"tilewise.fp32_tc_bmm: shapes a {tuple(a.shape)}, b {tuple(b.shape)}, out "
            f"{tuple(out.shape)} do not make a batched product"
        )
    if batch == 0 or m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), batch)
    _bmm_kernel[grid](
        a,
        b,
        out,
        m,
        n,
        k,
        *a.stride(),
        *b.stride(),
        *out.stride(),
        PRECISION=cfg.precision,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
