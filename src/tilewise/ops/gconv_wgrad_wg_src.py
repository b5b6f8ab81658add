"""CUDA C++ source of the grouped conv's warpgroup-MMA weight gradient (``CudaTile.wgmma`` among
the wgrad tiles; Hopper's ``wgmma.mma_async`` with both operands in shared memory, sm_90a).
A ``str.format`` template: the tap source's prefix (``gconv_cuda_src.SOURCE`` up to its kernels:
the macros, ``WGRAD_PARAMS``, ``red_add``, ``finish_wgrad``) and this kernel, which adds
``{DYR}``, ``{XR}`` (ring rows), ``{A_SMEM}``, ``{WGMMA}`` and ``{WGMMA_RS}``.

One warpgroup per group of 8 channels. A CTA walks a run of units (image, chunk of TW output
columns) as one sequence of positions u, one per padded input row (Ho + R - 1 a unit); for
input row X = u's row and its 16-column k-step:
- M = 64 = 8 kernel rows x 8 out channels: A[(7 - r, o), col] = dy[X - r + pad_h, col, o], an
  MN-major A whose 8 core-matrix rows are 8 consecutive dy rows of a ring in shared memory (each
  row stored once, the ring's first 7 rows a second time past its end, so a window of 8 never
  wraps); rows past a unit's last dy row are zeros, so a window reaching into the unit before
  reads zeros, not that unit's rows;
- N = 8 S = kernel columns x 8 in channels: the input row as an MN-major B whose kernel column s
  starts 16 bytes (one pixel) further on;
- K = 16 output columns.
MMA work: 64 x 8 S per 16 pixels of an input row, R / 8 of it useful (7x7: 7/8). Without a
producer warp every MMA of a step is waited for at the next step's start (the rings hold
(STAGES + 1) x TH rows and the window's 7), and all threads load between two CTA barriers. With
one or two (WARPS = 4 NG + 1 or 2) the last warps load each step's rows into a ring of STAGES
steps behind a full mbarrier per step; the warpgroups keep one step's MMAs in flight and hand a
step back through its empty mbarrier, and never meet at a CTA barrier in the loop.
``{A_SMEM}``: the MMA reads A from shared memory by descriptor; 0: through ``ldmatrix.trans``
into registers (all TH rows' before the step's one fence; session 31's prototype read this way).
``{TMA}`` (producer tiles, experimental, session 33): 1, lane 0 of the producer warp loads the
rows by tensor copies; 2, the producers land rows with a pixel's groups side by side in a
staging ring and each warpgroup copies its group into the rows its MMAs read; 3 (session 34),
the same staging, each producer thread copying the pieces it loaded itself once they land. All
three were slower than ``cp.async`` rows straight into the groups' rows: the staging halves the
L2 sectors the loads fetch, but the copy's shared-memory traffic takes what the loads save.
"""

from tilewise.ops.gconv_cuda_src import MBAR_WAIT
from tilewise.ops.gconv_cuda_src import SOURCE as _TAP_SOURCE
from tilewise.ops.gconv_wgmma_src import DESC

#: dy rows one MMA's A spans: its M = 8 kernel rows (R <= 8)
WINDOW = 8

