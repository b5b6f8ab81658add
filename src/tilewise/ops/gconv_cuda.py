"""Grouped conv2d (group width 8) fprop in CUDA C++, compiled at run time through NVRTC.

Why not Triton: a Triton tile can only be re-loaded per tap, so every tap's shifted input tile
travels L2 -> shared memory -> registers again (~0.4 of copy bandwidth, ``docs/PERF_NOTES.md``).
Here a CTA copies its input tile plus halo into shared memory once (``cp.async``, zero-filled at
the borders) and reads the taps from it with ``ldmatrix``: one ``mma.sync.m16n8k16`` multiplies
16 output pixels by two taps x 8 input channels (K = 16) of one group into that group's 8 output
channels (N = 8), so no tensor-core work is wasted on other groups' zeros. A pixel's channels sit
at a padded stride in shared memory so the 8 rows of an ``ldmatrix`` hit different banks.

The input gradient of a stride-1 conv is this same conv of ``dy`` with the weights flipped and
transposed within each group, with padding ``R - 1 - pad``; the kernel reads the weights that
way itself (``dgrad=True``). CTAs are persistent: each stages its channel
block's weights once and double-buffers the halo tiles it walks, so loads overlap the MMAs.

fp16 and bf16 (fp32 accumulation), NHWC, C % 8 == 0, any R, S in 1..7, any padding, any N, H, W.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass

import torch

from tilewise.ops._common import cdiv, num_sms
from tilewise.runtime import alloc
from tilewise.runtime.cuda_launch import Launcher

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
#define DGRAD {DGRAD}
#define DB_HALF {DB_HALF}
#define NG (CB / 8)
#define TAPS (R * S)
#define TP ((TAPS + 1) / 2)
#define HH (TH + R - 1)
#define HWD (TW + S - 1)
#define PIX (CB * 2 + 16)
#define MTW ((TH * TW) / (16 * WARPS))
#define STAGES {STAGES}
#define HALO (HH * HWD * PIX)
#define W_OFF (STAGES * HALO)
#define Z_OFF (W_OFF + NG * TP * 256)
#define S_OFF (Z_OFF + PIX)
#define WSTAGE (HALO + TH * TW * PIX)
#define WZ_OFF (STAGES * WSTAGE)

typedef unsigned short u16;
typedef unsigned int u32;
struct __align__(16) v4u32 {{ u32 a, b, c, d; }};

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

__device__ __forceinline__ void ldsm_x4_t(u32& a0, u32& a1, u32& a2, u32& a3, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(addr));
}}

__device__ __forceinline__ void ldsm_x2_t(u32& b0, u32& b1, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{%0,%1}}, [%2];\n"
                 : "=r"(b0), "=r"(b1) : "r"(addr));
}}

__device__ __forceinline__ void red_add(float* p, float v) {{
    asm volatile("red.global.add.f32 [%0], %1;\n" :: "l"(p), "f"(v) : "memory");
}}

// L2 (not L1) loads and stores, for the sums other CTAs' atomics wrote. The memory clobber
// keeps the compiler from moving a load above the fence; the hardware still has a batch of them
// in flight, as nothing uses a value until the batch is issued.
__device__ __forceinline__ float ld_cg(const float* p) {{
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
    return v;
}}

__device__ __forceinline__ void st_cg(float* p, float v) {{
    asm volatile("st.global.cg.f32 [%0], %1;\n" :: "l"(p), "f"(v) : "memory");
}}

__device__ __forceinline__ float to_f32(u16 v) {{
#if IS_BF16
    return __uint_as_float(((u32)v) << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#endif
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

__device__ __forceinline__ u16 to_u16(float v) {{ return (u16)(pack2(v, 0.f) & 0xffffu); }}

// ROWS halo rows of tile t (zero-filled off the image; rows from VALID_ROWS on are zero too)
template <int ROWS, int VALID_ROWS>
__device__ __forceinline__ void load_rows(u32 dst, const u16* __restrict__ x, int t, int Hi,
                                          int Wi, int C, int c0, int pad_h, int pad_w,
                                          int tiles_h, int tiles_w, int tid) {{
    const int tw_i = t % tiles_w, th_i = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    const int h0 = th_i * TH - pad_h, w0 = tw_i * TW - pad_w;
    for (int i = tid; i < ROWS * HWD * NG; i += WARPS * 32) {{
        const int pix = i / NG, ch = i - pix * NG;
        const int hh = pix / HWD, ww = pix - hh * HWD;
        const int ih = h0 + hh, iw = w0 + ww;
        const bool ok = (VALID_ROWS >= ROWS || hh < VALID_ROWS) && (unsigned)ih < (unsigned)Hi &&
                        (unsigned)iw < (unsigned)Wi;
        const u16* src = ok ? x + ((((long long)n * Hi + ih) * Wi + iw) * C + c0 + ch * 8) : x;
        cp_async16(dst + pix * PIX + ch * 16, src, ok ? 16 : 0);
    }}
}}

__device__ __forceinline__ void load_tile(u32 dst, const u16* __restrict__ x, int t, int Hi,
                                          int Wi, int C, int c0, int pad_h, int pad_w,
                                          int tiles_h, int tiles_w, int tid) {{
    load_rows<HH, HH>(dst, x, t, Hi, Wi, C, c0, pad_h, pad_w, tiles_h, tiles_w, tid);
}}

// the staged output tile t (pixels at stride PIX) to NHWC y, 16 bytes per thread and step
__device__ __forceinline__ void store_tile(u16* __restrict__ y, const u16* stg, int t, int Ho,
                                           int Wo, int C, int c0, int tiles_h, int tiles_w,
                                           int tid) {{
    const int tw_i = t % tiles_w, th_i = (t / tiles_w) % tiles_h;
    const int n = t / (tiles_w * tiles_h);
    for (int i = tid; i < TH * TW * NG; i += WARPS * 32) {{
        const int p = i / NG, ch = i - (i / NG) * NG;
        const int oh = th_i * TH + p / TW, ow = tw_i * TW + (p - (p / TW) * TW);
        if (oh < Ho && ow < Wo)
            *(v4u32*)(y + (((long long)n * Ho + oh) * Wo + ow) * C + c0 + ch * 8) =
                *(const v4u32*)(stg + p * (PIX / 2) + ch * 8);
    }}
}}

// the fprop kernels' common signature
#define FPROP_PARAMS                                                                             \
    const u16 *__restrict__ x, const u16 *__restrict__ w, const float *__restrict__ bias,        \
        u16 *__restrict__ y, int Hi, int Wi, int Ho, int Wo, int C, int pad_h, int pad_w,       \
        int tiles_h, int tiles_w, int n_tiles, int ws0, int ws1, int ws2, int ws3

__device__ __forceinline__ void load_dy(u32 dst, const u16* __restrict__ dy, int t, int Ho,
                                        int Wo, int C, int c0, int tiles_h, int tiles_w,
                                        int tid) {{
    const int tw_i = t % tiles_w, th_i = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    for (int i = tid; i < TH * TW * NG; i += WARPS * 32) {{
        const int pix = i / NG, ch = i - pix * NG;
        const int oh = th_i * TH + pix / TW, ow = tw_i * TW + (pix - (pix / TW) * TW);
        const bool ok = oh < Ho && ow < Wo;
        const u16* src = ok ? dy + ((((long long)n * Ho + oh) * Wo + ow) * C + c0 + ch * 8) : dy;
        cp_async16(dst + pix * PIX + ch * 16, src, ok ? 16 : 0);
    }}
}}

// one wgrad pipeline stage: ROWS input halo rows of tile t, then (XBYTES further) its dy tile
template <int ROWS, int VALID_ROWS, int XBYTES>
__device__ __forceinline__ void load_wgrad_stage(u32 dst, const u16* __restrict__ x,
                                                 const u16* __restrict__ dy, int t, int Hi,
                                                 int Wi, int Ho, int Wo, int C, int c0,
                                                 int pad_h, int pad_w, int tiles_h, int tiles_w,
                                                 int tid) {{
    load_rows<ROWS, VALID_ROWS>(dst, x, t, Hi, Wi, C, c0, pad_h, pad_w, tiles_h, tiles_w, tid);
    load_dy(dst + XBYTES, dy, t, Ho, Wo, C, c0, tiles_h, tiles_w, tid);
}}

// the first STAGES - 1 wgrad stages of this CTA's tiles start loading (one commit group each)
template <int ROWS, int VALID_ROWS, int XBYTES, int SBYTES>
__device__ __forceinline__ void prefetch_wgrad(u32 sbase, const u16* __restrict__ x,
                                               const u16* __restrict__ dy, int Hi, int Wi,
                                               int Ho, int Wo, int C, int c0, int pad_h,
                                               int pad_w, int tiles_h, int tiles_w, int n_tiles,
                                               int tid) {{
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {{
        const int ts = blockIdx.x + st * gridDim.x;
        if (ts < n_tiles)
            load_wgrad_stage<ROWS, VALID_ROWS, XBYTES>(sbase + st * SBYTES, x, dy, ts, Hi, Wi,
                                                       Ho, Wo, C, c0, pad_h, pad_w, tiles_h,
                                                       tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }}
}}

// adds this thread's share of the bias gradient of channel c0 + tid % CB over a staged dy tile
__device__ __forceinline__ void add_dbias_tile(float& sum, const u16* dys, int tid) {{
    for (int i = tid; i < TH * TW * CB; i += WARPS * 32)
        sum += to_f32(dys[(i / CB) * (PIX / 2) + (i - (i / CB) * CB)]);
}}

// the wgrad kernels' common signature: dw [R, S, C, 8] and db [C] are fp32 sums in a workspace
// that is zero on entry and left zero on exit, counters [C / CB] likewise; dw_out [C, 8, R, S]
// in the input dtype, db_out [C] in the input dtype (DB_HALF) or fp32
#define WGRAD_PARAMS                                                                             \
    const u16 *__restrict__ x, const u16 *__restrict__ dy, float *__restrict__ dw,              \
        float *__restrict__ db, u16 *__restrict__ dw_out, void *__restrict__ db_out,           \
        unsigned *__restrict__ counters, int Hi, int Wi, int Ho, int Wo, int C, int pad_h,      \
        int pad_w, int tiles_h, int tiles_w, int n_tiles

// After this CTA's atomics: the last CTA of the channel block (counted per blockIdx.y) turns the
// block's fp32 sums into dw_out and db_out and zeroes them and the counter again, so one launch
// does what a memset, the kernel and a cast kernel did. ``flag``: a word of shared memory the
// main loop is done with.
__device__ __forceinline__ void finish_wgrad(float* __restrict__ dw, float* __restrict__ db,
                                             u16* __restrict__ dw_out, void* __restrict__ db_out,
                                             unsigned* __restrict__ counters, int C, int c0,
                                             int tid, volatile unsigned* flag) {{
    __threadfence();  // this thread's atomics are visible before the CTA is counted
    __syncthreads();
    if (tid == 0) *flag = atomicAdd(counters + blockIdx.y, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    // FB loads in flight per thread before their stores: a serial load-store loop left an L2
    // round trip per element on the kernel's tail (session 7: +5-7 us per call)
    constexpr int FB = 8, NW = CB * 8 * TAPS;
    for (int base = 0; base < NW; base += FB * WARPS * 32) {{
        float v[FB];
#pragma unroll
        for (int j = 0; j < FB; ++j) {{
            const int i = base + j * WARPS * 32 + tid;
            v[j] = i < NW ? ld_cg(dw + (long long)(i % TAPS) * C * 8 + c0 * 8 + i / TAPS) : 0.f;
        }}
#pragma unroll
        for (int j = 0; j < FB; ++j) {{
            const int i = base + j * WARPS * 32 + tid;  // i / TAPS = (co - c0) * 8 + ci
            if (i < NW) {{
                dw_out[(long long)c0 * 8 * TAPS + i] = to_u16(v[j]);
                st_cg(dw + (long long)(i % TAPS) * C * 8 + c0 * 8 + i / TAPS, 0.f);
            }}
        }}
    }}
#if HAS_BIAS
    for (int i = tid; i < CB; i += WARPS * 32) {{
        const float v = ld_cg(db + c0 + i);
#if DB_HALF
        ((u16*)db_out)[c0 + i] = to_u16(v);
#else
        ((float*)db_out)[c0 + i] = v;
#endif
        st_cg(db + c0 + i, 0.f);
    }}
#endif
    if (tid == 0) counters[blockIdx.y] = 0u;
}}

// Persistent CTAs: blockIdx.y picks CB channels (its weights are staged once), blockIdx.x walks
// the spatial tiles gridDim.x apart, the next tile's halo loading (cp.async) while this one's
// MMAs run.
extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS})
tw_gconv_fprop(FPROP_PARAMS)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c0 = blockIdx.y * CB;
    const u32 sbase = smem_u32(smem);

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {{  // the first STAGES - 1 tiles start loading
        const int ts = blockIdx.x + st * gridDim.x;
        if (ts < n_tiles)
            load_tile(sbase + st * HALO, x, ts, Hi, Wi, C, c0, pad_h, pad_w, tiles_h, tiles_w,
                      tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }}

    // weights [C, 8, R, S] (any strides) -> [NG][TP][2 taps][8 out][8 in], zero for the pad tap;
    // dgrad reads them flipped and transposed within the group
    u16* wsm = (u16*)(smem + W_OFF);
    for (int i = tid; i < NG * TP * 128; i += WARPS * 32) {{
        const int ci = i & 7, o = (i >> 3) & 7, sl = (i >> 6) & 1, rest = i >> 7;
        const int tp = rest % TP, gc = c0 + (rest / TP) * 8;
        const int tap = 2 * tp + sl;
        u16 v = 0;
        if (tap < TAPS) {{
            const int r = tap / S, s = tap - (tap / S) * S;
#if DGRAD
            v = w[(long long)(gc + ci) * ws0 + o * ws1 + (R - 1 - r) * ws2 + (S - 1 - s) * ws3];
#else
            v = w[(long long)(gc + o) * ws0 + ci * ws1 + r * ws2 + s * ws3];
#endif
        }}
        wsm[i] = v;
    }}
    // one zero pixel: the A rows of the padding tap when R * S is odd (finite, so 0 * x = 0)
    for (int i = tid; i < NG * 4; i += WARPS * 32) ((u32*)(smem + Z_OFF))[i] = 0u;

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
    const int cpair = (lane & 3) * 2;
    float bv[NG][2];
#pragma unroll
    for (int g = 0; g < NG; ++g) {{
#if HAS_BIAS
        bv[g][0] = bias[c0 + g * 8 + cpair];
        bv[g][1] = bias[c0 + g * 8 + cpair + 1];
#else
        bv[g][0] = 0.f;
        bv[g][1] = 0.f;
#endif
    }}

    u16* stg = (u16*)(smem + S_OFF);  // the output tile, staged for 16-byte global stores
    int buf = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        const int tn = t + (STAGES - 1) * gridDim.x;
        if (tn < n_tiles)
            load_tile(sbase + ((buf + STAGES - 1) % STAGES) * HALO, x, tn, Hi, Wi, C, c0, pad_h,
                      pad_w, tiles_h, tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        __syncthreads();

        float acc[MTW][NG][4];
#pragma unroll
        for (int a = 0; a < MTW; ++a)
#pragma unroll
            for (int g = 0; g < NG; ++g)
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[a][g][k] = 0.f;

        const u32 hbase = sbase + buf * HALO;
#pragma unroll
        for (int tp = 0; tp < TP; ++tp) {{
            const int tap = 2 * tp + slot;
            u32 a_addr[MTW];
#pragma unroll
            for (int a = 0; a < MTW; ++a)
                a_addr[a] = tap < TAPS ? hbase + (pbase[a] + (tap / S) * HWD + (tap % S)) * PIX
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

        // C fragment: rows lane/4 and lane/4 + 8 of the m-tile, channels 2 * (lane % 4) + 0, 1
#pragma unroll
        for (int a = 0; a < MTW; ++a)
#pragma unroll
            for (int half = 0; half < 2; ++half) {{
                const int p = (warp * MTW + a) * 16 + (lane >> 2) + half * 8;
#pragma unroll
                for (int g = 0; g < NG; ++g)
                    *(u32*)(stg + p * (PIX / 2) + g * 8 + cpair) =
                        pack2(acc[a][g][half * 2] + bv[g][0], acc[a][g][half * 2 + 1] + bv[g][1]);
            }}
        __syncthreads();
        store_tile(y, stg, t, Ho, Wo, C, c0, tiles_h, tiles_w, tid);
        __syncthreads();  // this halo buffer and the staging tile are reused next iteration
        buf = (buf + 1) % STAGES;
    }}
    asm volatile("cp.async.wait_group 0;\n" ::);
}}

// Weight gradient: one warp per group (WARPS == NG). Per 16-pixel chunk of a dy tile, one
// mma.m16n8k16 per tap pair: A = the shifted inputs (2 taps x 8 in-channels by 16 pixels, read
// transposed from the halo tile), B = dy (16 pixels by the group's 8 out-channels). Sums stay in
// registers across the CTA's tiles and are added to dw [R, S, C, 8] (fp32) with atomics at the end.
extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS})
tw_gconv_wgrad(WGRAD_PARAMS)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, g = tid >> 5;
    const int c0 = blockIdx.y * CB;
    const u32 sbase = smem_u32(smem);
    prefetch_wgrad<HH, HH, HALO, WSTAGE>(sbase, x, dy, Hi, Wi, Ho, Wo, C, c0, pad_h, pad_w,
                                         tiles_h, tiles_w, n_tiles, tid);
    for (int i = tid; i < NG * 4; i += WARPS * 32) ((u32*)(smem + WZ_OFF))[i] = 0u;

    float acc[TP][4];
#pragma unroll
    for (int tp = 0; tp < TP; ++tp)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[tp][k] = 0.f;
    float dbs = 0.f;  // bias gradient of channel c0 + tid % CB over this thread's pixels
    const int a_pix = (lane & 7) + ((lane >> 4) & 1) * 8, a_slot = (lane >> 3) & 1;
    const int b_pix = (lane & 7) + ((lane >> 3) & 1) * 8;

    int buf = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        const int tn = t + (STAGES - 1) * gridDim.x;
        if (tn < n_tiles)
            load_wgrad_stage<HH, HH, HALO>(sbase + ((buf + STAGES - 1) % STAGES) * WSTAGE, x, dy,
                                           tn, Hi, Wi, Ho, Wo, C, c0, pad_h, pad_w, tiles_h,
                                           tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        __syncthreads();
        const u32 hx = sbase + buf * WSTAGE, hd = hx + HALO;
#pragma unroll 2
        for (int ch = 0; ch < (TH * TW) / 16; ++ch) {{
            u32 b0, b1;
            ldsm_x2_t(b0, b1, hd + (ch * 16 + b_pix) * PIX + g * 16);
            const int ap = ch * 16 + a_pix, apy = ap / TW;
            const int abase = apy * HWD + (ap - apy * TW);
#pragma unroll
            for (int tp = 0; tp < TP; ++tp) {{
                const int tap = 2 * tp + a_slot;
                const u32 addr = tap < TAPS ? hx + (abase + (tap / S) * HWD + (tap % S)) * PIX
                                            : sbase + WZ_OFF;
                u32 a0, a1, a2, a3;
                ldsm_x4_t(a0, a1, a2, a3, addr + g * 16);
                mma16816(acc[tp], a0, a1, a2, a3, b0, b1);
            }}
        }}
#if HAS_BIAS
        add_dbias_tile(dbs, (const u16*)(smem + buf * WSTAGE + HALO), tid);
#endif
        __syncthreads();  // this stage's buffers are refilled next iteration
        buf = (buf + 1) % STAGES;
    }}
    asm volatile("cp.async.wait_group 0;\n" ::);
    // D rows: lane/4 = in-channel (tap 2tp), +8 = same in-channel (tap 2tp+1); cols = out-channels
    const int ci = lane >> 2, co = c0 + g * 8 + (lane & 3) * 2;
#pragma unroll
    for (int tp = 0; tp < TP; ++tp)
#pragma unroll
        for (int half = 0; half < 2; ++half) {{
            const int tap = 2 * tp + half;
            if (tap < TAPS) {{
                red_add(dw + ((long long)tap * C + co) * 8 + ci, acc[tp][half * 2]);
                red_add(dw + ((long long)tap * C + co + 1) * 8 + ci, acc[tp][half * 2 + 1]);
            }}
        }}
#if HAS_BIAS
    red_add(db + c0 + tid % CB, dbs);
#endif
    finish_wgrad(dw, db, dw_out, db_out, counters, C, c0, tid, (volatile unsigned*)smem);
}}
"""

