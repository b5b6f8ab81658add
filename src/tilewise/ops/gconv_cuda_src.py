"""CUDA C++ sources of the grouped conv's NVRTC kernels (``ops.gconv_cuda`` compiles them).

``SOURCE``: the shared prefix (helpers, loaders, signatures), the tap fprop/dgrad kernel
``tw_gconv_fprop`` and the tap wgrad kernel ``tw_gconv_wgrad``. ``SOURCE_RP`` and ``SOURCE_WRP``:
the prefix plus the row-pair fprop/dgrad kernel ``tw_gconv_fprop_rp`` or the row-pair wgrad kernel
``tw_gconv_wgrad_rp``. Each is a ``str.format`` template (``{R}``, ``{S}``, ``{TH}``, ``{TW}``,
``{CB}``, ``{WARPS}``, ``{MIN_CTAS}``, ``{STAGES}``, ``{IS_BF16}``, ``{HAS_BIAS}``, ``{DB_HALF}``,
``{DGRAD}``, ``{DW_CL}``, ``{RED4}``, ``{WABLATE}``, ``{FIN_ORDER}``, ``{FIN_SMEM}``, ``{STAMPS}``,
``{SUMK}``, ``{WCOPIES}``, ``{WSLOTS}``;
literal braces doubled);
``gconv_cuda.source`` fills it in.
"""

#: helpers the kernels of ``gconv_wgmma_src`` share (``str.format`` text: braces doubled): the
#: shared-memory address of a pointer, and an mbarrier wait for a phase's parity
SMEM_U32 = r"""__device__ __forceinline__ u32 smem_u32(const void* p) {{
    u32 r;
    asm("{{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }}" : "=r"(r) : "l"(p));
    return r;
}}
"""
MBAR_WAIT = r"""__device__ __forceinline__ void mbar_wait(u32 mbar, u32 parity) {{
    u32 done;
    do {{
        asm volatile("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }}\n"
                     : "=r"(done) : "r"(mbar), "r"(parity) : "memory");
    }} while (!done);
}}
"""

#: the TMA kernels' tensor-map parameter type and their swizzled stage addressing (``hoff``: the
#: includer defines ``PIXT``, a pixel's bytes in a stage, and ``SWM``, the swizzle's XOR mask);
#: also ``bench.tma_copy``'s kernel
TMA_DESC_HOFF = (
    "// the kernel parameter a tensor map travels in (CUtensorMap: 128 bytes, 64-byte aligned)\n"
    r"""struct __align__(64) TmaDesc {{ unsigned long long v[16]; }};

// byte offset of 16-byte chunk ``ch`` of pixel ``pix`` in a TMA stage (swizzled)
__device__ __forceinline__ u32 hoff(int pix, int ch) {{
    const u32 o = (u32)pix * PIXT + (u32)ch * 16;
    return o ^ (((o >> 7) & SWM) << 4);
}}
"""
)
#: one thread's set-up of ``n`` single-arrival mbarriers, made visible to the TMA unit
MBAR_INIT = (
    "// one thread: ``n`` barriers at ``mbar0``, 8 bytes apart, each for one arrival, made visible"
    " to\n"
    r"""// the TMA unit
__device__ __forceinline__ void mbar_init(u32 mbar0, int n) {{
    for (int st = 0; st < n; ++st)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(mbar0 + 8 * st));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}}
"""
)

