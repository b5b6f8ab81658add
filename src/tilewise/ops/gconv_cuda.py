"""Grouped conv2d (group width 8) fprop in CUDA C++, compiled at run time through NVRTC.

Why not Triton: a Triton tile can only be re-loaded per tap, so every tap's shifted input tile
travels L2 -> shared memory -> registers again (~0.4 of copy bandwidth, ``docs/PERF_NOTES.md``).
Here a CTA copies its input tile plus halo into shared memory once (``cp.async``, zero-filled at
the borders) and reads the taps from it with ``ldmatrix``: one ``mma.sync.m16n8k16`` multiplies
16 output pixels by two taps x 8 input channels (K = 16) of one group into that group's 8 output
channels (N = 8), so no tensor-core work is wasted on other groups' zeros. A pixel's channels sit
at a padded stride in shared memory so the 8 rows of an ``ldmatrix`` hit different banks.

The input gradient of a stride-1 conv is this same conv of ``dy`` with the weights flipped and
transposed within each group (``dgrad_weight``), with padding ``R - 1 - pad``.

fp16 and bf16 (fp32 accumulation), NHWC, C % 8 == 0, any R, S in 1..7, any padding, any N, H, W.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tilewise.ops._common import cdiv

log = logging.getLogger(__name__)

_SOURCE = r"""
#define R {R}
#define S {S}
#define TH {TH}
#define TW {TW}
#define CB {CB}
#define WARPS {WARPS}
#define IS_BF16 {IS_BF16}
#define HAS_BIAS {HAS_BIAS}
#define NG (CB / 8)
#define TAPS (R * S)
#define TP ((TAPS + 1) / 2)
#define HH (TH + R - 1)
#define HWD (TW + S - 1)
#define PIX (CB * 2 + 16)
#define MTW ((TH * TW) / (16 * WARPS))
#define W_OFF (HH * HWD * PIX)
#define Z_OFF (W_OFF + NG * TP * 256)

typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ u32 smem_u32(const void* p) {{
    u32 r;
    asm("{{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }}" : "=r"(r) : "l"(p));
    return r;
}}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(bytes));
}}

__device__ __forceinline__ void ldsm_x4(u32& a0, u32& a1, u32& a2, u32& a3, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(addr));
}}