#: Row-pair fprop/dgrad (``CudaTile.kind == "rowpair"``): one warp per group (times WS column
#: splits). The weights are the MMA's A operand, held in registers for the whole CTA: rows = (out
#: channel, which of two output rows), cols = (in channel, which of two input rows); B = the
#: inputs of 8 pixels in two halo rows (one ``ldmatrix.x2``), so each B fragment read from shared
#: memory feeds both output rows it touches. Shared-memory reads per output fall from ~R*S to
#: ~S*(1 + (R-1)/TH) fragments (3x3, TH = 8: 3.75 against 10 per 16 outputs). Zero weights pair
#: with inputs outside an output's window, so a non-finite input could poison a neighbour row
#: (0 * Inf); a warp whose accumulators are not all finite recomputes its block exactly.
_RP_KERNEL = r"""
#define NP ((R + 2) / 2)
#define HHP (TH + 2 * NP - 2)
#define HALO_RP (HHP * HWD * PIX)
#define WS (WARPS / NG)
#define CBLK (TW / 8)
#define QP (TH / 2)

// weight [o][c][r][s] of the conv this kernel computes (dgrad: flipped and transposed), 0 off
// the kernel
__device__ __forceinline__ u16 wval(const u16* __restrict__ w, int gc, int o, int c, int r,
                                    int s, int ws0, int ws1, int ws2, int ws3) {{
    if (r < 0 || r >= R) return 0;
#if DGRAD
    return w[(long long)(gc + c) * ws0 + o * ws1 + (R - 1 - r) * ws2 + (S - 1 - s) * ws3];
#else
    return w[(long long)(gc + o) * ws0 + c * ws1 + r * ws2 + s * ws3];
#endif
}}

extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS})
tw_gconv_fprop_rp(FPROP_PARAMS)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = warp % NG, part = warp / NG;
    const int c0 = blockIdx.y * CB, gc = c0 + g * 8;
    const u32 sbase = smem_u32(smem);

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {{
        const int ts = blockIdx.x + st * gridDim.x;
        if (ts < n_tiles)
            load_rows<HHP, TH + R - 1>(sbase + st * HALO_RP, x, ts, Hi, Wi, C, c0, pad_h, pad_w,
                                       tiles_h, tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }}

    // A fragments: a0 (d 0, jj 0), a1 (d 1, jj 0), a2 (d 0, jj 1), a3 (d 1, jj 1) for row
    // o = lane / 4 and in-channels cp, cp + 1; tap row r = 2 p + jj - d
    const int o = lane >> 2, cp = (lane & 3) * 2;
    u32 wa[S][NP][4];
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
        for (int p = 0; p < NP; ++p)
#pragma unroll
            for (int q = 0; q < 4; ++q) {{
                const int r = 2 * p + (q >> 1) - (q & 1);
                const u32 lo = wval(w, gc, o, cp, r, s, ws0, ws1, ws2, ws3);
                const u32 hi = wval(w, gc, o, cp + 1, r, s, ws0, ws1, ws2, ws3);
                wa[s][p][q] = lo | (hi << 16);
            }}
#if HAS_BIAS
    const float bv = bias[gc + o];
#else
    const float bv = 0.f;
#endif
    // ldmatrix.x2 row address of this lane: matrix (lane / 8) & 1 = which halo row of the pair,
    // row lane % 8 = pixel
    const int b_row = (lane >> 3) & 1, b_px = lane & 7;
    u16* stg = (u16*)(smem + STAGES * HALO_RP);

    int buf = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        const int tn = t + (STAGES - 1) * gridDim.x;
        if (tn < n_tiles)
            load_rows<HHP, TH + R - 1>(sbase + ((buf + STAGES - 1) % STAGES) * HALO_RP, x, tn, Hi,
                                       Wi, C, c0, pad_h, pad_w, tiles_h, tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        __syncthreads();
        const u32 hbase = sbase + buf * HALO_RP;
#pragma unroll 1
        for (int cb = part; cb < CBLK; cb += WS) {{
            float acc[QP][4];
#pragma unroll
            for (int q = 0; q < QP; ++q)
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[q][k] = 0.f;
            const u32 lane_addr = hbase + (b_row * HWD + cb * 8 + b_px) * PIX + g * 16;
#pragma unroll
            for (int s = 0; s < S; ++s)
#pragma unroll
                for (int ip = 0; ip < QP + NP - 1; ++ip) {{
                    u32 b0, b1;
                    ldsm_x2(b0, b1, lane_addr + (2 * ip * HWD + s) * PIX);
#pragma unroll
                    for (int p = 0; p < NP; ++p) {{
                        const int q = ip - p;
                        if (q >= 0 && q < QP)
                            mma16816(acc[q], wa[s][p][0], wa[s][p][1], wa[s][p][2], wa[s][p][3],
                                     b0, b1);
                    }}
                }}
            bool bad = false;
#pragma unroll
            for (int q = 0; q < QP; ++q)
#pragma unroll
                for (int k = 0; k < 4; ++k)  // exponent all ones: Inf or NaN
                    bad |= (~__float_as_uint(acc[q][k]) & 0x7f800000u) == 0u;
            if (__any_sync(0xffffffffu, bad)) {{
                // exact: each output sums only its own window (PyTorch's NaN/Inf pattern)
                const u16* hs = (const u16*)(smem + buf * HALO_RP);
                for (int i = lane; i < TH * 64; i += 32) {{
                    const int oo = i & 7, px = cb * 8 + ((i >> 3) & 7), row = i >> 6;
                    float sum = 0.f;
                    for (int r = 0; r < R; ++r)
                        for (int s = 0; s < S; ++s)
                            for (int c = 0; c < 8; ++c)
                                sum += to_f32(wval(w, gc, oo, c, r, s, ws0, ws1, ws2, ws3)) *
                                       to_f32(hs[((row + r) * HWD + px + s) * (PIX / 2) + g * 8 +
                                                 c]);
#if HAS_BIAS
                    sum += bias[gc + oo];
#endif
                    stg[(row * TW + px) * (PIX / 2) + g * 8 + oo] = to_u16(sum);
                }}
            }} else {{
                // D rows: o (output row 2q) and o + 8 (row 2q + 1); cols: pixels cp, cp + 1
#pragma unroll
                for (int q = 0; q < QP; ++q)
#pragma unroll
                    for (int d = 0; d < 2; ++d) {{
                        const int p0 = (2 * q + d) * TW + cb * 8 + cp;
                        stg[p0 * (PIX / 2) + g * 8 + o] = to_u16(acc[q][2 * d] + bv);
                        stg[(p0 + 1) * (PIX / 2) + g * 8 + o] = to_u16(acc[q][2 * d + 1] + bv);
                    }}
            }}
        }}
        __syncthreads();
        store_tile(y, stg, t, Ho, Wo, C, c0, tiles_h, tiles_w, tid);
        __syncthreads();
        buf = (buf + 1) % STAGES;
    }}
    asm volatile("cp.async.wait_group 0;\n" ::);
}}
"""
_SOURCE_RP = _SOURCE[: _SOURCE.index("// Persistent CTAs")] + _RP_KERNEL


