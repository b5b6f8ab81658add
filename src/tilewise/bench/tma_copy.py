"""What a TMA tile pipeline can move: the grouped conv's row-pair kernel stripped of its math.

The 3x3 fprop/dgrad kernels read and write exactly their compulsory bytes (session 43, Nsight
Compute) yet run at ~0.77 of copy on the H200, with no unit saturated. This kernel keeps only
their data movement: a persistent grid of CTAs (static tile order, ``t += gridDim.x``), each
loading a channel block's halo box of ``(TH + halo) x (TW + halo)`` pixels through the TMA unit
into a ring of ``stages`` stages (mbarriers), and storing a ``TH x TW`` box by one TMA bulk store.
Its time against torch's ``copy_`` of the same bytes says how much of the conv's gap the
pipeline's shape alone costs (box rows of 64 or 128 bytes, stages, CTAs an SM), without the
MMAs. Modes:

- ``copy``: the store reads the load's stage (no halo): a TMA copy, thread 0 alone;
- ``staged``: as the conv, the CTA's threads move the box's interior into a staging tile, which
  the store reads (one store in flight, waited for a tile later);
- ``loads``: the halo loads alone; ``stores``: the stores alone (of a zero staging tile);
- ``ldst``: no TMA and no shared memory: the CTA's threads copy each tile by 16-byte global loads
  and stores (all of a thread's loads before its stores), as a plain copy kernel would: what the
  TMA unit itself costs against torch's ``copy_`` (session 44: a TMA copy reached 0.89-0.93 of it).

``copy``, ``staged`` and ``ldst`` leave ``y`` equal to ``x``, ``stores`` leaves it zero: the probe
checks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from tilewise.ops import gconv_cuda
from tilewise.ops._common import cdiv, num_sms
from tilewise.ops.gconv_cuda_src import MBAR_INIT, MBAR_WAIT, SMEM_U32, TMA_DESC_HOFF
from tilewise.runtime import cuda_launch, nvrtc_cache

MODES = ("copy", "staged", "loads", "stores", "ldst")
THREADS = 128
#: threads an SM holds (compute capability 8.0-9.0)
MAX_THREADS_SM = 2048
#: shared memory a stage (and the staging tile) starts on: the 128-byte swizzle's period
ALIGN = 1024


@dataclass(frozen=True, kw_only=True)
class TmaCopyConfig:
    """One pipeline shape (keywords only): the mode (``MODES``), the channels a box row
    holds (``cb``: 32 or 64 fp16 channels, 64- or 128-byte rows), the output box (``tw`` x
    ``th`` pixels), the halo around it, the stages of the load ring, the CTAs an SM (the
    persistent grid, held there by the shared memory a CTA asks for) and the threads a CTA
    (``staged`` and ``ldst`` use them all; the conv's 8x8 64-channel tile has 256)."""

    mode: str = "staged"
    cb: int = 32
    tw: int = 16
    th: int = 8
    halo: int = 2
    stages: int = 2
    ctas: int = 4
    threads: int = THREADS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"argument 'mode' must be one of {MODES}, got {self.mode!r}")
        if self.cb * 2 not in (32, 64, 128):
            raise ValueError(f"argument 'cb' {self.cb}: box rows of 32, 64 or 128 bytes")
        if self.halo < 0 or self.halo % 2 or max(self.tw, self.th) + self.halo > 256:
            raise ValueError(f"argument 'halo' {self.halo}: even, boxes of at most 256 pixels")
        if self.mode in ("copy", "ldst") and self.halo:
            raise ValueError(f"mode {self.mode!r} copies the box itself: argument 'halo' must be 0")
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"argument 'threads' {self.threads}: whole warps, at most 1024")
        if self.ctas * self.threads > MAX_THREADS_SM:
            raise ValueError(
                f"arguments 'ctas', 'threads': {self.ctas} x {self.threads} threads exceed an SM's "
                f"{MAX_THREADS_SM}"
            )
        if self.stages < 2:
            raise ValueError(f"argument 'stages' {self.stages}: a ring of at least 2")
        if self.ctas < 1:
            raise ValueError(f"argument 'ctas' {self.ctas} must be positive")

    @property
    def name(self) -> str:
        name = f"{self.mode}_c{self.cb}_{self.th}x{self.tw}h{self.halo}s{self.stages}m{self.ctas}"
        return name + (f"t{self.threads}" if self.threads != THREADS else "")

    @property
    def load_bytes(self) -> int:
        return (self.tw + self.halo) * (self.th + self.halo) * self.cb * 2

    @property
    def staging_bytes(self) -> int:
        return self.tw * self.th * self.cb * 2 if self.mode in ("staged", "stores") else 0

    def smem_bytes(self) -> int:
        """Dynamic shared memory the kernel uses (alignment slack and mbarriers included)."""
        if self.mode == "ldst":  # none: the occupancy padding alone holds its CTAs an SM
            return ALIGN
        stage = cdiv(self.load_bytes, ALIGN) * ALIGN
        staging = cdiv(self.staging_bytes, ALIGN) * ALIGN
        return ALIGN + self.stages * stage + staging + 8 * self.stages