SOURCE = (
    r"""
#define R {R}
#define R_FULL {R_FULL}
#define ROWSPLIT {ROWSPLIT}
#define S {S}
#define TH {TH}
#define TW {TW}
#define CB {CB}
#define WARPS {WARPS}
#define IS_BF16 {IS_BF16}
#define HAS_BIAS {HAS_BIAS}
#define DGRAD {DGRAD}
#define DB_HALF {DB_HALF}
#define CLUSTER {CLUSTER}
#define SUMK {SUMK}
#define TMA {TMA}
#define DW_CL {DW_CL}
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
// wgrad's dw_out element (out channel * 8 + in channel, tap): [C, 8, R_FULL, S] contiguous, or
// with DW_CL in a channels_last weight's layout [C, R_FULL, S, 8], so that autograd keeps the
// gradient of a channels_last parameter as it is instead of copying it into that layout
// and the (out channel * 8 + in channel, tap) that the finishing loops' element i stands for:
// i runs over the layout's order, so consecutive threads store consecutive elements
#if DW_CL
#define DW_OUT(oi8, tap) \
    ((long long)((oi8) >> 3) * (R_FULL * S * 8) + (long long)(tap) * 8 + ((oi8) & 7))
#define FIN_OI(i) (((i) / (8 * TAPS)) * 8 + ((i) & 7))
#define FIN_TAP(i) (((i) >> 3) % TAPS)
#else
#define DW_OUT(oi8, tap) ((long long)(oi8) * (R_FULL * S) + (tap))
#define FIN_OI(i) ((i) / TAPS)
#define FIN_TAP(i) ((i) % TAPS)
#endif

// the wgrad finish's element order (``TILEWISE_GCONV_WGRAD_FINISH_ORDER``; see finish_wgrad)
#define FIN_ORDER {FIN_ORDER}
// the bytes at the start of the wgrad kernel's dynamic shared memory its finish may stage dw_out
// in (``gconv_cuda.finish_staging_bytes``: the tail with the mbarriers left out)
#define FIN_SMEM {FIN_SMEM}
// the copies of the wgrad workspace's sums the tap kernel's CTAs spread their reductions over
// (``TILEWISE_GCONV_WGRAD_COPIES``; session 48): CTA b adds into copy b % WCOPIES, the finish's
// pass adds the copies up
#define WCOPIES {WCOPIES}
// the tap wgrad's slots (``CudaTile.slots``; session 49): each CTA stores its sums with plain
// stores into its own slot of a buffer (dw: gridDim.x slots of R_FULL x S x C x 8 + C floats;
// no atomics, no count, no finish) and lets the dependent slot-sum kernel (``gconv_slots_src``)
// start; that kernel adds the slots up in a fixed order (a deterministic wgrad)
#define WSLOTS {WSLOTS}
// where a slots CTA lets the slot-sum kernel be launched: 1 at its start, 0 once its slot is
// stored (``gconv_cuda.SLOT_TRIGGER``)
#define SLOT_EARLY {SLOT_EARLY}
// the wgrad's phase stamps (session 47, diagnosis only: ``gconv_cuda.WGRAD_STAMPS``, the address
// of a u64 buffer the probe owns, 0 off): thread 0 of each CTA writes %globaltimer at its start,
// before its finish, after its count and (session 48) at its main loop's end (from word 64, 4 a
// CTA: 0, 1, 2, 3); the last CTA of channel block 0
// writes its pass's phases in words 0-31 (%globaltimer) and 32-63 (clock64): 0 count seen, 1
// after the fence, 2 + r round r's stores issued, 10 + r round r's loads back (rounds 0-7), 30
// done
#define STAMPS {STAMPS}ULL
#if STAMPS
__device__ __forceinline__ unsigned long long tw_gtimer() {{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    return t;
}}
// the timer after ``v`` is known: the stamp's value depends on it, so the read waits for it
__device__ __forceinline__ unsigned long long tw_gtimer_after(float v) {{
    unsigned long long t;
    asm volatile(
        "{{ .reg .pred p; setp.eq.f32 p, %1, 0f00000001; mov.u64 %0, %%globaltimer; "
        "@p add.u64 %0, %0, 1; }}" : "=l"(t) : "f"(v) : "memory");
    return t;
}}
#define TW_CTA_ID (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))
#define STAMP_CTA(k)                                                                 \
    do {{                                                                             \
        if (tid == 0) ((unsigned long long*)STAMPS)[64 + 4 * TW_CTA_ID + (k)] = tw_gtimer(); \
    }} while (0)
#define STAMP_LAST(k)                                                          \
    do {{                                                                       \
        if (tid == 0 && blockIdx.y == 0 && blockIdx.z == 0) {{                   \
            ((unsigned long long*)STAMPS)[k] = tw_gtimer();                    \
            ((unsigned long long*)STAMPS)[32 + (k)] = clock64();               \
        }}                                                                      \
    }} while (0)
#else
#define STAMP_CTA(k)
#define STAMP_LAST(k)
#endif

typedef unsigned short u16;
typedef unsigned int u32;
struct __align__(16) v4u32 {{ u32 a, b, c, d; }};

"""
    + SMEM_U32
    + r"""
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

// thread-block clusters (the cluster wgrad): barrier with release/acquire at cluster scope, this
// CTA's rank, and a float from another CTA's shared memory at this CTA's address ``local``
__device__ __forceinline__ void cluster_sync() {{
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}}

__device__ __forceinline__ u32 cluster_rank() {{
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}}

// the halves of cluster_sync apart: arrive (after this thread's reads of other CTAs' shared
// memory) and wait (before leaving, so no CTA leaves while another still reads its memory)
__device__ __forceinline__ void cluster_arrive() {{
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}}

__device__ __forceinline__ void cluster_wait() {{
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}}

// this CTA's shared address ``local`` in the CTA of cluster rank ``rank``, and a float there
__device__ __forceinline__ u32 dsmem_addr(u32 local, u32 rank) {{
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
}}

__device__ __forceinline__ float ld_cluster(u32 remote) {{
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
    return v;
}}

__device__ __forceinline__ float ld_dsmem(u32 local, u32 rank) {{
    u32 remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
    return v;
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
    // consecutive threads: the NG chunks of a pixel, so each 8-thread phase of the 16-byte
    // stores writes whole 32-byte sectors (session 8: chunk-major phases, free of shared-memory
    // bank conflicts but with half-sector stores, made the tap kernels 12-15% slower)
    for (int i = tid; i < TH * TW * NG; i += WARPS * 32) {{
        const int p = i / NG, ch = i - (i / NG) * NG;
        const int oh = th_i * TH + p / TW, ow = tw_i * TW + (p - (p / TW) * TW);
        if (oh < Ho && ow < Wo)
            *(v4u32*)(y + (((long long)n * Ho + oh) * Wo + ow) * C + c0 + ch * 8) =
                *(const v4u32*)(stg + p * (PIX / 2) + ch * 8);
    }}
}}

#if TMA
// TMA tiles: a stage is dense, pixels at CB * 2 bytes, its 16-byte chunks swizzled by the tensor
// map (32/64/128-byte mode by CB: chunk bits ^= address bits 7.., which keeps an ldmatrix's 8
// consecutive pixels on 8 bank groups); stages start on the swizzle's period, TALIGN
#define PIXT (CB * 2)
#define SWM (CB == 8 ? 0 : CB == 16 ? 1 : CB == 32 ? 3 : 7)  // CB = 128: 128-byte mode too
#define TALIGN (128 * (SWM + 1))

"""
    + TMA_DESC_HOFF
    + r"""
// one 4-d box (channels, w, h, n) of ``map`` from (c, w, h, n) into ``dst``, completing on
// ``mbar`` (whose expected bytes the caller has set); issued by one thread. Pixels wider than
// 128 bytes (CB = 128): a 5-d map of 64-channel rows (row channel, row, w, h, n), the same bytes
// in the same order
__device__ __forceinline__ void tma_load(u32 dst, u32 mbar, const TmaDesc* map, int c, int w,
                                         int h, int n) {{
#if PIXT > 128
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {{%2, %3, %4, %5, %6}}], [%7];\n"
                 :: "r"(dst), "l"(map), "r"(0), "r"(c / 64), "r"(w), "r"(h), "r"(n), "r"(mbar)
                 : "memory");
#else
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {{%2, %3, %4, %5}}], [%6];\n"
                 :: "r"(dst), "l"(map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(mbar)
                 : "memory");
#endif
}}

"""
    + MBAR_WAIT
    + r"""
"""
    + MBAR_INIT
    + r"""#endif

// Programmatic dependent launch (sm_90+; a no-op for a grid launched without it): wait until
// the grids this one depends on have finished and their writes are visible, then let the next
// kernel's CTAs be scheduled (they wait in turn). Every thread calls it before its first read of
// global memory or write to it, so overlapping with the kernel before only hides this one's
// launch and prologue.
__device__ __forceinline__ void grid_dependency_sync() {{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}}

// the fprop kernels' common signature
#define FPROP_PTRS                                                                               \
    const u16 *__restrict__ x, const u16 *__restrict__ w, const float *__restrict__ bias,        \
        u16 *__restrict__ y
#define FPROP_INTS                                                                               \
    int Hi, int Wi, int Ho, int Wo, int C, int pad_h, int pad_w, int tiles_h, int tiles_w,       \
        int n_tiles, int ws0, int ws1, int ws2, int ws3
#define FPROP_PARAMS FPROP_PTRS, FPROP_INTS

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

// the wgrad kernels' common signature: dw [R_FULL, S, C, 8] and db [C] are fp32 sums in a
// workspace that is zero on entry and left zero on exit, counters [row blocks x C / CB]
// likewise; dw_out [C, 8, R_FULL, S] in the input dtype (DW_CL: channels_last), db_out [C] in
// the input dtype (DB_HALF) or fp32
#define WGRAD_PARAMS                                                                             \
    const u16 *__restrict__ x, const u16 *__restrict__ dy, float *__restrict__ dw,              \
        float *__restrict__ db, u16 *__restrict__ dw_out, void *__restrict__ db_out,           \
        unsigned *__restrict__ counters, int Hi, int Wi, int Ho, int Wo, int C, int pad_h,      \
        int pad_w, int tiles_h, int tiles_w, int n_tiles

// After this CTA's atomics: the last CTA of the channel block (counted per blockIdx.y) turns the
// block's fp32 sums into dw_out and db_out and zeroes them and the counter again, so one launch
// does what a memset, the kernel and a cast kernel did. ``flag``: a word of shared memory the
// main loop is done with.
template <int COPIES = 1>
__device__ __forceinline__ void finish_wgrad(float* __restrict__ dw, float* __restrict__ db,
                                             u16* __restrict__ dw_out, void* __restrict__ db_out,
                                             unsigned* __restrict__ counters, int C, int c0,
                                             int tid, volatile unsigned* flag, int ablate = 0) {{
    // ablate (the tap wgrad's WABLATE, for timing only; session 46): 16 the count alone (the last
    // CTA resets the counter and leaves: no pass), 32 no fence before the count; session 47: 64
    // the pass's loads without its stores (no dw_out, the workspace left unclean)
    STAMP_CTA(1);
    if (!(ablate & 32)) __threadfence();  // this thread's atomics are visible before the count
    __syncthreads();
    unsigned* const counter = counters + blockIdx.z * gridDim.y + blockIdx.y;
    if (tid == 0) *flag = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    STAMP_CTA(2);
    if (!*flag) return;
    STAMP_LAST(0);
    if (ablate & 16) {{
        if (tid == 0) *counter = 0u;
        return;
    }}
    __threadfence();
    STAMP_LAST(1);
    // this CTA's taps start at tap0 of the R_FULL x S kernel (ROWSPLIT: R rows per blockIdx.z)
    const int tap0 = blockIdx.z * TAPS;
    // Where a thread's share is at most 24 sums (3x3: CB 64 on 256 threads, 18), the pairs'
    // order (FIN_ORDER 0, the default): thread t takes the (out, in) channel pairs p = t,
    // t + FNT, ... and every tap of each. A tap's CB * 8 sums are contiguous in the workspace,
    // so a warp's loads and zeroing are one 128-byte line each, the addresses need no division,
    // and all of the thread's loads are in flight at once. Session 47's clock stamps (H200, the
    // 3x3 pick at N = 8 and 128): the dw_out-order pass below took 3.2 us of the last CTA, its
    // loads 0.42-0.90 us a round (three rounds) and the index arithmetic and branches of its
    // stores 0.22-0.64 us a round; the workspace order 2.5-3.0 us; this one 0.9. Larger shares
    // (5x5 and up, or fewer threads) keep the loop below: batched, the pairs spilled more in
    // the 6x6-7x7 tiles' 128 registers (ptxas).
    constexpr int FNP = CB * 8, FNT = WARPS * 32, FPPT = (FNP + FNT - 1) / FNT;
    constexpr bool FPAIRS = FIN_ORDER == 0 && TAPS * FPPT <= 24;
    // a contiguous dw_out takes a warp's 32 pairs' taps as one run of 32 x TAPS halves: staged
    // in this warp's piece of shared memory (the main loop is done with it), they leave as
    // coalesced words, where the pairs' own stores took 18 sectors a warp store (session 47's
    // stamps, 3x3 pick at N = 128: 1.5 us of stores after 0.35 us of loads)
    constexpr bool FSTAGE = FPAIRS && !DW_CL && !ROWSPLIT && FIN_SMEM >= 16 + WARPS * 32 * TAPS * 2;
    // COPIES (session 48): the sums in that many copies of the workspace, R_FULL x S x C x 8
    // floats apart
    static_assert(COPIES == 1 || FPAIRS, "copies of the sums need the pairs' pass");
    const long long cstride = (long long)R_FULL * S * C * 8;
    if (FPAIRS) {{
        float* const wsb = dw + (long long)tap0 * C * 8 + c0 * 8;
        const long long tstride = (long long)C * 8;
        float v[FPPT][TAPS];
        {{
            float vc[COPIES][FPPT][TAPS];  // every load in flight before the first add
#pragma unroll
            for (int m = 0; m < COPIES; ++m)
#pragma unroll
                for (int q = 0; q < FPPT; ++q)
#pragma unroll
                    for (int j = 0; j < TAPS; ++j) {{
                        const int p = tid + q * FNT;
                        vc[m][q][j] = FNP % FNT == 0 || p < FNP
                                          ? ld_cg(wsb + m * cstride + j * tstride + p)
                                          : 0.f;
                    }}
#pragma unroll
            for (int q = 0; q < FPPT; ++q)
#pragma unroll
                for (int j = 0; j < TAPS; ++j) {{
                    v[q][j] = vc[0][q][j];
#pragma unroll
                    for (int m = 1; m < COPIES; ++m) v[q][j] += vc[m][q][j];
                }}
        }}
#if STAMPS
        if (tid == 0 && blockIdx.y == 0 && blockIdx.z == 0) {{  // thread 0's loads are back
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < TAPS; ++j) sum += v[0][j];
            ((unsigned long long*)STAMPS)[10] = tw_gtimer_after(sum);
        }}
#endif
        if (ablate & 64) {{  // the loads only, no stores: a sum that is stored only if 0x1p-149
            float sum = 0.f;
#pragma unroll
            for (int q = 0; q < FPPT; ++q)
#pragma unroll
                for (int j = 0; j < TAPS; ++j) sum += v[q][j];
            if (sum == 1.401298464e-45f) dw_out[tid] = 0;
        }} else {{
#pragma unroll
            for (int q = 0; q < FPPT; ++q) {{
                const int p = tid + q * FNT;  // (co - c0) * 8 + ci
                if (FNP % FNT == 0 || p < FNP)
#pragma unroll
                    for (int j = 0; j < TAPS; ++j) {{
                        if (!FSTAGE) dw_out[DW_OUT(c0 * 8 + p, tap0 + j)] = to_u16(v[q][j]);
#pragma unroll
                        for (int m = 0; m < COPIES; ++m)
                            st_cg(wsb + m * cstride + j * tstride + p, 0.f);
                    }}
                if (FSTAGE) {{
                    const int lane = tid & 31, w0 = q * FNT + (tid & ~31);  // the warp's 1st pair
                    u16* const stage = (u16*)((unsigned char*)flag + 16) + (tid >> 5) * 32 * TAPS;
#pragma unroll
                    for (int j = 0; j < TAPS; ++j) stage[lane * TAPS + j] = to_u16(v[q][j]);
                    __syncwarp();
                    const int halves = (FNP % FNT == 0 ? 32 : min(32, FNP - w0)) * TAPS;
                    // no row split: one row block (tap0 0) and R_FULL * S == TAPS
                    u16* const out = dw_out + (long long)(c0 * 8 + w0) * TAPS;
                    if (halves == 32 * TAPS && !((size_t)out & 3))  // whole words
                        for (int e = lane; e < 16 * TAPS; e += 32)
                            ((u32*)out)[e] = ((const u32*)stage)[e];
                    else
                        for (int e = lane; e < halves; e += 32) out[e] = stage[e];
                    __syncwarp();
                }}
            }}
            STAMP_LAST(2);
        }}
    }} else {{
    // FIN_ORDER 1 (the order before session 47, and every larger share) runs element i over
    // dw_out's order (FIN_OI, FIN_TAP): the u16 stores coalesce, the fp32 loads and the zeroing
    // take 9-18 sectors a warp; 2 (session 46's switch) over the workspace's order: the loads
    // and the zeroing coalesce. FB loads in flight per thread before their stores (session 7: a
    // serial load-store loop left an L2 round trip per element on the kernel's tail, +5-7 us
    // per call).
#if FIN_ORDER == 2
#define FIN_EL_OI(i) ((i) % (CB * 8))
#define FIN_EL_TAP(i) ((i) / (CB * 8))
#else
#define FIN_EL_OI(i) FIN_OI(i)
#define FIN_EL_TAP(i) FIN_TAP(i)
#endif
    constexpr int FB = 8, NW = CB * 8 * TAPS;
    for (int base = 0; base < NW; base += FB * WARPS * 32) {{
        float v[FB];
#pragma unroll
        for (int j = 0; j < FB; ++j) {{
            const int i = base + j * WARPS * 32 + tid;
            v[j] = i < NW ? ld_cg(dw + (long long)(tap0 + FIN_EL_TAP(i)) * C * 8 + c0 * 8 +
                                  FIN_EL_OI(i))
                          : 0.f;
        }}
#if STAMPS
        if (tid == 0 && blockIdx.y == 0 && blockIdx.z == 0) {{  // thread 0's loads are back
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < FB; ++j) sum += v[j];
            const int rnd = base / (FB * WARPS * 32);  // words 2-9 and 10-17: 8 rounds at most
            if (rnd < 8) ((unsigned long long*)STAMPS)[10 + rnd] = tw_gtimer_after(sum);
        }}
#endif
        if (ablate & 64) {{  // the loads only, no stores: a sum that is stored only if 0x1p-149
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < FB; ++j) sum += v[j];
            if (sum == 1.401298464e-45f) dw_out[tid] = 0;
            continue;
        }}
#pragma unroll
        for (int j = 0; j < FB; ++j) {{
            const int i = base + j * WARPS * 32 + tid;  // FIN_EL_OI(i) = (co - c0) * 8 + ci
            if (i < NW) {{
                dw_out[DW_OUT(c0 * 8 + FIN_EL_OI(i), tap0 + FIN_EL_TAP(i))] = to_u16(v[j]);
                st_cg(dw + (long long)(tap0 + FIN_EL_TAP(i)) * C * 8 + c0 * 8 + FIN_EL_OI(i), 0.f);
            }}
        }}
        if (base / (FB * WARPS * 32) < 8) STAMP_LAST(2 + base / (FB * WARPS * 32));
    }}
#undef FIN_EL_OI
#undef FIN_EL_TAP
    }}
#if HAS_BIAS
    if (blockIdx.z == 0)
    for (int i = tid; i < CB; i += WARPS * 32) {{
        float v = ld_cg(db + c0 + i);
#pragma unroll
        for (int m = 1; m < COPIES; ++m) v += ld_cg(db + m * C + c0 + i);
#if DB_HALF
        ((u16*)db_out)[c0 + i] = to_u16(v);
#else
        ((float*)db_out)[c0 + i] = v;
#endif
#pragma unroll
        for (int m = 0; m < COPIES; ++m) st_cg(db + m * C + c0 + i, 0.f);
    }}
#endif
    if (tid == 0) *counter = 0u;
    STAMP_LAST(30);
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
// CLUSTER > 0 (small batches): the grid is one cluster of CLUSTER CTAs per channel block, which
// sum their partials through distributed shared memory and write dw_out / db_out themselves: no
// atomics, workspace or last-CTA pass (each an L2 round trip on a kernel of a few microseconds).
// SUMK > 0 (TMA tiles, persistent CTAs; session 48): clusters of SUMK CTAs add up their sums
// through distributed shared memory before the atomics (see the end of tw_gconv_wgrad)
#if CLUSTER
#define WGRAD_CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#elif SUMK
#define WGRAD_CLUSTER_DIMS __cluster_dims__(SUMK, 1, 1)
#else
#define WGRAD_CLUSTER_DIMS
#endif
// WARPS = NG x WSPLIT: the WSPLIT warps of a group take turns over a tile's 16-pixel chunks (more
// warps per CTA where a cluster grid has few CTAs); their sums add up at the end.
#define WSPLIT (WARPS / NG)
// RED4 (``TILEWISE_GCONV_WGRAD_RED4=1``; session 42, prepared without a GPU): the sums leave by
// red.global.add.v4.f32, four in channels an atomic (a quarter of the L2 operations; the wgmma
// wgrad's scalar atomics were a 13 us tail in session 33), on compute capability 9.0+ (PTX ISA
// 8.1: NVRTC of CUDA 12.1 or later)
#define RED4 ({RED4} && __CUDA_ARCH__ >= 900)
// the tap wgrad's diagnosis switch (``TILEWISE_GCONV_WGRAD_ABLATE``, never set in use; wrong
// results, for timing only; session 45: where its ~11 us a launch goes): 1 no atomics (the
// CTAs' sums never leave), 2 no finish (no counter, no last-CTA pass), 4 no MMAs (the tap loop
// left out), 8 no loads (TMA tiles: no tensor copies, no waits; the stages' stale contents);
// session 46, inside the finish (finish_wgrad's ablate): 16 the count alone, 32 no fence before it
// (a late atomic may then land after the zeroing: the workspace left unclean, as with 2 or 16);
// session 47: 64 the pass's loads without its stores
#define WABLATE {WABLATE}
// session 48: 128 the dw sums leave by plain stores to the same words instead of reductions (the
// L2's read-modify-write taken out, the traffic and the fence kept; wrong results); the bias
// sums and RED4's four-wide reductions stay reductions
#if WABLATE & 128
#define WRED st_cg
#else
#define WRED red_add
#endif
#if RED4
__device__ __forceinline__ void red_add_v4(float* p, const float (&v)[4]) {{
    asm volatile("red.global.add.v4.f32 [%0], {{%1, %2, %3, %4}};\n"
                 :: "l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory");
}}
// A tap pair's four sums (D columns: out channel co or co + 1, tap 2tp or 2tp + 1) transposed
// over the four lanes of in channels 4h..4h+3 (lane bits 2-3; h = lane >> 4, same lane & 3), so
// lane m = (lane >> 2) & 3 ends with column m's sums for those four in channels: the block swap
// with the lane 8 apart, then each 2 x 2 block's transpose with the lane 4 apart
__device__ __forceinline__ void transpose_quad(float (&v)[4], int lane) {{
    const int m = (lane >> 2) & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) {{
        const float got = __shfl_xor_sync(0xffffffffu, (m & 2) ? v[j] : v[j + 2], 8);
        if (m & 2) v[j] = got; else v[j + 2] = got;
    }}
#pragma unroll
    for (int j = 0; j < 4; j += 2) {{
        const float got = __shfl_xor_sync(0xffffffffu, (m & 1) ? v[j] : v[j + 1], 4);
        if (m & 1) v[j] = got; else v[j + 1] = got;
    }}
}}
#endif
#if TMA && CLUSTER
#error "TMA wgrad tiles take no clusters (the cluster epilogue reuses the stage buffers)"
#endif
#if WSLOTS && (CLUSTER || SUMK || RED4)
#error "slots are for the persistent tap CTAs' plain stores (no clusters, no SUMK, no RED4)"
#endif
#if WSLOTS && (WABLATE & (1 | 128))
#error "ablation bits 1 and 128 change reductions that slots do not make (slots left unstored)"
#endif
#if SUMK && (CLUSTER || !TMA)
#error "SUMK is for the TMA tiles' persistent CTAs (the sums sit in their dead stages)"
#endif
#if TMA
// TMA wgrad (experimental, session 9): per stage the input halo and the dy tile arrive as two
// tensor copies on one mbarrier, dense and swizzled (see tma_load), stages on TALIGN boundaries;
// then the zero pixel and the barriers. Not with clusters (their epilogue reuses the stages).
#define HALO_W ((HH * HWD * PIXT + TALIGN - 1) / TALIGN * TALIGN)
#define DY_W ((TH * TW * PIXT + TALIGN - 1) / TALIGN * TALIGN)
#define WST (HALO_W + DY_W)
#define WZT (STAGES * WST)
#define WMB (WZT + NG * 16)
#define W_TMA_BYTES ((HH * HWD + TH * TW) * PIXT)
#define WGRAD_KPARAMS WGRAD_PARAMS, const __grid_constant__ TmaDesc tmap_x, \
    const __grid_constant__ TmaDesc tmap_dy

// tile t's input halo and dy tile into stage ``dst`` on ``mbar``; one thread
__device__ __forceinline__ void tma_wgrad_stage(u32 dst, u32 mbar, const TmaDesc* mx,
                                                const TmaDesc* mdy, int t, int c0, int pad_h,
                                                int pad_w, int tiles_h, int tiles_w) {{
    const int tw_i = t % tiles_w, th_i = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(mbar), "r"(W_TMA_BYTES) : "memory");
    tma_load(dst, mbar, mx, c0, tw_i * TW - pad_w, th_i * TH - pad_h, n);
    tma_load(dst + HALO_W, mbar, mdy, c0, tw_i * TW, th_i * TH, n);
}}
#else
#define WGRAD_KPARAMS WGRAD_PARAMS
#endif
extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS}) WGRAD_CLUSTER_DIMS
tw_gconv_wgrad(WGRAD_KPARAMS)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, g = WSPLIT > 1 ? (tid >> 5) % NG : tid >> 5;
    // a constant 0 without splits: the chunk loop keeps a compile-time start (session 8: a
    // runtime one made the one-warp-per-group cluster tiles 28% slower at batch 1)
    const int split = WSPLIT > 1 ? (tid >> 5) / NG : 0;
    const int c0 = blockIdx.y * CB;
    STAMP_CTA(0);
#if WSLOTS && SLOT_EARLY && __CUDA_ARCH__ >= 900
    // the slot-sum kernel's CTAs may be scheduled now; they wait for this grid's end
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#if ROWSPLIT
    // kernel rows [r0, r0 + R) of R_FULL: the wgrad of an R-row kernel whose input starts r0
    // rows lower, i.e. with r0 less padding on top (negative padding reads inside the image)
    pad_h -= blockIdx.z * R;
#endif
#if TMA
    const u32 sbase = (smem_u32(smem) + TALIGN - 1) & ~(u32)(TALIGN - 1);  // host: TALIGN slack
    unsigned char* const sm = smem + (sbase - smem_u32(smem));
    const u32 zero_px = sbase + WZT, mbar0 = sbase + WMB;
    for (int i = tid; i < NG * 4; i += WARPS * 32) ((u32*)(sm + WZT))[i] = 0u;
    if (tid == 0) {{
        mbar_init(mbar0, STAGES);
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {{
            const int ts = blockIdx.x + st * gridDim.x;
            if (ts < n_tiles && !(WABLATE & 8))
                tma_wgrad_stage(sbase + st * WST, mbar0 + 8 * st, &tmap_x, &tmap_dy, ts, c0,
                                pad_h, pad_w, tiles_h, tiles_w);
        }}
    }}
    __syncthreads();  // the zero pixel and the barriers' initialisation, before any wait
    u32 parity = 0;
#else
    const u32 sbase = smem_u32(smem);
    prefetch_wgrad<HH, HH, HALO, WSTAGE>(sbase, x, dy, Hi, Wi, Ho, Wo, C, c0, pad_h, pad_w,
                                         tiles_h, tiles_w, n_tiles, tid);
    for (int i = tid; i < NG * 4; i += WARPS * 32) ((u32*)(smem + WZ_OFF))[i] = 0u;
#endif

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
#if TMA
        const int nb = (buf + STAGES - 1) % STAGES;
        if (tid == 0 && tn < n_tiles && !(WABLATE & 8))
            tma_wgrad_stage(sbase + nb * WST, mbar0 + 8 * nb, &tmap_x, &tmap_dy, tn, c0, pad_h,
                            pad_w, tiles_h, tiles_w);
        if (!(WABLATE & 8)) mbar_wait(mbar0 + 8 * buf, parity);
        const u32 hx = sbase + buf * WST, hd = hx + HALO_W;
#else
        if (tn < n_tiles)
            load_wgrad_stage<HH, HH, HALO>(sbase + ((buf + STAGES - 1) % STAGES) * WSTAGE, x, dy,
                                           tn, Hi, Wi, Ho, Wo, C, c0, pad_h, pad_w, tiles_h,
                                           tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        __syncthreads();
        const u32 hx = sbase + buf * WSTAGE, hd = hx + HALO;
#endif
#pragma unroll 2
        for (int ch = split; ch < ((WABLATE & 4) ? 0 : (TH * TW) / 16); ch += WSPLIT) {{
            u32 b0, b1;
#if TMA
            ldsm_x2_t(b0, b1, hd + hoff(ch * 16 + b_pix, g));
#else
            ldsm_x2_t(b0, b1, hd + (ch * 16 + b_pix) * PIX + g * 16);
#endif
            const int ap = ch * 16 + a_pix, apy = ap / TW;
            const int abase = apy * HWD + (ap - apy * TW);
#pragma unroll
            for (int tp = 0; tp < TP; ++tp) {{
                const int tap = 2 * tp + a_slot;
#if TMA
                const u32 addr = tap < TAPS ? hx + hoff(abase + (tap / S) * HWD + (tap % S), g)
                                            : zero_px + g * 16;
#else
                const u32 addr = (tap < TAPS ? hx + (abase + (tap / S) * HWD + (tap % S)) * PIX
                                             : sbase + WZ_OFF) + g * 16;
#endif
                u32 a0, a1, a2, a3;
                ldsm_x4_t(a0, a1, a2, a3, addr);
                mma16816(acc[tp], a0, a1, a2, a3, b0, b1);
            }}
        }}
#if HAS_BIAS
#if TMA
        {{  // the staged dy tile's channel sums, read through the swizzle
            const unsigned char* dys = sm + buf * WST + HALO_W;
            for (int i = tid; i < TH * TW * CB; i += WARPS * 32) {{
                const int p = i / CB, cc = i - (i / CB) * CB;
                dbs += to_f32(*(const u16*)(dys + hoff(p, cc >> 3) + (cc & 7) * 2));
            }}
        }}
#else
        if (!ROWSPLIT || blockIdx.z == 0)  // row block 0 alone sums the bias gradient
            add_dbias_tile(dbs, (const u16*)(smem + buf * WSTAGE + HALO), tid);
#endif
#endif
        __syncthreads();  // this stage's buffers are refilled next iteration
        buf = (buf + 1) % STAGES;
#if TMA
        parity ^= buf == 0;
#endif
    }}
#if !TMA
    asm volatile("cp.async.wait_group 0;\n" ::);
#endif
    STAMP_CTA(3);  // the main loop done
    // D rows: lane/4 = in-channel (tap 2tp), +8 = same in-channel (tap 2tp+1); cols = out-channels
    const int ci = lane >> 2, co = c0 + g * 8 + (lane & 3) * 2;
#if CLUSTER
    // this CTA's sums [TAPS][CB out][8 in] (then [CB] bias sums) over its dead stage buffers,
    // added up over the WSPLIT warps of each group
    float* part = (float*)smem;
    __syncthreads();
#if WSPLIT > 1
    for (int i = tid; i < TAPS * CB * 8; i += WARPS * 32) part[i] = 0.f;
    __syncthreads();
#endif
#pragma unroll
    for (int tp = 0; tp < TP; ++tp)
#pragma unroll
        for (int half = 0; half < 2; ++half) {{
            const int tap = 2 * tp + half;
            if (tap < TAPS) {{
#if WSPLIT > 1
                atomicAdd(part + (tap * CB + co - c0) * 8 + ci, acc[tp][half * 2]);
                atomicAdd(part + (tap * CB + co - c0 + 1) * 8 + ci, acc[tp][half * 2 + 1]);
#else
                part[(tap * CB + co - c0) * 8 + ci] = acc[tp][half * 2];
                part[(tap * CB + co - c0 + 1) * 8 + ci] = acc[tp][half * 2 + 1];
#endif
            }}
        }}
#if HAS_BIAS
    float* bpart = part + TAPS * CB * 8;
    for (int i = tid; i < CB; i += WARPS * 32) bpart[i] = 0.f;
    __syncthreads();
    atomicAdd(bpart + tid % CB, dbs);
#endif
    cluster_sync();
    const u32 rank = cluster_rank();
    // dw_out [C, 8, R, S]: element i of this block is (FIN_OI(i), FIN_TAP(i)), in dw_out's order
    for (int i = rank * WARPS * 32 + tid; i < CB * 8 * TAPS; i += CLUSTER * WARPS * 32) {{
        const int tap = FIN_TAP(i), oi = FIN_OI(i);
        const u32 local = sbase + (tap * CB * 8 + oi) * 4;
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < CLUSTER; ++k) v += ld_dsmem(local, k);
        dw_out[DW_OUT(c0 * 8 + oi, blockIdx.z * TAPS + tap)] = to_u16(v);
    }}
#if HAS_BIAS
    if (rank == CLUSTER - 1 && blockIdx.z == 0)
        for (int i = tid; i < CB; i += WARPS * 32) {{
            const u32 local = sbase + (TAPS * CB * 8 + i) * 4;
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < CLUSTER; ++k) v += ld_dsmem(local, k);
#if DB_HALF
            ((u16*)db_out)[c0 + i] = to_u16(v);
#else
            ((float*)db_out)[c0 + i] = v;
#endif
        }}
#endif
    cluster_sync();  // no CTA leaves while another still reads its shared memory
#else
    // this CTA's copy of the workspace's sums (WCOPIES copies, R_FULL x S x C x 8 apart)
    float* const dwc = dw + (long long)(blockIdx.x % WCOPIES) * (R_FULL * S) * C * 8;
    float* const dbc = db + (blockIdx.x % WCOPIES) * C;
    (void)dwc, (void)dbc;
#if WABLATE & 1
    (void)ci, (void)co;
    if (C < 0) {{  // never true; the sums stay live, so the MMAs that make them stay too
#pragma unroll
        for (int tp = 0; tp < TP; ++tp)
#pragma unroll
            for (int k = 0; k < 4; ++k) dw[tp * 4 + k] = acc[tp][k];
        dw[4 * TP] = dbs;
    }}
#elif WSLOTS
    // this CTA's slot: every (tap, out channel, in channel) of its channel block and row block,
    // written exactly once by a plain store (a CTA without tiles stores zeros)
    {{
        static_assert(WSPLIT == 1, "slots take one warp a group (no two warps share a sum)");
        const long long dw_words = (long long)(R_FULL * S) * C * 8;
        float* const slot = dw + (long long)blockIdx.x * (dw_words + C);
#pragma unroll
        for (int tp = 0; tp < TP; ++tp)
#pragma unroll
            for (int half = 0; half < 2; ++half) {{
                const int tap = 2 * tp + half;
                if (tap < TAPS) {{
                    const long long tg = blockIdx.z * TAPS + tap;
                    slot[(tg * C + co) * 8 + ci] = acc[tp][half * 2];
                    slot[(tg * C + co + 1) * 8 + ci] = acc[tp][half * 2 + 1];
                }}
            }}
#if HAS_BIAS
        // the bias sums of channel c0 + tid % CB, added up over the CTA in a fixed order
        constexpr int PER = WARPS * 32 / CB;
        static_assert(PER * CB == WARPS * 32, "threads a whole multiple of the channel block");
        float* const red = (float*)smem;  // the stages are done with (no copy in flight)
        __syncthreads();
        red[tid] = dbs;
        __syncthreads();
        if (tid < CB && blockIdx.z == 0) {{
            float v = red[tid];
#pragma unroll
            for (int k = 1; k < PER; ++k) v += red[tid + k * CB];
            slot[dw_words + c0 + tid] = v;
        }}
#endif
#if !SLOT_EARLY && __CUDA_ARCH__ >= 900
        // this CTA's slot is stored: the slot-sum kernel may be launched once every CTA is here
        // (it still waits for this grid's end and its writes before reading)
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    }}
#elif SUMK
    // The SUMK CTAs of a cluster add up their sums through distributed shared memory first, and
    // each sends every SUMK-th of them (element j = rank + SUMK m of a thread's TP x 4): the L2
    // takes 1 / SUMK of the reductions. Session 47's stamps (H200, the 3x3 pick at N = 8, 128
    // CTAs' 4,608 reductions each into the same 144 lines): the count completed 2.9 us after
    // the last CTA arrived, 0.8 without atomics. Every CTA holds a thread's sums at the same
    // place (same tid, same tap and channels); they wait in the dead stages 128 bytes past sm,
    // clear of the finish's flag (word 0 of smem, at or below sm), which a CTA may write while
    // another still reads its sums. The last CTA's staging (FSTAGE) does overwrite them: by
    // then every CTA has counted, so every peer's loads of them are done (they precede its
    // reductions, its fence and its count). RED4 is not used with SUMK.
    {{
        constexpr int NV = TP * 4, NT = WARPS * 32, NM = NV / SUMK;
        static_assert(NV % SUMK == 0 && 128 + NV * NT * 4 <= WZT, "the sums overrun the stages");
        float* const part = (float*)(sm + 128);
#pragma unroll
        for (int j = 0; j < NV; ++j) part[j * NT + tid] = acc[j / 4][j % 4];
        cluster_sync();
        const int rank = (int)cluster_rank();
        const u32 mine = sbase + 128 + (rank * NT + tid) * 4;  // element j = rank, m = 0
        float got[NM][SUMK];  // every load in flight before the first add
#pragma unroll
        for (int k = 0; k < SUMK; ++k) {{
            const u32 peer = dsmem_addr(mine, k);
#pragma unroll
            for (int m = 0; m < NM; ++m) got[m][k] = ld_cluster(peer + m * SUMK * NT * 4);
        }}
        cluster_arrive();  // this CTA is done with the others' memory (cluster_wait at the end)
#pragma unroll
        for (int m = 0; m < NM; ++m) {{
            float v = got[m][0];
#pragma unroll
            for (int k = 1; k < SUMK; ++k) v += got[m][k];
            const int j = rank + SUMK * m, q = j & 3, tap = 2 * (j >> 2) + (q >> 1);
            if (tap < TAPS)
                WRED(dwc + ((long long)(blockIdx.z * TAPS + tap) * C + co + (q & 1)) * 8 + ci, v);
        }}
    }}
#elif RED4
    (void)ci;  // the transposed sums' in channels are the lane's quad's (lane >> 4) * 4 + 0..3
#pragma unroll
    for (int tp = 0; tp < TP; ++tp) {{  // every lane shuffles; lane m adds column m
        float v[4] = {{acc[tp][0], acc[tp][1], acc[tp][2], acc[tp][3]}};
        transpose_quad(v, lane);
        const int m = (lane >> 2) & 3, tap = 2 * tp + (m >> 1);
        if (tap < TAPS) {{
            const long long tg = blockIdx.z * TAPS + tap;  // the tap in the R_FULL x S kernel
            red_add_v4(dwc + (tg * C + co + (m & 1)) * 8 + (lane >> 4) * 4, v);
        }}
    }}
#else
#pragma unroll
    for (int tp = 0; tp < TP; ++tp)
#pragma unroll
        for (int half = 0; half < 2; ++half) {{
            const int tap = 2 * tp + half;
            if (tap < TAPS) {{
                const long long tg = blockIdx.z * TAPS + tap;  // the tap in the R_FULL x S kernel
                WRED(dwc + (tg * C + co) * 8 + ci, acc[tp][half * 2]);
                WRED(dwc + (tg * C + co + 1) * 8 + ci, acc[tp][half * 2 + 1]);
            }}
        }}
#endif
#if HAS_BIAS && !(WABLATE & 1) && !WSLOTS
    if (blockIdx.z == 0) red_add(dbc + c0 + tid % CB, dbs);
#endif
#if !(WABLATE & 2) && !WSLOTS
    finish_wgrad<WCOPIES>(dw, db, dw_out, db_out, counters, C, c0, tid, (volatile unsigned*)smem,
                          WABLATE);
#endif
#if SUMK && !(WABLATE & 1)
    cluster_wait();  // no CTA leaves while another still reads its sums
#endif
#endif
}}
"""
)

