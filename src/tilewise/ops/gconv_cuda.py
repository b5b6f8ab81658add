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
The CUDA sources (tap and row-pair kernels, fprop/dgrad and wgrad) live in
``ops.gconv_cuda_src``, the warpgroup-MMA fprop/dgrad kernel (Hopper, sm_90a: ``CudaTile.wgmma``)
in ``ops.gconv_wgmma_src``; this module holds the tiles and their legality, compilation, launches
and the wgrad's workspace.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import logging
import os

import torch

from tilewise.ops import gconv_slots
from tilewise.ops import gconv_wgrad_wg_src as _wgrad_wg_module
from tilewise.ops._common import _smem_optin, cdiv, num_sms
from tilewise.ops.gconv_config import dw_format
from tilewise.ops.gconv_cuda_src import SOURCE as _SOURCE
from tilewise.ops.gconv_cuda_src import SOURCE_RP as _SOURCE_RP
from tilewise.ops.gconv_cuda_src import SOURCE_WRP as _SOURCE_WRP
from tilewise.ops.gconv_roll_src import SOURCE_ROLL as _SOURCE_ROLL
from tilewise.ops.gconv_slots_src import SOURCE as _SLOT_SUM_SOURCE
from tilewise.ops.gconv_tiles import CLUSTER_WGRAD_TILES as CLUSTER_WGRAD_TILES
from tilewise.ops.gconv_tiles import EXPERIMENTAL_FPROP_TILES as EXPERIMENTAL_FPROP_TILES
from tilewise.ops.gconv_tiles import EXPERIMENTAL_WGMMA_TILES as EXPERIMENTAL_WGMMA_TILES
from tilewise.ops.gconv_tiles import (
    EXPERIMENTAL_WGMMA_WGRAD_TILES as EXPERIMENTAL_WGMMA_WGRAD_TILES,
)
from tilewise.ops.gconv_tiles import EXPERIMENTAL_WGRAD_TILES as EXPERIMENTAL_WGRAD_TILES
from tilewise.ops.gconv_tiles import ROLL_TILES as ROLL_TILES
from tilewise.ops.gconv_tiles import ROW_WGRAD_TILES as ROW_WGRAD_TILES
from tilewise.ops.gconv_tiles import SUMK_WGRAD_TILES as SUMK_WGRAD_TILES
from tilewise.ops.gconv_tiles import TALL_TILES as TALL_TILES
from tilewise.ops.gconv_tiles import TILES as TILES
from tilewise.ops.gconv_tiles import TMA_TILES as TMA_TILES
from tilewise.ops.gconv_tiles import TMA_WGRAD_TILES as TMA_WGRAD_TILES
from tilewise.ops.gconv_tiles import WGMMA_DEEP_TILES as WGMMA_DEEP_TILES
from tilewise.ops.gconv_tiles import WGMMA_TILES as WGMMA_TILES
from tilewise.ops.gconv_tiles import WGMMA_WGRAD_TILES as WGMMA_WGRAD_TILES
from tilewise.ops.gconv_tiles import WGMMA_WIDE_TILES as WGMMA_WIDE_TILES
from tilewise.ops.gconv_tiles import WGRAD_TILES as WGRAD_TILES
from tilewise.ops.gconv_tiles import WIDE_KERNEL_TILES as WIDE_KERNEL_TILES
from tilewise.ops.gconv_tiles import WIDE_ROW_TILES as WIDE_ROW_TILES
from tilewise.ops.gconv_tiles import CudaTile as CudaTile
from tilewise.ops.gconv_wgmma_src import SOURCE_WG as _SOURCE_WG
from tilewise.ops.gconv_wgmma_src import wgmma_asm as _wgmma_asm
from tilewise.ops.gconv_wgrad_wg_src import RELAYOUT_RING_STEPS
from tilewise.ops.gconv_wgrad_wg_src import SOURCE_WWG as _SOURCE_WWG
from tilewise.ops.gconv_wgrad_wg_src import WINDOW as _WG_WINDOW
from tilewise.ops.gconv_wgrad_wg_src import rings as wgrad_wg_rings
from tilewise.ops.gconv_wgrad_wg_src import smem_bytes as _wgrad_wg_smem
from tilewise.runtime import alloc, cuda_launch, nvrtc_cache, workspace
from tilewise.runtime import tma as _tma

log = logging.getLogger(__name__)
#: the launch shape fprop and bind_fprop take when given none
_DEFAULT_TILE = CudaTile()


SMEM_MAX = 227 * 1024  # dynamic shared memory one CTA may use on an H100
SMEM_SM = 228 * 1024  # shared memory of an H100's SM, all its CTAs together
SMEM_RESERVED = 1024  # shared memory the system keeps per CTA


#: channel blocks a TMA tile takes: a power of two whose pixel row the swizzle modes cover (8-64
#: channels: one 16-128 byte box row), or 128 channels as two 128-byte rows per pixel (a 5-d map)
TMA_CHANNEL_BLOCKS = (8, 16, 32, 64, 128)


def _tma_period(cb: int) -> int:
    """The swizzle's period for a ``cb``-channel TMA tile: 128 B x (SWM + 1) = 16 x CB bytes,
    1024 for the 128-byte mode (64 and 128 channels); the kernels place stages on it."""
    return min(16 * cb, 1024)


def _tma_stage(nbytes: int, cb: int) -> int:
    """``nbytes`` of a TMA stage rounded up to the swizzle's period (``_tma_period``)."""
    return cdiv(nbytes, _tma_period(cb)) * _tma_period(cb)


def _up1k(nbytes: int) -> int:
    """``nbytes`` rounded up to 1024 (the warpgroup-MMA kernels' ``UP1K``)."""
    return cdiv(nbytes, 1024) * 1024