_SOURCE = (
    r"""
#define CB {cb}
#define TW {tw}
#define TH {th}
#define HALO {halo}
#define STAGES {stages}
#define MODE {mode}
#define THREADS {threads}
#define CTAS {ctas}
#define PIXB (CB * 2)
#define BW (TW + HALO)
#define BH (TH + HALO)
#define H0 (HALO / 2)
#define LOAD_BYTES (BW * BH * PIXB)
#define STAGE_BYTES ((LOAD_BYTES + {align} - 1) / {align} * {align})
#define STG_RAW ((MODE == 1 || MODE == 3) ? TW * TH * PIXB : 0)
#define STG_BYTES ((STG_RAW + {align} - 1) / {align} * {align})
#define SWM (PIXB == 32 ? 1 : PIXB == 64 ? 3 : 7)
#define PIXT PIXB  // the shared helpers' name for a pixel's bytes in a stage
typedef unsigned int u32;
struct __align__(16) v4u32 {{ u32 a, b, c, d; }};

"""
    + TMA_DESC_HOFF
    + MBAR_INIT
    + SMEM_U32
    + MBAR_WAIT
    + r"""
__device__ __forceinline__ void tile_xy(int t, int tiles_h, int tiles_w, int& w, int& h, int& n) {{
    w = (t % tiles_w) * TW;
    h = ((t / tiles_w) % tiles_h) * TH;
    n = t / (tiles_w * tiles_h);
}}
__device__ __forceinline__ void load(u32 dst, u32 mbar, const TmaDesc* map, int t, int c0,
                                     int tiles_h, int tiles_w) {{
    int w, h, n;
    tile_xy(t, tiles_h, tiles_w, w, h, n);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(mbar), "r"(LOAD_BYTES) : "memory");
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {{%2, %3, %4, %5}}], [%6];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(w - H0), "r"(h - H0), "r"(n), "r"(mbar)
                 : "memory");
}}
__device__ __forceinline__ void store(u32 src, const TmaDesc* map, int t, int c0, int tiles_h,
                                      int tiles_w) {{
    int w, h, n;
    tile_xy(t, tiles_h, tiles_w, w, h, n);
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                 " [%0, {{%1, %2, %3, %4}}], [%5];\n"
                 :: "l"(map), "r"(c0), "r"(w), "r"(h), "r"(n), "r"(src) : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS)
tw_tma_copy(const __grid_constant__ TmaDesc map_x, const __grid_constant__ TmaDesc map_y,
            const v4u32* __restrict__ x, v4u32* __restrict__ y, int H, int W, int C,
            int tiles_h, int tiles_w, int n_tiles) {{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, c0 = blockIdx.y * CB;
    const u32 base = (smem_u32(smem) + {align} - 1) & ~(u32)({align} - 1);
    const u32 stg = base + STAGES * STAGE_BYTES, mbar0 = stg + STG_BYTES;
    unsigned char* const sm = smem + (base - smem_u32(smem));
#if MODE == 3
    for (int i = tid; i < STG_BYTES / 16; i += THREADS)
        *(v4u32*)(sm + STAGES * STAGE_BYTES + i * 16) = v4u32{{0, 0, 0, 0}};
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
#if MODE <= 2  // the modes that load by TMA (stores and ldst have no barriers in their memory)
    if (tid == 0) mbar_init(mbar0, STAGES);
#endif
    // programmatic dependent launch, as the conv's row-pair kernel (a no-op without it)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    __syncthreads();
#if MODE == 4
    // a thread's chunks of a tile: 16 bytes each, pixel-major, every load before any store
#define CH (PIXB / 16)
#define PER ((TW * TH * CH + THREADS - 1) / THREADS)
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        int w0, h0, n;
        tile_xy(t, tiles_h, tiles_w, w0, h0, n);
        v4u32 v[PER];
        long long at[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {{
            const int i = tid + k * THREADS, pix = i / CH, ch = i % CH;
            const int h = h0 + pix / TW, w = w0 + pix % TW;
            at[k] = i < TW * TH * CH && h < H && w < W
                        ? ((((long long)n * H + h) * W + w) * C + c0) / 8 + ch : -1;
            if (at[k] >= 0) v[k] = x[at[k]];
        }}
#pragma unroll
        for (int k = 0; k < PER; ++k)
            if (at[k] >= 0) y[at[k]] = v[k];
    }}
#elif MODE == 3
    if (tid == 0)
        for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
            store(stg, &map_y, t, c0, tiles_h, tiles_w);
            asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(STAGES - 1) : "memory");
        }}
#else
    if (MODE != 1 && tid != 0) return;  // copy and loads: thread 0 alone
    if (tid == 0)
        for (int st = 0; st < STAGES - 1; ++st) {{
            const int ts = blockIdx.x + st * gridDim.x;
            if (ts < n_tiles)
                load(base + st * STAGE_BYTES, mbar0 + 8 * st, &map_x, ts, c0, tiles_h, tiles_w);
        }}
    int buf = 0;
    u32 parity = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {{
        const int tn = t + (STAGES - 1) * gridDim.x, nb = (buf + STAGES - 1) % STAGES;
#if MODE == 0
        mbar_wait(mbar0 + 8 * buf, parity);
        store(base + buf * STAGE_BYTES, &map_y, t, c0, tiles_h, tiles_w);
        // stage nb held the tile before this one: its store has read it
        asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
        if (tn < n_tiles)
            load(base + nb * STAGE_BYTES, mbar0 + 8 * nb, &map_x, tn, c0, tiles_h, tiles_w);
#elif MODE == 2
        if (tn < n_tiles)
            load(base + nb * STAGE_BYTES, mbar0 + 8 * nb, &map_x, tn, c0, tiles_h, tiles_w);
        mbar_wait(mbar0 + 8 * buf, parity);
#else
        // the conv's order: the next load into the stage the last tile freed, the last store's
        // read of the staging tile waited for, this tile's halo awaited
        if (tid == 0) {{
            if (tn < n_tiles)
                load(base + nb * STAGE_BYTES, mbar0 + 8 * nb, &map_x, tn, c0, tiles_h, tiles_w);
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        }}
        mbar_wait(mbar0 + 8 * buf, parity);
        __syncthreads();
        const unsigned char* hs = sm + buf * STAGE_BYTES;
        unsigned char* st = sm + STAGES * STAGE_BYTES;
        for (int i = tid; i < TH * TW * (PIXB / 16); i += THREADS) {{
            const int pix = i / (PIXB / 16), ch = i % (PIXB / 16);
            const int py = pix / TW, px = pix % TW;
            const v4u32 v = *(const v4u32*)(hs + hoff((py + H0) * BW + px + H0, ch));
            *(v4u32*)(st + hoff(pix, ch)) = v;
        }}
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (tid == 0) store(stg, &map_y, t, c0, tiles_h, tiles_w);
#endif
        buf = (buf + 1) % STAGES;
        parity ^= buf == 0;
    }}
#endif
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}}
"""
)