__device__ __forceinline__ void ldsm_x2(u32& b0, u32& b1, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{%0,%1}}, [%2];\n"
                 : "=r"(b0), "=r"(b1) : "r"(addr));
}}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3,
                                         u32 b0, u32 b1) {{
#if IS_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                 "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}

__device__ __forceinline__ u32 pack2(float lo, float hi) {{
    u32 r;
#if IS_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}}

extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS})
tw_gconv_fprop(const u16* __restrict__ x, const u16* __restrict__ wt,
               const float* __restrict__ bias, u16* __restrict__ y,
               int Hi, int Wi, int Ho, int Wo, int C, int pad_h, int pad_w,
               int tiles_h, int tiles_w)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int t = blockIdx.x;
    const int tw_i = t % tiles_w; t /= tiles_w;
    const int th_i = t % tiles_h;
    const int n = t / tiles_h;
    const int c0 = blockIdx.y * CB;
    const int h0 = th_i * TH - pad_h, w0 = tw_i * TW - pad_w;
    const u32 sbase = smem_u32(smem);

    // input tile + halo, one 16-byte chunk (8 channels = one group) per copy, zeros outside
    for (int i = tid; i < HH * HWD * NG; i += WARPS * 32) {{
        const int pix = i / NG, ch = i - pix * NG;
        const int hh = pix / HWD, ww = pix - hh * HWD;
        const int ih = h0 + hh, iw = w0 + ww;
        const bool ok = (unsigned)ih < (unsigned)Hi && (unsigned)iw < (unsigned)Wi;
        const u16* src = ok ? x + ((((long long)n * Hi + ih) * Wi + iw) * C + c0 + ch * 8) : x;
        cp_async16(sbase + pix * PIX + ch * 16, src, ok ? 16 : 0);
    }}
    // weights of this CTA's groups: [NG][TP][2 taps][8 out][8 in]
    const u16* wsrc = wt + (long long)blockIdx.y * (NG * TP * 128);
    for (int i = tid; i < NG * TP * 16; i += WARPS * 32)
        cp_async16(sbase + W_OFF + i * 16, wsrc + i * 8, 16);
    // one zero pixel: the A rows of the padding tap when R * S is odd (finite, so 0 * x = 0)
    for (int i = tid; i < NG * 4; i += WARPS * 32) ((u32*)(smem + Z_OFF))[i] = 0u;
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();

    float acc[MTW][NG][4];
#pragma unroll
    for (int a = 0; a < MTW; ++a)
#pragma unroll
        for (int g = 0; g < NG; ++g)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[a][g][k] = 0.f;

    // ldmatrix.x4 row owned by this lane: matrices (pixels 0-7 | 8-15) x (tap slot 0 | 1)
    int pbase[MTW];
#pragma unroll
    for (int a = 0; a < MTW; ++a) {{
        const int p = (warp * MTW + a) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int py = p / TW;
        pbase[a] = py * HWD + (p - py * TW);
    }}
    const int slot = lane >> 4;
    const u32 b_lane = sbase + W_OFF + ((lane >> 3) & 1) * 128 + (lane & 7) * 16;

#pragma unroll
    for (int tp = 0; tp < TP; ++tp) {{
        const int tap = 2 * tp + slot;
        u32 a_addr[MTW];
#pragma unroll
        for (int a = 0; a < MTW; ++a)
            a_addr[a] = tap < TAPS ? sbase + (pbase[a] + (tap / S) * HWD + (tap % S)) * PIX
                                   : sbase + Z_OFF;
#pragma unroll
        for (int g = 0; g < NG; ++g) {{
            u32 b0, b1;
            ldsm_x2(b0, b1, b_lane + (g * TP + tp) * 256);
#pragma unroll
            for (int a = 0; a < MTW; ++a) {{
                u32 a0, a1, a2, a3;
                ldsm_x4(a0, a1, a2, a3, a_addr[a] + g * 16);
                mma16816(acc[a][g], a0, a1, a2, a3, b0, b1);
            }}
        }}
    }}

    // C fragment: rows lane/4 and lane/4 + 8 of the m-tile, channels 2 * (lane % 4) + {{0, 1}}
    const int cpair = (lane & 3) * 2;
#pragma unroll
    for (int a = 0; a < MTW; ++a) {{
#pragma unroll
        for (int half = 0; half < 2; ++half) {{
            const int p = (warp * MTW + a) * 16 + (lane >> 2) + half * 8;
            const int py = p / TW, px = p - (p / TW) * TW;
            const int oh = th_i * TH + py, ow = tw_i * TW + px;
            if (oh < Ho && ow < Wo) {{
                u16* dst = y + (((long long)n * Ho + oh) * Wo + ow) * C + c0 + cpair;
#pragma unroll
                for (int g = 0; g < NG; ++g) {{
                    float v0 = acc[a][g][half * 2], v1 = acc[a][g][half * 2 + 1];
#if HAS_BIAS
                    v0 += bias[c0 + g * 8 + cpair];
                    v1 += bias[c0 + g * 8 + cpair + 1];
#endif
                    *(u32*)(dst + g * 8) = pack2(v0, v1);
                }}
            }}
        }}
    }}
}}
"""


@dataclass(frozen=True)
class CudaTile:
    """Launch shape of the NVRTC kernel: an output tile of ``th`` x ``tw`` pixels by ``cb``
    channels per CTA, ``warps`` warps (each owning ``th * tw / (16 * warps)`` 16-pixel rows)."""

    th: int = 16
    tw: int = 16
    cb: int = 64
    warps: int = 8
    min_ctas: int = 2

    @property
    def name(self) -> str:
        return f"cuda_t{self.th}x{self.tw}c{self.cb}w{self.warps}"


def smem_bytes(r: int, s: int, tile: CudaTile) -> int:
    taps_pairs = (r * s + 1) // 2
    pix = tile.cb * 2 + 16
    return (tile.th + r - 1) * (tile.tw + s - 1) * pix + (tile.cb // 8) * taps_pairs * 256 + pix


def tile_ok(c: int, r: int, s: int, tile: CudaTile) -> bool:
    """Whether ``tile`` is a legal launch for this problem (channel block divides C, whole
    16-pixel rows per warp, shared memory within the H100's 227 KB per CTA)."""
    return (
        c % tile.cb == 0
        and tile.cb % 8 == 0
        and (tile.th * tile.tw) % (16 * tile.warps) == 0
        and smem_bytes(r, s, tile) <= 227 * 1024
    )


@functools.cache
def _kernel(r: int, s: int, tile: CudaTile, bf16: bool, has_bias: bool, device_index: int):
    src = _SOURCE.format(
        R=r,
        S=s,
        TH=tile.th,
        TW=tile.tw,
        CB=tile.cb,
        WARPS=tile.warps,
        MIN_CTAS=tile.min_ctas,
        IS_BF16=int(bf16),
        HAS_BIAS=int(has_bias),
    )
    with torch.cuda.device(device_index):
        kernel = torch.cuda._compile_kernel(src, "tw_gconv_fprop")
        kernel.set_shared_memory_config(smem_bytes(r, s, tile))
    return kernel


def available() -> bool:
    """NVRTC compilation through PyTorch (``torch.cuda._compile_kernel``) and a CUDA device."""
    return torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[C, 8, R, S] -> [C/8, taps/2, 2, 8 out, 8 in]: each (group, tap pair) is one 256-byte
    ``ldmatrix.x2`` source; an odd tap count is padded with a zero tap."""
    c, _, r, s = weight.shape
    w = weight.reshape(c // 8, 8, 8, r * s).permute(0, 3, 1, 2)  # group, tap, out, in
    if (r * s) % 2:
        w = F.pad(w, (0, 0, 0, 0, 0, 1))
    return w.contiguous()


def dgrad_weight(weight: torch.Tensor) -> torch.Tensor:
    """Weights of the conv that computes dx from dy (stride 1): flipped taps, in/out swapped
    within each group."""
    c, _, r, s = weight.shape
    return weight.reshape(c // 8, 8, 8, r, s).transpose(1, 2).flip(3, 4).reshape(c, 8, r, s)


def fprop(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pad_h: int,
    pad_w: int,
    tile: CudaTile = CudaTile(),
    packed_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = conv2d(x, weight, bias, padding, groups=C/8)`` for channels_last fp16/bf16 tensors
    (``out`` preallocated, channels_last). Launches on the current stream."""
    n, c, hi, wi = x.shape
    _, _, ho, wo = out.shape
    r, s = weight.shape[2], weight.shape[3]
    wt = packed_weight if packed_weight is not None else pack_weight(weight)
    kernel = _kernel(r, s, tile, x.dtype == torch.bfloat16, bias is not None, x.device.index or 0)
    tiles_h, tiles_w = cdiv(ho, tile.th), cdiv(wo, tile.tw)
    b = bias.float() if bias is not None else wt
    kernel(
        grid=(n * tiles_h * tiles_w, c // tile.cb, 1),
        block=(tile.warps * 32, 1, 1),
        args=[x, wt, b, out, hi, wi, ho, wo, c, pad_h, pad_w, tiles_h, tiles_w],
        shared_mem=smem_bytes(r, s, tile),
    )
    return out
