"""Few-row true-fp32 linear forwards in CUDA C++ (NVRTC): ``y = act(x @ W^T + b)``, x of <= 16 rows
(<= 64 in chunks of 16; ``TILEWISE_GEMV_ROW_CHUNKS=0`` withholds the chunks).

At small batch an fp32 linear layer is a stream of its weights: [16, 1024] x [1024, 1024] reads
4 MB for 17 M fused multiply-adds, ~1.3 us from DRAM against ~0.5 us of FMAs on 132 SMs. cuBLAS's
SGEMM gives the few output tiles to a few SMs (~13 us per layer with PyTorch's ``addmm``), the
cuBLAS split over K (``ops.gemm_splitk``) takes ~8-10 us in two launches, and Triton's true-fp32
paths do no better: ``tl.dot`` pads the rows to 16 and stages both operands through shared
memory, and a broadcast product over [rows, columns, K] compiled to layout shuffles (session 15,
call 2: 12-24 us). Why CUDA: the kernel below is a GEMV with the rows kept in registers, a shape
Triton cannot express without those shuffles.

A CTA of ``warps`` warps owns ``warps * rows_per_warp`` output columns (weight rows) and one slice
of K. Each lane walks the slice in 16-byte steps, loading ``rows_per_warp`` weight rows (read-only
path, coalesced: a warp reads 512 contiguous bytes of each row) and the same 16 bytes of every row
of ``x`` (L1 hits after the first warp: x is a few KB) and multiply-adds them: each weight value
feeds up to 16 FMAs and each ``x`` value ``rows_per_warp``. (A first version staged ``x`` in
shared memory per CTA: with few columns per CTA that moved twice the weights' bytes again, and the
staging phase did not overlap the weight loads; 2x slower at 16 x 8192 x 8192, session 15.)
A butterfly of shuffles sums the lanes. With ``split_k`` > 1 the CTA writes its fp32 partial
into slot j of a workspace and takes a ticket from its column block's counter; the last CTA adds
the slots in a fixed order (deterministic), adds the bias, applies the activation, writes ``y``
and re-zeroes the counter.

Row chunks (session 23; ``ROW_CHUNKS``, on unless ``TILEWISE_GEMV_ROW_CHUNKS=0``): 17-64
rows run as ``blockIdx.z`` chunks of 16, each a GEMV as above over its rows (the weights stream
once from DRAM, the other chunks' reads hit L2). At batch 32 an 8-layer fp32 MLP of hidden 128
took 55 us in tilewise's GEMM tiles against 20 us at batch 16 in this kernel (H100 and H200);
PyTorch + graph 118-126 us. Session 24 (H100): its GPU tests pass, and that cell takes 20.7 us
(batch 64: 21.1 against 55.5), so the chunks are offered by default.

fp32 operands only (fp16/bf16 take tensor cores elsewhere), activation none or ReLU, ``W``
contiguous [N, K] with K % 4 == 0, ``x`` with unit-stride rows, both 16-byte aligned
(``usable``); offered per shape to the linear autotuner (``GemvConfig``), which keeps it only
where it wins.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from tilewise.ops._common import activation_code, cdiv, next_pow2, unit_stride
from tilewise.runtime import alloc, cuda_launch, nvrtc_cache, workspace

#: the most rows of x one CTA takes: all of them sit in every lane's registers
MAX_ROWS = 16
#: the most rows in chunks of ``MAX_ROWS`` (grid z), offered with ``ROW_CHUNKS``
CHUNKED_MAX_ROWS = 64
#: (rows per warp, warps) left out for row chunks: the chunked variant spills there (offline
#: ptxas, sm_90, CUDA 13: 192 bytes at 4 x 4 warps on 255 registers, 276 at 2 x 16 warps, whose
#: 512 threads cap a lane at 128), where the unchunked one (254 and 101 registers) does not
_CHUNKED_SPILLS = ((4, 4), (2, 16))
ENV_ROW_CHUNKS = "TILEWISE_GEMV_ROW_CHUNKS"
#: offer 17-``CHUNKED_MAX_ROWS`` rows (default since session 24: GPU tests pass on an H100, and
#: fp32 8 layers at batch 32 x hidden 128 went from 55.2 to 20.7 us);
#: ``TILEWISE_GEMV_ROW_CHUNKS=0`` turns it off
ROW_CHUNKS = os.environ.get(ENV_ROW_CHUNKS, "1") == "1"
_SPLIT_MAX = 32
#: the kernel's arguments for the lean launcher: 6 pointers, 6 ints
_SIGNATURE = "pppppp" + "i" * 6
#: K per slice at least (each lane's loop runs >= 2 steps of 4)
_MIN_SLICE = 256
#: CTAs per SM the K split aims at
_CTAS_PER_SM = 4

_SOURCE = r"""
#define MP {MP}
#define NPW {NPW}
#define WARPS {WARPS}
#define ACT {ACT}
#define HAS_BIAS {HAS_BIAS}
#define CHUNKED {CHUNKED}
#if CHUNKED  // K-split slots of MP rows per chunk
#define SLOT_ROWS MP
#else
#define SLOT_ROWS M
#endif

