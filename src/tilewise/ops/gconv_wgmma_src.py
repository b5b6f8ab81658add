"""CUDA C++ source of the grouped conv's warpgroup-MMA fprop/dgrad kernel (``CudaTile.wgmma``,
Hopper's ``wgmma.mma_async``, sm_90a; ``ops.gconv_cuda`` compiles it). A ``str.format`` template
(``{R}``, ``{S}``, ``{TH}``, ``{CB}``, ``{HS}``, ``{NST}``: halo stages, ``{GL}``, ``{AS}``,
``{BR}``, ``{MIN_CTAS}``, ``{IS_BF16}``, ``{HAS_BIAS}``, ``{DGRAD}``, ``{WGMMA}``, ``{ABLATE}``;
literal braces doubled).

HS warpgroups per group of 8 channels, each taking TH / HS of the tile's rows (its own bands of
BR rows and the row pairs they read from the CTA's one halo), or (GL > 1, session 38) each
warpgroup GL groups in turn, a group's epilogue under the next one's first wgmmas; a CTA tile is
TH output rows x 64 pixels x CB channels.
- M = 64 pixels of a row: the A operand in registers, one ``ldmatrix.x4`` per warp (16 pixels x
  2 input rows x 8 channels) from the TMA's swizzled, pixel-major halo;
- N = 8 BR = BR output rows (4, or 2: session 38) x 8 out channels: one accumulator block a band;
- K = 16 = 2 input rows x 8 in channels. B (the weights, shared memory) is Toeplitz in (input row,
  output row): its 8 x 8 core matrix (input row jj, band row nb) is W[r = 2j + jj + nb - (BR - 1)]
  for k-step j, the band's rows reversed; with a kernel column's W[r] core matrices stored in order
  (zeros around them) the descriptor's K and N strides are both 128 bytes. An A fragment (kernel
  column, input row pair) feeds every band whose window covers it; AS sets of them
  (``CudaTile.asets``) rotate, a set reloaded once the wgmmas of the column AS back completed.
MMA work per output: 16 S ceil((R + BR - 1) / 2) multiply-adds: with 4-row bands 560 at 7x7 (392
useful), 320 at 5x5; with 2-row bands 448 and 240. Zeros pair with inputs outside an output's window
(0 * Inf): a tile whose outputs are not all finite is recomputed exactly from the halo it was
computed from, by per-tap MMAs (``mma.sync``, two taps a k-step, the weights from B's copy), which
pair no zero weight with an input (session 35; before, an output-by-output loop ran 65-190x slower
than finite inputs at 5x5 and 7x7 when the inputs held Inf).
"""

from tilewise.ops.gconv_cuda_src import MBAR_WAIT, SMEM_U32

#: a shared-memory matrix descriptor without swizzle (``str.format`` text: braces doubled);
#: the warpgroup-MMA kernels' B operand, K-major or MN-major alike (the K stride in the
#: descriptor's leading field: session 31's wgrad prototype checked both orders)
DESC = (
    "// a matrix descriptor, no swizzle: 8 x 16-byte core matrices, ``kstride`` bytes "
    r"""apart along K,
// ``nstride`` along N
__device__ __forceinline__ u64 desc(u32 addr, u32 kstride, u32 nstride) {{
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(kstride >> 4) << 16) |
           ((u64)(nstride >> 4) << 32);
}}
"""
)

#: a float pair rounded to the kernel's half type, packed (``str.format`` text); the wgmma
#: kernels' epilogues
PACK2 = r"""__device__ __forceinline__ u32 pack2(float a, float b) {{
    u32 r;
#if IS_BF16
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(a), "f"(b));
#else
    asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(a), "f"(b));
#endif
    return r;
}}
"""
#: one ``ldmatrix.x4`` into four registers (``str.format`` text)
LDSM_X4 = r"""__device__ __forceinline__ void ldsm_x4(u32* a, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}}
"""

#: the parameter list of the warpgroup-MMA fprop kernels (``str.format`` text): the NVRTC fprop
#: kernels' signature with both tensor maps (``gconv_cuda._TMA_SIGNATURES[2]``)
TMA_FPROP_PARAMS = r"""(const u16* __restrict__ x, const u16* __restrict__ w,
                  const float* __restrict__ bias, u16* __restrict__ y, int Hi, int Wi, int Ho,
                  int Wo, int C, int pad_h, int pad_w, int tiles_h, int tiles_w, int n_tiles,
                  int ws0, int ws1, int ws2, int ws3, const __grid_constant__ TmaDesc tmap,
                  const __grid_constant__ TmaDesc tmap_y)"""