def smem_bytes(r: int, s: int, tile: CudaTile) -> int:
    """``stages`` halo buffers, the CTA's weights, one zero pixel and the output staging tile
    (row-pair kernel: halo buffers of whole row pairs and the staging tile)."""
    taps_pairs = (r * s + 1) // 2
    pix = tile.cb * 2 + 16
    if tile.roll:  # see gconv_roll_src: B (2R - 1 kernel-row blocks), the slots, the staging
        # rings, the mbarriers and 16 zero bytes, on 1024 bytes
        b = _up1k(tile.cb // 8 * (2 * r - 1) * ((s + 1) // 2) * 2 * 128)
        slot = _up1k(ROLL_SLOT_ROWS * _tma_stage((tile.tw + s - 1) * tile.cb * 2, tile.cb))
        wgs, gw = tile.warps // 4, roll_groups(tile)  # each warpgroup's staging ring
        stg = wgs * ROLL_STAGING_ROWS * _up1k(tile.tw * 16 * gw)
        return 1024 + b + tile.stages * slot + stg + 16 * tile.stages + 16
    if tile.wgmma:  # see gconv_wgmma_src: B, ``stages`` halo stages, the staging tile, the
        # mbarriers, on 1024 bytes
        spb = 2 * wgmma_ksteps(r, tile) + tile.band_rows - 1  # the kernel's SPB
        b = _up1k(tile.cb // 8 * s * spb * 128)
        halo = _up1k(wgmma_halo_rows(r, tile) * (tile.tw + s - 1) * tile.cb * 2)
        stg = _up1k(tile.th * tile.tw * tile.cb * 2)
        return 1024 + b + tile.stages * halo + stg + 8 * tile.stages
    if tile.rowpair:
        rows = tile.th + 2 * ((r + 2) // 2) - 2
        # wsmem: one 512-byte A matrix per (group, kernel column, row pair), 16-byte aligned
        weights = 16 + (tile.cb // 8) * rowpair_fragments(r, s) * 512 if tile.wsmem else 0
        if tile.tma:  # dense swizzled stages (+ one period to align them), mbarriers
            stage = _tma_stage(rows * (tile.tw + s - 1) * tile.cb * 2, tile.cb)
            out = tile.th * tile.tw * (tile.cb * 2 if tile.tma == 2 else pix)
            dyn = 4 * tile.stages if dynamic_tiles(tile) else 0  # the stages' tile indices
            return _tma_period(tile.cb) + tile.stages * (stage + 8) + dyn + out + weights
        return tile.stages * rows * (tile.tw + s - 1) * pix + tile.th * tile.tw * pix + weights
    halo = (tile.th + r - 1) * (tile.tw + s - 1) * pix
    return tile.stages * halo + (tile.cb // 8) * taps_pairs * 256 + pix + tile.th * tile.tw * pix


#: the row-pair kernel keeps S x ceil((R + 1) / 2) weight fragments (4 registers each) per thread;
#: every tile takes up to this many (3x3: 6, 5x5: 15), more only where its registers allow
#: (``rowpair_registers_fit``): the ``WIDE_KERNEL_TILES``
ROWPAIR_MAX_FRAGMENTS = 15
#: ``TILEWISE_GCONV_WIDE_TILES=0`` withholds the row-pair kernel from kernels of more than
#: ``ROWPAIR_MAX_FRAGMENTS`` weight fragments (7x7, 6x6, 5x7, ...), which then run the tap kernel
#: (written in session 21 without a GPU; offered by default since session 22's H100 run)
ENV_WIDE_TILES = "TILEWISE_GCONV_WIDE_TILES"
#: adds the experimental wgrad tiles to the candidates ("1"; ``wgrad_candidates``)
ENV_EXPERIMENTAL_WGRAD = "TILEWISE_EXPERIMENTAL_WGRAD"


def rowpair_fragments(r: int, s: int) -> int:
    """Weight fragments a row-pair thread keeps for an R x S kernel (its A operands)."""
    return s * ((r + 2) // 2)


def register_cap(tile: CudaTile) -> int:
    """Registers a thread of ``tile`` may use so ``min_ctas`` CTAs fit an SM's 65536: allocated
    in steps of 8, at most 255 (``__launch_bounds__(warps * 32, min_ctas)``: 168 at 3 CTAs of 4
    warps, 128 at 4)."""
    return min(255, 65536 // (32 * tile.warps * tile.min_ctas) // 8 * 8)


def rowpair_registers_fit(r: int, s: int, tile: CudaTile) -> bool:
    """Whether a row-pair tile's weights (4 registers a fragment), accumulators (2 x TH) and
    its addresses and loop state (~40 registers with TMA, ~80 with the per-chunk loads) fit the
    per-thread cap its CTAs per SM leave (``register_cap``). ptxas
    (nvcc 13.0, sm_90, unbounded): 7x7 8x16 160-164 registers with TMA, 190-196 without (at 3
    CTAs per SM, 168 a thread, it spilled); 16x16 with TMA 174; 5x5 8x16 122."""
    cap = register_cap(tile)
    fixed = {2: 40, 1: 48}.get(tile.tma, 80)  # TMA loads only (tma=1): 128 where tma=2 took 114
    if tile.wsmem:  # a column's B fragments and one A fragment (two in flight) instead
        return 2 * (tile.th // 2 + (r + 2) // 2 - 1) + 8 + 2 * tile.th + fixed <= cap
    return 4 * rowpair_fragments(r, s) + 2 * tile.th + fixed <= cap


def wgmma_halo_rows(r: int, tile: CudaTile) -> int:
    """Input rows a ``wgmma`` tile loads: whole row pairs (the kernel's HH = 2 IP) covering its
    ``th + r - 1``."""
    return 2 * ((tile.th + r) // 2)


def wgmma_split(tile: CudaTile) -> int:
    """Warpgroups a ``wgmma`` tile gives each group of 8 channels (the kernel's HS): each takes
    ``th / HS`` of the tile's rows, all of them reading the CTA's one halo."""
    return max(1, tile.warps // (4 * (tile.cb // 8)))


def wgmma_group_loop(tile: CudaTile) -> int:
    """Groups of 8 channels each warpgroup of a ``wgmma`` tile takes in turn (the kernel's GL;
    2, 4 or 8): fewer warps than 4 a group; a group's epilogue runs under the next one's
    wgmmas."""
    return max(1, 4 * (tile.cb // 8) // tile.warps)


def wgmma_ksteps(r: int, tile: CudaTile) -> int:
    """k-steps (2 input rows each) a band of a ``wgmma`` tile takes a kernel column (the kernel's
    J): its ``band_rows`` output rows read ``r + band_rows - 1`` input rows."""
    return (r + tile.band_rows) // 2


def wgmma_bands(tile: CudaTile) -> int:
    """Bands of ``band_rows`` rows each of a ``wgmma`` tile's warpgroups takes (the kernel's
    NBW)."""
    return tile.th // tile.band_rows // wgmma_split(tile)


def wgmma_registers_fit(r: int, s: int, tile: CudaTile) -> bool:
    """Whether a ``wgmma`` warpgroup's accumulators (4 registers per output row; two sets with
    a group loop), ``asets`` sets of A fragments (4 registers per input row pair its bands read)
    and ~40 more fit ``register_cap``.
    ptxas (nvcc 13.0, sm_90a, session 31's source): 8x64 at 128 a thread 98-126 (7x7 114; the
    rule had said no), 12x64 7x7 146-154, 16x64 7x7 178-190, 16x64 16-channel 3x3 181; the CPU
    suite compiles every candidate and experimental tile and fails on a spill."""
    bands, br = wgmma_bands(tile), tile.band_rows
    row_pairs = br // 2 * (bands - 1) + wgmma_ksteps(r, tile)  # the kernel's IPW
    # several warpgroups a group: 16x64 16-channel at 7x7 spilled 240 bytes at 128 a thread where
    # the same warpgroup's work alone (8x64, 2 CTAs an SM) took 114 (ptxas)
    more = 40 if wgmma_split(tile) == 1 else 48
    accumulators = 4 * br * bands * (2 if wgmma_group_loop(tile) > 1 else 1)
    return accumulators + 4 * tile.asets * row_pairs + more <= register_cap(tile)


#: input rows a slot of the rolling-row kernel's ring holds (its RB), and output rows each
#: warpgroup's staging ring holds (its SR)
ROLL_SLOT_ROWS = 2
ROLL_STAGING_ROWS = 4


def roll_groups(tile: CudaTile) -> int:
    """Groups of 8 channels each warpgroup of a ``roll`` tile takes (the kernel's GW: 2 or 4):
    ``cb / 8`` groups over ``warps / 4`` warpgroups."""
    return max(1, tile.cb // (2 * tile.warps))


def roll_warps(cb: int, groups: int) -> int:
    """Warps of a ``roll`` tile of ``cb`` channels whose warpgroups take ``groups`` groups each
    (fewer where ``cb`` has fewer)."""
    return 4 * max(1, cb // 8 // groups)


def roll_registers_fit(r: int, s: int, tile: CudaTile) -> bool:
    """Whether a ``roll`` warpgroup's accumulators (4 R registers a group), A fragments (4 a
    k-step a group) and ~45 more (addresses, descriptors, bias, the copied-out block: ptxas,
    session 36, 3x3-7x7 at 2 and 4 groups) fit ``register_cap``; the CPU suite compiles every
    tile and fails on a spill or a serialized wgmma."""
    return roll_groups(tile) * (4 * r + 4 * ((s + 1) // 2)) + 45 <= register_cap(tile)


def wide_tiles_offered() -> bool:
    """Whether the ``WIDE_KERNEL_TILES`` are offered (unless ``TILEWISE_GCONV_WIDE_TILES=0``)."""
    return os.environ.get(ENV_WIDE_TILES) != "0"


def tile_ok(c: int, r: int, s: int, tile: CudaTile) -> bool:
    """Whether ``tile`` is a legal launch for this problem (channel block divides C, whole
    16-pixel rows per warp, shared memory within the H100's 227 KB per CTA; row-pair: row pairs,
    8-pixel column blocks split evenly over each group's warps, weights that fit registers)."""
    if c % tile.cb or tile.cb % 8 or smem_bytes(r, s, tile) > SMEM_MAX:
        return False
    if tile.roll:  # as the kernel is written (gconv_roll_src) and smem_bytes counts it
        return (
            tile.wgmma
            and not (tile.rowpair or tile.wsmem or tile.cluster or tile.tap_rows)
            and tile.tma == 2
            and tile.tw == 64
            and tile.cb in (16, 32)
            and tile.warps % 4 == 0
            and roll_groups(tile) in (2, 4)
            and (tile.cb // 8) % roll_groups(tile) == 0
            and tile.stages >= 2
            and 1 <= r <= 8
            and tile.tw + s - 1 <= 256
            and tile.min_ctas * (smem_bytes(r, s, tile) + SMEM_RESERVED) <= SMEM_SM
            and roll_registers_fit(r, s, tile)
        )
    if tile.wgmma:  # as the kernel is written (gconv_wgmma_src) and smem_bytes counts it
        return (
            not (tile.rowpair or tile.wsmem or tile.cluster or tile.tap_rows)
            and tile.stages in (2, 3)
            and tile.tma == 2
            and tile.tw == 64
            and tile.cb in (8, 16, 32, 64)
            and tile.asets in (2, 3)
            and (tile.asets == 2 or s >= tile.asets)  # fewer columns: ptxas serialized
            and tile.warps % 4 == 0
            # several warpgroups a group, or (a group loop) several groups a warpgroup
            and (tile.warps % (4 * (tile.cb // 8)) == 0 or 4 * (tile.cb // 8) % tile.warps == 0)
            and tile.band_rows in (2, 4)
            and tile.th % (tile.band_rows * wgmma_split(tile)) == 0
            # several warpgroups a group: each one's rows start on a swizzle period
            and (wgmma_split(tile) == 1 or tile.band_rows * wgmma_bands(tile) % 8 == 0)
            and tile.min_ctas * (smem_bytes(r, s, tile) + SMEM_RESERVED) <= SMEM_SM
            and wgmma_halo_rows(r, tile) <= 256
            and wgmma_registers_fit(r, s, tile)
        )
    if tile.tma not in (0, 1, 2) or tile.tap_rows:  # tap_rows: wgrad tiles only
        return False
    if tile.wsmem and not (tile.rowpair and rowpair_registers_fit(r, s, tile)):
        return False
    box_too_big = tile.th + r - 1 > 256 or tile.tw + s - 1 > 256  # TMA boxes: <= 256 a side
    if tile.tma and (not tile.rowpair or tile.cb not in TMA_CHANNEL_BLOCKS or box_too_big):
        return False
    if not tile.rowpair:
        return (tile.th * tile.tw) % (16 * tile.warps) == 0
    groups = tile.cb // 8
    return (
        tile.th % 2 == 0
        and tile.tw % 8 == 0
        and tile.warps % groups == 0
        and (tile.tw // 8) % (tile.warps // groups) == 0
        and (rowpair_fragments(r, s) <= ROWPAIR_MAX_FRAGMENTS or rowpair_registers_fit(r, s, tile))
    )


def _fitted(tile: CudaTile, c: int, warp_per_group: bool = False) -> CudaTile:
    """``tile`` with its channel block halved until it divides C (8 always does); wgrad tiles
    keep one warp per group, row-pair tiles their warps per group."""
    cb = tile.cb
    while cb > 8 and c % cb:
        cb //= 2
    warps = tile.warps
    if warp_per_group:  # wgrad: warps per group (the tap kernel's chunk split) kept
        warps = (cb // 8) * max(1, tile.warps // (tile.cb // 8))
    elif tile.rowpair:
        warps = max(1, tile.warps // (tile.cb // 8)) * (cb // 8)
    elif tile.roll:  # a warpgroup two or four groups
        warps = roll_warps(cb, roll_groups(tile))
    elif tile.wgmma:  # its warpgroups a group (or its groups a warpgroup)
        warps = max(4, wgmma_split(tile) * 4 * (cb // 8) // wgmma_group_loop(tile))
    return dataclasses.replace(tile, cb=cb, warps=warps)


def non_tma_twin(tile: CudaTile, c: int, r: int, s: int, legal=None) -> CudaTile:
    """``tile`` without TMA, its rows halved until its per-chunk staging (16 bytes more per
    pixel than the dense TMA stages) fits shared memory: what runs where no lean launcher can
    pass a tensor map. A row-pair tile of a wide kernel first takes fewer CTAs per SM where
    the per-chunk loads' addresses leave its weights too few registers. ``legal``: the legality
    check (``tile_ok``; the wgrad's ``wgrad_tile_ok``)."""
    legal = legal or tile_ok
    twin = dataclasses.replace(tile, tma=0, sumk=0)  # sumk: the sums sit in the TMA stages
    wide = tile.rowpair and rowpair_fragments(r, s) > ROWPAIR_MAX_FRAGMENTS
    while wide and twin.min_ctas > 1 and not rowpair_registers_fit(r, s, twin):
        twin = dataclasses.replace(twin, min_ctas=twin.min_ctas - 1)
    while not legal(c, r, s, twin) and twin.th > 2:
        twin = dataclasses.replace(twin, th=twin.th // 2)
    if not legal(c, r, s, twin):
        raise ValueError(f"argument 'tile' {tile.name}: no non-TMA twin fits C={c}, {r}x{s}")
    return twin


def candidates(
    c: int, r: int, s: int, tma: bool = False, wide_tiles: bool | None = None, wgmma: bool = False
) -> tuple[CudaTile, ...]:
    """The legal ``TILES`` (and with ``tma`` the ``TMA_TILES``, and for 1 x 1 and 3 x 3 kernels
    where C takes 64-channel blocks the ``WIDE_ROW_TILES``) for C channels and an R x S kernel
    (empty if none fits); row-pair tiles for kernels of more than
    ``ROWPAIR_MAX_FRAGMENTS`` weight fragments, and the ``WIDE_KERNEL_TILES``, only with
    ``wide_tiles`` (None: unless ``TILEWISE_GCONV_WIDE_TILES=0``); with ``tma`` and ``wgmma``
    (a GPU of compute capability 9.0: ``wgmma_usable``) the ``WGMMA_TILES`` for 3+ rows and the
    ``WGMMA_DEEP_TILES`` for 5+, the ``WGMMA_WIDE_TILES`` for 7+."""
    if wide_tiles is None:
        wide_tiles = wide_tiles_offered()
    return _candidates(c, r, s, tma, wide_tiles, wgmma)


@functools.lru_cache(maxsize=1024)
def _candidates(
    c: int, r: int, s: int, tma: bool, wide_tiles: bool, wgmma: bool = False
) -> tuple[CudaTile, ...]:
    pool = TILES + (TMA_TILES if tma else ()) + (TALL_TILES if tma and r >= 5 else ())
    pool += WIDE_ROW_TILES if tma and r == s and r in (1, 3) else ()  # as measured, tested
    pool += WGMMA_TILES if tma and wgmma and r >= 3 else ()
    # the three-stage tiles as measured: 32-channel blocks (fitted down, a tile nobody timed)
    pool += WGMMA_DEEP_TILES if tma and wgmma and r >= 5 and c % 32 == 0 else ()
    pool += WGMMA_WIDE_TILES if tma and wgmma and r >= 7 and c % 16 == 0 else ()
    wide = rowpair_fragments(r, s) > ROWPAIR_MAX_FRAGMENTS
    if wide and wide_tiles:
        pool += tuple(t for t in WIDE_KERNEL_TILES if tma or not t.tma)
    fitted = (_fitted(t, c) for t in pool if _offered(t, c))
    return tuple(
        dict.fromkeys(
            t
            for t in fitted
            if tile_ok(c, r, s, t)
            and (wide_tiles or not (wide and t.rowpair))
            and (not (wide and t.tma) or t.wgmma or _has_twin(t, c, r, s))
        )
    )


def _has_twin(tile: CudaTile, c: int, r: int, s: int) -> bool:
    """Whether a TMA tile has a legal non-TMA twin (what runs without the lean launcher): a
    wide kernel's row-pair tile of one CTA per SM may fit registers only with TMA."""
    try:
        non_tma_twin(tile, c, r, s)
    except ValueError:
        return False
    return True


def _offered(tile: CudaTile, c: int) -> bool:
    """A tile of 64 or 128 channels only where its block divides C: fitted down to fewer
    channels it is a tile nobody measured (session 19's review: the one-CTA-per-SM tiles would
    keep one CTA per SM with a fraction of the warps; session 44's ``WIDE_ROW_TILES`` were
    timed as 64-channel tiles only). A wgmma tile only where C takes 16-channel blocks: fitted
    down to 8 channels it is one warpgroup an SM reading 16-byte pieces of each pixel (session
    31: such tiles read DRAM twice over and ran 2-4x slower)."""
    if tile.wgmma and c % 16:
        return False
    return not (tile.cb >= 64 and c % tile.cb)


def tma_usable(x: torch.Tensor) -> bool:
    """Whether ``x``'s GPU and driver take the TMA tiles (compute capability 9.0+ and
    ``cuTensorMapEncodeTiled``). Without the lean launcher a TMA tile runs as its non-TMA twin
    (``fprop``)."""
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _tma.supported(dev)


def wgmma_usable(x: torch.Tensor) -> bool:
    """Whether ``x``'s GPU takes the ``WGMMA_TILES``: sm_90a code runs on compute capability 9.0
    only, and with TMA (``tma_usable``)."""
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _is_sm90(dev) and _tma.supported(dev)


@functools.cache
def _is_sm90(device: int) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


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
_NON_PORTABLE_CLUSTER_ATTRIBUTE = 14  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED


def _tma_wgrad_stages(r: int, s: int, tile: CudaTile) -> int:
    """The TMA tap wgrad's stages (input halo + dy tile, each dense on the swizzle period) for
    an R x S kernel: the start of its dynamic shared memory (the kernel's WZT)."""
    halo = _tma_stage((tile.th + r - 1) * (tile.tw + s - 1) * tile.cb * 2, tile.cb)
    return tile.stages * (halo + _tma_stage(tile.th * tile.tw * tile.cb * 2, tile.cb))


def wgrad_smem_bytes(r: int, s: int, tile: CudaTile) -> int:
    """``stages`` x (input halo + dy tile) and one zero pixel (row-pair: halo rows of whole
    pairs, no zero pixel; TMA: dense stages on the swizzle period, the alignment slack and the
    mbarriers). ``tap_rows``: the halo and the sums of that many kernel rows."""
    if tile.wgmma:
        producer = wgrad_wg_producer(tile)
        return _wgrad_wg_smem(s, tile.tw, tile.cb, tile.th, tile.stages, producer, tile.tma)
    r = tile.tap_rows or r
    pix = tile.cb * 2 + 16
    if tile.tma:
        stages = _tma_wgrad_stages(r, s, tile)
        return _tma_period(tile.cb) + stages + tile.cb * 2 + 8 * tile.stages
    if tile.rowpair:
        rows = tile.th + 2 * (r // 2 + 1) - 2
        return tile.stages * (rows * (tile.tw + s - 1) * pix + tile.th * tile.tw * pix)
    halo = (tile.th + r - 1) * (tile.tw + s - 1) * pix
    loop = tile.stages * (halo + tile.th * tile.tw * pix) + pix
    if tile.cluster:  # the CTA's fp32 sums (dw, db), staged over the dead buffers at the end
        return max(loop, (r * s * tile.cb * 8 + tile.cb) * 4)
    return loop


def wgrad_copies(r: int, s: int, tile: CudaTile) -> int:
    """The copies of the workspace's sums a wgrad kernel spreads its reductions over
    (``WGRAD_COPIES``): the persistent tap kernel's, where its finish runs over channel pairs
    (the "pairs" finish order and a thread's share at most 24 sums: ``FPAIRS`` in the source),
    else 1 (the row-pair and warpgroup kernels, the cluster tiles, larger shares, the other
    finish orders)."""
    if tile.rowpair or tile.wgmma or tile.cluster or tile.slots:
        return 1
    if WGRAD_FINISH_ORDER != FINISH_ORDERS[0]:
        return 1
    share = (tile.tap_rows or r) * s * cdiv(tile.cb * 8, tile.warps * 32)
    return WGRAD_COPIES if share <= 24 else 1


def finish_staging_bytes(r: int, s: int, tile: CudaTile) -> int:
    """The bytes at the start of a wgrad kernel's dynamic shared memory that its finish may
    stage dw_out in (``FIN_SMEM``): all of it but the tail, where the TMA tiles' alignment slack,
    the zero pixel and the mbarriers sit (at most a swizzle period and 512 bytes), so the
    staging never overwrites an mbarrier."""
    tail = 512 + (_tma_period(tile.cb) if tile.tma else 0)
    return max(0, wgrad_smem_bytes(r, s, tile) - tail)


_WG_WGRAD = "tw_gconv_wgrad_wg"


def source(
    r: int,
    s: int,
    tile: CudaTile,
    bf16: bool,
    bias: int,
    dgrad: bool,
    entry: str,
    dw_cl=False,
    copies: int | None = None,
) -> tuple[str, str]:
    """(CUDA source, entry point) of a kernel variant. ``entry``: "tw_gconv_fprop" (the tile
    picks the tap or row-pair kernel) or "tw_gconv_wgrad". ``bias``: fprop, whether there is one
    (bool); wgrad, 0 no bias gradient, 1 an fp32 one, 2 one in the input dtype. ``dw_cl`` (bool):
    wgrad writes dw in a channels_last weight's layout. ``copies``: the tap wgrad's workspace
    copies (None: ``wgrad_copies``, from the switches now)."""
    template = _SOURCE
    if entry == "tw_gconv_fprop" and tile.roll:
        src = _SOURCE_ROLL.format(
            R=r, S=s, TH=tile.th, CB=tile.cb, GW=roll_groups(tile), RB=ROLL_SLOT_ROWS,
            D=tile.stages, SR=ROLL_STAGING_ROWS,
            MIN_CTAS=tile.min_ctas, IS_BF16=int(bf16),
            HAS_BIAS=int(bias > 0), DGRAD=int(dgrad), WGMMA=_wgmma_asm(bf16, 8 * r),
            ABLATE=int(os.environ.get("TILEWISE_ROLL_ABLATE", "0")),
        )  # fmt: skip
        return src, "tw_gconv_fprop_roll"
    if entry == "tw_gconv_fprop" and tile.wgmma:
        src = _SOURCE_WG.format(
            R=r, S=s, TH=tile.th, CB=tile.cb, HS=wgmma_split(tile), NST=tile.stages,
            GL=wgmma_group_loop(tile), AS=tile.asets, BR=tile.band_rows, MIN_CTAS=tile.min_ctas,
            IS_BF16=int(bf16), HAS_BIAS=int(bias > 0), DGRAD=int(dgrad),
            WGMMA=_wgmma_asm(bf16, 8 * tile.band_rows),
            ABLATE=WG_ABLATE,
        )  # fmt: skip
        return src, "tw_gconv_fprop_wg"
    if entry == "tw_gconv_fprop" and tile.rowpair:
        template, entry = _SOURCE_RP, "tw_gconv_fprop_rp"
    elif entry == "tw_gconv_wgrad" and tile.rowpair:
        template, entry = _SOURCE_WRP, "tw_gconv_wgrad_rp"
    extra = {}
    if entry == "tw_gconv_wgrad" and tile.wgmma:
        template, entry = _SOURCE_WWG, _WG_WGRAD
        dyr, xr = wgrad_wg_rings(tile.th, tile.stages, wgrad_wg_producer(tile), tile.tma)
        ss = _wgmma_asm(bf16, 8 * s, trans_b=True, a_desc=True)
        rs = _wgmma_asm(bf16, 8 * s, trans_b=True)
        extra = {
            "DYR": dyr,
            "XR": xr,
            "MR": RELAYOUT_RING_STEPS,
            "WGMMA": ss,
            "WGMMA_RS": rs,
            "A_SMEM": int(tile.wsmem),
        }
    rows = tile.tap_rows if entry == "tw_gconv_wgrad" and tile.tap_rows else r
    src = template.format(
        **extra,
        R=rows,  # the kernel rows one CTA takes (wgrad with tap_rows) of R_FULL
        R_FULL=r,
        ROWSPLIT=int(rows != r),
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
        CLUSTER=tile.cluster,
        SUMK=tile.sumk,
        TMA=tile.tma if entry in ("tw_gconv_fprop_rp", "tw_gconv_wgrad", _WG_WGRAD) else 0,
        DW_CL=int(dw_cl),
        WSMEM=int(tile.wsmem),
        RED4=int(WGRAD_RED4 and not tile.slots),
        WSLOTS=int(tile.slots),
        SLOT_EARLY=int(tile.slots and not tile.wgmma and SLOT_TRIGGER == "early"),
        WABLATE=WGRAD_ABLATE,
        FIN_ORDER=FINISH_ORDERS.index(WGRAD_FINISH_ORDER),
        FIN_SMEM=finish_staging_bytes(r, s, tile) if entry.startswith("tw_gconv_wgrad") else 0,
        WCOPIES=(copies or wgrad_copies(r, s, tile)) if entry == "tw_gconv_wgrad" else 1,
        STAMPS=WGRAD_STAMPS if entry.startswith("tw_gconv_wgrad") else 0,
        DYN=int(entry == "tw_gconv_fprop_rp" and dynamic_tiles(tile)),
    )
    return src, entry


# one NVRTC compile per kernel variant and device (an uncached one cost ~19 ms), its binary kept
# on disk for the next process (``runtime.nvrtc_cache``)
@functools.cache
def _kernel(
    r: int,
    s: int,
    tile: CudaTile,
    bf16: bool,
    bias: int,
    dgrad: bool,
    device: int,
    entry: str = "tw_gconv_fprop",
    dw_cl: bool = False,
    copies: int = 1,
):
    """The compiled kernel (arguments as ``source``; ``copies`` a wgrad's workspace copies, part
    of the cache key so that a kernel never meets a workspace sized for another count)."""
    src, entry = source(r, s, tile, bf16, bias, dgrad, entry, dw_cl, copies)
    with torch.cuda.device(device):
        arch = "90a" if tile.wgmma else None  # wgmma: sm_90a only
        kernel = nvrtc_cache.compile_kernel(src, entry, compute_capability=arch)
        if entry.startswith("tw_gconv_wgrad"):
            kernel.set_shared_memory_config(wgrad_smem_bytes(r, s, tile))
        else:  # the most any launch asks for: a dependent one may ask for more (launch_smem;
            # its most at min_ctas), on any GPU that makes dependent launches, whatever the
            # switches say now (they may change before a launch)
            most = smem_bytes(r, s, tile)
            if tile.rowpair and _capability(torch.device("cuda", device)) >= (9, 0):
                most = _capped_smem(r, s, tile, tile.min_ctas, *_device_smem(device))
            kernel.set_shared_memory_config(most)
        try:  # all of L1 as shared memory, so min_ctas CTAs fit on an SM
            lib = torch.cuda._utils._get_gpu_runtime_library()
            lib.cuFuncSetAttribute(kernel.func, _CARVEOUT_ATTRIBUTE, 100)
        except Exception as exc:  # a hint only: the launch works without it
            log.info("tilewise gconv_cuda: shared-memory carveout not set (%s)", exc)
        if tile.cluster > MAX_CLUSTER:  # required: a 16-CTA cluster does not launch without it
            result = torch.cuda._utils._get_gpu_runtime_library().cuFuncSetAttribute(
                kernel.func, _NON_PORTABLE_CLUSTER_ATTRIBUTE, 1
            )
            if result != 0:
                torch.cuda._utils._check_cuda(result)
    return kernel


#: the lean launcher per kernel and signature (a module attribute: tests replace it to force
#: PyTorch's launcher)
_launcher = cuda_launch.lean_launcher
available = cuda_launch.nvrtc_available


def _launch(
    kernel, signature: str, grid, block, args, shared_mem: int, device: int, dependent=False
) -> None:
    """Launch on the current stream of ``device`` (``runtime.cuda_launch.launch``);
    ``dependent``: a programmatic dependent launch (the row-pair kernel, ``dependent_launch``)."""
    launcher = _launcher(kernel, signature, dependent)
    cuda_launch.launch(kernel, grid, block, args, shared_mem, device, launcher)


#: switches the row-pair kernel's and the slot sum's programmatic dependent launches off ("0")
ENV_PDL = "TILEWISE_GCONV_PDL"
#: "0" lets a programmatic dependent launch ask for only the shared memory its kernel uses
#: (``launch_smem``; the form before session 41)
ENV_OCCUPANCY_CAP = "TILEWISE_GCONV_OCCUPANCY_CAP"
#: the unit shared memory is allocated to a CTA in (compute capability 8.x and 9.x)
SMEM_GRANULE = 128


def launch_smem(
    r: int,
    s: int,
    tile: CudaTile,
    dependent: bool,
    ctas_per_sm: int = 0,
    sm_bytes: int = SMEM_SM,
    block_max: int = SMEM_MAX,
) -> int:
    """Dynamic shared memory a launch of ``tile`` asks for: the kernel's own (``smem_bytes``),
    raised for a programmatic dependent launch until no more CTAs fit an SM than the grid needs
    there (``ctas_per_sm``, at least ``min_ctas``; unless ``TILEWISE_GCONV_OCCUPANCY_CAP=0``).
    ``sm_bytes``, ``block_max``: the device's shared memory per SM and its per-CTA opt-in limit.

    Why (session 41, H200, ``scripts/autotune_timer_probe.py``): the row-pair kernel lets the
    next launch's CTAs be scheduled as soon as its own start, and those wait on any SM with room
    left. Where an SM fits more CTAs than the persistent grid's ``min_ctas`` (8x16 tiles: 7 by
    shared memory against 4), the next kernel starts with its CTAs piled on some SMs, and its
    static tile order makes those SMs the critical path: back-to-back launches of the 8x16 4-CTA
    tile read 54 us at C=64 3x3 N = 128 against 37 each behind an L2 flush (cold). Asking for
    enough shared memory that one CTA more than the grid needs an SM cannot fit leaves each SM
    its share, whatever the order CTAs land in; the kernel itself is unchanged. A grid larger
    than ``min_ctas`` an SM (channel blocks rounding it up) is capped at what it needs, never
    below, so no CTA waits for a second wave that the uncapped launch would not have had."""
    if not dependent or os.environ.get(ENV_OCCUPANCY_CAP, "1") == "0":
        return smem_bytes(r, s, tile)
    return _capped_smem(r, s, tile, max(tile.min_ctas, ctas_per_sm), sm_bytes, block_max)


def _capped_smem(
    r: int, s: int, tile: CudaTile, ctas: int, sm_bytes: int = SMEM_SM, block_max: int = SMEM_MAX
) -> int:
    """``smem_bytes`` raised to a whole ``SMEM_GRANULE`` count at which ``ctas`` + 1 CTAs no
    longer fit ``sm_bytes`` while ``ctas`` still do; ``smem_bytes`` itself where no such size
    exists within ``block_max``. Never increases with ``ctas``."""
    return pad_for_occupancy(smem_bytes(r, s, tile), ctas, sm_bytes, block_max)


def pad_for_occupancy(
    smem: int, ctas: int, sm_bytes: int = SMEM_SM, block_max: int = SMEM_MAX
) -> int:
    """``smem`` bytes a CTA raised to a whole ``SMEM_GRANULE`` count at which ``ctas`` + 1 CTAs
    no longer fit ``sm_bytes`` while ``ctas`` still do (``smem`` itself where no such size
    exists within ``block_max``); also the TMA probe's launches (``bench.tma_copy``)."""
    share = sm_bytes // (ctas + 1) - SMEM_RESERVED + SMEM_GRANULE
    padded = cdiv(max(smem, share), SMEM_GRANULE) * SMEM_GRANULE
    if padded > block_max or ctas * (padded + SMEM_RESERVED) > sm_bytes:
        return smem  # no room to pad: the CTAs the grid needs must still fit
    return padded


#: "0" keeps a persistent launch's CTAs a channel block at ``min_ctas`` an SM rounded up to whole
#: channel blocks even where the GPU cannot hold them all at once (the rule before session 51)
ENV_RESIDENT_GRID = "TILEWISE_GCONV_RESIDENT_GRID"
#: the rule in force (read once; a probe may set it between binds to time both)
RESIDENT_GRID = os.environ.get(ENV_RESIDENT_GRID, "1") != "0"


def resident_grid_x(wanted: int, blocks: int, per_sm: int | None, sms: int) -> int:
    """CTAs a channel block (grid x) of a persistent launch over ``blocks`` channel (and row)
    blocks: ``wanted`` where the whole grid fits the GPU at once (``per_sm`` CTAs an SM; None:
    not known), else the most that do (at least 1).

    Why (session 51, offline: ptxas's registers and the kernels' shared memory): rounding
    ``min_ctas`` x SMs up to whole channel blocks asks for more CTAs than fit where C has many
    blocks (C=1024: the 64-channel TMA wgrad tile 9 x 16 = 144 CTAs of one an SM; C=256: the
    warpgroup wgrad tiles of two CTAs an SM 17 x 16 = 272), and so do tiles whose registers or
    shared memory hold fewer than ``min_ctas`` an SM (e.g. 5x5/7x7 tap tiles). Each CTA walks a
    fixed share of the tiles, so the CTAs that found no room start when the first ones end: a
    second round as long as the first for a few CTAs."""
    if per_sm is None or per_sm <= 0 or wanted * blocks <= per_sm * sms:
        return wanted
    return max(1, per_sm * sms // blocks)


#: the driver's CTAs an SM per (kernel id, threads, shared memory), asked once; each entry keeps
#: its kernel, so no other kernel can take that id while the answer stands
_RESIDENT: dict[tuple[int, int, int], tuple[object, int | None]] = {}


def _resident_per_sm(kernel, threads: int, smem: int, device: int) -> int | None:
    """CTAs of ``kernel`` an SM of CUDA device ``device`` holds
    (``cuda_launch.max_active_blocks``); None without a CUDA device, without ``RESIDENT_GRID``,
    for a kernel without a function handle (the CPU tests' fakes), or where the driver does not
    say (logged once)."""
    if not RESIDENT_GRID or not torch.cuda.is_available() or not getattr(kernel, "func", None):
        return None
    key = (id(kernel), threads, smem)
    if key not in _RESIDENT:
        try:
            with cuda_launch.on_device(device):  # the kernel's context
                most = cuda_launch.max_active_blocks(kernel, threads, smem)
        except Exception as exc:  # a foreign kernel object: the grid as asked
            most = None
            log.info("tilewise gconv_cuda: no occupancy for a launch (%s)", exc)
        if most is None:
            _log_once("tilewise gconv_cuda: the driver gives no occupancy; grids as asked")
        _RESIDENT[key] = (kernel, most)
    return _RESIDENT[key][1]


@functools.lru_cache(maxsize=16)  # asked on every bind of a launch
def _device_smem(device: int) -> tuple[int, int]:
    """(shared memory per SM, the per-CTA opt-in limit) of CUDA device ``device``; the Hopper
    figures where PyTorch does not report them (or, as in the CPU tests' faked launches, has no
    CUDA device to ask)."""
    if not torch.cuda.is_available():
        return SMEM_SM, SMEM_MAX
    props = torch.cuda.get_device_properties(device)
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
    return per_sm or SMEM_SM, _smem_optin(device) or SMEM_MAX


def dependent_launch(device: torch.device) -> bool:
    """Whether the row-pair kernel starts while the kernel before it drains (its prologue and
    launch overlap that kernel's tail; it waits for that kernel's writes before reading), and
    the wgrad's slot-sum kernel likewise after its tap kernel: on Hopper and later
    (``griddepcontrol``), unless ``TILEWISE_GCONV_PDL=0``."""
    return os.environ.get(ENV_PDL, "1") != "0" and _capability(device) >= (9, 0)


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0)
    return torch.cuda.get_device_capability(device)


def fprop(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pad_h: int,
    pad_w: int,
    tile: CudaTile = _DEFAULT_TILE,
    dgrad: bool = False,
) -> torch.Tensor:
    """``out = conv2d(x, weight, bias, padding, groups=C/8)`` for channels_last fp16/bf16 ``x`` and
    ``out`` (preallocated; its size sets the output size), weights of any strides. ``dgrad=True``
    convolves with the weights flipped and transposed within each group, without making them
    (padding ``R - 1 - pad``, which may be negative). Launches on the current stream."""
    bind_fprop(x, weight, bias, out, pad_h, pad_w, tile, dgrad)(x, weight, bias, out)
    return out


class BoundLaunch:
    """One kernel's launch for one problem (shapes, strides, dtypes, tile): called with that
    problem's tensors, it fills in their pointers (and tensor maps) and launches on the current
    stream. ``planned``: through its own ``PlannedLaunch`` (scalars written once; for the ops'
    per-problem plans), else through the kernel's shared lean launcher."""

    __slots__ = ("kernel", "signature", "grid", "block", "smem", "dev", "scalars", "n_ptrs",
                 "maps", "dependent", "planned")  # fmt: skip

    def __init__(self, kernel, signature, grid, block, smem, dev, scalars, n_ptrs, maps,
                 dependent=False, planned=False) -> None:  # fmt: skip
        self.kernel, self.signature, self.grid, self.block = kernel, signature, grid, block
        self.smem, self.dev, self.scalars, self.n_ptrs = smem, dev, tuple(scalars), n_ptrs
        self.maps, self.dependent = maps, dependent  # maps: (pointer index, cb, box w, box h)
        self.planned = None
        lean = _launcher(kernel, signature, dependent) if planned else None
        if lean is not None:  # its own launcher, dependent only where the kernel's lean one is
            self.planned = cuda_launch.PlannedLaunch(  # (a driver without cuLaunchKernelEx)
                kernel, signature, grid, block, smem, self.scalars,
                dependent and getattr(lean, "dependent", dependent),
            )  # fmt: skip

    def launch(self, ptrs: list) -> None:
        """Launch with the problem's tensors ``ptrs`` (in the kernel's pointer order)."""
        live = ptrs + [_tensor_map(ptrs[i], cb, bw, bh) for i, cb, bw, bh in self.maps]
        if self.planned is None:
            args = ptrs + list(self.scalars) + live[self.n_ptrs :]
            _launch(self.kernel, self.signature, self.grid, self.block, args, self.smem,
                    self.dev, self.dependent)  # fmt: skip
        else:
            with cuda_launch.on_device(self.dev):
                self.planned.run(live, torch._C._cuda_getCurrentRawStream(self.dev))


class BoundFprop(BoundLaunch):
    """``fprop`` bound to one problem: ``(x, weight, bias, out)`` of that problem's metadata."""

    __slots__ = ()

    def __call__(self, x, weight, bias, out) -> None:
        b = bias.float() if bias is not None else weight  # the kernel adds an fp32 bias (or none)
        self.launch([x, weight, b, out])


class BoundDynamicFprop(BoundLaunch):
    """``BoundFprop`` of a kernel that hands out its tiles by counters (``dynamic_tiles``): two
    per channel block (next tile, CTAs finished) from the stream's self-cleaning workspace."""

    __slots__ = ()

    def __call__(self, x, weight, bias, out) -> None:
        b = bias.float() if bias is not None else weight
        counters = tile_counters(x.device, self.grid[1])
        with workspace.guarded(x.device):
            self.launch([x, weight, b, out, counters])


def tile_counters(device: torch.device, cblocks: int) -> torch.Tensor:
    """The zeroed counters a ``dynamic_tiles`` kernel takes (next tile, CTAs finished, per
    channel block) from the stream's self-cleaning workspace; the kernel leaves them zero."""
    return workspace.zeroed(device, (2 * cblocks,))[0].view(torch.int32)


def bind_fprop(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    pad_h: int,
    pad_w: int,
    tile: CudaTile = _DEFAULT_TILE,
    dgrad: bool = False,
    planned: bool = False,
) -> BoundFprop:
    """``fprop``'s launch for the shapes, strides and dtypes of these tensors (the tensors
    themselves are not kept): the kernel, grid, scalar arguments and tensor-map boxes, worked out
    once. ``planned``: scalars written once into a launcher of its own (``BoundLaunch``)."""
    n, c, hi, wi = x.shape
    _, _, ho, wo = out.shape
    r, s = weight.shape[2], weight.shape[3]
    if tile.tma not in _TMA_SIGNATURES or (tile.tma and not (tile.rowpair or tile.wgmma)):
        raise ValueError(f"argument 'tile' {tile}: TMA (1 or 2) takes the row-pair kernel only")
    if tile.wgmma and not tile_ok(c, r, s, tile):  # e.g. without both tensor maps or a
        # warpgroup per group, the kernel would leave outputs unwritten
        raise ValueError(f"argument 'tile' {tile.name} does not fit C={c}, {r}x{s} (tile_ok)")
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    kernel = _kernel(r, s, tile, x.dtype == torch.bfloat16, bias is not None, dgrad, dev)
    no_launcher = tile.tma and _launcher(kernel, _signature(tile)) is None
    if tile.wgmma and no_launcher:  # its tensor maps need the lean launcher; no twin exists,
        # so the first candidate without TMA (a choice cached by a process that had the launcher)
        plain = candidates(c, r, s, tma=False)
        if not plain:
            raise ValueError(f"argument 'tile' {tile.name}: needs the lean launcher (tensor maps)")
        _log_once(f"tilewise gconv_cuda: {tile.name} needs the lean launcher; {plain[0].name} runs")
        tile, no_launcher = plain[0], False
        kernel = _kernel(r, s, tile, x.dtype == torch.bfloat16, bias is not None, dgrad, dev)
    if no_launcher:
        # PyTorch's own launcher cannot pass a tensor map: the same tile without TMA
        _log_once(f"tilewise gconv_cuda: {tile.name} runs without TMA (no lean launcher)")
        tile = non_tma_twin(tile, c, r, s)
        kernel = _kernel(r, s, tile, x.dtype == torch.bfloat16, bias is not None, dgrad, dev)
    tiles_h, tiles_w = cdiv(ho, tile.th), cdiv(wo, tile.tw)
    n_tiles = n * tiles_h * tiles_w
    cblocks, sms = c // tile.cb, num_sms(x.device)
    grid_x = max(1, min(n_tiles, cdiv(tile.min_ctas * sms, cblocks)))
    most = _resident_per_sm(kernel, tile.warps * 32, smem_bytes(r, s, tile), dev)
    grid_x = resident_grid_x(grid_x, cblocks, most, sms)
    scalars = [hi, wi, ho, wo, c, pad_h, pad_w, tiles_h, tiles_w, n_tiles, *weight.stride()]
    maps = []
    if tile.roll:  # a copy an input row; a copy a warpgroup's channels of an output row
        maps += [(0, tile.cb, tile.tw + s - 1, 1), (3, 8 * roll_groups(tile), tile.tw, 1)]
    elif tile.tma:  # the wgmma kernel loads whole input row pairs
        halo_rows = wgmma_halo_rows(r, tile) if tile.wgmma else tile.th + r - 1
        maps.append((0, tile.cb, tile.tw + s - 1, halo_rows))
        if tile.tma == 2:
            maps.append((3, tile.cb, tile.tw, tile.th))
    grid, block = (grid_x, cblocks, 1), (tile.warps * 32, 1, 1)
    dependent = tile.rowpair and dependent_launch(x.device)
    per_sm = cdiv(grid_x * cblocks, sms)  # CTAs an SM holds for one wave
    smem = launch_smem(r, s, tile, dependent, per_sm, *_device_smem(dev))
    if dynamic_tiles(tile):  # the counters ride after the four tensors
        return BoundDynamicFprop(kernel, _signature(tile), grid, block, smem, dev, scalars, 5,
                                 maps, dependent, planned)  # fmt: skip
    return BoundFprop(kernel, _signature(tile), grid, block, smem, dev, scalars, 4, maps,
                      dependent, planned)  # fmt: skip


#: tensor maps of the TMA tiles' inputs and outputs, by address and shape (a loop's buffers
#: come back)
_TMA_MAPS = _tma.MapCache()
#: the fprop kernels' argument kinds by ``CudaTile.tma``: the TMA variants take the input's map,
#: and ``tma=2`` the output's too
_TMA_SIGNATURES = {0: "pppp" + "i" * 14, 1: "pppp" + "i" * 14 + "t", 2: "pppp" + "i" * 14 + "tt"}


def _signature(tile: CudaTile) -> str:
    """The fprop kernel's argument kinds for ``tile``: a dynamically scheduled one takes its
    counters as a fifth pointer."""
    sig = _TMA_SIGNATURES[tile.tma]
    return "p" + sig if dynamic_tiles(tile) else sig


@functools.cache
def _log_once(message: str) -> None:
    log.warning(message)


def _tensor_map(t: torch.Tensor, cb: int, box_w: int, box_h: int) -> _tma.TensorMap:
    key = (t.data_ptr(), t.shape, t.dtype, cb, box_w, box_h)
    return _TMA_MAPS.get(key, lambda: (_tma.nhwc_halo_map(t, cb, box_w, box_h), t.data_ptr()))


#: output pixels (N x Ho x Wo) up to which the cluster tiles are candidates: beyond, 8 CTAs per
#: channel block leave SMs idle against the persistent grid of the other tiles
CLUSTER_MAX_PIXELS = 16384
#: kernel rows from which the wgmma wgrad tiles are offered: M = 8 kernel rows wastes (8 - R) / 8
WGMMA_WGRAD_MIN_ROWS = 5
#: the largest portable thread-block cluster
MAX_CLUSTER = 8
#: the largest cluster an H100 launches once a kernel allows non-portable sizes (experimental
#: tiles only)
NON_PORTABLE_MAX_CLUSTER = 16
#: the wgmma fprop/dgrad kernel's diagnosis switch (``TILEWISE_WG_ABLATE``, read once: wrong or
#: slower kernels for timing only); part of ``SOURCE_DIGEST`` when set, so an ablated process's
#: autotune timings never land under the normal key
WG_ABLATE = int(os.environ.get("TILEWISE_WG_ABLATE") or 0)
#: the tap wgrad's sums leave by four-wide atomics (``TILEWISE_GCONV_WGRAD_RED4=1``, read once;
#: session 42; compute capability 9.0+): a quarter of the L2 operations. Off: its GPU tests pass
#: but the 3x3 wgrad read the same with it (session 43), so its ~11 us of fixed cost a launch is
#: not the atomics
ENV_WGRAD_RED4 = "TILEWISE_GCONV_WGRAD_RED4"
WGRAD_RED4 = os.environ.get(ENV_WGRAD_RED4, "0") == "1"
#: the tap wgrad's diagnosis switch (``TILEWISE_GCONV_WGRAD_ABLATE``, read once: wrong results,
#: for timing only; session 45): bits 1 no atomics, 2 no finish, 4 no MMAs, 8 no loads (TMA
#: tiles); session 46, inside the finish: 16 the count alone (no last-CTA pass), 32 no fence
#: before the count; session 47: 64 the pass's loads without its stores; session 48: 128 plain
#: stores in place of the scalar dw reductions (the bias's and RED4's stay). Part of
#: ``SOURCE_DIGEST`` when set, as ``WG_ABLATE``. What it is for: the 3x3 wgrad pick takes
#: ~11.5 us more than its bytes at any N (session 45, H200: 13.5 us at C=64 N=8, one tile a CTA,
#: where the fprop takes 6.1)
ENV_WGRAD_ABLATE = "TILEWISE_GCONV_WGRAD_ABLATE"
WGRAD_ABLATE = int(os.environ.get(ENV_WGRAD_ABLATE) or 0)
#: the order of the wgrad finish's pass over the block's sums
#: (``TILEWISE_GCONV_WGRAD_FINISH_ORDER``, read once): "pairs" (session 47, the default) each
#: thread a channel pair's taps, every load and zeroing a warp's one line, no index division, all
#: loads in one batch, where a thread's share is at most 24 sums (else as "dw_out"); "dw_out"
#: the element order of dw_out (before session 47); "workspace" the workspace's (session 46's
#: switch). Why: session 47's clock stamps put 3.2 us of the 3x3 pick (C=64, H200) in the
#: dw_out-order pass, in three rounds of loads (0.42-0.90 us each) and their stores' index
#: arithmetic and branches (0.22-0.64 us each); the workspace order took 0.2-0.4 us of it, the
#: pairs' order (with a contiguous dw_out staged in shared memory) 2.3. Part of
#: ``SOURCE_DIGEST`` when not the default
ENV_WGRAD_FINISH_ORDER = "TILEWISE_GCONV_WGRAD_FINISH_ORDER"
FINISH_ORDERS = ("pairs", "dw_out", "workspace")
WGRAD_FINISH_ORDER = os.environ.get(ENV_WGRAD_FINISH_ORDER) or FINISH_ORDERS[0]
if WGRAD_FINISH_ORDER not in FINISH_ORDERS:
    raise ValueError(
        f"{ENV_WGRAD_FINISH_ORDER}={WGRAD_FINISH_ORDER!r} is none of {', '.join(FINISH_ORDERS)}"
    )
#: the copies of the workspace's sums the tap wgrad's CTAs spread their reductions over
#: (``TILEWISE_GCONV_WGRAD_COPIES``, read once; session 48): CTA b adds into copy b % copies and
#: the last CTA's pass adds the copies up (only where the pass runs over channel pairs, 3x3 and
#: smaller at the usual tiles; elsewhere one copy). Why it was tried: session 48's clock stamps
#: (H200, the 3x3 pick at C=64 N = 8) had the count complete 3.1 us after the last CTA's sums
#: left, with plain stores in their place too (so not the reductions' arithmetic), and 1.9 us
#: with half the CTAs writing (clusters of two adding up first): 128 CTAs writing the same 144
#: lines queue at them. What it did (graph replay, C=64 N = 8 / 32 / 128): 1 copy 10.2 / 16.7 /
#: 39.1 us, 2 10.4 / 17.5 / 40.0, 4 10.5 / 17.9 / 40.7, 8 12.3 / 19.9 / 42.6; with 4 the count
#: came 1.4 us sooner but the last CTA's pass over four times the sums took 1.2 us longer. Off
#: (1). Part of ``SOURCE_DIGEST`` when not the default
ENV_WGRAD_COPIES = "TILEWISE_GCONV_WGRAD_COPIES"
WGRAD_COPIES_DEFAULT = 1
WGRAD_COPIES = int(os.environ.get(ENV_WGRAD_COPIES) or WGRAD_COPIES_DEFAULT)
if WGRAD_COPIES not in (1, 2, 4, 8):
    raise ValueError(f"{ENV_WGRAD_COPIES}={WGRAD_COPIES} is none of 1, 2, 4, 8")
#: where the slot tiles' CTAs (``CudaTile.slots``) let the dependent slot-sum kernel be launched
#: (``TILEWISE_GCONV_SLOT_TRIGGER``, read once; session 49): "late" (default), once a CTA's
#: slot is stored; "early", at its start (``griddepcontrol.launch_dependents``). Early, the
#: slot-sum kernel's CTAs start at once and wait (``griddepcontrol.wait``) for the tap kernel's
#: end: a profiler then books the wait to it as well, and session 49's in-situ study read the
#: 3x3 wgrad at about twice its time at batch 128-256 (ConvFirst 86.7 us a layer at 128, where
#: graph replay of the wgrad alone read 38.9). Part of ``SOURCE_DIGEST`` when not the default
ENV_SLOT_TRIGGER = "TILEWISE_GCONV_SLOT_TRIGGER"
SLOT_TRIGGERS = ("late", "early")
SLOT_TRIGGER = os.environ.get(ENV_SLOT_TRIGGER) or SLOT_TRIGGERS[0]
if SLOT_TRIGGER not in SLOT_TRIGGERS:
    raise ValueError(f"{ENV_SLOT_TRIGGER}={SLOT_TRIGGER!r} is none of {', '.join(SLOT_TRIGGERS)}")
#: the tap wgrad's phase stamps (session 47, diagnosis only): the address of a u64 buffer of at
#: least 64 + 4 x CTAs words that ``scripts/wgrad_stamp_probe.py`` allocates and sets here before
#: the first compile (0: off; the source then has no stamps). Not part of ``SOURCE_DIGEST``: the
#: probe times no autotune choice
WGRAD_STAMPS = 0
#: the row-pair TMA tiles hand out their tiles past each CTA's first by a counter
#: (``TILEWISE_GCONV_DYNAMIC_TILES=1``, read once; session 43, off). Why it was tried: Nsight
#: Compute read the C=64 3x3 N=128 row-pair 8x16 tile's SMs active only 85% of its 40 us. What
#: it did (session 43, H200): SMs 92% active, the kernel 3-11% slower at 4 CTAs an SM and 25-29%
#: at 6; kept as the tool for studying tile orders
ENV_DYNAMIC_TILES = "TILEWISE_GCONV_DYNAMIC_TILES"
DYNAMIC_TILES = os.environ.get(ENV_DYNAMIC_TILES, "0") == "1"


def dynamic_tiles(tile: CudaTile) -> bool:
    """Whether ``tile``'s fprop/dgrad kernel takes its tiles from counters (``DYNAMIC_TILES``:
    the row-pair kernel with TMA loads)."""
    return (
        DYNAMIC_TILES
        and tile.rowpair
        and tile.tma > 0
        and tile.stages >= 2  # the kernel's first tile is static: one stage has none
        and not tile.roll
        and not tile.wgmma
    )


#: part of the autotune keys of the ops that time these kernels: a cached choice made with other
#: kernel sources or other tile tables is timed again instead of trusted (session 8: an edited
#: epilogue made a cached tile 20% slower than another candidate; session 9: new TMA tiles were
#: never timed where an older choice was still a candidate). The rolling-row kernel
#: (``ROLL_TILES``) is not a candidate, so neither its source nor its tiles are part of it.
SOURCE_DIGEST = hashlib.sha1(
    (
        _SOURCE
        + _SOURCE_RP
        + _SOURCE_WRP
        + _SLOT_SUM_SOURCE
        + _SOURCE_WG
        + _wgmma_asm(False)
        + _wgmma_asm(True)
        + repr(
            (
                TILES,
                TMA_TILES,
                WIDE_ROW_TILES,
                WGRAD_TILES,
                TMA_WGRAD_TILES,
                CLUSTER_WGRAD_TILES,
                ROW_WGRAD_TILES,
                EXPERIMENTAL_WGRAD_TILES,
                SUMK_WGRAD_TILES,
                WIDE_KERNEL_TILES,
                TALL_TILES,
                EXPERIMENTAL_FPROP_TILES,
                WGMMA_TILES,
                WGMMA_DEEP_TILES,
                WGMMA_WIDE_TILES,
                EXPERIMENTAL_WGMMA_TILES,
            )
        )
        + (f"wg-ablate {WG_ABLATE}" if WG_ABLATE else "")
        + ("wgrad-red4" if WGRAD_RED4 else "")
        + (f"wgrad-ablate {WGRAD_ABLATE}" if WGRAD_ABLATE else "")
        + (f"wgrad-finish {WGRAD_FINISH_ORDER}" if WGRAD_FINISH_ORDER != FINISH_ORDERS[0] else "")
        + (f"wgrad-copies {WGRAD_COPIES}" if WGRAD_COPIES != WGRAD_COPIES_DEFAULT else "")
        + (f"slot-trigger {SLOT_TRIGGER}" if SLOT_TRIGGER != SLOT_TRIGGERS[0] else "")
        # the slot forms among the fast mode's candidates (session 49; derived, not a table)
        + "wgrad candidates: the TMA tiles' slot forms first"
        + ("dynamic-tiles" if DYNAMIC_TILES else "")
        # the launch rule the timings depend on (session 41: launch_smem; a choice timed with
        # TILEWISE_GCONV_OCCUPANCY_CAP=0 is stored under the same key)
        + "launch_smem: dependent row-pair launches capped at the CTAs an SM needs"
        # session 51: persistent grids cut to what the GPU holds at once (resident_grid_x)
        + ("grids all resident" if RESIDENT_GRID else "")
    ).encode()
).hexdigest()[:10]


def wgrad_wg_producer(tile: CudaTile) -> bool:
    """Whether a wgmma wgrad tile has producer warps (``warps`` 4 a group plus one or two; dy read
    from shared memory only): they load the rows, the warpgroups meet them at mbarriers."""
    return tile.wgmma and tile.warps % 4 in (1, 2)


def wgrad_wg_registers_fit(s: int, tile: CudaTile) -> bool:
    """Whether a wgmma wgrad tile's registers (the accumulators, 4 S; with dy in registers
    4 a k-step of every row of a step; with a producer warp 32; 36 more: ptxas at 5x5/7x7 in
    session 32, 125-127 for 4 rows a step at 7x7) fit its CTAs per SM (65536 an SM, at most 255
    a thread)."""
    a = 0 if tile.wsmem else 4 * tile.th * (tile.tw // 16)
    a += 32 if wgrad_wg_producer(tile) else 0  # its load offsets (94 at 7x7 against 70)
    cap = min(255, 65536 // (tile.min_ctas * tile.warps * 32))
    return 4 * s + a + 36 <= cap


#: part of the wgrad's autotune key where the wgmma wgrad tiles are candidates (apart from
#: ``SOURCE_DIGEST``, so that adding them left every other cached choice valid)
WGRAD_WG_DIGEST = hashlib.sha1(
    (
        inspect.getsource(_wgrad_wg_module)  # the template, its ring and shared-memory rules
        + _wgmma_asm(False, 56, True, True)
        + _wgmma_asm(True, 56, True)
        + repr((WGMMA_WGRAD_TILES, EXPERIMENTAL_WGMMA_WGRAD_TILES, WGMMA_WGRAD_MIN_ROWS))
        # the rule that offers their slot forms first (session 50; derived, not a table)
        + "the warpgroup tiles' slot forms first"
    ).encode()
).hexdigest()[:8]
#: the row-pair wgrad keeps 2 x (R / 2 + 1) x S accumulator fragments (4 registers each)
ROWPAIR_WGRAD_MAX_FRAGMENTS = 16


@functools.lru_cache(maxsize=4096)  # asked on every wgrad launch
def wgrad_tile_ok(c: int, r: int, s: int, tile: CudaTile) -> bool:
    """Warps per group dividing the tile's 16-pixel chunks (the row-pair kernel: one), channel
    block dividing C, shared memory within the H100's limit, at least 16 pixels per warp (the
    tap source's fprop kernel gives each warp a 16-pixel row), clusters of at most
    ``NON_PORTABLE_MAX_CLUSTER`` (tap kernel only; above ``MAX_CLUSTER`` experimental);
    row-pair: row pairs, 16-pixel rows and accumulators that fit registers."""
    groups = tile.cb // 8
    if tile.wgmma:  # a warpgroup a group, 16-column k-steps, up to 8 kernel rows (its M)
        plain = not (tile.rowpair or tile.cluster or tile.tap_rows or tile.sumk)
        # slots: on the tiles whose rows load by cp.async (the offered ones; the tensor-copy and
        # staged forms are experimental and their slot forms untested)
        plain = plain and not (tile.slots and tile.tma)
        # tma 1: the rows by tensor copies from one producer warp's lane 0; 2: by producer warps
        # into a staging ring that the warpgroups re-lay out
        producers = tile.warps - 4 * groups
        plain = plain and (
            tile.tma == 0
            or (tile.tma == 1 and producers == 1)
            # the staging swizzle (g ^ SWZ(p)) stays within the groups only for 1, 2, 4, 8
            or (tile.tma in (2, 3) and producers in (1, 2) and groups & (groups - 1) == 0)
        )
        return (
            plain
            and wgrad_wg_registers_fit(s, tile)
            and tile.cb % 8 == 0
            and c % tile.cb == 0
            and producers in ((0, 1, 2) if tile.wsmem else (0,))
            and tile.tw % 16 == 0
            and 16 <= tile.tw <= 64
            and tile.th >= 1
            and tile.stages >= (2 if wgrad_wg_producer(tile) else 1)  # 1 ring step: a deadlock
            and 1 <= r <= _WG_WINDOW
            and 8 * s <= 256  # the MMA's N
            and tile.min_ctas * (wgrad_smem_bytes(r, s, tile) + SMEM_RESERVED) <= SMEM_SM
        )
    if c % tile.cb or tile.warps % groups or wgrad_smem_bytes(r, s, tile) > SMEM_MAX:
        return False
    if tile.th * tile.tw < 16 * tile.warps:  # the source's fprop tap kernel: a row per warp
        return False
    split = tile.warps // groups
    if ((tile.th * tile.tw) // 16) % split or (tile.rowpair and split != 1):
        return False
    if not 0 <= tile.cluster <= NON_PORTABLE_MAX_CLUSTER or (tile.cluster and tile.rowpair):
        return False
    if tile.tap_rows and (tile.rowpair or tile.tma or r % tile.tap_rows or tile.tap_rows > r):
        return False
    if tile.tma and (
        tile.tma != 1
        or tile.rowpair
        or tile.cluster
        or tile.cb not in TMA_CHANNEL_BLOCKS
        or max(tile.th + r - 1, tile.tw + s - 1) > 256
    ):
        return False
    if tile.sumk and not sum_clusters_fit(r, s, tile):
        return False
    if tile.slots and (tile.rowpair or tile.cluster or tile.sumk or split != 1):
        return False  # slots: persistent tap CTAs whose warps hold disjoint sums
    if not tile.rowpair:
        return True
    fragments = 2 * (r // 2 + 1) * s
    return tile.th % 2 == 0 and tile.tw % 16 == 0 and fragments <= ROWPAIR_WGRAD_MAX_FRAGMENTS


def sum_clusters_fit(r: int, s: int, tile: CudaTile) -> bool:
    """Whether a ``sumk`` tile is legal: clusters of 2 or 4 persistent TMA CTAs (no cluster
    grid, no row split), whose sums (a thread's (R S + 1) / 2 x 4, past a 128-byte head) fit the
    stages they wait in (the kernel's static_assert)."""
    if tile.sumk not in (2, 4) or tile.tma != 1 or tile.cluster or tile.tap_rows or tile.rowpair:
        return False
    return 128 + (r * s + 1) // 2 * 4 * tile.warps * 32 * 4 <= _tma_wgrad_stages(r, s, tile)


def wgrad_candidates(
    c: int, r: int, s: int, small: bool = True, tma: bool | None = None, wgmma: bool | None = None
) -> tuple[CudaTile, ...]:
    """The legal ``WGRAD_TILES`` for C channels and an R x S kernel (empty if none fits), the
    ``TMA_WGRAD_TILES`` with ``tma`` (None: whether the current GPU has TMA) and their slot
    forms (``CudaTile.slots``), and the
    ``CLUSTER_WGRAD_TILES`` and ``ROW_WGRAD_TILES`` for a ``small`` problem (at most
    ``CLUSTER_MAX_PIXELS``), and with ``wgmma`` (None: whether the current GPU takes sm_90a code
    and TMA) the ``WGMMA_WGRAD_TILES`` and their slot forms for kernels of
    ``WGMMA_WGRAD_MIN_ROWS`` rows or more.
    ``TILEWISE_EXPERIMENTAL_WGRAD=1`` adds ``EXPERIMENTAL_WGRAD_TILES`` (for timing studies; a
    choice already cached on disk is not timed again; its TMA tiles only with ``tma``)."""
    experimental = os.environ.get(ENV_EXPERIMENTAL_WGRAD) == "1"
    if tma is None:
        tma = torch.cuda.is_available() and _tma.supported(torch.cuda.current_device())
    if wgmma is None:
        dev = torch.cuda.current_device() if torch.cuda.is_available() else None
        wgmma = tma and dev is not None and _is_sm90(dev)
    return _wgrad_candidates(c, r, s, small, experimental, tma, wgmma)


@functools.lru_cache(maxsize=1024)
def _wgrad_candidates(
    c: int, r: int, s: int, small: bool, experimental: bool, tma: bool = False, wgmma=False
) -> tuple:
    wg = _offered_wgmma_wgrad(c, r) if wgmma else ()
    # their slot forms first (session 50, H200, C=64, graph replay: faster than the atomic form
    # in every cell probed. With dw channels_last by 1.4-4.7 us (7x7 N=128 72.9 against 76.1);
    # with dw contiguous by 4-27 us (73.4 against 92.9), where the atomic forms read 3-17 us
    # slower than with dw channels_last and the slot forms the same.
    # Issue 3's study chose them in all 16 cells at N >= 32: 0.6-17% faster than session 49's)
    wg = _slot_forms(wg) + wg
    tiles = _offered_tma_wgrad(c) if tma else ()
    # their slot forms first (session 49, H200, 3x3: faster than the atomic form in all 7 of
    # the cells timed, 7.9 against 10.2 us at C=64 N = 8, 38.9 against 39.2 at N = 128)
    tiles = _slot_forms(tiles) + tiles
    tiles += WGRAD_TILES + (CLUSTER_WGRAD_TILES + ROW_WGRAD_TILES if small else ())
    if experimental:
        tiles += tuple(t for t in EXPERIMENTAL_WGRAD_TILES if tma or not t.tma)
    fitted = wg + tuple(_fitted(t, c, warp_per_group=True) for t in tiles)
    return tuple(dict.fromkeys(t for t in fitted if wgrad_tile_ok(c, r, s, t)))


def _slot_forms(tiles: tuple[CudaTile, ...]) -> tuple[CudaTile, ...]:
    """The slot forms (``CudaTile.slots``) of ``tiles``, in their order."""
    return tuple(dataclasses.replace(t, slots=True) for t in tiles)


def _offered_tma_wgrad(c: int) -> tuple[CudaTile, ...]:
    """The ``TMA_WGRAD_TILES`` offered for C channels (unfitted)."""
    return tuple(t for t in TMA_WGRAD_TILES if _offered(t, c))


def _offered_wgmma_wgrad(c: int, r: int) -> tuple[CudaTile, ...]:
    """The ``WGMMA_WGRAD_TILES`` offered for C channels and R kernel rows (as they are: their
    warps, a producer's included, are not one a group)."""
    if r < WGMMA_WGRAD_MIN_ROWS:
        return ()
    return tuple(t for t in WGMMA_WGRAD_TILES if c % t.cb == 0)


def slot_wgrad_candidates(
    c: int, r: int, s: int, tma: bool = False, wgmma: bool = False
) -> tuple[CudaTile, ...]:
    """The deterministic wgrad's tiles for C channels and an R x S kernel: the slot forms
    (``CudaTile.slots``) of the offered ``WGMMA_WGRAD_TILES`` (with ``wgmma``: 5+ kernel rows), of
    the offered ``TMA_WGRAD_TILES`` (with ``tma``) and of the tap tiles of ``WGRAD_TILES``,
    fitted to C and legal. Each CTA's sums and the slot-sum kernel's additions run in an order
    fixed by the launch shapes (``gconv_slots``)."""
    return _slot_wgrad_candidates(c, r, s, bool(tma), bool(tma and wgmma))


@functools.lru_cache(maxsize=1024)
def _slot_wgrad_candidates(c: int, r: int, s: int, tma: bool, wgmma: bool) -> tuple:
    wg = _slot_forms(_offered_wgmma_wgrad(c, r)) if wgmma else ()
    tiles = _offered_tma_wgrad(c) if tma else ()
    tiles += tuple(t for t in WGRAD_TILES if not (t.rowpair or t.cluster))
    fitted = (_fitted(t, c, warp_per_group=True) for t in _slot_forms(tiles))
    return tuple(dict.fromkeys(t for t in wg + tuple(fitted) if wgrad_tile_ok(c, r, s, t)))


def wgrad_twin(tile: CudaTile, c: int, r: int, s: int) -> CudaTile:
    """A TMA wgrad ``tile`` without TMA (``non_tma_twin`` by the wgrad's legality check)."""
    return non_tma_twin(tile, c, r, s, wgrad_tile_ok)


#: the wgrad kernels' argument kinds (a TMA tile adds the input's and dy's tensor maps, "tt")
_WGRAD_SIGNATURE = "ppppppp" + "i" * 10


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
    dw_cl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight gradient [C, 8, R, S] in x's dtype, contiguous or with ``dw_cl`` channels_last,
    bias gradient [C] in ``db_dtype`` (fp32 or x's dtype) or None) of the grouped conv
    ``y = conv2d(x, w, padding)`` given ``dy``, both channels_last fp16/bf16. One launch: the
    CTAs add fp32 sums with atomics (run-to-run rounding differences: the non-deterministic mode)
    into a workspace whose last CTA per channel block writes the results and zeroes it again. A
    ``slots`` tile instead stores each CTA's sums in its own slot and a second, dependent kernel
    adds them up in a fixed order (``gconv_slots``; the same bits from run to run)."""
    return bind_wgrad(dy, x, r, s, pad_h, pad_w, need_db, tile, db_dtype, dw_cl)(dy, x)


def _sum_grid(kernel, grid_x: int, ctas: int, blocks: int, tile: CudaTile, smem: int) -> int:
    """A ``sumk`` tile's CTAs per channel block: ``grid_x`` rounded up to whole clusters where
    that stays within ``ctas`` (else down), then cut to the clusters the GPU holds at once, so
    that none waits for another to leave (``blocks``: channel blocks x row blocks)."""
    k = tile.sumk
    up = cdiv(grid_x, k) * k
    grid_x = up if up <= ctas else max(k, grid_x // k * k)
    block = (tile.warps * 32, 1, 1)
    most = cuda_launch.max_active_clusters(kernel, (grid_x, blocks, 1), block, smem)
    if most is None:
        _log_once(f"tilewise gconv_cuda: {tile.name}: the driver gives no cluster occupancy")
    elif most >= blocks:
        grid_x = min(grid_x, most // blocks * k)
    return grid_x


class BoundWgrad(BoundLaunch):
    """``wgrad`` bound to one problem: ``(dy, x) -> (dw, db or None)``. ``slot_sum``: a slots
    tile's slot-sum launch (``gconv_slots``), after the tap kernel's."""

    __slots__ = ("dw_shape", "dw_format", "db_dtype", "sums", "cluster", "slot_sum", "slot_numel")

    def __call__(self, dy, x) -> tuple[torch.Tensor, torch.Tensor | None]:
        dw = alloc.empty(*self.dw_shape, device=x.device, dtype=x.dtype,
                         memory_format=self.dw_format)  # fmt: skip
        c = self.dw_shape[0]
        db = alloc.empty(c, device=x.device, dtype=self.db_dtype) if self.db_dtype else None
        if self.slot_sum is not None:  # no workspace: every slot word is stored, then summed
            slots = gconv_slots.slot_buffer(self.slot_numel, x.device)
            out_b = db if db is not None else dw
            self.launch([x, dy, slots, slots, dw, out_b, slots])
            self.slot_sum.launch([slots, dw, out_b])
            return dw, db
        if self.cluster:  # one cluster per channel block; it writes dw and db itself
            dw_sums = db_sums = counters = dw
        else:
            dw_sums, db_sums, counters = workspace.zeroed(x.device, self.sums)
            counters = counters.view(torch.int32)
        with workspace.guarded(x.device):
            self.launch([x, dy, dw_sums, db_sums, dw, db if db is not None else dw, counters])
        return dw, db


def bind_wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    r: int,
    s: int,
    pad_h: int,
    pad_w: int,
    need_db: bool,
    tile: CudaTile = WGRAD_TILES[0],
    db_dtype: torch.dtype = torch.float32,
    dw_cl: bool = False,
    planned: bool = False,
) -> BoundWgrad:
    """``wgrad``'s launch for the shapes and dtypes of ``dy`` and ``x`` (as ``bind_fprop``)."""
    n, c, hi, wi = x.shape
    ho, wo = dy.shape[2], dy.shape[3]
    if not wgrad_tile_ok(c, r, s, tile):  # e.g. a row split of the row-pair or TMA kernel
        raise ValueError(f"argument 'tile': {tile.name} is no legal wgrad tile for C={c}, {r}x{s}")
    if db_dtype not in (torch.float32, x.dtype):
        raise ValueError(f"argument 'db_dtype' must be torch.float32 or {x.dtype}, not {db_dtype}")
    if tile.wgmma and not wgmma_usable(x):  # before compiling sm_90a code for this GPU
        raise ValueError(f"argument 'tile': {tile.name} needs compute capability 9.0 and TMA")
    db_mode = (1 if db_dtype == torch.float32 else 2) if need_db else 0
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    bf16 = x.dtype == torch.bfloat16
    wg, copies = "tw_gconv_wgrad", wgrad_copies(r, s, tile)  # copies: part of the cache key
    kernel = _kernel(r, s, tile, bf16, db_mode, False, dev, wg, dw_cl, copies)
    maps_in = tile.tma and not (tile.wgmma and tile.tma in (2, 3))  # tensor maps as arguments
    if maps_in and _launcher(kernel, _WGRAD_SIGNATURE + "tt") is None:
        # PyTorch's own launcher cannot pass a tensor map: the same tile without TMA
        _log_once(f"tilewise gconv_cuda: {tile.name} runs without TMA (no lean launcher)")
        tile, maps_in = wgrad_twin(tile, c, r, s), False
        copies = wgrad_copies(r, s, tile)
        kernel = _kernel(r, s, tile, bf16, db_mode, False, dev, wg, dw_cl, copies)
    smem = wgrad_smem_bytes(r, s, tile)
    cblocks, rblocks = c // tile.cb, r // (tile.tap_rows or r)
    # wgmma: units of whole images' rows, (image, column chunk)
    tiles_h, tiles_w = 1 if tile.wgmma else cdiv(ho, tile.th), cdiv(wo, tile.tw)
    n_tiles = n * tiles_h * tiles_w
    if tile.cluster:
        grid_x = tile.cluster
    else:
        sms = num_sms(x.device)
        ctas = cdiv(tile.min_ctas * sms, cblocks * rblocks)
        grid_x = max(1, min(n_tiles, ctas))
        if tile.sumk:  # whole clusters, all resident at once (a CTA without tiles adds zeros)
            with cuda_launch.on_device(dev):  # the kernel's context
                grid_x = _sum_grid(kernel, grid_x, ctas, cblocks * rblocks, tile, smem)
        else:
            most = _resident_per_sm(kernel, tile.warps * 32, smem, dev)
            grid_x = resident_grid_x(grid_x, cblocks * rblocks, most, sms)
    scalars = [hi, wi, ho, wo, c, pad_h, pad_w, tiles_h, tiles_w, n_tiles]
    maps = []
    if maps_in and tile.wgmma:  # a group's input row and dy row
        maps = [(0, 8, tile.tw + s - 1, 1), (1, 8, tile.tw, 1)]
    elif maps_in:  # the input's halo and dy's tile: pointers 0 and 1
        maps = [(0, tile.cb, tile.tw + s - 1, tile.th + r - 1), (1, tile.cb, tile.tw, tile.th)]
    grid, block = (grid_x, cblocks, rblocks), (tile.warps * 32, 1, 1)
    signature = _WGRAD_SIGNATURE + ("tt" if maps_in else "")
    bound = BoundWgrad(kernel, signature, grid, block, smem, dev, scalars, 7, maps, False, planned)
    bound.dw_shape, bound.dw_format = (c, 8, r, s), dw_format(dw_cl)
    bound.db_dtype = db_dtype if need_db else None
    bound.sums = (copies * r * s * c * 8, copies * c, cblocks * rblocks)
    bound.cluster = bool(tile.cluster)
    bound.slot_sum, bound.slot_numel = None, grid_x * gconv_slots.slot_words(c, r, s)
    if tile.slots:  # the slot-sum kernel, a programmatic dependent of the tap kernel
        sum_kernel = gconv_slots.kernel(r, s, bf16, db_mode, dw_cl, dev)
        sum_grid, sum_block = gconv_slots.sum_grid(c, r, s, need_db)
        bound.slot_sum = BoundLaunch(
            sum_kernel, gconv_slots.SIGNATURE, sum_grid, sum_block, 0, dev, [c, grid_x], 3, [],
            dependent_launch(x.device), planned,
        )  # fmt: skip
    return bound