__device__ __forceinline__ float tw_epilogue(float v, const float* __restrict__ bias, int n) {{
#if HAS_BIAS
  v += bias[n];
#endif
#if ACT == 1
  v = v < 0.f ? 0.f : v;  // NaN stays NaN, as in torch.relu
#endif
  return v;
}}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
tw_gemv(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
        float* __restrict__ y, float* __restrict__ ws, unsigned int* __restrict__ cnt,
        int M, int N, int K, int sxm, int ks, int split) {{
#if CHUNKED
  {{  // row chunk blockIdx.z: rows [mz, mz + MP); its split slots of MP x N and its tickets
    const int mz = blockIdx.z * MP;
    M = min(MP, M - mz);
    x += (long long)mz * sxm;
    y += (long long)mz * N;
    ws += (long long)blockIdx.z * split * MP * N;
    cnt += blockIdx.z * gridDim.x;
  }}
#endif
  const int kb = blockIdx.y * ks;
  const int len = min(K - kb, ks);  // a multiple of 4 (K % 4 == 0, ks % 4 == 0); may be <= 0
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * WARPS + warp) * NPW;
  float acc[MP][NPW];
#pragma unroll
  for (int m = 0; m < MP; ++m)
#pragma unroll
    for (int j = 0; j < NPW; ++j) acc[m][j] = 0.f;
  const float* wrow[NPW];
#pragma unroll
  for (int j = 0; j < NPW; ++j) wrow[j] = w + (long long)min(n0 + j, N - 1) * K + kb;
  const float* xrow[MP];  // rows past M read row M - 1 (in bounds) and are never stored
#pragma unroll
  for (int m = 0; m < MP; ++m) xrow[m] = x + (long long)min(m, M - 1) * sxm + kb;
#pragma unroll 4
  for (int k = lane * 4; k < len; k += 128) {{
    float4 wv[NPW];
#pragma unroll
    for (int j = 0; j < NPW; ++j) wv[j] = __ldg(reinterpret_cast<const float4*>(wrow[j] + k));
#pragma unroll
    for (int m = 0; m < MP; ++m) {{
      const float4 xv = __ldg(reinterpret_cast<const float4*>(xrow[m] + k));  // L1 hits
#pragma unroll
      for (int j = 0; j < NPW; ++j) {{
        float a = acc[m][j];
        a = fmaf(xv.x, wv[j].x, a);
        a = fmaf(xv.y, wv[j].y, a);
        a = fmaf(xv.z, wv[j].z, a);
        a = fmaf(xv.w, wv[j].w, a);
        acc[m][j] = a;
      }}
    }}
  }}
#pragma unroll
  for (int m = 0; m < MP; ++m)
#pragma unroll
    for (int j = 0; j < NPW; ++j) {{
      float v = acc[m][j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[m][j] = v;
    }}
  // lane (m * NPW + j) % 32 writes value (m, j): the writes spread over the lanes
  if (split == 1) {{
#pragma unroll
    for (int m = 0; m < MP; ++m)
#pragma unroll
      for (int j = 0; j < NPW; ++j) {{
        const int n = n0 + j;
        if (lane == ((m * NPW + j) & 31) && m < M && n < N)
          y[(long long)m * N + n] = tw_epilogue(acc[m][j], bias, n);
      }}
    return;
  }}
  const long long slot = (long long)blockIdx.y * SLOT_ROWS * N;
#pragma unroll
  for (int m = 0; m < MP; ++m)
#pragma unroll
    for (int j = 0; j < NPW; ++j) {{
      const int n = n0 + j;
      if (lane == ((m * NPW + j) & 31) && m < M && n < N)
        ws[slot + (long long)m * N + n] = acc[m][j];
    }}
  __threadfence();  // the partial is visible device-wide before the ticket is taken
  __syncthreads();
  __shared__ unsigned int ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(&cnt[blockIdx.x], 1u);
  __syncthreads();
  if (ticket != (unsigned int)(split - 1)) return;
  __threadfence();
  // the column block's last CTA: sum the slots in order, then the epilogue
  const int cols = WARPS * NPW, c0 = blockIdx.x * cols;
  for (int i = threadIdx.x; i < M * cols; i += WARPS * 32) {{
    const int m = i / cols, n = c0 + (i - m * cols);
    if (n >= N) continue;
    float v = 0.f;
    for (int s = 0; s < split; ++s)
      v += __ldcg(ws + (long long)s * SLOT_ROWS * N + (long long)m * N + n);
    y[(long long)m * N + n] = tw_epilogue(v, bias, n);
  }}
  if (threadIdx.x == 0) cnt[blockIdx.x] = 0u;  // a self-cleaning workspace
}}
"""


@dataclass(frozen=True)
class GemvConfig:
    """Launch shape: weight rows per warp, warps per CTA, K slices (CTAs per column block)."""

    rows_per_warp: int
    warps: int
    split_k: int = 1


def _slice(k: int, split: int) -> int:
    """K per slice: a whole number of 16-byte steps."""
    return cdiv(cdiv(k, split), 4) * 4


def _padded_rows(m: int) -> int:
    """Rows the K-split workspace holds: m, or with row chunks whole chunks of ``MAX_ROWS``."""
    return m if m <= MAX_ROWS else cdiv(m, MAX_ROWS) * MAX_ROWS


def row_limit() -> int:
    """The most rows offered: ``MAX_ROWS``, or ``CHUNKED_MAX_ROWS`` with ``ROW_CHUNKS``."""
    return CHUNKED_MAX_ROWS if ROW_CHUNKS else MAX_ROWS


def usable(x: torch.Tensor, weight: torch.Tensor, activation: str) -> bool:
    """Whether this kernel takes ``x @ weight^T``: CUDA fp32 operands, at most ``row_limit()`` rows,
    activation none/relu, K % 4 == 0, ``weight`` contiguous, ``x``'s rows of unit stride at a
    multiple-of-4 row stride, both 16-byte aligned."""
    m, k = x.shape
    return (
        x.is_cuda
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and 0 < m <= row_limit()
        and k > 0
        and k % 4 == 0
        and activation in ("none", "relu")
        and weight.is_contiguous()
        and weight.data_ptr() % 16 == 0
        and x.stride(1) == 1
        and (m == 1 or x.stride(0) % 4 == 0)  # one row: its stride is never used
        and x.data_ptr() % 16 == 0
        and x.stride(0) * m < 2**31
        and cuda_launch.nvrtc_available()
    )


def candidates(m: int, n: int, k: int, sms: int) -> tuple[GemvConfig, ...]:
    """Configs worth timing for an [m, k] x [n, k]^T forward: none above ``row_limit()`` rows,
    without SMs or with K % 4 != 0; per (rows per warp, warps) the K split that gives the SMs
    about ``_CTAS_PER_SM`` CTAs each (row chunks count) and a quarter of it, every slice at
    least ``_MIN_SLICE`` long (but one) and none empty."""
    if sms <= 0 or not 0 < m <= row_limit() or n <= 0 or k <= 0 or k % 4:
        return ()
    chunks = cdiv(m, MAX_ROWS)
    out = []
    # more columns per CTA for more rows: each CTA reads all of x's slice through L1, so x's L2
    # traffic is rows / columns of the weights' (call 5: 16 rows at 8 columns ran 2x slower)
    for npw, warps in ((1, 4), (2, 4), (4, 4), (2, 8), (4, 8), (2, 16)):
        if npw * next_pow2(min(m, MAX_ROWS)) > 64:  # accumulators per lane
            continue
        if chunks > 1 and (npw, warps) in _CHUNKED_SPILLS:
            continue
        blocks = cdiv(n, npw * warps)
        split = min(_SPLIT_MAX, next_pow2(cdiv(_CTAS_PER_SM * sms, blocks * chunks)))
        while split > 1 and _slice(k, split) < _MIN_SLICE:
            split //= 2
        if split * _padded_rows(m) * n >= 2**31:
            continue
        for sp in dict.fromkeys((split, max(1, split // 4))):
            out.append(GemvConfig(npw, warps, cdiv(k, _slice(k, sp))))  # no empty slice
    return tuple(dict.fromkeys(out))


def source(mp: int, npw: int, warps: int, act: int, has_bias: bool, chunked: bool) -> str:
    """The CUDA source of a variant: ``mp`` rows per CTA (a power of two), ``chunked`` for
    row chunks over grid z (more than ``MAX_ROWS`` rows; otherwise the code is as before)."""
    return _SOURCE.format(
        MP=mp, NPW=npw, WARPS=warps, ACT=act, HAS_BIAS=int(has_bias), CHUNKED=int(chunked)
    )


@functools.cache  # one NVRTC compile per variant and device
def _kernel(mp: int, npw: int, warps: int, act: int, has_bias: bool, device: int, chunked=False):
    src = source(mp, npw, warps, act, has_bias, chunked)
    with torch.cuda.device(device):
        return nvrtc_cache.compile_kernel(src, "tw_gemv")


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    cfg: GemvConfig,
) -> torch.Tensor:
    """``act(x @ weight^T + bias)`` for fp32 ``x`` [M <= ``row_limit()``, K] and ``weight``
    [N, K] as ``usable`` asks; a contiguous [M, N] output."""
    m, k = x.shape
    n = weight.shape[0]
    if not usable(x, weight, activation):
        raise ValueError(
            f"tilewise.linear: the few-row CUDA GEMM does not take x {tuple(x.shape)} "
            f"{x.dtype} on {x.device}, weight {tuple(weight.shape)} "
            f"(contiguous={weight.is_contiguous()}), activation {activation!r}"
        )
    ks = _slice(k, max(1, cfg.split_k))
    split = cdiv(k, ks)
    if cfg.split_k < 1 or split > 65535 or split * _padded_rows(m) * n >= 2**31:
        raise ValueError(
            f"tilewise.linear: argument 'cfg' splits K={k} into {cfg.split_k} slices of an "
            f"[{m}, {n}] output"
        )
    if cfg.rows_per_warp < 1 or not 1 <= cfg.warps <= 32:
        raise ValueError(f"tilewise.linear: argument 'cfg' {cfg} has no launchable shape")
    bias = unit_stride(bias)
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()
    y = alloc.empty((m, n), device=x.device, dtype=torch.float32)
    if n == 0:
        return y
    cols = cfg.rows_per_warp * cfg.warps
    blocks = cdiv(n, cols)
    mp = next_pow2(min(m, MAX_ROWS))
    chunks = cdiv(m, MAX_ROWS)
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    kernel = _kernel(mp, cfg.rows_per_warp, cfg.warps, activation_code(activation),
                     bias is not None, dev, chunks > 1)  # fmt: skip
    ws = cnt = y
    if split > 1:
        # split slots of SLOT_ROWS rows (per chunk when chunked): flat, as the kernel indexes it
        ws = alloc.empty((split * _padded_rows(m), n), device=x.device, dtype=torch.float32)
        cnt = workspace.zeroed(x.device, (blocks * chunks,))[0].view(torch.int32)
    args = (x, weight, y if bias is None else bias, y, ws, cnt)
    args += (m, n, k, x.stride(0) if m > 1 else 0, ks, split)
    grid, block, smem = (blocks, split, chunks), (32 * cfg.warps, 1, 1), 0
    launcher = cuda_launch.lean_launcher(kernel, _SIGNATURE)
    with workspace.guarded(x.device):
        cuda_launch.launch(kernel, grid, block, args, smem, dev, launcher)
    return y
