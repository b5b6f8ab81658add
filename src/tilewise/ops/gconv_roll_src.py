"""CUDA C++ source of the grouped conv's rolling-row warpgroup-MMA fprop/dgrad kernel
(``CudaTile.roll``, Hopper's ``wgmma.mma_async``, sm_90a; ``ops.gconv_cuda`` compiles it). A
``str.format`` template (``{R}``, ``{S}``, ``{TH}``, ``{CB}``, ``{GW}``, ``{RB}``, ``{D}``,
``{SR}``, ``{MIN_CTAS}``, ``{IS_BF16}``, ``{HAS_BIAS}``, ``{DGRAD}``, ``{WGMMA}``,
``{ABLATE}``; literal braces doubled).

Each input row is read once and meets every kernel row in one set of MMAs, so the weights carry
no Toeplitz zeros (``gconv_wgmma_src``'s B is 30% zeros at 7x7). For input row i of a band and
64 pixels, one warpgroup takes GW (2 or 4) groups of 8 channels, each group:
- M = 64 output pixels: A[x][(s, c)] = in[i][x + s][c], in registers by ``ldmatrix.x4`` (two
  kernel columns a k-step; an odd last column's partner is zero in A, so no zero weight meets an
  input and NaN/Inf land where PyTorch puts them);
- N = 8 R = kernel rows r x 8 out channels: B = the weights, K-major in shared memory;
- the accumulator's block b holds output row o with o = b (mod R) for the whole band: input row
  i adds kernel row r to output row i - r, so block b takes kernel row (i - b) mod R. B's kernel
  rows are stored reversed and twice (2R - 1 blocks), so each phase i mod R is a window of them:
  one descriptor offset, no register moves. Before row i's MMAs, output row i - R is complete in
  block i mod R: copied out, zeroed, staged (bias added, rounded). The row loop is unrolled by R
  so the block is a constant.
MMA work: 16 ceil(S / 2) R multiply-adds an output, 448 at 7x7 (392 useful; the Toeplitz
kernel's 560), 240 at 5x5 (200; 320), 96 at 3x3 (72; 144).
Input rows arrive by TMA, RB rows a slot, in a ring of D slots (``full``/``empty`` mbarriers):
thread 0 refills a slot once every warp has released it (no producer warp: its registers would
cost the consumers theirs). Each warpgroup's staged row leaves by a TMA store behind the
warpgroup's named barrier, issued while the next row's MMAs run. A CTA is persistent over bands
of TH output rows x 64 pixels. Session 36: correct, slower than the other kernels' candidates
(the per-row chain of each warpgroup bounds it: docs/PERF_NOTES.md "Session 36").
"""

from tilewise.ops.gconv_cuda_src import MBAR_WAIT, SMEM_U32
from tilewise.ops.gconv_wgmma_src import DESC, LDSM_X4, PACK2, TMA_FPROP_PARAMS

