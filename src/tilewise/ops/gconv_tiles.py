"""The grouped conv's NVRTC launch shapes (``CudaTile``) and the tile tables the autotuner
times: fprop/dgrad (tap, row-pair, TMA, wide-kernel, tall and warpgroup-MMA tiles) and wgrad
(tap, TMA, cluster, row-split and warpgroup-MMA tiles), each table with what measured it in or
out. ``ops.gconv_cuda`` holds the rules (``tile_ok``, ``wgrad_tile_ok``), the candidates and the
launches, and re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CudaTile:
    """Launch shape of the NVRTC kernel: an output tile of ``th`` x ``tw`` pixels by ``cb`` channels
    per CTA, ``warps`` warps (each owning ``th * tw / (16 * warps)`` 16-pixel rows). ``rowpair``:
    the row-pair fprop/dgrad kernel instead (weights as A in registers; warps = groups x column
    splits). ``cluster`` (wgrad, tap kernel only): one thread-block cluster of that many CTAs per
    channel block, summing through distributed shared memory (0: persistent CTAs and fp32 atomics).
    ``sumk`` (TMA tap wgrad, persistent CTAs): clusters of that many CTAs (2 or 4) add up their
    sums through distributed shared memory before the atomics, each sending a 1 / sumk share.
    ``slots`` (tap wgrad, persistent CTAs, one warp a group; since session 50 the warpgroup
    wgrad): each CTA stores its sums into its own slot (plain stores; no atomics, count or
    finish; the warpgroup wgrad's CTAs of one column, one a channel block, share a slot, each
    storing its channels) and a dependent slot-sum kernel adds the slots up in a fixed order
    (``gconv_slots``): a deterministic wgrad.
    ``tma`` (row-pair fprop/dgrad; the tap wgrad): 1, the halo tiles (wgrad: and the dy tiles)
    arrive by Hopper's tensor copy (one ``cp.async.bulk.tensor`` per tile into a swizzled dense
    buffer) instead of per-chunk ``cp.async``; 2 (fprop/dgrad), the output tiles leave by it too.
    ``tap_rows`` (wgrad, tap kernel, no TMA): each CTA takes that many of the kernel's rows of taps
    (a divisor of R; 0: all), so R / tap_rows times the CTAs share the work of a small problem and
    each reduces fewer sums; the input is read once per row block. ``wsmem`` (row-pair fprop/dgrad,
    experimental): the weights stay in shared memory, read by ``ldmatrix`` per kernel column and row
    pair, instead of in registers. ``wgmma`` (fprop/dgrad, sm_90a only, ``tma=2``, ``tw=64``, ``th``
    a multiple of ``band_rows``, ``warps`` 4 a group times the warpgroups a group, ``wgmma_split``,
    or 4 for every 2, 4 or 8 groups, ``wgmma_group_loop``): the warpgroup-MMA kernel
    (``gconv_wgmma_src``), pixels as M in registers (``asets`` sets of A fragments, 2 or 3), the
    weights as a Toeplitz B in shared memory (N = ``band_rows`` output rows x 8 channels, 4 or 2);
    among wgrad tiles (sm_90a only), the warpgroup-MMA wgrad (``gconv_wgrad_wg_src``): ``th`` input
    rows a step, ``tw`` output columns a chunk (16, 32, 48 or 64), ``cb`` 8 per warpgroup, ``warps``
    4 a group (one or two more: producer warps load the rows, ``wgrad_wg_producer``), ``stages``
    steps loaded ahead (with a producer: ring steps), ``wsmem`` the MMA reads dy from shared memory
    (else through ``ldmatrix`` into registers), ``tma`` (experimental) 1: the rows arrive by tensor
    copies (one producer warp); 2: staged with a pixel's groups side by side and re-laid out by the
    warpgroups; 3: staged the same way and re-laid out by the producer threads into MMA rings of
    ``RELAYOUT_RING_STEPS``. ``roll`` (fprop/dgrad, with ``wgmma``, ``tma=2``, ``tw=64``): the
    rolling-row warpgroup-MMA kernel (``gconv_roll_src``): bands of ``th`` output rows, each input
    row read once and met by every kernel row in one set of MMAs (N = kernel rows x 8 channels, no
    Toeplitz zeros); a warpgroup per two or four groups of 8 channels (``roll_groups``: cb / (2
    warps)), ``stages`` slots of ``ROLL_SLOT_ROWS`` input rows in the TMA ring."""

    th: int = 8
    tw: int = 16
    cb: int = 32
    warps: int = 4
    min_ctas: int = 4
    stages: int = 2
    rowpair: bool = False
    cluster: int = 0
    tma: int = 0
    tap_rows: int = 0
    wsmem: bool = False
    wgmma: bool = False
    roll: bool = False
    asets: int = 2  # wgmma fprop/dgrad: sets of A fragments in registers (2 or 3)
    band_rows: int = 4  # wgmma fprop/dgrad: output rows an MMA's N covers (4, or 2: N = 16)
    sumk: int = 0  # TMA tap wgrad: clusters of sumk CTAs add their sums up before the atomics
    slots: bool = False  # tap wgrad: a slot of sums per CTA and a slot-sum kernel, no atomics

    @property
    def name(self) -> str:
        kind = "cudawg" if self.wgmma else "cudarp" if self.rowpair else "cuda"
        kind = "cudawr" if self.roll else kind
        shape = f"t{self.th}x{self.tw}c{self.cb}w{self.warps}m{self.min_ctas}s{self.stages}"
        cluster = f"k{self.cluster}" if self.cluster else ""
        rows = f"r{self.tap_rows}" if self.tap_rows else ""
        ws = "_ws" if self.wsmem else ""
        sets = f"a{self.asets}" if self.asets != 2 else ""
        sets += f"b{self.band_rows}" if self.band_rows != 4 else ""
        tma = f"_tma{self.tma}" if self.tma else ""
        tma += f"_sum{self.sumk}" if self.sumk else ""
        tma += "_slot" if self.slots else ""
        return f"{kind}_{shape}{cluster}{rows}{ws}{sets}{tma}"


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


#: Row-pair tiles whose halos arrive by TMA (``CudaTile.tma``), candidates on GPUs that have it
#: (``runtime.tma.supported``) beside ``TILES``. Session 9 (``scripts/gconv_cuda_probe.py
#: --rowpair``, N = 128, 3x3, H100): loads and stores by TMA (``tma=2``) took fprop from 0.73 /
#: 0.65 / 0.58 of copy (best non-TMA tile, fp16, C = 64 / 128 / 256) to 0.78 / 0.73 / 0.62; TMA
#: loads alone (``tma=1``) helped less; 3-stage TMA tiles (2 CTAs per SM by shared memory) were
#: 15-45% slower and are left out. The 5- and 6-CTA 8x16 tiles use the registers the TMA store
#: frees (72-128 at 4 CTAs, ptxas). The 8x8 tile is for small batches (N = 32 at 16x16 gives the
#: 16x16 tile one tile per CTA and nothing to overlap). The 32x32 16-warp tile (session 13: one
#: CTA per SM, 128 registers and 210 KB of shared memory by ptxas and ``smem_bytes``) re-reads
#: 1.13x its pixels as halo against the 16x32 tile's 1.20x, for the L2, which was 88% busy at 70%
#: of DRAM bandwidth with the 16x16 tile (ncu, session 9). The 64-channel tiles (session 19,
#: ``--fprop-extra``: 128-byte pixel rows, the 128-byte swizzle, one CTA per SM) read 0.866-0.879
#: of copy at C=64 N=256 against the 32-channel tiles' best 0.796-0.817, 0.785-0.797 at C=128
#: N=256 against 0.763-0.771 (fprop, fp16 / bf16). The 128-channel 8x16 tile (16 warps; 256-byte
#: pixels as two 128-byte rows, a 5-d tensor map): 0.814-0.819 at C=128 N=256 against the
#: 64-channel tiles' 0.785-0.804 in the same run; no gain at N=128 or C=256.
TMA_TILES = (
    CudaTile(16, 16, 32, 4, 3, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 32, 4, 4, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 32, 4, 5, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 32, 4, 6, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 32, 4, 4, 2, rowpair=True, tma=1),
    CudaTile(8, 8, 32, 4, 6, 2, rowpair=True, tma=2),
    CudaTile(16, 32, 32, 8, 2, 2, rowpair=True, tma=2),
    CudaTile(32, 32, 32, 16, 1, 2, rowpair=True, tma=2),
    CudaTile(16, 16, 64, 8, 1, 2, rowpair=True, tma=2),
    CudaTile(8, 32, 64, 16, 1, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 128, 16, 1, 2, rowpair=True, tma=2),
)


#: Row-pair TMA tiles of 64 channels (128-byte pixel rows) at several CTAs an SM, candidates
#: for 3x3 (measured) and 1x1 (GPU-tested) kernels where C takes 64-channel blocks. Why
#: (session 44, H200, ``scripts/tma_copy_probe.py``): the conv's data movement alone, without
#: its MMAs, reads its halo loads at 0.65 of the read ceiling in 64-byte box rows (32 channels)
#: and at 0.83-0.90 in 128-byte rows; the 32-channel 8x16 tile's movement alone takes 40.4-40.6
#: us at C=64 N=128, about the whole kernel's time, and in 128-byte rows at 4 CTAs an SM it takes
#: 36.2. Timed as conv tiles (``gconv_wide_probe.py``, graph replay, C=64 3x3 fp16, fprop /
#: dgrad): 8x8 4-CTA 37.7 / 37.2 us at N=128 and 72.4 / 71.9 at N=256 against the best
#: 32-channel tile's 41.1 / 40.9 and 79.1 / 78.5; 8x16 2-CTA three-stage 39.9 / 38.8 and
#: 73.8 / 71.2. The 64-channel tiles of ``TMA_TILES`` (one CTA an SM) read 43.2-45.8 at N=128.
#: At 5x5 none beats the wgmma pick, and the 8x8 tile spills 48 bytes (ptxas, 64 registers at 4
#: CTAs of 8 warps).
WIDE_ROW_TILES = (
    CudaTile(8, 8, 64, 8, 4, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 64, 8, 2, 3, rowpair=True, tma=2),
)


#: Row-pair tiles for kernels whose weights exceed ``ROWPAIR_MAX_FRAGMENTS`` (7x7: 28 fragments,
#: 112 registers), which every other tile leaves to the tap kernel (session 20: 7x7 fprop/dgrad
#: at 0.19-0.21 of copy at N = 128-256, and 0.81-0.83x cuDNN at N = 1). Fewer CTAs per SM give
#: each thread the registers (``rowpair_registers_fit``; ptxas, offline: 168 registers at 3 CTAs
#: of 4 warps for 8x16, 174 at 2 for 16x16, no spills). The row-pair kernel's MMAs at 7x7 do 448
#: FMAs per output against 392 useful (the pair rows past the kernel are zeros), so it is
#: compute-bound near 0.5 of copy at best on mma.sync; the tap kernel re-reads its shared-memory
#: operands per tap. Session 22 (H100, ``gconv-s22-k7-big``, CUDA-graph replay, C=64 64x64 7x7
#: N = 128-256): fprop/dgrad 0.45-0.52 of copy, 5.7-6.4x cuDNN (the tap kernel read 0.19-0.21);
#: N = 1 4 us against cuDNN's 14 (``gconv-s22-k57-small``). The 64-channel TMA tile of
#: ``TMA_TILES`` (one CTA of 8 warps per SM) fits too and joins them there. The last one is the
#: non-TMA tile for GPUs without TMA.
WIDE_KERNEL_TILES = (
    CudaTile(8, 16, 32, 4, 3, 2, rowpair=True, tma=2),
    CudaTile(16, 16, 32, 4, 2, 2, rowpair=True, tma=2),
    CudaTile(8, 8, 32, 4, 3, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 32, 4, 2, 2, rowpair=True),
)


#: Tall row-pair TMA tiles, candidates for kernels of 5 or more rows: 16 row pairs a warp (32
#: rows by 8 or 16 columns) give each B fragment read from shared memory more MMAs to feed and
#: each warp more independent accumulators. Session 29 (``scripts/gconv_wide_probe.py``, C=64
#: 64x64 N=128, events, two calls): 5x5 fprop/dgrad 61.1-62.8 us (32x8) against the other
#: candidates' best 69.2-70.2 (0.71-0.73 of copy against 0.64); 7x7 fprop 101.1-102.3 us (32x16)
#: against 119.0-121.3, dgrad 99.2 against 100.5-116.2 (0.44-0.45 of copy).
TALL_TILES = (
    CudaTile(32, 8, 32, 4, 2, 2, rowpair=True, tma=2),
    CudaTile(32, 16, 32, 8, 1, 2, rowpair=True, tma=2),
)


#: Row-pair tiles with the weights in shared memory (``CudaTile.wsmem``): 16 warps per SM at 7x7,
#: where the register-resident weights (112 registers) allow 8-12 (session 29's Nsight Compute:
#: the MMAs latency-bound at 41% of the tensor pipe). Written after session 29's device time;
#: session 30 (H100): correct on every odd shape (tests/test_gconv_cuda.py's extra tiles), but
#: slower than the candidates everywhere (``wide-probe-wsmem-s30``, C=64 N=128: 7x7 106-109 us
#: against the 32x16 tall tile's 101-102, 5x5 73-84 against 62-63, 3x3 59-62 against 55): not
#: candidates; kept as tested extra tiles beside the ``WGMMA_TILES`` that took 7x7 instead.
EXPERIMENTAL_FPROP_TILES = (
    CudaTile(16, 32, 32, 16, 1, 2, rowpair=True, tma=2, wsmem=True),
    CudaTile(8, 32, 32, 16, 1, 2, rowpair=True, tma=2, wsmem=True),
)


#: Warpgroup-MMA tiles (``CudaTile.wgmma``), candidates on compute capability 9.0 (sm_90a) with
#: TMA for kernels of 3+ rows. Session 30, H100: its prototype (``scripts/gconv_wgrs_probe.py``
#: at commit e3707e7, without bias or the non-finite fallback; C=64 64x64 N=128, events, fp16 /
#: bf16): 7x7 fprop 16x64 16-channel 83.0 / 81.6 us against the best row-pair tile's 102.5 /
#: 101.1 (0.54 of copy against 0.44); 5x5 8x64 32-channel 60.9 / 61.1 against 63.4 / 62.3; 3x3
#: 55.1 / 55.9 against 55.9 / 55.1. In the study (``gconv-s30-k57``, graph replay) the autotuner
#: chose them for all eight 7x7 cells (0.52-0.59 of copy, N = 128-256) and four of eight 5x5.
WGMMA_TILES = (
    CudaTile(8, 64, 32, 16, 1, 2, tma=2, wgmma=True),
    CudaTile(16, 64, 16, 8, 1, 2, tma=2, wgmma=True),
    CudaTile(8, 64, 16, 8, 1, 2, tma=2, wgmma=True),
)

#: Warpgroup-MMA tiles written in session 31, tested beside the candidates and timed by
#: ``scripts/gconv_wide_probe.py --experimental``; not candidates. Its first call (H100, C=64
#: N=128 fp16, events; ``wide-probe-wgmma1-s31``): 2-4 CTAs an SM to overlap one CTA's epilogue
#: with another's MMAs gained only at 7x7 with 16-channel blocks (8x64, 2 CTAs: 90.7 us against
#: 102.8 for 1 CTA, the 16x64 candidate 86.9); 8-channel blocks (one warpgroup a CTA, 16-byte
#: pixel pieces) read DRAM twice over (Nsight Compute: 263 MB for 134) and ran 2-4x slower;
#: 12-row tiles tied the 8-row ones at 5x5 and were slower at 7x7 (64 rows in 6 tiles: 12% of
#: the MMAs on padding rows). Kept: the 2-CTA tile, and 16x64 with two warpgroups a group (each
#: 8 rows of one halo: four warpgroups an SM like the 8x64 32-channel tile, with the 16-row
#: tile's halo); the second call (``wide-probe-wgmma2-s31``) read it at 5x5 70.0 us against the
#: 8x64 32-channel candidate's 61.9 (at 7x7 it spills: illegal).
EXPERIMENTAL_WGMMA_TILES = (
    CudaTile(8, 64, 16, 8, 2, 2, tma=2, wgmma=True),
    CudaTile(16, 64, 16, 16, 1, 2, tma=2, wgmma=True),
    # session 38 (``wide-probe-loop-s38-call1``, ``-call2``; H100, C=64 N=128 fp16, events,
    # fprop / dgrad): fewer warpgroups than groups, each taking two groups in turn, a group's
    # epilogue under the next one's wgmmas (``wgmma_group_loop``), with two or three A-fragment
    # sets (``asets``): 5x5 63.6 / 63.6 and 63.5 / 62.8 us against the 32-channel candidates'
    # 60.0-61.1 / 58.9-60.9 (the MMA phase alone 51.0-52.5 against 49.7-49.8: fewer warps
    # slow it more than the overlap gains); with three halo stages or one warpgroup for four
    # groups slower still (dropped)
    CudaTile(8, 64, 32, 8, 1, 2, tma=2, wgmma=True),
    CudaTile(8, 64, 32, 8, 1, 2, tma=2, wgmma=True, asets=3),
    # session 38: bands of 2 output rows (N = 16): a 5x5 kernel's MMAs 240 multiply-adds an
    # output against 320 with 4-row bands (7x7: 448 against 560), fewer Toeplitz zeros read from
    # shared memory, the same A fragments, 1.5x the wgmma instructions: 5x5 59.2 / 59.8 us
    # (three stages) against 59.4 / 60.1, 7x7 16x64 91.4 / 89.8 against 84.3 / 82.2
    CudaTile(8, 64, 32, 16, 1, 2, tma=2, wgmma=True, band_rows=2),
    CudaTile(8, 64, 32, 16, 1, 3, tma=2, wgmma=True, band_rows=2),
    CudaTile(16, 64, 16, 8, 1, 2, tma=2, wgmma=True, band_rows=2),
)

#: The 8x64 32-channel wgmma tile with three halo stages (two tiles' loads ahead of the MMAs, not
#: one; session 37), a candidate for kernels of 5+ rows where C takes 32-channel blocks (at 7x7
#: its stages exceed the shared memory). ``scripts/gconv_wide_probe.py --experimental``, H100,
#: C=64 N=128 fp16, events, two calls (``wg-stages-s37-calls.log``): 5x5 fprop / dgrad 60.0 /
#: 59.6 and 59.4 / 59.4 us against 61.8 / 62.2 and 61.5 / 61.3 with two stages (the 32x8 row-pair
#: tile 60.9 / 61.1, 60.0 / 60.6); 3x3 slower (57.1-60.3 against 55.2-56.4). Three stages of the
#: 16-channel tiles were within 3% of their two-stage forms (7x7 16x64: 84.3-85.4 against
#: 84.8-86.2 us; 8x64: 97.4-99.3 against 99.5-100.4); not kept.
WGMMA_DEEP_TILES = (CudaTile(8, 64, 32, 16, 1, 3, tma=2, wgmma=True),)

#: The 16x64 16-channel wgmma tile with three sets of A fragments (``asets``; session 38), a
#: candidate for kernels of 7+ rows where C takes 16-channel blocks. ``scripts/gconv_wide_probe.py
#: --experimental``, H100, C=64 N=128 fp16, events, two calls (``wide-probe-loop-s38-call1``,
#: ``-call2``): 7x7 fprop / dgrad 80.6 / 79.5 and 81.9 / 80.0 us against 83.4 / 81.7 and 84.3 /
#: 82.2 with two sets; at 5x5 no faster (67.9 / 68.3 against 68.3 / 69.0; the 8x64 32-channel
#: three-stage candidate 60.0 / 58.9), so not offered there.
WGMMA_WIDE_TILES = (CudaTile(16, 64, 16, 8, 1, 2, tma=2, wgmma=True, asets=3),)

#: Rolling-row warpgroup-MMA tiles (``CudaTile.roll``, ``gconv_roll_src``; session 36): bands of
#: ``th`` output rows, 16 or 32 channels, two or four groups a warpgroup (``roll_groups``),
#: ``stages`` slots of two input rows. Correct on every odd shape (``test_roll_tiles``) but slower
#: than the candidates in every cell timed (``scripts/gconv_wide_probe.py --roll``, H100, C=64
#: N=128 fp16, events; ``wide-probe-roll-s36``): the 32-channel four-group tile 103.6 / 72.7 /
#: 59.0 us at 7x7 / 5x5 / 3x3 against the candidates' best 85.9 / 60.3 / 55.3. Not candidates;
#: tested beside them. Bands of 8 rows and 1-CTA tiles timed slower and were dropped, as were
#: 64-row bands (a tie in the first version, slower in every later one).
ROLL_TILES = (
    CudaTile(32, 64, 32, 4, 2, 4, tma=2, wgmma=True, roll=True),
    CudaTile(16, 64, 32, 4, 2, 4, tma=2, wgmma=True, roll=True),
    CudaTile(32, 64, 32, 8, 2, 6, tma=2, wgmma=True, roll=True),
    CudaTile(32, 64, 16, 4, 3, 4, tma=2, wgmma=True, roll=True),
    CudaTile(32, 64, 16, 4, 4, 4, tma=2, wgmma=True, roll=True),
)


#: wgrad tiles: one warp per group of the channel block (warps = cb / 8). The row-pair 8x16
#: tile joined in session 7: correct on every odd shape (tests/test_gconv_cuda.py, two GPU
#: runs) and within 1-2% of the best tap tile, the fastest at C=64 (scripts/gconv_cuda_probe.py
#: --wgrad-only, N=128 3x3: 64.1 us against 65.1, fp16). One group per CTA (8x8 pixels, 1 warp:
#: 4x the CTAs of a 32-channel block, for small batches) joined in session 8: correct in two GPU
#: runs and the autotuner's pick for batch-1 C=128 32x32 (6.3 us against cuDNN's 5.5; the
#: other tiles 6.6+).
WGRAD_TILES = (
    CudaTile(8, 16, 32, 4, 4, 2),
    CudaTile(16, 16, 32, 4, 3, 2),
    CudaTile(8, 16, 64, 8, 2, 2),
    CudaTile(8, 16, 32, 4, 4, 2, rowpair=True),
    CudaTile(8, 8, 8, 1, 8, 2),
)

#: wgrad tiles whose input halo and dy tile arrive by TMA (``tma=1``: two tensor copies per
#: stage on one mbarrier, dense swizzled stages), candidates on GPUs that have it beside
#: ``WGRAD_TILES``. Session 19 (``scripts/gconv_cuda_probe.py --wgrad-only --wgrad-extra``, 3x3,
#: H100, fraction of copy, fp16 / bf16): the 64-channel 16x16 tile (8 warps, one CTA per SM:
#: 128-byte pixels, whole lines, the 128-byte swizzle) read C=64 N=128 0.804 / 0.803, N=256
#: 0.906 / 0.909, C=128 N=256 0.790 / 0.799, C=256 N=256 0.654 / 0.651, against the best
#: non-TMA tile's 0.71 / 0.75 / 0.68-0.71 / 0.61; the 32-channel 8x16 tile (session 9,
#: experimental until then) came second at N=128 (C=64 and C=128); its readings in the same four
#: cells: 0.79 / 0.81-0.82 / 0.75 / 0.58-0.59.
TMA_WGRAD_TILES = (
    CudaTile(16, 16, 64, 8, 1, 2, tma=1),
    CudaTile(8, 16, 32, 4, 4, 2, tma=1),
)

#: cluster wgrad tiles, candidates for small problems only (``CLUSTER_MAX_PIXELS``): one cluster
#: of 8 CTAs per channel block, no atomics, workspace or last-CTA pass (each an L2 round trip on
#: a ~6 us kernel). Session 8, batch 1, fp16, profiler device time against cuDNN: C=128 32x32
#: 1.12x with the 16-channel tile (0.89x for the best tile without clusters), C=64 5x5 0.87x
#: with the 8-channel one (a tie with the Triton path it replaced as the choice).
CLUSTER_WGRAD_TILES = (
    CudaTile(8, 16, 16, 2, 4, 2, cluster=8),
    CudaTile(8, 16, 8, 1, 8, 2, cluster=8),
)
#: row-split wgrad tiles (``tap_rows``), candidates for small problems beside the cluster tiles.
#: At batch 1 with 5x5 and 7x7 kernels every tile above left each CTA all R x S taps of its
#: pixels and a cluster reduction of all their sums, and stayed at 0.52-0.61x cuDNN's device time
#: at C=128 32x32. One row of taps per CTA (session 12, ``scripts/wgrad_n1_probe.py``, graph
#: replay, fp16/bf16): C=128 5x5 9.4 -> 6.0 us (cuDNN 5.8), C=128 7x7 12.5 -> 7.5 us (cuDNN
#: 8.3), C=64 64x64 5x5 12.7 -> 10.0 us (cuDNN 12.6 / 10.8; the experimental 16-CTA 8x8 tile:
#: 9.4), C=128 3x3 5.7 -> 5.1 us. For C=256's 16x16 images (two 8x16 tiles: an 8-CTA cluster
#: idles) the 4-CTA 8x8 tile: 7x7 6.9 -> 6.1 us (cuDNN 6.4), 5x5 5.3 -> 5.2 us (cuDNN 4.8-5.4).
ROW_WGRAD_TILES = (
    CudaTile(8, 16, 16, 2, 4, 2, cluster=8, tap_rows=1),
    CudaTile(8, 16, 8, 1, 8, 2, cluster=8, tap_rows=1),
    CudaTile(8, 8, 16, 2, 8, 2, cluster=4, tap_rows=1),
    CudaTile(8, 16, 16, 2, 4, 2, tap_rows=1),
)


#: wgrad tiles tested and timed (tests/test_gconv_cuda.py, scripts/gconv_cuda_probe.py) but not
#: candidates: the row-pair 16x16 was 10-17% slower than the best tile at every shape (session
#: 7); the 8x8 cluster tile was never the autotuner's choice at batch 1, nor were the 4-warp
#: split cluster tiles (4 warps per group, each on every 4th 16-pixel chunk; written for C=64
#: 5x5, which ran 64 one-warp CTAs; correct on the GPU, 6.8 us at C=128 where the 2-warp
#: cluster tile took 5.3; session 8).
EXPERIMENTAL_WGRAD_TILES = (
    CudaTile(16, 16, 32, 4, 3, 2, rowpair=True),
    CudaTile(8, 8, 8, 1, 8, 2, cluster=8),
    CudaTile(8, 16, 8, 4, 2, 2, cluster=8),
    CudaTile(8, 16, 16, 4, 2, 2, cluster=8),
    # 16-CTA (non-portable) clusters for batch-1 5x5, where the 8-CTA ones left SMs idle (64
    # one-warp CTAs at C=64); and TMA loads of the input halo and the dy tile. Both written in
    # session 9 after the device budget ran out: not yet run on a GPU
    CudaTile(8, 16, 8, 1, 8, 2, cluster=16),
    CudaTile(8, 8, 8, 1, 8, 2, cluster=16),
    CudaTile(16, 16, 32, 4, 3, 2, tma=1),
    CudaTile(8, 16, 32, 4, 4, 3, tma=1),
    # the fastest at C=64 64x64 5x5 batch 1 (9.4 us against 10.0 for the best candidate), but a
    # non-portable cluster, like the 16-CTA tiles above. Row-split tiles timed in session 12 and
    # left out, never the fastest at any batch-1 shape: 8x8 one-warp CTAs in 8- and 4-CTA
    # clusters, 8x16 with two warps per group, 16x16 in 4-CTA clusters (C=128 5x5 6.9 us against
    # 6.0-6.2 for the candidates), the 2-CTA 8x16 (C=256 7x7 within 1% of the 4-CTA 8x8)
    CudaTile(8, 8, 8, 1, 8, 2, cluster=16, tap_rows=1),
)
#: the TMA wgrad tiles with their sums added up in clusters of 2 or 4 CTAs before the atomics
#: (``sumk``), neither candidates nor among the experimental tiles (their compiles would double
#: that test's time). Session 48, H200, 3x3, graph replay: C=64 N = 8 10.1 / 10.8 us against the
#: 16x16 pick's 10.2, N = 32 17.4 / 18.8 against 16.7, N = 128 40.1 / 42.7 against 38.9; C=128
#: and 256 alike. Clock stamps at C=64 N = 8: half the writers to the workspace's lines brought
#: the count 1.2 us sooner after the sums left, but adding up through the cluster's shared
#: memory took 1.5 us; clusters of 4 fit 120 CTAs at once, not 132
SUMK_WGRAD_TILES = (
    CudaTile(16, 16, 64, 8, 1, 2, tma=1, sumk=2),
    CudaTile(16, 16, 64, 8, 1, 2, tma=1, sumk=4),
    CudaTile(8, 16, 32, 4, 4, 2, tma=1, sumk=2),
)
#: warpgroup-MMA wgrad tiles (``CudaTile.wgmma``, ``gconv_wgrad_wg_src``; session 32),
#: candidates on compute capability 9.0 with TMA (``wgmma_usable``) for kernels of
#: ``WGMMA_WGRAD_MIN_ROWS`` rows or more: dy read by the MMA from shared memory (``wsmem``) or
#: through ``ldmatrix`` into registers (the way of session 31's prototype,
#: ``scripts/gconv_wgrad_wgmma_probe.py``), and with a producer warp (``warps`` 4 a group + 1).
#: Session 32, H100, C=64 64x64 N=128 fp16, CUDA events (``wgrad-wg4-s32``): the producer-warp
#: 4-row tile 7x7 108.0 us (0.414 of copy), 5x5 86.1 (0.519); without a producer 120-124 and
#: 100-105 (``wgrad-wg3-s32``: 120.8 / 99.3); the library's wgrad before, 188 / ~90 (a TMA tap
#: tile). The 32-column tiles are for 32-pixel images (the one without a producer was the
#: autotuner's pick at C=128 32x32 7x7 in ``gconv-s32-wgrad-k57``). Rows loaded only 4 ahead
#: left the shared-memory kernel without a producer at 3.9 us a step at 7x7. Session 33
#: (``wgrad-bounds2-s33``, ``wgrad-bounds3-s33``; the probe's events read ~20 us above the
#: study's): two producer warps, 7x7 104.3-105.4 us against 106.4-107.4 with one, 5x5 84.2-85.0
#: against 86.7-86.8.
WGMMA_WGRAD_TILES = (
    CudaTile(4, 64, 16, 10, 2, 4, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 9, 2, 4, wsmem=True, wgmma=True),
    CudaTile(2, 64, 16, 9, 2, 8, wsmem=True, wgmma=True),
    CudaTile(4, 32, 16, 9, 2, 4, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 8, 2, 3, wsmem=True, wgmma=True),
    CudaTile(4, 32, 16, 8, 4, 1, wsmem=True, wgmma=True),
    # session 34 (probe, N=256 fp16 7x7): C=256 16x16 115.1 us against the autotuner's pick's
    # 124.4 (16 columns, 32 channels: one CTA an SM); C=128 32x32 123.4 against 128.4 (8 rows)
    CudaTile(4, 16, 32, 18, 1, 4, wsmem=True, wgmma=True),
    CudaTile(8, 32, 16, 10, 2, 4, wsmem=True, wgmma=True),
)
#: wgmma wgrad tiles tested but not offered (session 32, C=64 64x64 N=128 fp16, 7x7 / 5x5 us,
#: ``wgrad-wg3-s32`` and ``wgrad-wg4-s32``): dy in registers, 4 rows a step (122.6-124.2 /
#: 102.9-105.0), 2 rows a step (123-131 / 100-110) or one CTA an SM (134-136 / 116-117); 3 CTAs
#: an SM with rows 4 ahead (170-173 / 141), one group a CTA (16-byte pieces of each pixel; 175 /
#: 154), 8 rows a step (121-137 / 107-123), one CTA an SM with rows 20 ahead (126-127 / 113), 4
#: groups a CTA (134-137 / 119 from shared memory; 151 / 121-122 in registers; 142 / 113 with a
#: producer warp)
EXPERIMENTAL_WGMMA_WGRAD_TILES = (
    CudaTile(4, 64, 16, 8, 2, 1, wgmma=True),
    CudaTile(4, 64, 16, 8, 3, 1, wsmem=True, wgmma=True),
    CudaTile(4, 64, 8, 4, 6, 1, wsmem=True, wgmma=True),
    CudaTile(8, 64, 16, 8, 1, 1, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 8, 1, 5, wsmem=True, wgmma=True),
    CudaTile(4, 64, 32, 16, 1, 1, wsmem=True, wgmma=True),
    CudaTile(4, 64, 32, 16, 1, 2, wgmma=True),
    CudaTile(2, 64, 16, 8, 2, 2, wgmma=True),
    CudaTile(2, 64, 16, 8, 2, 3, wgmma=True),
    CudaTile(4, 64, 16, 8, 1, 3, wgmma=True),
    CudaTile(4, 64, 32, 17, 1, 4, wsmem=True, wgmma=True),
    # session 33, once the producer tiles' MMAs ran asynchronously (probe events, 7x7 / 5x5 us,
    # against 106.4-109.2 / 86.7-88.1 for the first one-producer tile): one group a CTA with a
    # producer, 4 or 3 CTAs an SM (128-137 / 107-125); 5 ring steps (109.9-110.1 / 86.4-87.0);
    # one CTA an SM with 6 (114.2 / 101.0); two producers and 2 rows a step (106.8 / 85.8); one
    # group and two producers (184 / 158); 8 rows a step (126.8 / 103.1). Row loads that ask L2
    # for 128 or 256 bytes (``.L2::128B``: 109.5-113.8 / 89.2-92.0) and 32-channel CTAs (64 bytes
    # a pixel: 127.1 / 107.9; with two producers 122.0 / 103.4) were slower too
    # (``wgrad-bounds{3,5}-s33``); C=16, whose CTAs read whole 32-byte pixels, loaded no faster
    # (``wgrad-bounds4-s33``: without MMAs 111.1 us at N=512, the same bytes)
    CudaTile(4, 64, 8, 5, 4, 4, wsmem=True, wgmma=True),
    CudaTile(2, 64, 8, 5, 4, 8, wsmem=True, wgmma=True),
    CudaTile(4, 64, 8, 5, 3, 6, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 9, 2, 5, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 9, 1, 6, wsmem=True, wgmma=True),
    # two producer warps (the 4-row tile is offered); 8 rows a step
    CudaTile(2, 64, 16, 10, 2, 8, wsmem=True, wgmma=True),
    CudaTile(8, 64, 16, 9, 2, 2, wsmem=True, wgmma=True),
    # rows by TMA: one thread issues a tensor copy (16 bytes x 70 pixels) per group and row;
    # slower (call 9: 7x7 / 5x5 120.7-157.9 / 105.9-136.5 us, without MMAs 125.4-138.1 /
    # 111.3-120.7, against 104.4 / 83.8 and 98.2 / 82.6 for the offered first tile; other TMA
    # tiles were 2 rows a step, 8 ring steps at one CTA an SM, 32 columns)
    CudaTile(4, 64, 16, 9, 2, 4, tma=1, wsmem=True, wgmma=True),
    # rows staged with a pixel's groups side by side, re-laid out by the warpgroups (tma=2):
    # correct (call 13), its loads faster (without MMAs 7x7 / 5x5 86.7-90.1 / 73.1-75.8 us
    # against 99.4 / 84.2) but the whole slower (109.7-115.6 / 87.6-93.2 against 104.6 / 84.8):
    # the copy costs the warpgroups more than the loads gain (also tried: 2 rows a step with 4 or
    # 6 staging steps, one producer)
    CudaTile(4, 64, 16, 9, 2, 2, tma=2, wsmem=True, wgmma=True),
    CudaTile(2, 64, 16, 10, 2, 4, tma=2, wsmem=True, wgmma=True),
    # session 34: staged the same way, each producer thread re-laying out its own pieces into
    # MMA rings of RELAYOUT_RING_STEPS steps (tma=3), off the warpgroups' path
    CudaTile(4, 64, 16, 10, 2, 2, tma=3, wsmem=True, wgmma=True),
    CudaTile(2, 64, 16, 10, 2, 4, tma=3, wsmem=True, wgmma=True),
    CudaTile(2, 64, 16, 10, 2, 6, tma=3, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 10, 1, 4, tma=3, wsmem=True, wgmma=True),
    CudaTile(4, 64, 16, 9, 2, 2, tma=3, wsmem=True, wgmma=True),
    # session 34: 16-column chunks for 16-pixel-wide images (C=256 16x16: a 32-column chunk
    # spends half its MMAs and row loads on padding) with 16 channels, two producers, 4 or 8
    # rows a step (call 11, N=256 fp16, 7x7 / 5x5 us: 146.0-156.0 / 118.4-121.5 against the
    # offered 32-channel 16-column tile's 115.1 / 92.6 and the library's pick's 124.4 / 65.4)
    CudaTile(4, 16, 16, 10, 2, 4, wsmem=True, wgmma=True),
    CudaTile(8, 16, 16, 10, 2, 4, wsmem=True, wgmma=True),
)