def source(cfg: TmaCopyConfig) -> str:
    """The CUDA source of ``cfg``'s kernel (entry ``tw_tma_copy``)."""
    return _SOURCE.format(
        cb=cfg.cb,
        tw=cfg.tw,
        th=cfg.th,
        halo=cfg.halo,
        stages=cfg.stages,
        mode=MODES.index(cfg.mode),
        threads=cfg.threads,
        ctas=cfg.ctas,
        align=ALIGN,
    )


@functools.cache
def _kernel(cfg: TmaCopyConfig, device: int, smem: int):
    with torch.cuda.device(device):
        kernel = nvrtc_cache.compile_kernel(source(cfg), "tw_tma_copy")
        kernel.set_shared_memory_config(smem)
    return kernel


class TmaCopy:
    """``cfg``'s kernel bound to channels_last fp16 tensors ``x`` and ``y`` of one shape; call
    to launch it on the current stream (programmatic dependent launches, as the conv's)."""

    def __init__(self, cfg: TmaCopyConfig, x: torch.Tensor, y: torch.Tensor) -> None:
        n, c, h, w = x.shape
        if x.dtype != torch.float16 or y.dtype != x.dtype or y.shape != x.shape:
            raise ValueError("arguments 'x', 'y': fp16 tensors of one shape")
        if not (x.is_cuda and y.device == x.device):
            raise ValueError("arguments 'x', 'y': tensors on one CUDA device")
        cl = torch.channels_last
        if not (x.is_contiguous(memory_format=cl) and y.is_contiguous(memory_format=cl)):
            raise ValueError("arguments 'x', 'y': dense channels_last tensors (the maps assume it)")
        if c % cfg.cb:
            raise ValueError(f"argument 'cfg': cb {cfg.cb} does not divide C = {c}")
        device = x.device.index or 0
        sm_bytes, block_max = gconv_cuda._device_smem(device)
        self.smem = gconv_cuda.pad_for_occupancy(cfg.smem_bytes(), cfg.ctas, sm_bytes, block_max)
        if self.smem > block_max or cfg.ctas * (self.smem + gconv_cuda.SMEM_RESERVED) > sm_bytes:
            raise ValueError(f"argument 'cfg': {cfg.name} asks for {self.smem} bytes a CTA")
        kernel = _kernel(cfg, device, self.smem)
        self.launcher = cuda_launch.Launcher(kernel, "ttppiiiiii", dependent=True)
        self.maps = (  # the conv's tensor maps (cached by address and shape)
            gconv_cuda._tensor_map(x, cfg.cb, cfg.tw + cfg.halo, cfg.th + cfg.halo),
            gconv_cuda._tensor_map(y, cfg.cb, cfg.tw, cfg.th),
        )
        self.tiles_h, self.tiles_w = cdiv(h, cfg.th), cdiv(w, cfg.tw)
        self.n_tiles = n * self.tiles_h * self.tiles_w
        # as the conv's persistent grid: the CTAs an SM over the channel blocks, rounded up
        sms = num_sms(x.device)
        self.grid = (max(1, min(self.n_tiles, cdiv(sms * cfg.ctas, c // cfg.cb))), c // cfg.cb, 1)
        self.device = device
        self.args = (*self.maps, x, y, h, w, c, self.tiles_h, self.tiles_w, self.n_tiles)
        self.block = (cfg.threads, 1, 1)

    def __call__(self) -> None:
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        self.launcher(self.grid, self.block, self.args, self.smem, stream)