_KERNEL = (
    r"""
typedef unsigned long long u64;
#define DYR {DYR}
#define A_SMEM {A_SMEM}
#define XR {XR}
#define WIN 8
#define KC (TW / 16)
#define NT (WARPS * 32)
// WS: producer warps (the last one or two) load the rows and the warpgroups only compute,
// meeting them at mbarriers (full: a step's rows landed; empty: a step's MMAs done), never at a
// CTA barrier
#define WS (WARPS % 4)
#define LN (WS ? 32 * WS : NT)
#define DY_ROW (TW * 16)
// TMA (one producer warp, whose lane 0 issues a tensor copy per group and row): rows on 128-byte
// boundaries, as the tensor copies' destinations must be
#define X_BOX (HWD * 16)
#define X_ALIGN (1 + 127 * (TMA == 1))
#define X_ROW ((X_BOX + X_ALIGN - 1) / X_ALIGN * X_ALIGN)
#define X_OFF ((DYR + WIN - 1) * DY_ROW)
#define GROUP_BYTES (X_OFF + XR * X_ROW)
// RL (TMA 2): the producer lands each row with a pixel's groups side by side in a staging ring
// of STAGES x TH rows (a 32-byte sector's halves adjacent: session 33, 20-25 us faster loads at
// 7x7 than into the groups' separate rows) and each warpgroup copies its group's pieces into the
// rows its MMAs read, whose rings then hold 2 steps (+7 for dy's window)
#define RL (TMA == 2)
// PRL (TMA 3): the same staging ring of STAGES steps, but each producer thread copies the pieces
// it loaded itself (its own cp.async.wait_group, no barrier) into MMA rings of MR steps, off the
// warpgroups' path
#define PRL (TMA == 3)
#define STAGED (RL + PRL)  // arithmetic: the layout test evaluates these
#define MR {MR}
// ring steps behind a full and an empty mbarrier each
#define NSLOT (PRL * MR + (1 - PRL) * STAGES)
#define SROWS (STAGES * TH)
#define STG_X (NG * HWD * 16)
#define STG_ROW (STG_X + NG * TW * 16)
#define STG_OFF (NG * GROUP_BYTES)
#define MBAR_OFF (STG_OFF + STAGED * SROWS * STG_ROW)
#if (STAGED && !WS) || WS > 2  // the re-layout needs producer warps; lid assumes 1 or 2 of them
#error "unsupported wgmma wgrad tile"
#endif
#ifndef WG_PROBE  // the probe script's bounds (bits; wrong answers): 1 no MMAs, 2 no loads, 4
#define WG_PROBE 0  // no atomics into the workspace; 8 a timeline (printf per CTA, globaltimer);
#endif              // 16 / 32: the row loads ask L2 to fetch the 128 / 256 bytes around them;
                    // 64 (with 1): rows land with a pixel's groups side by side; 128: lanes
                    // take 8 pixels of one group (the staged tiles' order) in the plain loads;
                    // 256: dy rows are not copied past the ring's end; 512: loads via L1
// a thread's pieces: piece i is pixel PX(i) of group GR(i); staged (or probe bit 128), 8
// consecutive pieces are 8 pixels of one group (a quarter warp's 16-byte accesses to 128
// contiguous bytes of a group's row, and in the staging ring to 8 distinct bank quads through
// the swizzle below)
#if WSLOTS && ((WG_PROBE & 4) || SLOT_EARLY)
#error "the warpgroup wgrad's slots are stored whole, and the slot sum triggered after them"
#endif
#if STAGED || (WG_PROBE & 128)
#define PX(i) (8 * (((i) >> 3) / NG) + ((i) & 7))
#define GR(i) (((i) >> 3) % NG)
#define XPIECES ((HWD + 7) / 8 * 8 * NG)
#else
#define PX(i) ((i) / NG)
#define GR(i) ((i) % NG)
#define XPIECES (HWD * NG)
#endif
// staging: pixel p's group g at piece NG p + (g ^ SWZ(p)), a sector's two 16-byte halves still
// side by side (the XOR keeps aligned pairs together)
#define SWZ(p) (((p) * NG / 8) % NG)
#define STG_PIECE(p, gg) (NG * (p) + ((gg) ^ SWZ(p)))
#define XJ ((XPIECES + LN - 1) / LN)
#define DJ ((TW * NG + LN - 1) / LN)
// 512: through L1 (.ca), so the second 16-byte half of a sector another lane asks for in the
// same instruction may come from L1 instead of L2 again (the plain layout: ncu counted half of
// the L2 sectors excessive)
#if WG_PROBE & 512
#define CPA "cp.async.ca"
#else
#define CPA "cp.async.cg"
#endif
#if WG_PROBE & 16
#define PF ".L2::128B"
#elif WG_PROBE & 32
#define PF ".L2::256B"
#else
#define PF ""
#endif
// a row's 16-byte piece (0 bytes read: zeros); PF, a wider L2 fetch: a CTA reads 16 bytes a
// group of a pixel, and the line's other bytes belong to the other channel blocks' CTAs
__device__ __forceinline__ void cp_row16(u32 dst, const void* src, int bytes) {{
    asm volatile(CPA ".shared.global" PF " [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(bytes));
}}
#if TMA == 1
#define WG_MAPS , const __grid_constant__ TmaDesc tmap_x, const __grid_constant__ TmaDesc tmap_dy
#else
#define WG_MAPS
#endif
#if WG_PROBE & 8
#define STAMP(v) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v))
#endif

"""
    + DESC
    + "#if !TMA  // the prefix has it with TMA\n"
    + MBAR_WAIT
    + "#endif\n"
    + r"""__device__ __forceinline__ v4u32 ld_sh16(u32 a) {{
    v4u32 v;
    asm volatile("ld.shared.v4.u32 {{%0, %1, %2, %3}}, [%4];\n"
                 : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "r"(a));
    return v;
}}
__device__ __forceinline__ void st_sh16(u32 a, v4u32 v) {{
    asm volatile("st.shared.v4.u32 [%0], {{%1, %2, %3, %4}};\n"
                 :: "r"(a), "r"(v.a), "r"(v.b), "r"(v.c), "r"(v.d) : "memory");
}}
__device__ __forceinline__ void red_add4(float* p, float a, float b, float c, float d) {{
    asm volatile("red.global.add.v4.f32 [%0], {{%1, %2, %3, %4}};\n"
                 :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}}
// slots (``CudaTile.slots``): 4 sums by one plain 16-byte store
__device__ __forceinline__ void st_global4(float* p, float a, float b, float c, float d) {{
    asm volatile("st.global.v4.f32 [%0], {{%1, %2, %3, %4}};\n"
                 :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}}
__device__ __forceinline__ void wgmma_ss(float* d, u64 da, u64 db, int accumulate) {{
{WGMMA}
}}
__device__ __forceinline__ void wgmma_rs(float* d, const u32* a, u64 db, int accumulate) {{
{WGMMA_RS}
}}

// Warpgroup g of CTA (x, y) takes out channels c0 + 8 g .. + 7 of the units [t0, t1): unit t is
// image t / tiles_w, columns (t % tiles_w) TW .. + TW - 1. A step computes TH positions; the
// loads run STAGES steps ahead.
extern "C" __global__ void __launch_bounds__(NT, {MIN_CTAS})
tw_gconv_wgrad_wg(WGRAD_PARAMS WG_MAPS)
{{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // on a 128-byte boundary (TMA; the allocation has 128 bytes of slack then)
    unsigned char* const smem =
        smem_raw + (TMA == 1 ? (128 - smem_u32(smem_raw) % 128) % 128 : 0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = warp >> 2, w4 = warp & 3;
    const int lid = WS ? tid & (LN - 1) : tid;  // its place among the threads that load
    const int c0 = blockIdx.y * CB;
    const int per = (n_tiles + gridDim.x - 1) / gridDim.x, t0 = blockIdx.x * per;
    const int t1 = min(n_tiles, t0 + per), rows = Ho + R - 1;
    // positions are unsigned: a ring slot is u % DYR (a constant: a multiply and a shift)
    const unsigned U = t1 > t0 ? (t1 - t0) * rows : 0, T = (U + TH - 1) / TH;
    const u32 sb = smem_u32(smem);
#if WG_PROBE & 8
    unsigned long long t_begin, t_loop, t_done;
    STAMP(t_begin);
#endif
    // zeros before the first position's window (and everywhere else, for simplicity)
    for (int i = tid; i < NG * GROUP_BYTES / 16; i += NT)
        *(v4u32*)(smem + 16 * i) = v4u32{{0u, 0u, 0u, 0u}};
#if WS
    const u32 full0 = sb + MBAR_OFF, empty0 = full0 + 8 * NSLOT;
    if (tid == 0) {{
        for (int st = 0; st < NSLOT; ++st) {{
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
                         :: "r"(full0 + 8 * st), "r"(TMA == 1 ? 1 : LN));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
                         :: "r"(empty0 + 8 * st), "r"(NG * 128));
        }}
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }}
#endif
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the zeros, for the MMAs
    __syncthreads();
    // this thread's 16-byte pieces of a row (pixel p of group gg), their addresses in the unit
    u32 xs[XJ], ds[DJ];
    int xg[XJ], dg[DJ];
    bool xin[XJ], xv[XJ], din[DJ], dv[DJ];
#pragma unroll
    for (int j = 0; j < XJ; ++j) {{
        const int i = lid + j * LN;
        xin[j] = i < XPIECES && PX(i) < HWD;
#if WG_PROBE & 64  // the probe's load test: a pixel's groups side by side (no MMA reads them)
        xs[j] = sb + X_OFF + i * 16;
#elif STAGED
        xs[j] = sb + STG_OFF + STG_PIECE(PX(i), GR(i)) * 16;
#else
        xs[j] = sb + GR(i) * GROUP_BYTES + X_OFF + PX(i) * 16;
#endif
    }}
#pragma unroll
    for (int j = 0; j < DJ; ++j) {{
        const int i = lid + j * LN;
        din[j] = i < TW * NG;
#if WG_PROBE & 64
        ds[j] = sb + i * 16;
#elif STAGED
        ds[j] = sb + STG_OFF + STG_X + STG_PIECE(PX(i), GR(i)) * 16;
#else
        ds[j] = sb + GR(i) * GROUP_BYTES + PX(i) * 16;
#endif
    }}
    int ln = 0;  // the loading unit's image
    auto set_unit = [&](int t) {{
        ln = t / tiles_w;
        const int cx = (t - ln * tiles_w) * TW;
#pragma unroll
        for (int j = 0; j < XJ; ++j) {{
            const int i = lid + j * LN, col = cx + PX(i) - pad_w;
            xv[j] = xin[j] && col >= 0 && col < Wi;
            xg[j] = xv[j] ? col * C + c0 + 8 * GR(i) : 0;
        }}
#pragma unroll
        for (int j = 0; j < DJ; ++j) {{
            const int i = lid + j * LN, col = cx + PX(i);
            dv[j] = din[j] && col < Wo;
            dg[j] = dv[j] ? col * C + c0 + 8 * GR(i) : 0;
        }}
    }};
    if (U > 0) set_unit(t0);
    unsigned lu = 0;
    int lt = t0, ly = 0;  // the next position to load: its unit and padded row
    auto load_step = [&]() {{
#pragma unroll
        for (int rb = 0; rb < TH; ++rb) {{
            if (lu < U) {{
                const int xr = ly - pad_h;
                if (xr >= 0 && xr < Hi) {{
                    const u16* src = x + ((long long)ln * Hi + xr) * Wi * C;
                    const u32 slot = STAGED ? (lu % SROWS) * STG_ROW : (lu % XR) * X_ROW;
#pragma unroll
                    for (int j = 0; j < XJ; ++j)
                        if (xin[j]) cp_row16(xs[j] + slot, src + xg[j], xv[j] ? 16 : 0);
                }}
                // dy row ly, zeros from Ho on: the rows above the next unit's first
                const bool in = ly < Ho;
                const u16* src = dy + (in ? ((long long)ln * Ho + ly) * Wo * C : 0);
                const int slot = lu % DYR;
#pragma unroll
                for (int j = 0; j < DJ; ++j)
                    if (din[j]) {{
                        const int bytes = in && dv[j] ? 16 : 0;
#if STAGED
                        cp_row16(ds[j] + (lu % SROWS) * STG_ROW, src + dg[j], bytes);
#else
                        cp_row16(ds[j] + slot * DY_ROW, src + dg[j], bytes);
                        if (slot < WIN - 1 && !(WG_PROBE & 256))  // the copy past the ring's end
                            cp_row16(ds[j] + (slot + DYR) * DY_ROW, src + dg[j], bytes);
#endif
                    }}
                ++lu;
                if (++ly == rows) {{
                    ly = 0;
                    if (++lt < t1) set_unit(lt);
                }}
            }}
        }}
    }};
#if TMA == 1
    // one thread: a step's rows by tensor copies onto full barrier ``mbar`` (zeros where a box
    // leaves the tensor: the padding columns and dy's rows from Ho on), its bytes expected first
    auto tma_step = [&](u32 mbar) {{
        u32 bytes = 0;
        unsigned u = lu;
        int y = ly;
#pragma unroll
        for (int rb = 0; rb < TH; ++rb)
            if (u < U) {{
                const int xr = y - pad_h;
                const int dup = u % DYR < WIN - 1;
                bytes += NG * ((xr >= 0 && xr < Hi ? X_BOX : 0) + DY_ROW * (1 + dup));
                ++u;
                if (++y == rows) y = 0;
            }}
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                     :: "r"(mbar), "r"(bytes) : "memory");
#pragma unroll
        for (int rb = 0; rb < TH; ++rb) {{
            if (lu < U) {{
                const int cx = (lt - ln * tiles_w) * TW, xr = ly - pad_h;
                const int slot = lu % DYR;
#pragma unroll
                for (int gg = 0; gg < NG; ++gg) {{
                    const u32 gb = sb + gg * GROUP_BYTES;
                    if (xr >= 0 && xr < Hi)
                        tma_load(gb + X_OFF + (lu % XR) * X_ROW, mbar, &tmap_x, c0 + 8 * gg,
                                 cx - pad_w, xr, ln);
                    tma_load(gb + slot * DY_ROW, mbar, &tmap_dy, c0 + 8 * gg, cx, ly, ln);
                    if (slot < WIN - 1)  // the copy past the ring's end
                        tma_load(gb + (slot + DYR) * DY_ROW, mbar, &tmap_dy, c0 + 8 * gg, cx,
                                 ly, ln);
                }}
                ++lu;
                if (++ly == rows) {{
                    ly = 0;
                    if (++lt < t1) ln = lt / tiles_w;
                }}
            }}
        }}
    }};
#endif
    float acc[4 * S];
#pragma unroll
    for (int i = 0; i < 4 * S; ++i) acc[i] = 0.f;
    float dbs = 0.f;  // bias gradient of channel c0 + 8 g + tid % 8 over this thread's pixels
    // the group's base, lane 0's: warp-uniform to ptxas, so the descriptors are built on the
    // uniform datapath (session 40's probe bit 1024; the default since session 42: the C=64
    // 5x5/7x7 wgrad cells -0.4% to +2.6% by the study's graph replay on an H200)
    const u32 gbase = __shfl_sync(0xffffffffu, sb + g * GROUP_BYTES, 0);
    const int a_blk = 2 * w4 + ((lane >> 3) & 1), a_px = (lane & 7) + 8 * (lane >> 4);
    const u32 a_lane = gbase + a_blk * DY_ROW + a_px * 16;  // + the window's first slot
    unsigned cu = 0;
    int cy = 0;  // the next position to compute and its padded row
    // a step's bias sums and MMAs (TH positions from cu on), not yet committed
    auto compute_step = [&]() {{
#if HAS_BIAS
#pragma unroll
        for (int rb = 0; rb < TH; ++rb)
            if (cu + rb < U) {{
                const u16* row = (const u16*)(smem + g * GROUP_BYTES +
                                              ((cu + rb) % DYR) * DY_ROW);
#pragma unroll
                for (int i = tid & 127; i < TW * 8; i += 128) dbs += to_f32(row[i]);
            }}
#endif
#if A_SMEM
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int rb = 0; rb < TH; ++rb) {{
            const int xr = cy - pad_h;
            if (cu < U && xr >= 0 && xr < Hi) {{
                // descriptors are linear in the address: a k-step on is 256 bytes, 16 units
                const u64 da = desc(gbase + ((cu + DYR - (WIN - 1)) % DYR) * DY_ROW, 128, DY_ROW);
                const u64 db = desc(gbase + X_OFF + (cu % XR) * X_ROW, 128, 16);
#pragma unroll
                for (int kc = 0; kc < KC && !(WG_PROBE & 1); ++kc)
                    wgmma_ss(acc, da + 16 * kc, db + 16 * kc, 1);
            }}
            ++cu;
            if (++cy == rows) cy = 0;
        }}
#else
        // A in registers by ldmatrix.trans, every row of the step before one fence: lane's
        // matrix q = lane / 8 is (M block 2 w4 + (q & 1), columns 8 (q >> 1) .. + 7) of a k-step
        u32 a[TH][KC][4];
        u64 dx[TH];
        bool ok[TH];
#pragma unroll
        for (int rb = 0; rb < TH; ++rb) {{
            const int xr = cy - pad_h;
            ok[rb] = cu < U && xr >= 0 && xr < Hi;
            dx[rb] = desc(gbase + X_OFF + (cu % XR) * X_ROW, 128, 16);
            if (ok[rb]) {{
                const u32 arow = a_lane + ((cu + DYR - (WIN - 1)) % DYR) * DY_ROW;
#pragma unroll
                for (int kc = 0; kc < KC; ++kc)
                    ldsm_x4_t(a[rb][kc][0], a[rb][kc][1], a[rb][kc][2], a[rb][kc][3],
                              arow + 256 * kc);
            }}
            ++cu;
            if (++cy == rows) cy = 0;
        }}
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int rb = 0; rb < TH; ++rb)
            if (ok[rb]) {{
#pragma unroll
                for (int kc = 0; kc < KC; ++kc) wgmma_rs(acc, a[rb][kc], dx[rb] + 16 * kc, 1);
            }}
#endif
    }};
#if RL
    // this warpgroup's group of the step's rows, staging -> the rows its MMAs read (positions
    // from cu on; cu and cy are not advanced here)
    auto relayout_step = [&]() {{
        const int tg = tid & 127;
        const u32 stg = sb + STG_OFF;
        int y = cy;
#pragma unroll
        for (int rb = 0; rb < TH; ++rb) {{
            const unsigned u = cu + rb;
            if (u < U) {{
                const u32 row = stg + (u % SROWS) * STG_ROW;
                const int xr = y - pad_h;
                if (xr >= 0 && xr < Hi) {{
                    const u32 xd = gbase + X_OFF + (u % XR) * X_ROW;
                    for (int p = tg; p < HWD; p += 128)
                        st_sh16(xd + 16 * p, ld_sh16(row + 16 * STG_PIECE(p, g)));
                }}
                const int slot = u % DYR;
                const u32 dd = gbase + slot * DY_ROW;
                for (int p = tg; p < TW; p += 128) {{
                    const v4u32 v = ld_sh16(row + STG_X + 16 * STG_PIECE(p, g));
                    st_sh16(dd + 16 * p, v);
                    if (slot < WIN - 1) st_sh16(dd + DYR * DY_ROW + 16 * p, v);
                }}
            }}
            if (++y == rows) y = 0;
        }}
    }};
#endif
#if PRL
    // this producer thread's own pieces of the next step to re-lay out (positions from ru on),
    // staging -> the MMA rings (group GR(i), pixel PX(i)), once its own cp.async have landed
    unsigned ru = 0;
    int ry = 0;
    auto own_relayout_step = [&]() {{
#pragma unroll
        for (int rb = 0; rb < TH; ++rb) {{
            if (ru < U) {{
                const u32 stg = (ru % SROWS) * STG_ROW;
                const int xr = ry - pad_h;
                if (xr >= 0 && xr < Hi) {{
                    const u32 xd = sb + X_OFF + (ru % XR) * X_ROW;
#pragma unroll
                    for (int j = 0; j < XJ; ++j) {{
                        const int i = lid + j * LN;
                        if (xin[j])
                            st_sh16(xd + GR(i) * GROUP_BYTES + PX(i) * 16,
                                    ld_sh16(xs[j] + stg));
                    }}
                }}
                const int slot = ru % DYR;
#pragma unroll
                for (int j = 0; j < DJ; ++j) {{
                    const int i = lid + j * LN;
                    if (din[j]) {{
                        const v4u32 v = ld_sh16(ds[j] + stg);
                        const u32 dd = sb + GR(i) * GROUP_BYTES + PX(i) * 16;
                        st_sh16(dd + slot * DY_ROW, v);
                        if (slot < WIN - 1) st_sh16(dd + (slot + DYR) * DY_ROW, v);
                    }}
                }}
                ++ru;
                if (++ry == rows) ry = 0;
            }}
        }}
    }};
#endif
#if WS
    // the role from lane 0 of the warp: provably uniform across it, so ptxas keeps the
    // warpgroups' MMAs asynchronous (with `warp == 4 * NG` it serialized them: C7520)
    const int role = __shfl_sync(0xffffffffu, tid / 128, 0);
    if (role == NG) {{  // the producer warps: step t's rows into ring step t % NSLOT
#if PRL
        // loads STAGES - 1 steps ahead into the staging ring; step t re-laid out into MMA ring
        // step t % MR once this thread's own copies of it have landed
#pragma unroll 1
        for (int t = 0; t < STAGES - 1; ++t) {{
            if (!(WG_PROBE & 2)) load_step();
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }}
        for (unsigned t = 0; t < T; ++t) {{
            if (!(WG_PROBE & 2)) load_step();
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1) : "memory");
            const unsigned st = t % MR;
            if (t >= MR) mbar_wait(empty0 + 8 * st, (t / MR - 1) & 1);
            if (!(WG_PROBE & 2)) own_relayout_step();
            // the stores, for the MMAs' reads (async proxy), before the full barrier's release
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                         :: "r"(full0 + 8 * st) : "memory");
        }}
#else
        for (unsigned t = 0; t < T; ++t) {{
            const unsigned st = t % STAGES;
            if (t >= STAGES) mbar_wait(empty0 + 8 * st, (t / STAGES - 1) & 1);
#if TMA == 1
            if (lane == 0) tma_step(full0 + 8 * st);
#else
            if (!(WG_PROBE & 2)) load_step();
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n"
                         :: "r"(full0 + 8 * st) : "memory");
#endif
        }}
#endif
    }} else {{
        for (unsigned t = 0; t < T; ++t) {{
            mbar_wait(full0 + 8 * (t % NSLOT), (t / NSLOT) & 1);
#if RL
            relayout_step();
            // the staging step is read: free for the producer
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                         :: "r"(empty0 + 8 * (t % STAGES)) : "memory");
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" :: "r"(1 + g) : "memory");  // this warpgroup
            compute_step();
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // the step before is done in this warp; once every warp of the group has said so
            // (wgmma groups are per warp), its rows may be rewritten at the next step
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" :: "r"(1 + g) : "memory");
#else
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            compute_step();
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // the step before is done (its MMAs and this thread's reads): its ring step is free
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (t > 0)
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                             :: "r"(empty0 + 8 * ((t - 1) % NSLOT)) : "memory");
#endif
        }}
    }}
#else
#pragma unroll
    for (int t = 0; t < STAGES; ++t) {{
        load_step();
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }}
    for (unsigned t = 0; t < T; ++t) {{
        // every warpgroup's MMAs of the step before are done: the slots loaded below are free
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();
        load_step();
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the MMAs' reads
        __syncthreads();
        compute_step();
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    }}
#endif
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#if WG_PROBE & 8
    STAMP(t_loop);
#endif
    // D row 16 w4 + lane / 4 (+ 8 h): kernel row 7 - 2 w4 - h, out channel lane / 4; column
    // 8 i + 2 (lane % 4) + e: kernel column i, in channel 2 (lane % 4) + e
    const int o = c0 + 8 * g + (lane >> 2);
#if WSLOTS
    // slot blockIdx.x: R x S x C x 8 weight sums, then C bias sums (``gconv_slots``)
    const long long dw_words = (long long)(R * S) * C * 8;
    float* const slot = dw + (long long)blockIdx.x * (dw_words + C);
#endif
    if (warp < 4 * NG) {{  // not the producer
        // 4 in channels an atomic (red.v4, a quarter of the L2 operations of scalar ones: the
        // kernel's tail, session 33): lane pairs swap halves, the even lane takes D row h = 0
        // and the odd one h = 1, both in channels 4 (lane % 4 / 2) .. + 3
        const int odd = lane & 1, r = WIN - 1 - 2 * w4 - odd;
#pragma unroll
        for (int i = 0; i < S; ++i) {{
            const float a0 = acc[4 * i], a1 = acc[4 * i + 1], a2 = acc[4 * i + 2],
                        a3 = acc[4 * i + 3];
            const float s0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : a2, 1);
            const float s1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : a3, 1);
#if WSLOTS
            // slots: the same 4 sums, stored once into this CTA's slot (blockIdx.x; the CTAs of
            // the other channel blocks store the other channels of it)
            if (r < R)
                st_global4(slot + ((long long)(r * S + i) * C + o) * 8 + 4 * ((lane & 3) >> 1),
                           odd ? s0 : a0, odd ? s1 : a1, odd ? a2 : s0, odd ? a3 : s1);
#else
            if (r < R && !(WG_PROBE & 4))
                red_add4(dw + ((long long)(r * S + i) * C + o) * 8 + 4 * ((lane & 3) >> 1),
                         odd ? s0 : a0, odd ? s1 : a1, odd ? a2 : s0, odd ? a3 : s1);
#endif
        }}
#if HAS_BIAS
    dbs += __shfl_xor_sync(0xffffffffu, dbs, 8);
    dbs += __shfl_xor_sync(0xffffffffu, dbs, 16);
#if !WSLOTS
    if (lane < 8) red_add(db + c0 + 8 * g + lane, dbs);
#endif
#endif
    }}
#if WG_PROBE & 8
    __syncthreads();
    STAMP(t_done);
    if (tid == 0 || tid == 4 * NG * 32) {{
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        printf("TL %d %d %d %u %llu %llu %llu %u\n", blockIdx.x, blockIdx.y, tid ? 1 : 0, sm,
               t_begin, t_loop, t_done, U);
    }}
#endif
#if WSLOTS
#if HAS_BIAS
    {{
        // the bias sums of channel c0 + 8 g + lane: the warpgroup's 4 warps' in warp order,
        // through shared memory (every MMA and copy is done once all threads are here)
        float* const red = (float*)smem;
        static_assert(4 * 32 * NG <= NG * GROUP_BYTES, "the sums stay in the groups' rings");
        __syncthreads();
        if (warp < 4 * NG && lane < 8) red[8 * warp + lane] = dbs;
        __syncthreads();
        if (tid < CB) {{
            const float* p = red + 32 * (tid >> 3) + (tid & 7);
            slot[dw_words + c0 + tid] = ((p[0] + p[8]) + p[16]) + p[24];
        }}
    }}
#endif
#if __CUDA_ARCH__ >= 900
    // this CTA's part of its slot is stored: the slot-sum kernel may be launched once every CTA
    // is here (it waits for this grid's end and its writes before reading)
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#else
    finish_wgrad(dw, db, dw_out, db_out, counters, C, c0, tid, (volatile unsigned*)smem);
#endif
}}
"""
)