SOURCE_WG = (
    r"""
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define R {R}
#define S {S}
#define TH {TH}
#define TW 64
#define CB {CB}
#define IS_BF16 {IS_BF16}
#define HAS_BIAS {HAS_BIAS}
#define DGRAD {DGRAD}
#define HS {HS}
#define NST {NST}
#define BR {BR}  // output rows a band (N = 8 BR: 4, or 2 with fewer Toeplitz zeros)
#if BR != 2 && BR != 4
#error "the wgmma kernel takes bands of 2 or 4 rows"
#endif
#define GL {GL}  // groups of 8 channels a warpgroup takes in turn (HS 1 only)
#define GRP(gw, k) ((gw) + (k) * (NG / GL))  // warpgroup gw's k-th group
#define AS {AS}  // sets of A fragments (CudaTile.asets)
#if AS < 2 || AS > 3
#error "the wgmma kernel takes 2 or 3 sets of A fragments"
#endif
#if NST < 2 || NST > 3  // first_halos and the loop's stage arithmetic are written for 2 or 3
#error "the wgmma kernel takes 2 or 3 halo stages"
#endif
// a diagnosis switch (``TILEWISE_WG_ABLATE``, never set in use; wrong results, for timing only):
// 1 skips the epilogue's staging writes and the TMA store (the non-finite check still reads the
// accumulators, so the wgmmas stay), 2 the wgmmas (ptxas drops the ldmatrix loads then too, and
// the epilogue stores garbage unchecked), 3 both: the halo loads alone; 4 issues the first
// halos after the weights are staged (the order before session 37); 8 loads no halos (the MMAs
// read whatever the stages hold; the non-finite check is read, not acted on): 9, the MMAs and
// the epilogue's arithmetic alone; 16 (results exact) keeps the descriptor base opaque per tile
// in vector registers, the form before session 40; 32 (exact) issues a column's wgmmas by A
// fragment, the order before session 40; 64 loads A for the first AS columns only (the later
// columns reuse those fragments: whether the per-column loads and the fence's wait for them
// bound the MMA phase), 128 with 64 also drops the per-column wait_group (as session 30's rate
// probe: only the wgmmas' own queue between them); 256, 512 (exact) delay some CTAs' start;
// 1024 (exact) stores the output tile by st.global instead of the TMA store
#define ABLATE {ABLATE}
#define NG (CB / 8)
#define NT (128 * NG * HS / GL)
#define NB (TH / BR)
#define NBW (NB / HS)
#define J ((R + BR) / 2)
#define IP ((TH + R) / 2)
#define IPW (BR / 2 * (NBW - 1) + J)
#define HH (2 * IP)
#define HWD (TW + S - 1)
#define PIXB (CB * 2)
#define UP1K(v) (((v) + 1023) / 1024 * 1024)
// a pixel's 16-byte chunk of group g: the TMA's swizzle of PIXB-byte rows (a stage on 1024 bytes)
#define SWZ(p) (((p) * NG / 8) % NG)
#define HOFF(p, g) ((p) * PIXB + 16 * ((g) ^ SWZ(p)))
// B: per group, per kernel column s, core matrices W[r][s] (8 out x 8 in) at
// s * SPB + BR - 1 + r
#define SPB (2 * J + BR - 1)
#define B_BYTES (S * SPB * 128)
#define OFF_HALO UP1K(NG * B_BYTES)
#define HALO_BYTES UP1K(HH * HWD * PIXB)
#define OFF_STG (OFF_HALO + NST * HALO_BYTES)
#define OFF_MBAR (OFF_STG + UP1K(TH * TW * PIXB))
#if IS_BF16
#define EXP_MASK2 0x7f807f80u
#define EXP_ONE2 0x00800080u
#else
#define EXP_MASK2 0x7c007c00u
#define EXP_ONE2 0x04000400u
#endif
struct __align__(64) TmaDesc {{ unsigned long long v[16]; }};

"""
    + SMEM_U32
    + PACK2
    + DESC
    + LDSM_X4
    + r"""__device__ __forceinline__ u32 lds_u32(u32 addr) {{
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}}
// the exact path's MMA: D[16 x 8] += A[16 x 16] (registers) x B[16 x 8] (b0, b1)
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {{
#if IS_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                 "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}
__device__ __forceinline__ void wgmma(float* d, const u32* a, u64 db, int accumulate) {{
{WGMMA}
}}
"""
    + MBAR_WAIT
    + r"""// weight [o][c][r][s] of this conv (dgrad: flipped, transposed)
__device__ __forceinline__ u16 wval(const u16* __restrict__ w, int gc, int o, int c, int r,
                                    int s, int ws0, int ws1, int ws2, int ws3) {{
#if DGRAD
    return w[(long long)(gc + c) * ws0 + o * ws1 + (R - 1 - r) * ws2 + (S - 1 - s) * ws3];
#else
    return w[(long long)(gc + o) * ws0 + c * ws1 + r * ws2 + s * ws3];
#endif
}}
__device__ __forceinline__ void tile_pos(int t, int tiles_h, int tiles_w, int& n, int& y0,
                                         int& x0) {{
    x0 = (t % tiles_w) * TW;
    y0 = ((t / tiles_w) % tiles_h) * TH;
    n = t / (tiles_w * tiles_h);
}}
// tile t's halo rows into ``dst``, completing on ``mbar``; one thread
__device__ __forceinline__ void tma_halo(u32 dst, u32 mbar, const TmaDesc* map, int t, int c0,
                                         int pad_h, int pad_w, int tiles_h, int tiles_w) {{
    int n, y0, x0;
    tile_pos(t, tiles_h, tiles_w, n, y0, x0);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(mbar), "r"(HH * HWD * PIXB) : "memory");
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {{%2, %3, %4, %5}}], [%6];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(x0 - pad_w), "r"(y0 - pad_h), "r"(n),
                    "r"(mbar)
                 : "memory");
}}
// the first NST - 1 tiles' halos into stages 0 .. NST - 2; one thread
__device__ __forceinline__ void first_halos(u32 halo, u32 mbar, const TmaDesc* map, int c0,
                                            int pad_h, int pad_w, int tiles_h, int tiles_w,
                                            int n_tiles) {{
    if (blockIdx.x < n_tiles)
        tma_halo(halo, mbar, map, blockIdx.x, c0, pad_h, pad_w, tiles_h, tiles_w);
#if NST == 3
    if (blockIdx.x + gridDim.x < n_tiles)
        tma_halo(halo + HALO_BYTES, mbar + 8, map, blockIdx.x + gridDim.x, c0, pad_h, pad_w,
                 tiles_h, tiles_w);
#endif
}}

// A tile whose outputs are not all finite, recomputed exactly: each output sums only its own
// window (PyTorch's NaN/Inf pattern). Each warpgroup redoes its group's outputs (B's copy of
// its weights) in units of 16 pixels x 8 channels a warp, by per-tap MMAs
// (mma.sync, two taps a k-step; an odd last tap pairs zeros with zeros) from the tile's halo at
// ``hs``: no zero weight meets an input outside the window.
__device__ __forceinline__ void exact_tile(u32 sbase, u32 hs, u32 stg,
                                           const float* __restrict__ bias, int c0) {{
    // the thread index read here (opaque), so nothing this path derives from it is hoisted
    // into the main loop's registers
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    const int lane = tid & 31, warp = tid >> 5, mq = lane >> 3, ci = 2 * (lane & 3);
    const int wl = ((warp >> 2) % HS) * 4 + (warp & 3);
#pragma unroll 1
    for (int k = 0; k < GL; ++k) {{
        const int g = GRP((warp >> 2) / HS, k);
        // B word: out channel lane / 4, in channels ci, ci + 1
        const u32 wb = sbase + g * B_BYTES + (lane >> 2) * 16 + ci * 2;
#if HAS_BIAS
        const float bv0 = bias[c0 + 8 * g + ci], bv1 = bias[c0 + 8 * g + ci + 1];
#else
        const float bv0 = 0.f, bv1 = 0.f;
#endif
#pragma unroll 1
        for (int u = wl; u < TH * (TW / 16); u += 4 * HS) {{
            const int row = u % TH, xb = u / TH;
            const int mpx = 16 * xb + (lane & 7) + 8 * (mq & 1);  // this lane's A row
            float d[4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll 1
            for (int t = 0; t < R * S; t += 2) {{
                const int tb = t + 1 < R * S ? t + 1 : t, tl = (mq >> 1) ? tb : t;
                u32 a[4];
                ldsm_x4(a, hs + HOFF((row + tl / S) * HWD + mpx + tl % S, g));
                const u32 b0 = lds_u32(wb + ((t % S) * SPB + BR - 1 + t / S) * 128);
                u32 b1 = lds_u32(wb + ((tb % S) * SPB + BR - 1 + tb / S) * 128);
                if (tb == t) a[2] = a[3] = b1 = 0u;
                mma16816(d, a, b0, b1);
            }}
            // D rows lane / 4 (+ 8): pixels 16 xb + lane / 4 (+ 8); cols: channels ci, ci + 1
            const int px = 16 * xb + (lane >> 2);
#pragma unroll
            for (int h = 0; h < 2; ++h)
                asm volatile("st.shared.u32 [%0], %1;\n"
                             :: "r"(stg + HOFF(row * TW + px + 8 * h, g) + 2 * ci),
                                "r"(pack2(d[2 * h] + bv0, d[2 * h + 1] + bv1))
                             : "memory");
        }}
    }}
}}

// ABLATE & 1024 (exact; session 41): the staged tile leaves by 16-byte st.global from every
// thread (8 channels of a pixel each, the pixels' chunks in order), clipped at the image's edge,
// instead of one TMA store: whether the TMA unit serializes the halo loads behind the stores
__device__ __forceinline__ void store_tile_lsu(u32 stg, u16* __restrict__ y, int t, int Ho,
                                               int Wo, int C, int c0, int tiles_h, int tiles_w,
                                               int tid) {{
    int n, y0, x0;
    tile_pos(t, tiles_h, tiles_w, n, y0, x0);
#pragma unroll 4
    for (int i = tid; i < TH * TW * NG; i += NT) {{
        const int g = i % NG, p = i / NG, row = p / TW, col = p % TW;
        if (y0 + row < Ho && x0 + col < Wo) {{
            u32 v0, v1, v2, v3;
            asm volatile("ld.shared.v4.u32 {{%0, %1, %2, %3}}, [%4];\n"
                         : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(stg + HOFF(p, g)));
            u16* dst = y + (((long long)n * Ho + y0 + row) * Wo + x0 + col) * C + c0 + 8 * g;
            asm volatile("st.global.v4.u32 [%0], {{%1, %2, %3, %4}};\n"
                         :: "l"(dst), "r"(v0), "r"(v1), "r"(v2), "r"(v3) : "memory");
        }}
    }}
}}

// the previous tile's output copy has read the staging tile (every thread, at once)
__device__ __forceinline__ void staging_free(int tid) {{
    if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    __syncthreads();
}}
// a group's accumulators, plus bias, rounded into the staging tile at ``dst`` (this warpgroup's
// first row). Band b's D: rows 16 w4 + lane / 4 (+ 8) = pixels; cols 8 i + 2 (lane % 4) (+ 1):
// band row BR - 1 - i, out channels 2 (lane % 4) (+ 1). Returns bit 15 or 31 set where a rounded
// output's exponent is all ones (Inf or NaN, an fp32 overflow included).
__device__ __forceinline__ u32 epilogue(const float (&acc)[NBW][4 * BR], u32 dst, int g, int lane,
                                        int w4, float bv0, float bv1) {{
    u32 flag = 0;
#pragma unroll
    for (int b = 0; b < NBW; ++b)
#pragma unroll
        for (int i = 0; i < BR; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {{
                const int p = (BR * b + BR - 1 - i) * TW + 16 * w4 + (lane >> 2) + 8 * h;
                const float* d = acc[b] + 4 * i + 2 * h;
                const u32 v = pack2(d[0] + bv0, d[1] + bv1);
                if (!(ABLATE & 2)) flag |= (v & EXP_MASK2) + EXP_ONE2;
                if (ABLATE & 1) continue;
                asm volatile("st.shared.u32 [%0], %1;\n"
                             :: "r"(dst + HOFF(p, g) + 4 * (lane & 3)), "r"(v)
                             : "memory");
            }}
    return flag;
}}

extern "C" __global__ void __launch_bounds__(NT, {MIN_CTAS})
tw_gconv_fprop_wg"""
    + TMA_FPROP_PARAMS
    + r"""
{{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gw = (warp >> 2) / HS, w4 = warp & 3;  // groups GRP(gw, k), k < GL
    // this warpgroup's bands hb0 .. hb0 + NBW - 1 read the halo from input row BR hb0 on and
    // write the staging tile from output row BR hb0 on: whole swizzle periods (tile_ok)
    const int hb0 = ((warp >> 2) % HS) * NBW;
    const u32 halo_row0 = BR * hb0 * HWD * PIXB, out_row0 = BR * hb0 * TW * PIXB;
    const int c0 = blockIdx.y * CB;
    // the swizzled TMA stages need 1024-byte alignment (the host adds the slack)
    const u32 sbase = (smem_u32(smem) + 1023) & ~1023u;
    unsigned char* const sm = smem + (sbase - smem_u32(smem));
    const u32 mbar = sbase + OFF_MBAR;
    // the first NST - 1 tiles' halos, one a stage, on their way before the weights are gathered
    // (session 37; ABLATE & 4: after them, as before)
    if (tid == 0) {{
#pragma unroll
        for (int k = 0; k < NST; ++k)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(mbar + 8 * k));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // for the TMA unit
        // 256 / 512 (exact; session 41): the odd CTAs' first halos leave up to ~2 us later /
        // CTA b's (b % 4) x up to ~0.7 us later (__nanosleep sleeps 0 to 2x what it is asked,
        // thread 0 only, under the weight gather), so the SMs' load and store phases need not
        // stay in step
        if (ABLATE & 256 && blockIdx.x & 1) __nanosleep(2000);
        if (ABLATE & 512) __nanosleep((blockIdx.x & 3) * 700);
        if (!(ABLATE & 12))
            first_halos(sbase + OFF_HALO, mbar, &tmap, c0, pad_h, pad_w, tiles_h, tiles_w,
                        n_tiles);
    }}
    for (int i = tid; i < NG * S * SPB * 64; i += NT) {{
        const int ci = i & 7, co = (i >> 3) & 7, m = (i >> 6) % (S * SPB);
        const int gg = i / (64 * S * SPB), s = m / SPB, r = m % SPB - (BR - 1);
        ((u16*)sm)[i] = (r >= 0 && r < R)
                            ? wval(w, c0 + gg * 8, co, ci, r, s, ws0, ws1, ws2, ws3) : (u16)0;
    }}
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (tid == 0 && (ABLATE & 12) == 4)
        first_halos(sbase + OFF_HALO, mbar, &tmap, c0, pad_h, pad_w, tiles_h, tiles_w, n_tiles);
    const u32 bg = sbase + gw * B_BYTES;
    // this lane's ldmatrix row: matrix q = lane / 8 (pixels + 8 for odd q, input row + 1 for
    // q > 1)
    const int q = lane >> 3, lm = 16 * w4 + (lane & 7) + 8 * (q & 1), ljj = q >> 1;
    float bv[GL][2];
#pragma unroll
    for (int k = 0; k < GL; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            bv[k][h] = HAS_BIAS ? bias[c0 + 8 * GRP(gw, k) + 2 * (lane & 3) + h] : 0.f;
    const u32 stg = sbase + OFF_STG;
    // GL > 1: two accumulator sets, so a group's epilogue runs under the next group's wgmmas
    float acc[GL > 1 ? 2 : 1][NBW][4 * BR];
    int it = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++it) {{
#if NST == 2  // as before session 37 (the general form costs the tightest tiles a spill)
        const int buf = it & 1, tn = t + gridDim.x, nxt = buf ^ 1, parity = (it >> 1) & 1;
#else
        const int buf = it % NST, tn = t + (NST - 1) * gridDim.x, nxt = (it + NST - 1) % NST;
        const int parity = (it / NST) & 1;
#endif
        // stage nxt was last read by the tile before, which every warp has finished
        if (tid == 0 && tn < n_tiles && !(ABLATE & 8))
            tma_halo(sbase + OFF_HALO + nxt * HALO_BYTES, mbar + 8 * nxt, &tmap, tn, c0, pad_h,
                     pad_w, tiles_h, tiles_w);
        if (!(ABLATE & 8)) mbar_wait(mbar + 8 * buf, parity);
        const u32 hb = sbase + OFF_HALO + buf * HALO_BYTES;
        // the descriptors' base, lane 0's: warp-uniform to ptxas, so the descriptor arithmetic
        // runs on the uniform datapath (session 40); ABLATE & 16, opaque per tile as before
        u32 bgt;
        if (ABLATE & 16)
            asm volatile("mov.b32 %0, %1;\n" : "=r"(bgt) : "r"(bg));
        else
            bgt = __shfl_sync(0xffffffffu, bg, 0);
        // A fragments in AS sets by running kernel column c (over the warpgroup's groups): a
        // set is reloaded once the wgmmas of the column AS back have completed (wait_group)
        u32 a[AS][IPW][4];
        u32 flag = 0;
#pragma unroll
        for (int k = 0; k < GL; ++k) {{
            const int g = GRP(gw, k);
            const u32 bk = bgt + (g - gw) * B_BYTES;
            // descriptors are linear in the address (shared addresses < 2^18 never carry out of
            // the 14-bit field): one made a group, the rest by an add
            const u64 dk = desc(bk, 128, 128);
#pragma unroll
            for (int s = 0; s < S; ++s) {{
                const int c = k * S + s;
                if (c >= AS && !(ABLATE & 128))
                    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(AS - 1) : "memory");
                if (c < AS || !(ABLATE & 64))
#pragma unroll
                    for (int ip = 0; ip < IPW; ++ip)
                        ldsm_x4(a[c % AS][ip],
                                hb + halo_row0 + HOFF((2 * ip + ljj) * HWD + lm + s, g));
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                // band-major by Toeplitz row j, so consecutive wgmmas take other accumulators
                // (a wgmma on the accumulator just written waits for it: session 30's probe,
                // one accumulator against two); ABLATE & 32, by A fragment as before session 40
#pragma unroll
                for (int o = 0; o < IPW * NBW; ++o) {{
                    const int ip = (ABLATE & 32) ? o / NBW : o / NBW + BR / 2 * (o % NBW);
                    const int b = o % NBW, j = ip - BR / 2 * b;
                    if (ip < IPW && j >= 0 && j < J && !(ABLATE & 2))
                        wgmma(acc[k & 1][b], a[c % AS][ip],
                              dk + (s * SPB + 2 * j) * 8, s > 0 || j > 0);
                }}
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                // the group before's wgmmas have completed by column AS - 1's wait: its
                // epilogue runs under this group's first columns
                if (k > 0 && s == (S < AS ? S : AS) - 1) {{
                    if (S < AS) asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                    if (k == 1) staging_free(tid);
                    flag |= epilogue(acc[(k - 1) & 1], stg + out_row0, GRP(gw, k - 1), lane, w4,
                                     bv[k - 1][0], bv[k - 1][1]);
                }}
            }}
        }}
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (GL == 1) staging_free(tid);
        flag |= epilogue(acc[(GL - 1) & 1], stg + out_row0, GRP(gw, GL - 1), lane, w4,
                         bv[GL - 1][0], bv[GL - 1][1]);
        if (__syncthreads_or((flag & 0x80008000u) != 0u) && !(ABLATE & 8)) {{
            exact_tile(sbase, hb, stg, bias, c0);
            __syncthreads();
        }}
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (ABLATE & 1024) {{
            if (!(ABLATE & 1)) store_tile_lsu(stg, y, t, Ho, Wo, C, c0, tiles_h, tiles_w, tid);
        }} else if (tid == 0 && !(ABLATE & 1)) {{
            int n, y0, x0;
            tile_pos(t, tiles_h, tiles_w, n, y0, x0);
            asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                         " [%0, {{%1, %2, %3, %4}}], [%5];\n"
                         :: "l"(&tmap_y), "r"(c0), "r"(x0), "r"(y0), "r"(n), "r"(stg)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }}
    }}
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}}
"""
)