#: Row-pair wgrad (``CudaTile(rowpair=True)`` among wgrad tiles; experimental, see
#: ``EXPERIMENTAL_WGRAD_TILES``): one warp per group. A = the inputs of two halo rows (in-channels
#: x 2 rows by 16 pixels, ``ldmatrix.x4.trans``), B = one dy row (16 pixels by the group's 8
#: out-channels). The same A fragment serves dy row y (taps 2k, 2k + 1) and dy row y + 1 (taps
#: 2k - 1, 2k): one shared-memory read feeds two MMAs, ~S x (1 + R / TH) / 2 A fragments per
#: 16 dy pixels instead of (R * S + 1) / 2. The tap products that fall outside the kernel (-1, R)
#: accumulate into registers that are never stored.
_WRP_KERNEL = r"""
#define NK (R / 2 + 1)
#define HHW (TH + 2 * NK - 2)
#define XHALO (HHW * HWD * PIX)
#define WSTAGE_RP (XHALO + TH * TW * PIX)

extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS})
tw_gconv_wgrad_rp(WGRAD_PARAMS)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, g = tid >> 5;
    const int c0 = blockIdx.y * CB;
    const u32 sbase = smem_u32(smem);
    prefetch_wgrad<HHW, TH + R - 1, XHALO, WSTAGE_RP>(sbase, x, dy, Hi, Wi, Ho, Wo, C, c0,
                                                      pad_h, pad_w, tiles_h, tiles_w, n_tiles,
                                                      tid);

    // even dy rows: taps 2k + j; odd dy rows: taps 2k + j - 1 (j: which row of the A pair)
    float ev[NK][S][4], od[NK][S][4];
#pragma unroll
    for (int k = 0; k < NK; ++k)
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) ev[k][s][q] = od[k][s][q] = 0.f;
    float dbs = 0.f;  // bias gradient of channel c0 + tid % CB over this thread's pixels
    // ldmatrix.x4.trans rows of this lane: matrices (row j 0 | 1) x (pixels 0-7 | 8-15)
    const int a_px = (lane & 7) + ((lane >> 4) & 1) * 8, a_row = (lane >> 3) & 1;
    const int b_px = (lane & 7) + ((lane >> 3) & 1) * 8;

    int buf = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        const int tn = t + (STAGES - 1) * gridDim.x;
        if (tn < n_tiles)
            load_wgrad_stage<HHW, TH + R - 1, XHALO>(
                sbase + ((buf + STAGES - 1) % STAGES) * WSTAGE_RP, x, dy, tn, Hi, Wi, Ho, Wo, C,
                c0, pad_h, pad_w, tiles_h, tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        __syncthreads();
        const u32 hx = sbase + buf * WSTAGE_RP, hd = hx + XHALO;
#pragma unroll 1
        for (int cx = 0; cx < TW; cx += 16) {{
#pragma unroll 1
            for (int y = 0; y < TH; y += 2) {{
                u32 e0, e1, o0, o1;
                ldsm_x2_t(e0, e1, hd + (y * TW + cx + b_px) * PIX + g * 16);
                ldsm_x2_t(o0, o1, hd + ((y + 1) * TW + cx + b_px) * PIX + g * 16);
                const u32 arow = hx + ((y + a_row) * HWD + cx + a_px) * PIX + g * 16;
#pragma unroll
                for (int s = 0; s < S; ++s)
#pragma unroll
                    for (int k = 0; k < NK; ++k) {{
                        u32 a0, a1, a2, a3;
                        ldsm_x4_t(a0, a1, a2, a3, arow + (2 * k * HWD + s) * PIX);
                        mma16816(ev[k][s], a0, a1, a2, a3, e0, e1);
                        mma16816(od[k][s], a0, a1, a2, a3, o0, o1);
                    }}
            }}
        }}
#if HAS_BIAS
        add_dbias_tile(dbs, (const u16*)(smem + buf * WSTAGE_RP + XHALO), tid);
#endif
        __syncthreads();  // this stage's buffers are refilled next iteration
        buf = (buf + 1) % STAGES;
    }}
    asm volatile("cp.async.wait_group 0;\n" ::);
    // D rows: lane/4 = in-channel of pair row 0, +8 = of pair row 1; cols = out-channel pairs
    const int ci = lane >> 2, co = c0 + g * 8 + (lane & 3) * 2;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
            for (int q = 0; q < 2; ++q) {{
                const float v = ev[r >> 1][s][(r & 1) * 2 + q] +
                                od[(r + 1) >> 1][s][((r + 1) & 1) * 2 + q];
                red_add(dw + ((long long)(r * S + s) * C + co + q) * 8 + ci, v);
            }}
#if HAS_BIAS
    red_add(db + c0 + tid % CB, dbs);
#endif
    finish_wgrad(dw, db, dw_out, db_out, counters, C, c0, tid, (volatile unsigned*)smem);
}}
"""
_SOURCE_WRP = _SOURCE[: _SOURCE.index("// Persistent CTAs")] + _WRP_KERNEL