#: the template ``gconv_cuda.source`` fills in for a wgmma wgrad tile
SOURCE_WWG = _TAP_SOURCE[: _TAP_SOURCE.index("// Persistent CTAs")] + _KERNEL


#: MMA ring steps of the producer re-layout tiles (``tma`` 3): the step computed, the one in
#: flight and the one being written
RELAYOUT_RING_STEPS = 3


def rings(th: int, stages: int, producer: bool = False, tma: int = 0) -> tuple[int, int]:
    """(dy rows, input rows) a group's rings hold: the positions from the window of a step's
    first row to the last row loaded ahead, (stages + 1) x th + 7 and (stages + 1) x th; with a
    producer warp, ``stages`` steps of th rows (+7 for dy); re-laid out from a staging ring by
    the warpgroups (``tma`` 2), the step computed and the one in flight, 2 th (+7); by the
    producers (``tma`` 3), ``RELAYOUT_RING_STEPS`` steps."""
    steps = {2: 2, 3: RELAYOUT_RING_STEPS}.get(tma, stages + (0 if producer else 1))
    live = steps * th
    return live + WINDOW - 1, live


def smem_bytes(
    s: int, tw: int, cb: int, th: int, stages: int, producer: bool = False, tma: int = 0
) -> int:
    """Shared memory of a CTA: per group the dy ring (its first 7 rows twice) and the input
    ring; with a producer warp, a full and an empty mbarrier a ring step; ``tma`` 1, input rows
    on 128-byte boundaries and 128 bytes of slack to align the whole; 2 and 3 (re-layout), the
    staging ring of stages x th rows of all groups."""
    dyr, xr = rings(th, stages, producer, tma)
    x_row = (tw + s - 1) * 16
    x_row = -(-x_row // 128) * 128 if tma == 1 else x_row
    rings_bytes = cb // 8 * ((dyr + WINDOW - 1) * tw * 16 + xr * x_row)
    staging = stages * th * cb // 8 * (tw + s - 1 + tw) * 16 if tma in (2, 3) else 0
    slots = RELAYOUT_RING_STEPS if tma == 3 else stages
    return rings_bytes + staging + (16 * slots if producer else 0) + (128 if tma == 1 else 0)