def wgmma_asm(bf16: bool, n: int = 32, trans_b: bool = False, a_desc: bool = False) -> str:
    """A ``wgmma`` body: m64nNk16 (this kernel: N = 8 BR), A (4 registers) from ``a``, B by
    descriptor (``trans_b``: MN-major), accumulating unless ``accumulate`` is 0. ``a_desc``: A by
    descriptor ``da`` too, MN-major (the wgrad kernel, ``gconv_wgrad_wg_src``)."""
    k = n // 2  # accumulator registers a thread; A's operands follow them
    regs = ", ".join(f"%{i}" for i in range(k))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(k))
    ty = "bf16" if bf16 else "f16"
    op = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty}"
    if a_desc:
        a_ops, ins, last, trans = f"%{k}", '"l"(da), "l"(db), "r"(accumulate)', k + 2, "1, "
    else:
        a_ops = f"{{%{k}, %{k + 1}, %{k + 2}, %{k + 3}}}"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate)'
        last, trans = k + 5, ""
    return (
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{last}, 0;\\n"\n'
        f'        "{op} {{{regs}}}, {a_ops}, %{last - 1}, p, 1, 1, '
        f'{trans}{int(trans_b)};\\n}}\\n"\n'
        f"        : {outs} : {ins});"
    )