#: Row-pair fprop/dgrad (``CudaTile.kind == "rowpair"``): one warp per group (times WS column
#: splits). The weights are the MMA's A operand, held in registers for the whole CTA: rows = (out
#: channel, which of two output rows), cols = (in channel, which of two input rows); B = the
#: inputs of 8 pixels in two halo rows (one ``ldmatrix.x2``), so each B fragment read from shared
#: memory feeds both output rows it touches. Shared-memory reads per output fall from ~R*S to
#: ~S*(1 + (R-1)/TH) fragments (3x3, TH = 8: 3.75 against 10 per 16 outputs). Zero weights pair
#: with inputs outside an output's window, so a non-finite input could poison a neighbour row
#: (0 * Inf); a warp whose accumulators are not all finite recomputes its block exactly.
_RP_KERNEL = r"""
#define DYN {DYN}
#if DYN && (!TMA || STAGES < 2)
#error "DYN takes the TMA row-pair kernel with two or more stages"
#endif
#define NP ((R + 2) / 2)
#define HHP (TH + 2 * NP - 2)
#if TMA
// TMA halo (see tma_load): each stage on a boundary of the swizzle's period, mbarriers after
// the staging tile
#define HALO_RP ((HHP * HWD * PIXT + TALIGN - 1) / TALIGN * TALIGN)
#define TMA_BYTES ((TH + R - 1) * HWD * PIXT)
#if TMA == 2
// TMA store too: the staging tile dense and swizzled like the halo, written out by one tensor copy
#define STG_BYTES (TH * TW * PIXT)
#else
#define STG_BYTES (TH * TW * PIX)
#endif
// WSMEM: the weight matrices after the mbarriers
// DYN: each stage's tile index (an int a stage) after the mbarriers
#define WA_OFF ((STAGES * HALO_RP + STG_BYTES + 8 * STAGES + 4 * STAGES * DYN + 15) / 16 * 16)
#else
#define HALO_RP (HHP * HWD * PIX)
#define WA_OFF (STAGES * HALO_RP + TH * TW * PIX)
#endif
// WSMEM (``CudaTile.wsmem``, experimental): the weights stay in shared memory as one 16 x 16 A
// matrix per (group, kernel column, row pair), read by ldmatrix.x4 once per column and pair and
// used for all QP output row pairs of a column's B fragments, which are read first; frees the
// 4 x S x NP weight registers (112 at 7x7) for more warps per SM. Written in session 29 after
// its device time: not run on a GPU
#define WSMEM {WSMEM}
#define NB (QP + NP - 1)
#define WS (WARPS / NG)
#define CBLK (TW / 8)
#define QP (TH / 2)
// two 16-bit floats' exponent fields, and the addend that carries an all-ones one into bit 15
#if IS_BF16
#define EXP_MASK2 0x7f807f80u
#define EXP_ONE2 0x00800080u
#else
#define EXP_MASK2 0x7c007c00u
#define EXP_ONE2 0x04000400u
#endif

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
// weights (o, c) and (o, c + 1) at (r, s), packed: the exact path's B fragment word
__device__ __forceinline__ u32 wpair(const u16* __restrict__ w, int gc, int o, int c, int r,
                                     int s, int ws0, int ws1, int ws2, int ws3) {{
    return (u32)wval(w, gc, o, c, r, s, ws0, ws1, ws2, ws3) |
           ((u32)wval(w, gc, o, c + 1, r, s, ws0, ws1, ws2, ws3) << 16);
}}

#if TMA
// the halo rows of tile t, one bulk tensor copy (zero-filled off the image by the TMA unit),
// completing on ``mbar``; issued by one thread
__device__ __forceinline__ void tma_rows(u32 dst, u32 mbar, const TmaDesc* map, int t, int c0,
                                         int pad_h, int pad_w, int tiles_h, int tiles_w) {{
    const int tw_i = t % tiles_w, th_i = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(mbar), "r"(TMA_BYTES) : "memory");
    tma_load(dst, mbar, map, c0, tw_i * TW - pad_w, th_i * TH - pad_h, n);
}}
// the staged output tile t to y (clipped at the image's edges by the TMA unit), one bulk
// group; issued by one thread after every thread's fence.proxy.async
__device__ __forceinline__ void tma_store(u32 src, const TmaDesc* map, int t, int c0,
                                          int tiles_h, int tiles_w) {{
    const int tw_i = t % tiles_w, th_i = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
#if PIXT > 128  // 64-channel rows, as tma_load
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group"
                 " [%0, {{%1, %2, %3, %4, %5}}], [%6];\n"
                 :: "l"(map), "r"(0), "r"(c0 / 64), "r"(tw_i * TW), "r"(th_i * TH), "r"(n),
                    "r"(src)
                 : "memory");
#else
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                 " [%0, {{%1, %2, %3, %4}}], [%5];\n"
                 :: "l"(map), "r"(c0), "r"(tw_i * TW), "r"(th_i * TH), "r"(n), "r"(src)
                 : "memory");
#endif
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}}
// DYN (TMA tiles only): the tiles after each CTA's first STAGES - 1 are handed out in order by
// a counter per channel block (``tile_ctr``, a zeroed workspace the last CTA leaves zero), so
// SMs that run faster take more tiles instead of idling at the end
#if DYN
#define RP_HEAD FPROP_PTRS, unsigned* __restrict__ tile_ctr, FPROP_INTS
#else
#define RP_HEAD FPROP_PARAMS
#endif
#if TMA == 2
#define RP_PARAMS RP_HEAD, const __grid_constant__ TmaDesc tmap, \
    const __grid_constant__ TmaDesc tmap_y
#else
#define RP_PARAMS RP_HEAD, const __grid_constant__ TmaDesc tmap
#endif
#else
#define RP_PARAMS FPROP_PARAMS
#endif

// A warp's block whose outputs are not all finite (8 pixels, column block ``cb``, x TH rows x
// group ``g``'s 8 channels), recomputed exactly from the halo at ``hs``: each output sums only
// its own window (PyTorch's NaN/Inf pattern). Per-tap MMAs, two taps a k-step (an odd last tap
// pairs zeros with zeros): no zero weight meets an input outside the window.
__device__ __forceinline__ void exact_block(u32 hs, unsigned char* stg,
                                            const u16* __restrict__ w,
                                            const float* __restrict__ bias, int gc, int cb,
                                            int g, int ws0, int ws1, int ws2, int ws3) {{
    // the thread index read here (opaque), so nothing this path derives from it is hoisted
    // into the main loop's registers
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    const int lane = tid & 31, mq = lane >> 3, mpx = cb * 8 + (lane & 7);
    const int co = lane >> 2, ci = 2 * (lane & 3);
#pragma unroll 1
    for (int q = 0; q < QP; ++q) {{
        float d[4] = {{0.f, 0.f, 0.f, 0.f}};
        const int mrow = 2 * q + (mq & 1);  // A rows 0-7: output row 2q; 8-15: 2q + 1
#pragma unroll 1
        for (int t = 0; t < R * S; t += 2) {{
            const int tb = t + 1 < R * S ? t + 1 : t, tl = (mq >> 1) ? tb : t;
            const int hp = (mrow + tl / S) * HWD + mpx + tl % S;
            u32 a0, a1, a2, a3;
#if TMA
            ldsm_x4(a0, a1, a2, a3, hs + hoff(hp, g));
#else
            ldsm_x4(a0, a1, a2, a3, hs + hp * PIX + g * 16);
#endif
            const u32 b0 = wpair(w, gc, co, ci, t / S, t % S, ws0, ws1, ws2, ws3);
            u32 b1 = wpair(w, gc, co, ci, tb / S, tb % S, ws0, ws1, ws2, ws3);
            if (tb == t) a2 = a3 = b1 = 0u;
            mma16816(d, a0, a1, a2, a3, b0, b1);
        }}
        // D rows lane / 4 (+ 8): pixel cb * 8 + lane / 4 of row 2q (2q + 1); cols: out
        // channels ci, ci + 1
        const int px = cb * 8 + (lane >> 2);
#if HAS_BIAS
        const float bv0 = bias[gc + ci], bv1 = bias[gc + ci + 1];
#else
        const float bv0 = 0.f, bv1 = 0.f;
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const u32 v = pack2(d[2 * h] + bv0, d[2 * h + 1] + bv1);
            const int row = 2 * q + h;
#if TMA == 2
            *(u32*)(stg + hoff(row * TW + px, g) + ci * 2) = v;
#else
            *(u32*)(stg + ((row * TW + px) * (PIX / 2) + g * 8 + ci) * 2) = v;
#endif
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__(WARPS * 32, {MIN_CTAS})
tw_gconv_fprop_rp(RP_PARAMS)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = warp % NG, part = warp / NG;
    const int c0 = blockIdx.y * CB, gc = c0 + g * 8;
#if TMA
    const u32 sbase = (smem_u32(smem) + TALIGN - 1) & ~(u32)(TALIGN - 1);  // host: TALIGN slack
    const u32 mbar0 = sbase + STAGES * HALO_RP + STG_BYTES;
    if (tid == 0) mbar_init(mbar0, STAGES);
    // halo rows past the kernel's (even R: the last pair's second row) stay zero: the TMA box
    // never writes them
    unsigned char* const sm = smem + (sbase - smem_u32(smem));
    for (int i = TMA_BYTES / 16 + tid; i < HHP * HWD * PIXT / 16; i += WARPS * 32)
#pragma unroll
        for (int st = 0; st < STAGES; ++st)
            *(v4u32*)(sm + st * HALO_RP + i * 16) = v4u32{{0, 0, 0, 0}};
    grid_dependency_sync();
    __syncthreads();
#if DYN
    const u32 tslot = mbar0 + 8 * STAGES;  // a 32-bit shared address: no generic pointer to keep
    // tid 0's next ticket, fetched a tile before its use so the atomic's round trip never
    // delays a load (session 43: fetched just before the load, the 8x16 tile lost 10%); a
    // CTA's unused ticket is past its last tile, so past the end
    unsigned ticket = 0;
#endif
    if (tid == 0) {{
#if DYN
        ticket = atomicAdd(tile_ctr + blockIdx.y, 1u);
#endif
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {{
            const int ts = blockIdx.x + st * gridDim.x;
#if DYN
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(tslot + 4 * st), "r"(ts) : "memory");
#endif
            if (ts < n_tiles)
                tma_rows(sbase + st * HALO_RP, mbar0 + 8 * st, &tmap, ts, c0, pad_h, pad_w,
                         tiles_h, tiles_w);
        }}
    }}
#else
    const u32 sbase = smem_u32(smem);
    unsigned char* const sm = smem;
    grid_dependency_sync();

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {{
        const int ts = blockIdx.x + st * gridDim.x;
        if (ts < n_tiles)
            load_rows<HHP, TH + R - 1>(sbase + st * HALO_RP, x, ts, Hi, Wi, C, c0, pad_h, pad_w,
                                       tiles_h, tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }}
#endif

    // A fragments: a0 (d 0, jj 0), a1 (d 1, jj 0), a2 (d 0, jj 1), a3 (d 1, jj 1) for row
    // o = lane / 4 and in-channels cp, cp + 1; tap row r = 2 p + jj - d
    const int o = lane >> 2, cp = (lane & 3) * 2;
#if WSMEM
    // matrix (group, s, p): 16 rows (d * 8 + out channel) of two 16-byte chunks (jj: in channels
    // of input row jj), chunk (row, jj) at row * 2 + (jj ^ (row / 4 & 1)), so the 8 rows one
    // ldmatrix phase reads fall on 8 bank groups
    for (int i = tid; i < NG * S * NP * 256; i += WARPS * 32) {{
        const int col = i & 15, row = (i >> 4) & 15, blk = i >> 8;
        const int p = blk % NP, s = (blk / NP) % S, gg = blk / (NP * S);
        const int jj = col >> 3, d = row >> 3;
        ((u16*)(sm + WA_OFF))[blk * 256 + (row * 2 + (jj ^ ((row >> 2) & 1))) * 8 + (col & 7)] =
            wval(w, c0 + gg * 8, row & 7, col & 7, 2 * p + jj - d, s, ws0, ws1, ws2, ws3);
    }}
    __syncthreads();
    // this lane's ldmatrix.x4 row: matrix lane / 8 (a0..a3), its row lane % 8
    const u32 wa_lane = sbase + WA_OFF + g * (S * NP * 512) +
                        ((lane & 15) * 2 + ((lane >> 4) ^ ((lane >> 2) & 1))) * 16;
#else
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
#endif
#if HAS_BIAS
    const float bv = bias[gc + o];
#else
    const float bv = 0.f;
#endif
    // ldmatrix.x2 row address of this lane: matrix (lane / 8) & 1 = which halo row of the pair,
    // row lane % 8 = pixel
    const int b_row = (lane >> 3) & 1, b_px = lane & 7;
    u16* stg = (u16*)(sm + STAGES * HALO_RP);

    int buf = 0;
#if TMA
    u32 parity = 0;  // of the stage-0 barrier's next phase; flips when buf wraps
#endif
#if DYN
    // a CTA's tiles ascend (its static ones, then the counter's), so the first one past the end
    // ends its loop with no load left in flight; the next tile is read at the loop's end
#define NEXT_TILE
#else
#define NEXT_TILE t += gridDim.x
#endif
    for (int t = blockIdx.x; t < n_tiles; NEXT_TILE) {{
#if !DYN
        const int tn = t + (STAGES - 1) * gridDim.x;
#endif
#if TMA
        const int nb = (buf + STAGES - 1) % STAGES;
#if DYN
        int tn = n_tiles;  // tid 0's alone
        if (tid == 0) {{
            tn = (STAGES - 1) * gridDim.x + (int)ticket;
            ticket = atomicAdd(tile_ctr + blockIdx.y, 1u);
            // read by every thread after this tile's __syncthreads
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(tslot + 4 * nb), "r"(tn) : "memory");
        }}
#endif
        if (tid == 0 && tn < n_tiles)
            tma_rows(sbase + nb * HALO_RP, mbar0 + 8 * nb, &tmap, tn, c0, pad_h, pad_w, tiles_h,
                     tiles_w);
#if TMA == 2
        // the previous tile's output copy has read the staging tile (issued a whole tile ago,
        // so this rarely waits); the barrier below hands that on to every warp
        if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
        mbar_wait(mbar0 + 8 * buf, parity);
#if TMA == 2
        __syncthreads();
#endif
#else
        if (tn < n_tiles)
            load_rows<HHP, TH + R - 1>(sbase + ((buf + STAGES - 1) % STAGES) * HALO_RP, x, tn, Hi,
                                       Wi, C, c0, pad_h, pad_w, tiles_h, tiles_w, tid);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
        __syncthreads();
#endif
        const u32 hbase = sbase + buf * HALO_RP;
#pragma unroll 1
        for (int cb = part; cb < CBLK; cb += WS) {{
            float acc[QP][4];  // the bias rides in as the accumulators' start
#pragma unroll
            for (int q = 0; q < QP; ++q)
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[q][k] = bv;
#if TMA
            const int lane_pix = b_row * HWD + cb * 8 + b_px;
#else
            const u32 lane_addr = hbase + (b_row * HWD + cb * 8 + b_px) * PIX + g * 16;
#endif
#if WSMEM
#pragma unroll
            for (int s = 0; s < S; ++s) {{
                u32 bf[NB][2];
#pragma unroll
                for (int ip = 0; ip < NB; ++ip)
#if TMA
                    ldsm_x2(bf[ip][0], bf[ip][1], hbase + hoff(lane_pix + 2 * ip * HWD + s, g));
#else
                    ldsm_x2(bf[ip][0], bf[ip][1], lane_addr + (2 * ip * HWD + s) * PIX);
#endif
#pragma unroll
                for (int p = 0; p < NP; ++p) {{
                    u32 a0, a1, a2, a3;
                    ldsm_x4(a0, a1, a2, a3, wa_lane + (s * NP + p) * 512);
#pragma unroll
                    for (int q = 0; q < QP; ++q)
                        mma16816(acc[q], a0, a1, a2, a3, bf[q + p][0], bf[q + p][1]);
                }}
            }}
#else
#pragma unroll
            for (int s = 0; s < S; ++s)
#pragma unroll
                for (int ip = 0; ip < QP + NP - 1; ++ip) {{
                    u32 b0, b1;
#if TMA
                    ldsm_x2(b0, b1, hbase + hoff(lane_pix + 2 * ip * HWD + s, g));
#else
                    ldsm_x2(b0, b1, lane_addr + (2 * ip * HWD + s) * PIX);
#endif
#pragma unroll
                    for (int p = 0; p < NP; ++p) {{
                        const int q = ip - p;
                        if (q >= 0 && q < QP)
                            mma16816(acc[q], wa[s][p][0], wa[s][p][1], wa[s][p][2], wa[s][p][3],
                                     b0, b1);
                    }}
                }}
#endif
            // D rows: o (output row 2q) and o + 8 (row 2q + 1); cols: pixels cp, cp + 1. Each
            // 8 x 8 (channel x pixel) half of it, rounded to 16 bits, is transposed in
            // registers (movmatrix): this lane then holds channels cp, cp + 1 of pixel o, one
            // 32-bit shared store. ``flag`` gets bit 15 or 31 where a rounded output's exponent
            // is all ones (Inf or NaN, an fp32 overflow included).
            u32 flag = 0;
#if TMA == 2
            const int out_pix = cb * 8 + o;
#else
            const u32 out0 = smem_u32(stg) + ((cb * 8 + o) * (PIX / 2) + g * 8 + cp) * 2;
#endif
#pragma unroll
            for (int q = 0; q < QP; ++q)
#pragma unroll
                for (int d = 0; d < 2; ++d) {{
                    const u32 v = pack2(acc[q][2 * d], acc[q][2 * d + 1]);
                    flag |= (v & EXP_MASK2) + EXP_ONE2;
                    u32 tv;
                    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(tv) : "r"(v));
#if TMA == 2
                    const u32 at = smem_u32(stg) + hoff(out_pix + (2 * q + d) * TW, g) + cp * 2;
#else
                    const u32 at = out0 + (2 * q + d) * TW * PIX;
#endif
                    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(at), "r"(tv) : "memory");
                }}
            if (__any_sync(0xffffffffu, (flag & 0x80008000u) != 0u)) {{
                __syncwarp();  // over this warp's fast-path stores
                exact_block(sbase + buf * HALO_RP, (unsigned char*)stg, w, bias, gc, cb, g, ws0,
                            ws1, ws2, ws3);
            }}
        }}
#if TMA == 2
        // every warp's staging stores reach the async proxy, and every warp is done with this
        // halo buffer (the next tile's load may overwrite it)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (tid == 0) tma_store(smem_u32(stg), &tmap_y, t, c0, tiles_h, tiles_w);
#else
        __syncthreads();
        store_tile(y, stg, t, Ho, Wo, C, c0, tiles_h, tiles_w, tid);
        __syncthreads();
#endif
        buf = (buf + 1) % STAGES;
#if TMA
        parity ^= buf == 0;
#endif
#if DYN
        // written at least one __syncthreads ago; tid 0 next writes another slot
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(t) : "r"(tslot + 4 * buf) : "memory");
#endif
    }}
#if TMA == 2
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#elif !TMA
    asm volatile("cp.async.wait_group 0;\n" ::);
#endif
#if DYN
    // the channel block's last CTA to finish leaves its counters zero: every CTA's last
    // fetch comes before its finish count (the fence), so none fetches after the reset
    if (tid == 0) {{
        __threadfence();
        if (atomicAdd(tile_ctr + gridDim.y + blockIdx.y, 1u) == gridDim.x - 1) {{
            __threadfence();  // acquire: every other CTA's fetches before the reset
            atomicExch(tile_ctr + blockIdx.y, 0u);
            atomicExch(tile_ctr + gridDim.y + blockIdx.y, 0u);
        }}
    }}
#endif
}}
"""
SOURCE_RP = SOURCE[: SOURCE.index("// Persistent CTAs")] + _RP_KERNEL


#: Row-pair wgrad (``CudaTile(rowpair=True)`` among wgrad tiles: the 8x16 tile is a candidate,
#: others are in ``gconv_cuda.EXPERIMENTAL_WGRAD_TILES``): one warp per group. A = the inputs of
#: two halo rows (in-channels x 2 rows by 16 pixels, ``ldmatrix.x4.trans``), B = one dy row (16
#: pixels by the group's 8
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
SOURCE_WRP = SOURCE[: SOURCE.index("// Persistent CTAs")] + _WRP_KERNEL