SOURCE_ROLL = (
    r"""
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define R {R}
#define S {S}
#define TH {TH}
#define TW 64
#define CB {CB}
#define RB {RB}
#define D {D}
#define IS_BF16 {IS_BF16}
#define HAS_BIAS {HAS_BIAS}
#define DGRAD {DGRAD}
// a diagnosis switch (``TILEWISE_ROLL_ABLATE``, never set in use; wrong results, for timing
// what each part costs): 1 no TMA stores (the rows are still staged), 2 no MMAs, 4 no waits for
// the rows' arrival (hangs: the ring's slots are never released in order)
#define ABLATE {ABLATE}
#define NG (CB / 8)
// groups a warpgroup (2 or 4): a pixel's 16 GW bytes leave together, and the per-row
// synchronization serves GW groups' MMAs
#define GW {GW}
#define NCW (4 * (NG / GW))
#define NT (32 * NCW)
#define KS ((S + 1) / 2)
#define KP (2 * KS)
#define HWD (TW + S - 1)
#define PIXB (CB * 2)
#define ROWS_IN (TH + R - 1)
#define CPT ((ROWS_IN + RB - 1) / RB)
#define UP1K(v) (((v) + 1023) / 1024 * 1024)
// a pixel's 16-byte chunk of group g: the TMA's swizzle of PIXB-byte rows (a slot on 1024 bytes)
#define SWZ(p) (((p) * NG / 8) % NG)
#define HOFF(p, g) ((p) * PIXB + 16 * ((g) ^ SWZ(p)))
// B per group: 2R - 1 blocks of kernel rows ((R - 1 - k) mod R), each KP core matrices along K
#define NBLK (2 * R - 1)
#define BG_BYTES (NBLK * KP * 128)
// a slot's rows each start on the swizzle's period (16 CB bytes, at most 1024), so a row's
// ldmatrix offsets are row 0's plus a constant
#define SWP (16 * CB < 1024 ? 16 * CB : 1024)
#define ROWB ((HWD * PIXB + SWP - 1) / SWP * SWP)
#define SLOT_BYTES UP1K(RB * ROWB)
#define OFF_SLOT UP1K(NG * BG_BYTES)
// each warpgroup's staging ring of SR output rows (TW pixels x its 8 GW channels)
#define SR {SR}
#define STG_BYTES UP1K(TW * 16 * GW)
#define OFF_STG (OFF_SLOT + D * SLOT_BYTES)
#define OFF_MBAR (OFF_STG + (NG / GW) * SR * STG_BYTES)  // full, empty (D each), 16 zero bytes
struct __align__(64) TmaDesc {{ unsigned long long v[16]; }};

"""
    + SMEM_U32
    + PACK2
    + DESC
    + LDSM_X4
    + r"""__device__ __forceinline__ u64 dword(u32 lo, u32 hi) {{
    u64 d;
    asm("mov.b64 %0, {{%1, %2}};\n" : "=l"(d) : "r"(lo), "r"(hi));
    return d;
}}
__device__ __forceinline__ void wgmma(float* d, const u32* a, u64 db, int accumulate) {{
{WGMMA}
}}
"""
    + MBAR_WAIT
    + r"""__device__ __forceinline__ void tile_pos(int t, int tiles_h, int tiles_w, int& n, int& y0,
                                         int& x0) {{
    x0 = (t % tiles_w) * TW;
    y0 = ((t / tiles_w) % tiles_h) * TH;
    n = t / (tiles_w * tiles_h);
}}

// Output row ``o`` of the band, in two steps. ``stage_row``: this thread's 2 pixels x 2
// channels of each of its warpgroup's groups (``blk[gl]``), bias added and rounded, into the
// warpgroup's staging row ``ko`` % SR (TW pixels x its 8 GW channels, the TMA's 16 GW-byte
// swizzle), fenced for the TMA; called while no MMA is in flight (the proxy fence might wait
// for them). ``store_row``: after the warpgroup's named barrier, one TMA copy of whole 16 GW-byte
// pixel pieces (rows and pixels past the output clipped by the copy); the leader then lets at most
// SR - 2 copies still read staging (row ko + 1's barrier orders that wait before anyone
// rewrites the row copy ko + 2 - SR read). Session 36: direct 4-byte stores of half sectors
// cost ~90 of 145 us at 7x7, 8-byte stores of whole sectors ~45 of 103.
__device__ __forceinline__ void stage_row(float (*blk)[4], u32 ko, u32 stg, int px, int lane,
                                          const float (*bv)[2]) {{
    const u32 srow = stg + (ko % SR) * STG_BYTES;
#pragma unroll
    for (int gl = 0; gl < GW; ++gl)
#pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int p = px + 8 * h;
            asm volatile("st.shared.u32 [%0], %1;\n"
                         :: "r"(srow + p * 16 * GW + 16 * (gl ^ ((p * GW / 8) % GW)) +
                                4 * (lane & 3)),
                            "r"(pack2(blk[gl][2 * h] + bv[gl][0], blk[gl][2 * h + 1] + bv[gl][1]))
                         : "memory");
        }}
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}}
__device__ __forceinline__ void store_row(int o, u32 ko, u32 stg, int wg,
                                          const TmaDesc* tmap_y, int c0, int x0, int y0, int n) {{
    asm volatile("bar.sync %0, 128;\n" :: "r"(1 + wg) : "memory");
    if ((threadIdx.x & 127) == 0 && !(ABLATE & 1)) {{
        asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                     " [%0, {{%1, %2, %3, %4}}], [%5];\n"
                     :: "l"(tmap_y), "r"(c0 + 8 * GW * wg), "r"(x0), "r"(y0 + o), "r"(n),
                        "r"(stg + (ko % SR) * STG_BYTES)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(SR - 2) : "memory");
    }}
}}

// Slot ``kp`` of this CTA's sequence (input rows RB (kp % CPT) on of its band kp / CPT) into
// ring slot kp % D, once the slot's previous rows are released (``empty``); one thread.
__device__ __forceinline__ void load_slot(u32 kp, u32 slots, u32 full, u32 empty,
                                          const TmaDesc* tmap, int c0, int pad_h, int pad_w,
                                          int tiles_h, int tiles_w, int n_tiles) {{
    const u32 it = kp / CPT, cc = kp - it * CPT;
    const int t = blockIdx.x + it * gridDim.x;
    if (t >= n_tiles) return;
    const u32 slot = kp % D;
    if (kp >= D) mbar_wait(empty + 8 * slot, ((kp / D) - 1) & 1);
    int n, y0, x0;
    tile_pos(t, tiles_h, tiles_w, n, y0, x0);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(full + 8 * slot), "r"(RB * HWD * PIXB) : "memory");
    for (int rr = 0; rr < RB; ++rr)  // a row a copy: rows ROWB apart
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {{%2, %3, %4, %5}}], [%6];\n"
            :: "r"(slots + slot * SLOT_BYTES + rr * ROWB), "l"(tmap), "r"(c0), "r"(x0 - pad_w),
               "r"(y0 - pad_h + (int)cc * RB + rr), "r"(n), "r"(full + 8 * slot)
            : "memory");
}}

// The other NVRTC fprop kernels' signature (``gconv_cuda._TMA_SIGNATURES``): x, y, Wi, Ho, Wo and
// C go unused (the tensor maps carry them).
extern "C" __global__ void __launch_bounds__(NT, {MIN_CTAS})
tw_gconv_fprop_roll"""
    + TMA_FPROP_PARAMS
    + r"""
{{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c0 = blockIdx.y * CB;
    // the swizzled TMA slots need 1024-byte alignment (the host adds the slack)
    const u32 sbase = (smem_u32(smem) + 1023) & ~1023u;
    unsigned char* const sm = smem + (sbase - smem_u32(smem));
    // B: group gg, block k (kernel row (R - 1 - k) mod R), core matrix s (8 out x 8 in
    // channels).
    // Each weight read once, in the weight's own order (coalesced, several loads in flight a
    // thread: the element-by-element gather took ~20% of a 7x7 kernel, Nsight Compute), into
    // its one or two blocks; the padding column s = S (odd S) zeroed.
#if KP > S
    for (int i = tid; i < NG * NBLK * 64; i += NT)
        ((u16*)sm)[(i / 64 * KP + S) * 64 + i % 64] = (u16)0;
#endif
#pragma unroll 4
    for (int i = tid; i < NG * 64 * R * S; i += NT) {{
        const int ss = i % S, rr = (i / S) % R, b = (i / (S * R)) & 7, a = (i / (S * R * 8)) & 7;
        const int gg = i / (S * R * 64);
        const u16 v = w[(long long)(c0 + gg * 8 + a) * ws0 + b * ws1 + rr * ws2 + ss * ws3];
#if DGRAD  // flipped, transposed: the weight's [c][o][R - 1 - r][S - 1 - s]
        const int co = b, ci = a, r = R - 1 - rr, s = S - 1 - ss;
#else
        const int co = a, ci = b, r = rr, s = ss;
#endif
        u16* const bp = (u16*)sm + gg * (NBLK * KP * 64) + s * 64 + co * 8 + ci;
        bp[(R - 1 - r) * KP * 64] = v;  // block R - 1 - r
        if (r > 0) bp[(2 * R - 1 - r) * KP * 64] = v;  // and 2R - 1 - r, within the 2R - 1
    }}
    const u32 full = sbase + OFF_MBAR, empty = full + 8 * D, zero16 = empty + 8 * D;
    if (tid < 4) ((u32*)(sm + OFF_MBAR + 16 * D))[tid] = 0u;  // 16 zero bytes
    if (tid == 0) {{
        for (int k = 0; k < D; ++k) {{
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(full + 8 * k));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
                         :: "r"(empty + 8 * k), "r"(NCW));
        }}
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }}
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const u32 slots = sbase + OFF_SLOT;
    // slots 0 .. D - 2 of the sequence; slot k + D - 1 is issued when slot k's first row starts
    if (tid == 0)
        for (u32 kp = 0; kp + 1 < D; ++kp)
            load_slot(kp, slots, full, empty, &tmap, c0, pad_h, pad_w, tiles_h, tiles_w, n_tiles);
    const int wg = warp >> 2, w4 = warp & 3;
    // B's descriptors at block 0 of this warpgroup's groups; a phase's window and a k-step are
    // constant offsets (16 bytes a unit in the address field, which they never carry out of)
    const u32 dhi = (u32)(desc(sbase, 128, KP * 128) >> 32);
    u32 dlo[GW];
    // this lane's ldmatrix rows: matrix q = lane / 8 (pixels + 8 for odd q, kernel column + 1
    // for q > 1), k-step j (columns 2j, 2j + 1), in a slot's row 0
    const int q = lane >> 3, lm = 16 * w4 + (lane & 7) + 8 * (q & 1) + (q >> 1);
    u32 aoff[GW][KS];
    float bv[GW][2];
#pragma unroll
    for (int gl = 0; gl < GW; ++gl) {{
        const int g = wg * GW + gl;
        dlo[gl] = (u32)desc(sbase + g * BG_BYTES, 128, KP * 128);
#pragma unroll
        for (int j = 0; j < KS; ++j) aoff[gl][j] = slots + HOFF(lm + 2 * j, g);
#if HAS_BIAS
        bv[gl][0] = bias[c0 + 8 * g + 2 * (lane & 3)];
        bv[gl][1] = bias[c0 + 8 * g + 2 * (lane & 3) + 1];
#else
        bv[gl][0] = bv[gl][1] = 0.f;
#endif
    }}
    const int px = 16 * w4 + (lane >> 2);
    const u32 stg = sbase + OFF_STG + wg * SR * STG_BYTES;
    float acc[GW][4 * R];
    u32 a[GW][KS][4];
    u32 k = 0;  // this CTA's slot sequence (``load_slot``'s kp)
    u32 ko = 0;  // this warpgroup's stored rows (``store_row``'s ko)
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        int n, y0, x0;
        tile_pos(t, tiles_h, tiles_w, n, y0, x0);
        const int yi0 = y0 - pad_h;
#pragma unroll
        for (int gl = 0; gl < GW; ++gl)
#pragma unroll
            for (int e = 0; e < 4 * R; ++e)
                asm volatile("mov.b32 %0, 0f00000000;\n" : "=f"(acc[gl][e]));
        // Row i: row i - 1's MMAs awaited; output row i - R (finished in block i mod R) taken
        // out, zeroed and staged; group by group, row i's A loaded and its MMAs issued; then the
        // staged row stored (barrier, TMA copy) while they run.
        for (int i0 = 0; i0 < ROWS_IN; i0 += R) {{
#pragma unroll
            for (int ph = 0; ph < R; ++ph) {{
                const int i = i0 + ph;
                if (i < ROWS_IN) {{
                    const u32 kk = k + (u32)i / RB, slot = kk % D;
                    if (i > 0 && (u32)(i - 1) % RB == RB - 1) {{
                        // row i - 1 ended its slot: its A was read (ldmatrix) before its MMAs
                        // were issued
                        __syncwarp();
                        if (lane == 0)
                            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                                         :: "r"(empty + 8 * ((kk - 1) % D)) : "memory");
                    }}
                    if ((u32)i % RB == 0) {{
                        // once every warp has released slot kk - 1, it takes slot kk + D - 1
                        if (tid == 0)
                            load_slot(kk + D - 1, slots, full, empty, &tmap, c0, pad_h, pad_w,
                                      tiles_h, tiles_w, n_tiles);
                        if (!(ABLATE & 4)) mbar_wait(full + 8 * slot, (kk / D) & 1);
                    }}
                    const bool live = (u32)(yi0 + i) < (u32)Hi;  // else zeros: skipped
                    const u32 row = slot * SLOT_BYTES + ((u32)i % RB) * ROWB;
                    // row i - 1's MMAs awaited; its finished output row i - R (block i mod R)
                    // copied out and zeroed by opaque moves before row i's MMAs (else the
                    // compiler moves them into the store's branch or between the MMAs, and
                    // ptxas serializes every wgmma: C7518, C7515)
                    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    float done[GW][4];
#pragma unroll
                    for (int gl = 0; gl < GW; ++gl)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {{
                            asm volatile("mov.b32 %0, %1;\n"
                                         : "=f"(done[gl][e]) : "f"(acc[gl][4 * ph + e]));
                            asm volatile("mov.b32 %0, 0f00000000;\n" : "=f"(acc[gl][4 * ph + e]));
                        }}
                    if (i >= R) stage_row(done, ko + i - R, stg, px, lane, bv);
#pragma unroll
                    for (int gl = 0; gl < GW; ++gl) {{
                        if (live && !(ABLATE & 2)) {{
#pragma unroll
                            for (int j = 0; j < KS; ++j) {{
                                u32 at = aoff[gl][j] + row;
#if S % 2
                                // the last k-step's second column: zeros, loaded (zeros written
                                // into the registers land between the MMAs: ptxas C7515)
                                if (j == KS - 1 && q >= 2) at = zero16;
#endif
                                ldsm_x4(a[gl][j], at);
                            }}
                            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                            // phase ph: blocks b take kernel rows (ph - b) mod R, B's window
                            // from block R - 1 - ph
#pragma unroll
                            for (int j = 0; j < KS; ++j)
                                wgmma(acc[gl], a[gl][j],
                                      dword(dlo[gl] + ((R - 1 - ph) * KP + 2 * j) * 8, dhi), 1);
                            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                        }}
                    }}
                    if (i >= R)  // output row i - R, staged above
                        store_row(i - R, ko + i - R, stg, wg, &tmap_y, c0, x0, y0, n);
                }}
            }}
        }}
        // the last row's MMAs, its slot, and output row TH - 1 (block ROWS_IN mod R)
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncwarp();
        if (lane == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                         :: "r"(empty + 8 * ((k + (ROWS_IN - 1) / RB) % D)) : "memory");
        float last[GW][4];
#pragma unroll
        for (int gl = 0; gl < GW; ++gl)
#pragma unroll
            for (int e = 0; e < 4; ++e) last[gl][e] = acc[gl][4 * (ROWS_IN % R) + e];
        stage_row(last, ko + TH - 1, stg, px, lane, bv);
        store_row(TH - 1, ko + TH - 1, stg, wg, &tmap_y, c0, x0, y0, n);
        k += CPT;
        ko += TH;
    }}
    if ((tid & 127) == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}}
"""
)