@dataclass(frozen=True)
class CudaTile:
    """Launch shape of the NVRTC kernel: an output tile of ``th`` x ``tw`` pixels by ``cb``
    channels per CTA, ``warps`` warps (each owning ``th * tw / (16 * warps)`` 16-pixel rows).
    ``rowpair``: the row-pair fprop/dgrad kernel instead (weights as A in registers; warps =
    groups x column splits)."""

    th: int = 8
    tw: int = 16
    cb: int = 32
    warps: int = 4
    min_ctas: int = 4
    stages: int = 2
    rowpair: bool = False

    @property
    def name(self) -> str:
        kind = "cudarp" if self.rowpair else "cuda"
        return f"{kind}_t{self.th}x{self.tw}c{self.cb}w{self.warps}m{self.min_ctas}s{self.stages}"


SMEM_MAX = 227 * 1024  # dynamic shared memory one CTA may use on an H100


def smem_bytes(r: int, s: int, tile: CudaTile) -> int:
    """``stages`` halo buffers, the CTA's weights, one zero pixel and the output staging tile
    (row-pair kernel: halo buffers of whole row pairs and the staging tile)."""
    taps_pairs = (r * s + 1) // 2
    pix = tile.cb * 2 + 16
    if tile.rowpair:
        rows = tile.th + 2 * ((r + 2) // 2) - 2
        return tile.stages * rows * (tile.tw + s - 1) * pix + tile.th * tile.tw * pix
    halo = (tile.th + r - 1) * (tile.tw + s - 1) * pix
    return tile.stages * halo + (tile.cb // 8) * taps_pairs * 256 + pix + tile.th * tile.tw * pix


#: the row-pair kernel keeps S x ceil((R + 1) / 2) weight fragments (4 registers each) per thread
ROWPAIR_MAX_FRAGMENTS = 15


def tile_ok(c: int, r: int, s: int, tile: CudaTile) -> bool:
    """Whether ``tile`` is a legal launch for this problem (channel block divides C, whole
    16-pixel rows per warp, shared memory within the H100's 227 KB per CTA; row-pair: row pairs,
    8-pixel column blocks split evenly over each group's warps, weights that fit registers)."""
    if c % tile.cb or tile.cb % 8 or smem_bytes(r, s, tile) > SMEM_MAX:
        return False
    if not tile.rowpair:
        return (tile.th * tile.tw) % (16 * tile.warps) == 0
    groups = tile.cb // 8
    return (
        tile.th % 2 == 0
        and tile.tw % 8 == 0
        and tile.warps % groups == 0
        and (tile.tw // 8) % (tile.warps // groups) == 0
        and s * ((r + 2) // 2) <= ROWPAIR_MAX_FRAGMENTS
    )


#: Tiles the autotuner times beside the Triton configs (channel block shrunk to divide C), best
#: first (untimed, e.g. during capture, the grouped conv takes its Triton default, not these).
#: scripts/gconv_cuda_probe.py --rowpair on the H100,
#: N=128, 3x3, fp16/bf16, fraction of copy: row-pair 16x16 0.72-0.74 / 0.64-0.65 / 0.50 at
#: C=64/128/256, row-pair 8x16 0.61-0.72 / 0.56-0.66 / 0.48-0.57, the tap kernel 8x16 0.68 / 0.58
#: / 0.47 (session 6). Row-pair 8x16 with 8 warps and 8x32 were slower everywhere and are left
#: out; the tap tiles stay for 7x7, which the row-pair kernel does not take.
TILES = (
    CudaTile(16, 16, 32, 4, 3, 2, rowpair=True),
    CudaTile(8, 16, 32, 4, 4, 2, rowpair=True),
    CudaTile(8, 16, 32, 4, 4, 2),
    CudaTile(8, 16, 32, 4, 5, 2),
    CudaTile(16, 16, 32, 8, 2, 2),
)


def _fitted(tile: CudaTile, c: int, warp_per_group: bool = False) -> CudaTile:
    """``tile`` with its channel block halved until it divides C (8 always does); wgrad tiles
    keep one warp per group, row-pair tiles their warps per group."""
    cb = tile.cb
    while cb > 8 and c % cb:
        cb //= 2
    warps = tile.warps
    if warp_per_group:
        warps = cb // 8
    elif tile.rowpair:
        warps = max(1, tile.warps // (tile.cb // 8)) * (cb // 8)
    return dataclasses.replace(tile, cb=cb, warps=warps)


@functools.lru_cache(maxsize=1024)
def candidates(c: int, r: int, s: int) -> tuple[CudaTile, ...]:
    """The legal ``TILES`` for C channels and an R x S kernel (empty if none fits)."""
    return tuple(dict.fromkeys(t for t in (_fitted(t, c) for t in TILES) if tile_ok(c, r, s, t)))


def usable(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether this call can take the CUDA kernel: half precision on a GPU with NVRTC, dense
    channels_last input and output on 16-byte boundaries (the kernel copies 16-byte chunks)."""
    return (
        x.is_cuda
        and x.dtype in (torch.float16, torch.bfloat16)
        and available()
        and x.is_contiguous(memory_format=torch.channels_last)
        and out.is_contiguous(memory_format=torch.channels_last)
        and x.data_ptr() % 16 == 0
        and out.data_ptr() % 16 == 0
    )


_CARVEOUT_ATTRIBUTE = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def wgrad_smem_bytes(r: int, s: int, tile: CudaTile) -> int:
    """``stages`` x (input halo + dy tile) and one zero pixel (row-pair: halo rows of whole
    pairs, no zero pixel)."""
    pix = tile.cb * 2 + 16
    if tile.rowpair:
        rows = tile.th + 2 * (r // 2 + 1) - 2
        return tile.stages * (rows * (tile.tw + s - 1) * pix + tile.th * tile.tw * pix)
    halo = (tile.th + r - 1) * (tile.tw + s - 1) * pix
    return tile.stages * (halo + tile.th * tile.tw * pix) + pix


def source(
    r: int, s: int, tile: CudaTile, bf16: bool, bias: int, dgrad: bool, entry: str
) -> tuple[str, str]:
    """(CUDA source, entry point) of a kernel variant. ``entry``: "tw_gconv_fprop" (the tile
    picks the tap or row-pair kernel) or "tw_gconv_wgrad". ``bias``: fprop, whether there is one
    (bool); wgrad, 0 no bias gradient, 1 an fp32 one, 2 one in the input dtype."""
    template = _SOURCE
    if entry == "tw_gconv_fprop" and tile.rowpair:
        template, entry = _SOURCE_RP, "tw_gconv_fprop_rp"
    elif entry == "tw_gconv_wgrad" and tile.rowpair:
        template, entry = _SOURCE_WRP, "tw_gconv_wgrad_rp"
    src = template.format(
        R=r,
        S=s,
        TH=tile.th,
        TW=tile.tw,
        CB=tile.cb,
        WARPS=tile.warps,
        MIN_CTAS=tile.min_ctas,
        STAGES=tile.stages,
        IS_BF16=int(bf16),
        HAS_BIAS=int(bias > 0),
        DB_HALF=int(bias == 2),
        DGRAD=int(dgrad),
    )
    return src, entry


@functools.cache  # one NVRTC compile per kernel variant and device (an uncached one cost ~19 ms)
def _kernel(
    r: int,
    s: int,
    tile: CudaTile,
    bf16: bool,
    bias: int,
    dgrad: bool,
    device: int,
    entry: str = "tw_gconv_fprop",
):
    """The compiled kernel (arguments as ``source``)."""
    src, entry = source(r, s, tile, bf16, bias, dgrad, entry)
    with torch.cuda.device(device):
        kernel = torch.cuda._compile_kernel(src, entry)
        size = wgrad_smem_bytes if entry.startswith("tw_gconv_wgrad") else smem_bytes
        kernel.set_shared_memory_config(size(r, s, tile))
        try:  # all of L1 as shared memory, so min_ctas CTAs fit on an SM
            lib = torch.cuda._utils._get_gpu_runtime_library()
            lib.cuFuncSetAttribute(kernel.func, _CARVEOUT_ATTRIBUTE, 100)
        except Exception as exc:  # a hint only: the launch works without it
            log.info("tilewise gconv_cuda: shared-memory carveout not set (%s)", exc)
    return kernel


@functools.cache  # one per compiled kernel and signature
def _launcher(kernel, signature: str) -> Launcher | None:
    """The lean launcher for ``kernel``, or None where it cannot be built (then PyTorch's own
    launcher runs; said once)."""
    try:
        return Launcher(kernel, signature)
    except (AttributeError, OSError, TypeError) as exc:
        log.info("tilewise gconv_cuda: PyTorch's kernel launcher in use (%s)", exc)
        return None


def _launch(kernel, signature: str, grid, block, args, shared_mem: int, device: int) -> None:
    """Launch on the current stream of ``device``: through ``runtime.cuda_launch.Launcher``
    (~host time of one driver call), or PyTorch's ``_CudaKernel`` call where it is unavailable."""
    launcher = _launcher(kernel, signature)
    if launcher is None:
        kernel(grid=grid, block=block, args=args, shared_mem=shared_mem)
        return
    launcher(grid, block, args, shared_mem, torch._C._cuda_getCurrentRawStream(device))


@functools.cache  # asked on every grouped-conv launch
def available() -> bool:
    """NVRTC compilation through PyTorch (``torch.cuda._compile_kernel``) and a CUDA device."""
    return torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")


def fprop(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pad_h: int,
    pad_w: int,
    tile: CudaTile = CudaTile(),
    dgrad: bool = False,
) -> torch.Tensor:
    """``out = conv2d(x, weight, bias, padding, groups=C/8)`` for channels_last fp16/bf16 ``x`` and
    ``out`` (preallocated; its size sets the output size), weights of any strides. ``dgrad=True``
    convolves with the weights flipped and transposed within each group, without making them
    (padding ``R - 1 - pad``, which may be negative). Launches on the current stream."""
    n, c, hi, wi = x.shape
    _, _, ho, wo = out.shape
    r, s = weight.shape[2], weight.shape[3]
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    kernel = _kernel(r, s, tile, x.dtype == torch.bfloat16, bias is not None, dgrad, dev)
    tiles_h, tiles_w = cdiv(ho, tile.th), cdiv(wo, tile.tw)
    n_tiles = n * tiles_h * tiles_w
    cblocks = c // tile.cb
    grid_x = max(1, min(n_tiles, cdiv(tile.min_ctas * num_sms(x.device), cblocks)))
    b = bias.float() if bias is not None else weight  # the kernel adds an fp32 bias (or none)
    args = [x, weight, b, out, hi, wi, ho, wo, c, pad_h, pad_w, tiles_h, tiles_w, n_tiles]
    args += weight.stride()
    grid, block = (grid_x, cblocks, 1), (tile.warps * 32, 1, 1)
    _launch(kernel, "pppp" + "i" * 14, grid, block, args, smem_bytes(r, s, tile), dev)
    return out


#: wgrad tiles: one warp per group of the channel block (warps = cb / 8). The row-pair 8x16
#: tile joined in session 7: correct on every odd shape (tests/test_gconv_cuda.py, two GPU
#: runs) and within 1-2% of the best tap tile, the fastest at C=64 (scripts/gconv_cuda_probe.py
#: --wgrad-only, N=128 3x3: 64.1 us against 65.1, fp16).
WGRAD_TILES = (
    CudaTile(8, 16, 32, 4, 4, 2),
    CudaTile(16, 16, 32, 4, 3, 2),
    CudaTile(8, 16, 64, 8, 2, 2),
    CudaTile(8, 16, 32, 4, 4, 2, rowpair=True),
)


#: wgrad tiles tested and timed (tests/test_gconv_cuda.py, scripts/gconv_cuda_probe.py) but not
#: candidates: the row-pair 16x16 was 10-17% slower than the best tile at every shape (session
#: 7); one group per CTA (8x8 pixels, 1 warp: 4x the CTAs of a 32-channel block, for small
#: batches that leave SMs idle; batch-1 wgrad at C=128 32x32 read 0.84x cuDNN's device time in
#: session 7) was written after that session's device budget ran out: compiled with nvcc only.
EXPERIMENTAL_WGRAD_TILES = (
    CudaTile(16, 16, 32, 4, 3, 2, rowpair=True),
    CudaTile(8, 8, 8, 1, 8, 2),
)
#: the row-pair wgrad keeps 2 x (R / 2 + 1) x S accumulator fragments (4 registers each)
ROWPAIR_WGRAD_MAX_FRAGMENTS = 16


def wgrad_tile_ok(c: int, r: int, s: int, tile: CudaTile) -> bool:
    """One warp per group, channel block dividing C, shared memory within the H100's limit;
    row-pair: row pairs, 16-pixel rows and accumulators that fit registers."""
    if c % tile.cb or tile.warps != tile.cb // 8 or wgrad_smem_bytes(r, s, tile) > SMEM_MAX:
        return False
    if not tile.rowpair:
        return True
    fragments = 2 * (r // 2 + 1) * s
    return tile.th % 2 == 0 and tile.tw % 16 == 0 and fragments <= ROWPAIR_WGRAD_MAX_FRAGMENTS


@functools.lru_cache(maxsize=1024)
def wgrad_candidates(c: int, r: int, s: int) -> tuple[CudaTile, ...]:
    """The legal ``WGRAD_TILES`` for C channels and an R x S kernel (empty if none fits)."""
    fitted = (_fitted(t, c, warp_per_group=True) for t in WGRAD_TILES)
    return tuple(dict.fromkeys(t for t in fitted if wgrad_tile_ok(c, r, s, t)))


#: per (device, stream): an fp32 workspace that every wgrad launch leaves zero (see
#: ``finish_wgrad``), grown when a larger problem comes, with its views per problem size
_WORKSPACES: dict[tuple[int, int], tuple[torch.Tensor, dict]] = {}


def _split(ws: torch.Tensor, taps: int, c: int, cblocks: int) -> tuple[torch.Tensor, ...]:
    return ws[:taps], ws[taps : taps + c], ws[taps + c : taps + c + cblocks].view(torch.int32)


def _workspace(device: torch.device, taps: int, c: int, cblocks: int) -> tuple[torch.Tensor, ...]:
    """(dw sums [taps], db sums [c], counters [cblocks] int32): zeroed fp32 workspace views.

    Outside graph capture the workspace is shared by every launch on the current stream (stream
    order keeps them apart, and each leaves it zero). Under capture each call gets its own
    (zeroed by a memset the graph records), so graphs replayed on different streams never share
    one.
    """
    need = taps + c + cblocks
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_current_stream_capturing():
        return _split(torch.zeros(need, device=device, dtype=torch.float32), taps, c, cblocks)
    dev = device.index if device.index is not None else torch.cuda.current_device()
    key = (dev, torch._C._cuda_getCurrentRawStream(dev) if cuda else 0)
    entry = _WORKSPACES.get(key)
    if entry is None or entry[0].numel() < need:
        size = max(need, 1 << 14, 2 * entry[0].numel() if entry is not None else 0)
        entry = (torch.zeros(size, device=device, dtype=torch.float32), {})
        _WORKSPACES[key] = entry
    views = entry[1].get((taps, c, cblocks))
    if views is None:
        views = entry[1][(taps, c, cblocks)] = _split(entry[0], taps, c, cblocks)
    return views


def wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    r: int,
    s: int,
    pad_h: int,
    pad_w: int,
    need_db: bool,
    tile: CudaTile = WGRAD_TILES[0],
    db_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight gradient [C, 8, R, S] in x's dtype, bias gradient [C] in ``db_dtype`` (fp32 or
    x's dtype) or None) of the grouped conv ``y = conv2d(x, w, padding)`` given ``dy``, both
    channels_last fp16/bf16. One launch: the CTAs add fp32 sums with atomics (run-to-run
    rounding differences: the non-deterministic mode) into a workspace whose last CTA per
    channel block writes the results and zeroes it again."""
    n, c, hi, wi = x.shape
    ho, wo = dy.shape[2], dy.shape[3]
    if db_dtype not in (torch.float32, x.dtype):
        raise ValueError(f"argument 'db_dtype' must be torch.float32 or {x.dtype}, not {db_dtype}")
    db_mode = (1 if db_dtype == torch.float32 else 2) if need_db else 0
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    kernel = _kernel(r, s, tile, x.dtype == torch.bfloat16, db_mode, False, dev, "tw_gconv_wgrad")
    cblocks = c // tile.cb
    dw_sums, db_sums, counters = _workspace(x.device, r * s * c * 8, c, cblocks)
    dw = alloc.empty(c, 8, r, s, device=x.device, dtype=x.dtype)
    db = alloc.empty(c, device=x.device, dtype=db_dtype) if need_db else None
    tiles_h, tiles_w = cdiv(ho, tile.th), cdiv(wo, tile.tw)
    n_tiles = n * tiles_h * tiles_w
    grid_x = max(1, min(n_tiles, cdiv(tile.min_ctas * num_sms(x.device), cblocks)))
    args = [x, dy, dw_sums, db_sums, dw, db if db is not None else dw, counters]
    args += [hi, wi, ho, wo, c, pad_h, pad_w, tiles_h, tiles_w, n_tiles]
    grid, block = (grid_x, cblocks, 1), (tile.warps * 32, 1, 1)
    _launch(kernel, "ppppppp" + "i" * 10, grid, block, args, wgrad_smem_bytes(r, s, tile), dev)
    return dw, db
