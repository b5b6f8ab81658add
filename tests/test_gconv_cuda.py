"""The NVRTC grouped-conv kernel (``tilewise.ops.gconv_cuda``): every tile, fprop and dgrad,
against fp64 by the three-way rule on odd shapes; NaN stays in its group. GPU only, but the
source template and the tile rules are checked on the CPU too."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch
import torch.nn.functional as F
from checks import ATOL, assert_three_way, fake_nvrtc

from tilewise.bench.checks import GCONV_ODD_SHAPES
from tilewise.ops import gconv_cuda, gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem
from tilewise.ops.gconv_cuda import CudaTile
from tilewise.runtime import workspace

CASES = GCONV_ODD_SHAPES


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def test_source_template_formats_for_every_kernel_size():
    for r in range(1, 8):
        for s in range(1, 8):
            for tile in (
                gconv_cuda.TILES
                + gconv_cuda.TMA_TILES
                + gconv_cuda.WIDE_ROW_TILES
                + gconv_cuda.WIDE_KERNEL_TILES
                + gconv_cuda.TALL_TILES
                + gconv_cuda.EXPERIMENTAL_FPROP_TILES
                + gconv_cuda.WGMMA_TILES
                + gconv_cuda.WGMMA_DEEP_TILES
                + gconv_cuda.WGMMA_WIDE_TILES
                + gconv_cuda.EXPERIMENTAL_WGMMA_TILES
                + gconv_cuda.ROLL_TILES
            ):
                src, entry = gconv_cuda.source(r, s, tile, True, True, True, "tw_gconv_fprop")
                assert src.count("{") == src.count("}") and f"{entry}(" in src
                if tile.roll:  # its own template: N = 8 R, the MMA's element type
                    assert entry == "tw_gconv_fprop_roll" and f".m64n{8 * r}k16" in src
                    assert ".f32.bf16.bf16" in src
                elif tile.wgmma:  # its own template: TMA always, the MMA's element type
                    assert entry == "tw_gconv_fprop_wg" and ".f32.bf16.bf16" in src
                else:
                    assert f"#define TMA {int(tile.tma)}" in src
            extra = gconv_cuda.CLUSTER_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGRAD_TILES
            extra += gconv_cuda.TMA_WGRAD_TILES
            extra += gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES
            for tile in gconv_cuda.WGRAD_TILES + gconv_cuda.ROW_WGRAD_TILES + extra:
                for bias in (0, 1, 2):
                    src, entry = gconv_cuda.source(r, s, tile, True, bias, False, "tw_gconv_wgrad")
                    assert src.count("{") == src.count("}") and f"{entry}(" in src
                    assert f"#define DB_HALF {int(bias == 2)}" in src
                    assert f"#define TMA {tile.tma}" in src
                    assert "#define DW_CL 0" in src
                    src_cl, _ = gconv_cuda.source(
                        r, s, tile, True, bias, False, "tw_gconv_wgrad", dw_cl=True
                    )
                    assert "#define DW_CL 1" in src_cl and src_cl.count("{") == src_cl.count("}")
                    rows = tile.tap_rows or r  # a row-split CTA's kernel: its rows of taps
                    assert f"#define R {rows}\n#define R_FULL {r}\n" in src
                    assert f"#define ROWSPLIT {int(rows != r)}" in src


def test_wide_pixels_take_the_5d_tensor_copies(tmp_path):
    """128-channel TMA tiles (256-byte pixels) load and store through 5-d tensor copies,
    narrower ones through 4-d copies: the CUDA source run through the C preprocessor (where one
    is installed; NVRTC is not needed) keeps only the matching forms."""
    import shutil
    import subprocess

    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor on this machine")
    wide = CudaTile(8, 16, 128, 16, 1, 2, rowpair=True, tma=2)
    narrow = CudaTile(16, 16, 64, 8, 1, 2, rowpair=True, tma=2)
    for tile, five, four in ((wide, 2, 0), (narrow, 0, 2)):
        src, _ = gconv_cuda.source(3, 3, tile, False, False, False, "tw_gconv_fprop")
        path = tmp_path / f"{tile.name}.cu"
        path.write_text(src)
        out = subprocess.run([cpp, "-P", str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.count("cp.async.bulk.tensor.5d") == five, tile.name  # load, store
        assert out.stdout.count("cp.async.bulk.tensor.4d") == four, tile.name
    assert gconv_cuda.tile_ok(128, 3, 3, wide) and gconv_cuda.TMA_CHANNEL_BLOCKS[-1] == 128
    assert not gconv_cuda.tile_ok(256, 3, 3, dataclasses.replace(wide, cb=256, warps=32))
    # stages on the 128-byte swizzle's 1024-byte period, as the kernel's TALIGN
    assert gconv_cuda._tma_period(128) == gconv_cuda._tma_period(64) == 1024
    assert gconv_cuda._tma_period(32) == 512 and gconv_cuda._tma_period(8) == 128


def _layout_value(src: str, expr: str, tmp_path) -> int:
    """The value of the C expression ``expr`` over ``src``'s macros, by the C preprocessor
    (skips the test where none is installed): integer arithmetic on positive values and
    ``==`` comparisons."""
    import shutil
    import subprocess

    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor on this machine")
    path = tmp_path / "k.cu"
    path.write_text(src + f"\ntw_layout_end = {expr};\n")
    out = subprocess.run([cpp, "-P", str(path)], capture_output=True, text=True)
    text = out.stdout.rsplit("tw_layout_end =", 1)[1].split(";")[0]
    assert set(text) <= set("0123456789+-*/%()= "), text  # "==": comparisons are 0 or 1
    return int(eval(text.replace("/", "//")))


def test_wgmma_shared_memory_matches_the_kernel_layout(tmp_path):
    """``smem_bytes`` of every wgmma candidate and experimental tile equals the kernel's own
    layout (its ``OFF_MBAR`` plus an 8-byte mbarrier a halo stage and the 1024-byte alignment
    slack), by the C preprocessor."""
    checked = 0
    for r, s in ((3, 3), (5, 5), (7, 7), (4, 6), (3, 7), (6, 1)):
        tiles = gconv_cuda.candidates(64, r, s, True, True, True)
        tiles += gconv_cuda.EXPERIMENTAL_WGMMA_TILES
        for tile in tiles:
            if not (tile.wgmma and gconv_cuda.tile_ok(64, r, s, tile)):
                continue
            src, _ = gconv_cuda.source(r, s, tile, False, False, False, "tw_gconv_fprop")
            end = _layout_value(src, "OFF_MBAR + 8 * NST", tmp_path)
            assert gconv_cuda.smem_bytes(r, s, tile) == end + 1024, (r, s, tile.name)
            checked += 1
    assert checked >= 20


def test_wgmma_wgrad_shared_memory_matches_the_kernel_layout(tmp_path):
    """``wgrad_smem_bytes`` of every wgmma wgrad tile equals the kernel's own layout (NG groups of
    GROUP_BYTES, and with a producer warp two mbarriers a ring step), by the C preprocessor."""
    checked = 0
    for r, s in ((7, 7), (5, 5), (3, 3), (6, 1)):
        for tile in gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES:
            src, entry = gconv_cuda.source(r, s, tile, False, 1, False, "tw_gconv_wgrad")
            assert entry == "tw_gconv_wgrad_wg"
            end = _layout_value(
                src, "MBAR_OFF + (WS + 1) / 2 * 16 * NSLOT + (TMA == 1) * 128", tmp_path
            )
            assert gconv_cuda.wgrad_smem_bytes(r, s, tile) == end, (r, s, tile.name)
            checked += 1
    tiles = gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES
    assert checked == 4 * len(tiles)


def test_wgmma_wgrad_tiles_rules_and_offering():
    """The wgmma wgrad tiles: offered only with ``wgmma`` (compute capability 9.0 with TMA), for
    kernels of ``WGMMA_WGRAD_MIN_ROWS`` rows or more, unfitted (their channel block divides C),
    first, their slot forms (session 50) before them; legal only as the kernel is written (a
    warpgroup a group, 16-64 columns in 16s, up to 8 kernel rows, shared memory of all its CTAs
    within the SM's)."""
    wg = gconv_cuda.WGMMA_WGRAD_TILES
    wg_slots = tuple(dataclasses.replace(t, slots=True) for t in wg)
    for r, s in ((5, 5), (7, 7), (6, 4), (7, 3)):
        with_wg = gconv_cuda.wgrad_candidates(64, r, s, tma=True, wgmma=True)
        plain = gconv_cuda.wgrad_candidates(64, r, s, tma=True, wgmma=False)
        assert with_wg[: 2 * len(wg)] == wg_slots + wg, (r, s)
        assert with_wg[2 * len(wg) :] == plain, (r, s)
        assert not any(t.wgmma for t in plain)
        assert not any(t.wgmma for t in gconv_cuda.wgrad_candidates(64, r, s, tma=False))
    for r, s in ((3, 3), (1, 1), (4, 7)):
        assert not any(t.wgmma for t in gconv_cuda.wgrad_candidates(64, r, s, True, True, True))
    # offered as they are where their channel block divides C (C=48: the 16-channel ones)
    c48 = [t for t in gconv_cuda.wgrad_candidates(48, 7, 7, True, True, True) if t.wgmma]
    assert c48 == [t for t in wg_slots + wg if 48 % t.cb == 0]
    assert any(gconv_cuda.wgrad_wg_producer(t) for t in c48)  # 9 warps kept, not refitted
    ok = CudaTile(4, 64, 16, 8, 3, 1, wsmem=True, wgmma=True)
    assert gconv_cuda.wgrad_tile_ok(64, 7, 7, ok) and gconv_cuda.wgrad_tile_ok(16, 8, 8, ok)
    assert not gconv_cuda.wgrad_tile_ok(64, 5, 33, ok)  # N = 8 S at most 256
    odd = CudaTile(1, 16, 12, 5, 1, 1, wsmem=True, wgmma=True)  # 12 channels: not whole groups
    assert not gconv_cuda.wgrad_tile_ok(24, 5, 5, odd)
    for bad in (
        dataclasses.replace(ok, tw=80),
        dataclasses.replace(ok, tw=24),
        dataclasses.replace(ok, warps=4),
        dataclasses.replace(ok, tma=1),
        dataclasses.replace(ok, rowpair=True),
        dataclasses.replace(ok, cluster=8),
        dataclasses.replace(ok, min_ctas=4),  # 4 x 63 KB
        dataclasses.replace(ok, wsmem=False),  # dy in registers: 128 a thread, 85 at 3 CTAs
    ):
        assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, bad), bad
    assert not gconv_cuda.wgrad_tile_ok(64, 9, 3, ok)  # M spans 8 kernel rows
    assert not gconv_cuda.wgrad_tile_ok(40, 7, 7, ok)  # 16 does not divide 40
    rs = CudaTile(4, 64, 16, 8, 2, 1, wgmma=True)  # 125-127 registers at 7x7 (ptxas)
    assert gconv_cuda.wgrad_tile_ok(64, 7, 7, rs)
    assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, dataclasses.replace(rs, th=5))
    # producer warps (warps 4 a group + 1 or 2): dy from shared memory, 2+ ring steps
    ws = CudaTile(4, 64, 16, 9, 2, 4, wsmem=True, wgmma=True)
    assert gconv_cuda.wgrad_wg_producer(ws) and gconv_cuda.wgrad_tile_ok(64, 7, 7, ws)
    assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, dataclasses.replace(ws, stages=1))
    assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, dataclasses.replace(ws, wsmem=False))
    two = dataclasses.replace(ws, warps=10)
    assert gconv_cuda.wgrad_wg_producer(two) and gconv_cuda.wgrad_tile_ok(64, 7, 7, two)
    assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, dataclasses.replace(ws, warps=11))
    # tma 1 (tensor copies from one producer warp's lane 0), tma 2 and 3 (staged, re-laid out by
    # the warpgroups or by the producer threads: one or two producer warps)
    for tma, warps, legal in ((1, 9, True), (1, 10, False), (1, 8, False), (2, 9, True),
                              (2, 10, True), (2, 8, False), (3, 9, True), (3, 10, True),
                              (3, 8, False), (4, 9, False)):  # fmt: skip
        tile = dataclasses.replace(ws, tma=tma, warps=warps, stages=2, min_ctas=2)
        assert gconv_cuda.wgrad_tile_ok(64, 7, 7, tile) == legal, (tma, warps)
    # staged (tma 2, 3): whole groups a power of two (the staging swizzle); 3 groups are not
    for tma in (2, 3):
        three = CudaTile(4, 64, 24, 14, 1, 2, tma=tma, wsmem=True, wgmma=True)
        assert not gconv_cuda.wgrad_tile_ok(48, 7, 7, three), tma
        assert gconv_cuda.wgrad_tile_ok(48, 7, 7, dataclasses.replace(three, tma=0, warps=12))
    assert gconv_cuda.wgrad_wg_rings(4, 4, True, 2) == (15, 8)  # 2 steps, dy's window
    # tma 3 (re-laid out by the producer threads): RELAYOUT_RING_STEPS steps, whatever stages
    assert gconv_cuda.wgrad_wg_rings(4, 2, True, 3) == (19, 12)
    assert gconv_cuda.wgrad_wg_rings(2, 6, True, 3) == (13, 6)
    assert gconv_cuda.wgrad_wg_rings(4, 4, True) == (23, 16)
    # the rings: (stages + 1) x th rows, and the window's 7 more for dy
    assert gconv_cuda.wgrad_wg_rings(4, 1) == (15, 8)
    assert gconv_cuda.wgrad_wg_rings(2, 2) == (13, 6)
    assert gconv_cuda.wgrad_wg_rings(8, 1) == (23, 16)
    assert gconv_cuda.wgrad_wg_rings(1, 1) == (9, 2)


def test_row_split_wgrad_tiles_legality_and_grid():
    """``tap_rows`` divides R, takes neither TMA nor the row-pair kernel nor fprop; a row-split
    tile's shared memory holds the halo of its rows only; the candidates for small problems
    include the row tiles and those for large ones do not."""
    row = CudaTile(8, 16, 16, 2, 4, 2, cluster=8, tap_rows=1)
    assert row.name.endswith("k8r1")
    assert all(gconv_cuda.wgrad_tile_ok(64, k, k, row) for k in range(1, 8))
    assert gconv_cuda.wgrad_tile_ok(64, 6, 6, CudaTile(tap_rows=2))
    assert not gconv_cuda.wgrad_tile_ok(64, 5, 5, CudaTile(tap_rows=2))  # 2 does not divide 5
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(tap_rows=4))
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(tap_rows=1, tma=1))
    rowpair = CudaTile(8, 16, 32, 4, 4, 2, rowpair=True)
    assert gconv_cuda.wgrad_tile_ok(64, 3, 3, rowpair)
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, dataclasses.replace(rowpair, tap_rows=1))
    assert not gconv_cuda.tile_ok(64, 3, 3, CudaTile(tap_rows=1))  # fprop/dgrad: no row split
    whole = CudaTile(8, 16, 16, 2, 4, 2)
    assert gconv_cuda.wgrad_smem_bytes(7, 7, CudaTile(8, 16, 16, 2, 4, 2, tap_rows=1)) < (
        gconv_cuda.wgrad_smem_bytes(7, 7, whole)
    )
    assert gconv_cuda.wgrad_smem_bytes(7, 7, CudaTile(8, 16, 16, 2, 4, 2, tap_rows=7)) == (
        gconv_cuda.wgrad_smem_bytes(7, 7, whole)
    )
    small = gconv_cuda.wgrad_candidates(128, 5, 5, small=True)
    large = gconv_cuda.wgrad_candidates(128, 5, 5, small=False)
    assert any(t.tap_rows for t in small) and not any(t.tap_rows for t in large)


def test_candidates_fit_the_channels_and_shared_memory():
    for c in (8, 16, 24, 64, 96, 256):
        for k in (1, 3, 7):
            tiles = gconv_cuda.candidates(c, k, k, wide_tiles=False)
            assert tiles, (c, k)
            for t in tiles:
                assert c % t.cb == 0 and gconv_cuda.smem_bytes(k, k, t) <= 227 * 1024
                if t.rowpair:  # one warp per group (times the column split), 8-pixel blocks
                    assert t.warps % (t.cb // 8) == 0 and t.tw % 8 == 0 and k < 7
    assert not gconv_cuda.usable(torch.zeros(1, 8, 2, 2), torch.zeros(1, 8, 2, 2))


def test_dependent_launches_ask_for_shared_memory_that_caps_ctas_per_sm(monkeypatch):
    """``launch_smem``: a programmatic dependent launch of a row-pair tile asks for enough shared
    memory that ``min_ctas`` CTAs fit an SM and one more does not (where ``min_ctas`` fit at all),
    in whole allocation units; a plain launch, and any launch with the cap switched off, asks for
    the kernel's own ``smem_bytes``."""
    sm, res = gconv_cuda.SMEM_SM, gconv_cuda.SMEM_RESERVED
    padded = 0
    for c in (64, 128, 256):
        for k in (3, 5, 7):
            for t in gconv_cuda.candidates(c, k, k, tma=True, wgmma=True):
                own = gconv_cuda.smem_bytes(k, k, t)
                assert gconv_cuda.launch_smem(k, k, t, False) == own
                if not t.rowpair:
                    continue
                asked = gconv_cuda.launch_smem(k, k, t, True)
                assert own <= asked <= gconv_cuda.SMEM_MAX
                if t.min_ctas * (own + res) > sm:  # min_ctas never fit: nothing to cap
                    assert asked == own, t.name
                    continue
                assert asked % gconv_cuda.SMEM_GRANULE == 0, t.name
                assert t.min_ctas * (asked + res) <= sm < (t.min_ctas + 1) * (asked + res), t.name
                padded += asked - own > gconv_cuda.SMEM_GRANULE
    # e.g. the 8x16 4-CTA TMA tile at 3x3: 7 fit by its own 32 KB
    assert padded >= 3
    tile = CudaTile(8, 16, 32, 4, 4, 2, rowpair=True, tma=2)
    own = gconv_cuda.smem_bytes(3, 3, tile)
    assert sm // (own + res) > 4
    # a grid that needs 5 CTAs an SM (channel blocks rounding it up) gets room for 5, not 4;
    # the ask never grows with the CTAs needed, so the kernel's maximum (at min_ctas) covers it
    five = gconv_cuda.launch_smem(3, 3, tile, True, ctas_per_sm=5)
    assert 5 * (five + res) <= sm < 6 * (five + res)
    asks = [gconv_cuda.launch_smem(3, 3, tile, True, ctas_per_sm=k) for k in range(9)]
    assert asks == sorted(asks, reverse=True) and asks[-1] == own  # 8 never fit: no padding
    # another GPU's shared memory (100 KB an SM): a 2-CTA tile gets room for two and not three;
    # the 4-CTA tile's four never fit there, so it is not padded
    two = dataclasses.replace(tile, min_ctas=2)
    small = gconv_cuda.launch_smem(3, 3, two, True, 0, sm_bytes=100 << 10, block_max=99 << 10)
    assert 2 * (small + res) <= 100 << 10 < 3 * (small + res)
    assert gconv_cuda.launch_smem(3, 3, tile, True, 0, 100 << 10, 99 << 10) == own
    monkeypatch.setenv(gconv_cuda.ENV_OCCUPANCY_CAP, "0")
    assert gconv_cuda.launch_smem(3, 3, tile, True) == own


def test_tma_tiles_are_row_pair_fprop_candidates_only_when_asked():
    plain = gconv_cuda.candidates(64, 3, 3, wide_tiles=False)
    with_tma = gconv_cuda.candidates(64, 3, 3, tma=True, wide_tiles=False)
    assert not any(t.tma for t in plain)
    assert set(plain) < set(with_tma)
    for t in with_tma:
        if t.tma:
            assert t.rowpair and gconv_cuda.smem_bytes(3, 3, t) <= gconv_cuda.SMEM_MAX
            assert t.name.endswith(f"_tma{t.tma}")
    assert not gconv_cuda.tile_ok(64, 3, 3, CudaTile(8, 16, 32, 4, 4, 2, tma=1))  # tap kernel
    # wgrad: TMA loads in the tap kernel only (experimental), no clusters, no TMA stores
    assert gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 16, 32, 4, 4, 2, tma=1))
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 16, 32, 4, 4, 2, tma=2))
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 16, 8, 1, 8, 2, cluster=8, tma=1))
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 16, 32, 4, 4, 2, rowpair=True, tma=1))
    # the TMA wgrad tiles are candidates only where asked (a GPU with TMA), first
    assert not any(t.tma for t in gconv_cuda.wgrad_candidates(64, 3, 3, tma=False))
    with_tma = gconv_cuda.wgrad_candidates(64, 3, 3, tma=True)
    assert with_tma[0].tma == 1 and with_tma[0].cb == 64
    assert set(gconv_cuda.wgrad_candidates(64, 3, 3, tma=False)) < set(with_tma)
    for c in (8, 24, 48, 96, 256):  # fitted channel blocks: powers of two, one warp per group
        for t in gconv_cuda.wgrad_candidates(c, 3, 3, tma=True):
            assert not t.tma or (t.cb in (8, 16, 32, 64) and t.warps == t.cb // 8)
    # TMA boxes take power-of-two channel blocks (a 24-channel tile has no swizzle mode)
    assert not gconv_cuda.tile_ok(48, 3, 3, CudaTile(8, 16, 24, 3, 4, 2, rowpair=True, tma=1))
    assert gconv_cuda.tile_ok(48, 3, 3, CudaTile(8, 16, 24, 3, 4, 2, rowpair=True))
    # 7x7 takes no row-pair tile, so no TMA tile either
    assert not any(t.tma for t in gconv_cuda.candidates(64, 7, 7, tma=True, wide_tiles=False))


def test_cluster_wgrad_tiles_only_for_small_problems():
    """Cluster tiles (one 8-CTA cluster per channel block) are timed only where the output has at
    most ``CLUSTER_MAX_PIXELS`` pixels, and never take the row-pair kernel."""
    for n, hw, small in ((1, 32, True), (16, 32, True), (17, 32, False), (128, 64, False)):
        prob = GConvProblem(n, 128, hw, hw, 3, 3, 1, 1)
        tiles = gconv_wgrad._candidates(prob, 132, with_cuda=True)
        clusters = [t for t in tiles if isinstance(t, CudaTile) and t.cluster]
        assert bool(clusters) == small, (n, hw)
        assert all(not t.rowpair and t.cluster <= gconv_cuda.MAX_CLUSTER for t in clusters)
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 16, 32, 4, 4, 2, True, cluster=8))
    assert gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 8, 8, 1, 8, 2, cluster=16))
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 8, 8, 1, 8, 2, cluster=32))
    # non-portable (16-CTA) clusters are experimental: never candidates
    for n, hw in ((1, 32), (1, 64)):
        prob = GConvProblem(n, 64, hw, hw, 5, 5, 2, 2)
        tiles = gconv_wgrad._candidates(prob, 132, with_cuda=True)
        assert all(t.cluster <= gconv_cuda.MAX_CLUSTER for t in tiles if isinstance(t, CudaTile))


#: tiles beyond the candidates: a 3-stage tap tile, and a row-pair tile with two warps per group
#: (its column-split loop runs in no candidate)
EXTRA_TILES = (
    CudaTile(8, 8, 8, 4, 4, 3),
    CudaTile(8, 16, 32, 8, 3, 2, rowpair=True),
    *gconv_cuda.EXPERIMENTAL_FPROP_TILES,  # session 29's weights-in-shared-memory tiles
    # session 31's 2-CTA and split-warpgroup wgmma tiles, session 38's group-loop and 2-row-band
    # ones
    *gconv_cuda.EXPERIMENTAL_WGMMA_TILES,
    *gconv_cuda.ROLL_TILES,  # session 36's rolling-row wgmma tiles
)


#: a regex over tile names: the wgmma tests that read it keep only the tiles it matches (a device
#: call's check of new tiles)
_WG_ONLY = "TILEWISE_TEST_WG_ONLY"


def _wg_only(tiles):
    """``tiles`` whose name matches ``TILEWISE_TEST_WG_ONLY`` (all of them when it is unset)."""
    only = os.environ.get(_WG_ONLY)
    return [t for t in tiles if only is None or re.search(only, t.name)]


def _wgmma() -> bool:
    """Whether this GPU takes the warpgroup-MMA tiles (compute capability 9.0, TMA)."""
    return gconv_cuda.wgmma_usable(torch.empty(0, device="cuda"))


def _tiles(c: int, r: int, s: int, tma: bool = True) -> list[CudaTile]:
    """Every candidate (the TMA ones where this GPU has TMA and ``tma``, the warpgroup-MMA ones
    where it is an sm_90) and the extra tiles."""
    extra = (gconv_cuda._fitted(t, c) for t in EXTRA_TILES)
    tma = tma and gconv_cuda._tma.supported(torch.cuda.current_device())
    wgmma = tma and _wgmma()
    # the wide-kernel row-pair tiles too, even where TILEWISE_GCONV_WIDE_TILES=0
    return list(gconv_cuda.candidates(c, r, s, tma, wide_tiles=True, wgmma=wgmma)) + [
        t for t in extra if gconv_cuda.tile_ok(c, r, s, t) and (wgmma or not t.wgmma)
    ]


def _case_id(case: tuple) -> str:
    n, c, h, w, r, s, ph, pw, has_b = case
    return f"n{n}c{c}-{h}x{w}-k{r}x{s}-p{ph}{pw}" + ("-b" if has_b else "")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)  # one test each: the GPU suite's shards
def test_every_tile_fprop_and_dgrad(case, dtype, rng_seed):
    _check_tiles(case, dtype, rng_seed, _tiles(case[1], case[4], case[5]))


def _check_tiles(case: tuple, dtype: torch.dtype, rng_seed: int, tiles: list[CudaTile]) -> None:
    """Each of ``tiles`` on ``case``: fprop (with bias where the case has one) and dgrad,
    three-way against fp64; odd heights read channels_last weights through their strides."""
    n, c, h, w, r, s, ph, pw, has_b = case
    x = _cl(torch.randn(n, c, h, w, device="cuda"))
    wt = torch.randn(c, 8, r, s, device="cuda") / (8 * r * s) ** 0.5
    if h % 2:  # a channels_last model's weights: read through their strides
        wt = _cl(wt)
    b = torch.randn(c, device="cuda") if has_b else None
    g = c // 8
    pad = (ph, pw)
    ref = F.conv2d(x.double(), wt.double(), b.double() if has_b else None, padding=pad, groups=g)
    bt = b.to(dtype) if has_b else None
    same = F.conv2d(x.to(dtype), wt.to(dtype), bt, padding=pad, groups=g)
    dy = torch.randn(ref.shape, device="cuda")
    dref = torch.nn.grad.conv2d_input(x.shape, wt.double(), dy.double(), padding=pad, groups=g)
    dsame = torch.nn.grad.conv2d_input(x.shape, wt.to(dtype), dy.to(dtype), padding=pad, groups=g)
    for tile in tiles:
        tag = f"n{n} c{c} {h}x{w} k{r}x{s} pad{pad} {tile.name} {dtype}"
        out = _cl(torch.full(same.shape, float("nan"), device="cuda", dtype=dtype))
        gconv_cuda.fprop(_cl(x.to(dtype)), wt.to(dtype), bt, out, ph, pw, tile)
        assert_three_way(out, same, ref, ATOL[dtype], f"fprop {tag}", rng_seed, ulps=1)
        dx = _cl(torch.full(x.shape, float("nan"), device="cuda", dtype=dtype))
        gconv_cuda.fprop(
            _cl(dy.to(dtype)), wt.to(dtype), None, dx, r - 1 - ph, s - 1 - pw, tile, True
        )
        assert_three_way(dx, dsame, dref, ATOL[dtype], f"dgrad {tag}", rng_seed, ulps=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k", [3, 5, 7])
def test_wgmma_tiles_over_many_tiles_with_non_finite_inputs(k, dtype, rng_seed, monkeypatch):
    """The warpgroup-MMA tiles (session 30) where each CTA walks many tiles (the halo stages'
    reuse, the mbarrier parity flips, the staging tile after its TMA store), fprop with bias and
    dgrad, with NaN and +-Inf in the input: NaN and Inf exactly where the fp64 reference (CPU)
    has them, Infs of its sign (the Toeplitz weights' zeros meet other outputs' inputs: such a
    tile is recomputed exactly), the rest within the three-way bound where PyTorch's own output
    is finite too. ``TILEWISE_TEST_WG_ONLY`` (a regex) keeps the tiles whose name matches."""
    if not _wgmma():
        pytest.skip("no sm_90 (wgmma) GPU")
    c, g = 64, 8
    x = _cl(torch.randn(12, c, 37, 70, device="cuda"))
    x[1, 5, 7, 9], x[7, 60, 30, 66], x[11, 0, 0, 0] = float("nan"), float("inf"), float("-inf")
    wt = torch.randn(c, 8, k, k, device="cuda") / (8 * k * k) ** 0.5
    b = torch.randn(c, device="cuda")
    pad = k // 2
    xd, wd, bd = x.to(dtype), wt.to(dtype), b.to(dtype)
    x64, w64 = xd.double().cpu(), wd.double().cpu()  # the rounded inputs, exact sums
    ref = F.conv2d(x64, w64, bd.double().cpu(), padding=pad, groups=g)
    dref = torch.nn.grad.conv2d_input(x.shape, w64, x64, padding=pad, groups=g)
    same = F.conv2d(xd, wd, bd, padding=pad, groups=g).cpu()
    dsame = torch.nn.grad.conv2d_input(x.shape, wd, xd, padding=pad, groups=g).cpu()
    tiles = _wg_only([t for t in _tiles(c, k, k) if t.wgmma])
    if not tiles and os.environ.get(_WG_ONLY) is not None:
        pytest.skip(f"no wgmma tile matching {os.environ[_WG_ONLY]!r} takes {k}x{k}")
    assert tiles
    # a grid of 1-2 CTAs a channel block: each walks 15-60 tiles (mbarrier phases of every stage
    # flip many times), and the full grid as chosen
    for tile, sms in [(t, n) for t in tiles for n in (None, 3)]:
        if sms is not None:
            monkeypatch.setattr(gconv_cuda, "num_sms", lambda device, n=sms: n)
        out = _cl(torch.full(same.shape, 7.0, device="cuda", dtype=dtype))
        gconv_cuda.fprop(xd, wd, bd, out, pad, pad, tile)
        dx = _cl(torch.full(x.shape, 7.0, device="cuda", dtype=dtype))
        gconv_cuda.fprop(xd, wd, None, dx, k - 1 - pad, k - 1 - pad, tile, True)
        monkeypatch.undo()
        for what, got, want, ref64 in (("fprop", out, same, ref), ("dgrad", dx, dsame, dref)):
            got = got.cpu()
            tag = f"{what} {tile.name} k{k} {dtype} sms={sms}"
            bad_nan = (got.isnan() != ref64.isnan()).sum().item()
            bad_inf = (got.isinf() != ref64.isinf()).sum().item()
            assert bad_nan == 0 and bad_inf == 0, (
                f"{tag}: {bad_nan} NaN and {bad_inf} Inf positions differ from fp64's "
                f"(PyTorch's own: {(want.isnan() != ref64.isnan()).sum().item()} NaN)"
            )
            inf = ref64.isinf()
            assert inf.any() and torch.equal(got[inf].double(), ref64[inf]), tag
            fin = ref64.isfinite() & want.isfinite()
            assert fin.double().mean() > 0.9, tag  # most outputs: the rest is checked
            assert_three_way(got[fin], want[fin], ref64[fin], ATOL[dtype], tag, rng_seed, ulps=1)
            # where only PyTorch's half output is not finite: within a few ulps of the exact sum
            odd = ref64.isfinite() & ~want.isfinite()
            err = (got[odd].double() - ref64[odd]).abs()
            bound = 4 * torch.finfo(dtype).eps * ref64[odd].abs() + ATOL[dtype]
            assert (err <= bound).all(), tag


#: shapes the odd-shape cases give the wgmma tiles nowhere: padding past R - 1 (negative dgrad
#: padding), an even kernel, S != R with S < 3, 48 channels (16-channel blocks fitted down),
#: no padding at the right and bottom edges (N, C, H, W, R, S, pad_h, pad_w, bias)
WGMMA_EDGE_CASES = (
    (1, 16, 4, 4, 3, 3, 3, 3, True),
    (2, 48, 9, 70, 4, 2, 1, 0, False),
    (1, 32, 5, 3, 3, 1, 1, 0, True),
    (3, 16, 17, 65, 6, 5, 0, 0, True),
)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", WGMMA_EDGE_CASES, ids=_case_id)
def test_wgmma_tiles_on_edge_shapes(case, dtype, rng_seed):
    """Every wgmma candidate on the edge shapes, fprop (with bias where the case has one) and
    dgrad, three-way against fp64 (written in session 30 after its device time)."""
    if not _wgmma():
        pytest.skip("no sm_90 (wgmma) GPU")
    tiles = [t for t in _tiles(case[1], case[4], case[5]) if t.wgmma]
    assert tiles, case
    _check_tiles(case, dtype, rng_seed, tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES + WGMMA_EDGE_CASES, ids=_case_id)
def test_roll_tiles(case, dtype, rng_seed):
    """The rolling-row wgmma tiles alone (session 36) on the odd shapes and the edge shapes,
    fprop and dgrad, three-way against fp64: the quick check of a change to that kernel (the
    every-tile test runs them too)."""
    if not _wgmma():
        pytest.skip("no sm_90 (wgmma) GPU")
    c, r, s = case[1], case[4], case[5]
    tiles = [gconv_cuda._fitted(t, c) for t in gconv_cuda.ROLL_TILES]
    tiles = [t for t in dict.fromkeys(tiles) if gconv_cuda.tile_ok(c, r, s, t)]
    if not tiles:
        pytest.skip(f"no rolling-row tile takes C={c} {r}x{s}")
    _check_tiles(case, dtype, rng_seed, tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES + WGMMA_EDGE_CASES, ids=_case_id)
def test_deep_and_experimental_wgmma_tiles(case, dtype, rng_seed):
    """The three-stage wgmma tiles (session 37) and the experimental ones (session 31: 2-CTA and
    split-warpgroup) alone on the odd shapes and the edge shapes, fprop and dgrad, three-way
    against fp64: the quick check of a change to that kernel (the every-tile test runs them
    too). ``TILEWISE_TEST_WG_ONLY`` (a regex) keeps the tiles whose name matches: a device call's
    check of one new tile."""
    if not _wgmma():
        pytest.skip("no sm_90 (wgmma) GPU")
    c, r, s = case[1], case[4], case[5]
    pool = (
        gconv_cuda.WGMMA_DEEP_TILES
        + gconv_cuda.WGMMA_WIDE_TILES
        + gconv_cuda.EXPERIMENTAL_WGMMA_TILES
    )
    tiles = [gconv_cuda._fitted(t, c) for t in _wg_only(pool)]
    tiles = [t for t in dict.fromkeys(tiles) if gconv_cuda.tile_ok(c, r, s, t)]
    if not tiles:
        pytest.skip(f"no deep or experimental wgmma tile takes C={c} {r}x{s}")
    _check_tiles(case, dtype, rng_seed, tiles)


def test_wgmma_edge_cases_take_wgmma_tiles():
    """Each edge case is one the wgmma candidates take (so the GPU test above runs them)."""
    for case in WGMMA_EDGE_CASES:
        c, r, s = case[1], case[4], case[5]
        assert any(t.wgmma for t in gconv_cuda.candidates(c, r, s, True, True, True)), case


@pytest.mark.gpu
def test_lean_launcher_matches_pytorch_launcher(monkeypatch):
    """The lean launcher (runtime.cuda_launch) and PyTorch's own give the same results: bitwise
    for fprop/dgrad, within fp32 atomics' reordering for wgrad; and the lean one is in use."""
    x = _cl(torch.randn(2, 64, 13, 17, device="cuda", dtype=torch.float16))
    w = torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16) * 0.1
    b = torch.randn(64, device="cuda", dtype=torch.float16)

    def run():
        outs = []
        for tile in _tiles(64, 3, 3, tma=False):  # PyTorch's launcher cannot pass a map
            out = _cl(torch.full_like(x, float("nan")))
            outs.append(gconv_cuda.fprop(x, w, b, out, 1, 1, tile).clone())
            outs.append(gconv_cuda.fprop(x, w, None, torch.empty_like(x), 1, 1, tile, True))
        dw, db = gconv_cuda.wgrad(x, x, 3, 3, 1, 1, True, db_dtype=torch.float16)
        return outs, dw.clone(), db.clone()

    assert gconv_cuda._launcher(gconv_cuda._kernel(3, 3, CudaTile(), False, True, False, 0),
                                "pppp" + "i" * 14) is not None  # fmt: skip
    lean = run()
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, signature, *dependent: None)
    torch_launch = run()
    for a, c in zip(lean[0], torch_launch[0], strict=True):
        assert torch.equal(a, c)
    # dw, db in fp16: fp32 atomics in another order may round to the neighbouring half value
    torch.testing.assert_close(lean[1], torch_launch[1], rtol=2e-3, atol=1e-3)
    torch.testing.assert_close(lean[2], torch_launch[2], rtol=2e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tma_pipeline_over_many_tiles_per_cta(dtype, caplog):
    """The odd shapes give every CTA one tile; here each CTA walks many (the TMA stages' reuse,
    the mbarrier parity flips, the staging tile's reuse after its TMA store), with NaN/Inf in
    the input and without: every TMA tile is bitwise equal to the same tile without TMA (the
    32x32 tile: to its 16-row twin, whose shared memory fits), fprop and dgrad."""
    if not gconv_cuda._tma.supported(torch.cuda.current_device()):
        pytest.skip("no TMA on this GPU")
    caplog.set_level("WARNING", logger=gconv_cuda.log.name)
    gconv_cuda._log_once.cache_clear()
    for c in (64, 256):  # 256: the 128-channel tiles (two 128-byte rows per pixel, 5-d maps)
        _check_tma_pipeline(c, dtype)
    # the TMA tiles ran as such (without the lean launcher they run as their twins, and the
    # comparisons above would compare a twin with itself)
    assert not any("runs without TMA" in r.message for r in caplog.records)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_dynamic_tiles_equal_static_and_leave_counters_zero(dtype, monkeypatch):
    """``TILEWISE_GCONV_DYNAMIC_TILES`` (session 43): every row-pair TMA candidate (3x3, 5x5, C=64
    and 128) whose tiles come from counters gives the statically scheduled kernel's outputs
    bitwise (fprop with bias, dgrad), launch after launch and under graph replay, and the
    counters are zero again after each. The first three shapes hold at least twice the tiles
    of each launch's grid, so at least half the tiles come from tickets (asserted); the last
    gives every CTA one tile (no ticket used)."""
    if not gconv_cuda._tma.supported(torch.cuda.current_device()):
        pytest.skip("no TMA on this GPU")
    problems, many = [], []
    shapes = ((64, 3, (64, 40, 40)), (64, 5, (64, 37, 45)), (128, 3, (48, 33, 31)))
    for c, k, shape in shapes + ((64, 5, (3, 37, 45)),):
        n, h, w = shape
        x = _cl(torch.randn(n, c, h, w, device="cuda", dtype=dtype))
        wt = torch.randn(c, 8, k, k, device="cuda", dtype=dtype) / (8 * k * k) ** 0.5
        b = torch.randn(c, device="cuda", dtype=dtype)
        tiles = [t for t in gconv_cuda.candidates(c, k, k, tma=True) if t.rowpair and t.tma]
        assert tiles, (c, k)
        problems += [(x, wt, b, k // 2, t) for t in tiles]
        many += [(c, k, shape) in shapes] * len(tiles)

    def run(x, wt, b, pad, tile, dgrad):
        out = _cl(torch.full_like(x, float("nan")))
        return gconv_cuda.fprop(x, wt, None if dgrad else b, out, pad, pad, tile, dgrad)

    def runs() -> list[torch.Tensor]:
        return [run(*p, d) for p in problems for d in (False, True)]

    gconv_cuda._kernel.cache_clear()
    static = runs()
    monkeypatch.setattr(gconv_cuda, "DYNAMIC_TILES", True)
    gconv_cuda._kernel.cache_clear()
    try:
        for (x, wt, b, pad, tile), check in zip(problems, many, strict=True):
            assert gconv_cuda.dynamic_tiles(tile), tile.name
            bound = gconv_cuda.bind_fprop(x, wt, b, torch.empty_like(x), pad, pad, tile)
            assert isinstance(bound, gconv_cuda.BoundDynamicFprop), tile.name
            n_tiles = bound.scalars[9]  # hi, wi, ho, wo, c, pad_h, pad_w, tiles_h, tiles_w, n_tiles
            assert not check or n_tiles >= 2 * bound.grid[0], (tile.name, n_tiles, bound.grid)
        for _ in range(3):
            for got, want in zip(runs(), static, strict=True):
                assert torch.equal(got, want)
            torch.cuda.synchronize()
            assert workspace.all_zero()
        x, wt, b, pad, tile = problems[0]
        outs = [_cl(torch.full_like(x, float("nan"))) for _ in range(4)]
        graph = torch.cuda.CUDAGraph()
        gconv_cuda.fprop(x, wt, b, outs[0], pad, pad, tile)  # warm: compiled and bound
        with torch.cuda.graph(graph):
            inp = x
            for i, out in enumerate(outs):  # a chain: each launch waits for the one before
                inp = gconv_cuda.fprop(inp, wt, None, out, pad, pad, tile, dgrad=bool(i % 2))
        for _ in range(3):
            for out in outs:
                out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            want = x
            for i in range(len(outs)):
                want = run(want, wt, None, pad, tile, bool(i % 2))
                assert torch.equal(outs[i], want), i
        torch.cuda.synchronize()
        assert workspace.all_zero()
    finally:
        gconv_cuda._kernel.cache_clear()  # no counter kernel left for the tests after this one


@pytest.mark.gpu
def test_dependent_launches_wait_for_the_kernel_before(monkeypatch):
    """The row-pair kernel is launched as a programmatic dependent launch (asking for the shared
    memory of ``launch_smem``): a chain of convs, each reading the output the one before it has
    just written (no other kernel between them), on one stream and replayed in a CUDA graph,
    equals the same chain launched plainly, bitwise, for TMA and non-TMA tiles."""
    c, dtype = 64, torch.float16
    x = _cl(torch.randn(16, c, 40, 40, device="cuda", dtype=dtype))
    w = torch.randn(c, 8, 3, 3, device="cuda", dtype=dtype) * 72**-0.5  # variance kept ~1
    tiles = [t for t in gconv_cuda.candidates(c, 3, 3, tma=True) if t.rowpair]
    assert any(t.tma for t in tiles) and any(not t.tma for t in tiles)
    depth = 12

    def chain(tile: CudaTile) -> list[torch.Tensor]:
        # outputs made first, so the row-pair kernels follow each other on the stream with
        # nothing between them: each starts early and must wait for the one it reads
        outs = [_cl(torch.full_like(x, float("nan"))) for _ in range(depth)]
        inp = x
        for i, out in enumerate(outs):  # alternate fprop and dgrad: both the row-pair kernel
            inp = gconv_cuda.fprop(inp, w, None, out, 1, 1, tile, dgrad=bool(i % 2))
        return outs

    for tile in tiles:
        monkeypatch.setenv(gconv_cuda.ENV_PDL, "0")
        plain = chain(tile)
        monkeypatch.setenv(gconv_cuda.ENV_PDL, "1")
        dependent = chain(tile)
        kernel = gconv_cuda._kernel(3, 3, tile, False, False, False, torch.cuda.current_device())
        launcher = gconv_cuda._launcher(kernel, gconv_cuda._TMA_SIGNATURES[tile.tma], True)
        assert gconv_cuda.dependent_launch(x.device) and launcher.dependent, tile.name
        # the dependent launch asks for the shared memory that caps an SM at min_ctas CTAs
        bound = gconv_cuda.bind_fprop(x, w, None, x, 1, 1, tile)
        assert bound.smem == gconv_cuda.launch_smem(3, 3, tile, True), tile.name
        assert bound.smem >= gconv_cuda.smem_bytes(3, 3, tile), tile.name
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(tile)  # warm-up off the capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            captured = chain(tile)
        for _ in range(3):
            for t in captured:
                t.fill_(float("nan"))
            graph.replay()
        torch.cuda.synchronize()
        for i, (p, d, g) in enumerate(zip(plain, dependent, captured, strict=True)):
            assert torch.equal(p.isnan(), d.isnan()) and torch.equal(p.nan_to_num(), d.nan_to_num())
            assert torch.equal(p.nan_to_num(), g.nan_to_num()), (tile.name, i)
            assert not p.isnan().any(), (tile.name, i)


def _check_tma_pipeline(c: int, dtype: torch.dtype) -> None:
    x = _cl(torch.randn(64, c, 33, 35, device="cuda", dtype=dtype))
    x[3, 5, 7, 9], x[40, 60, 32, 34], x[63, 0, 0, 0] = float("nan"), float("inf"), float("-inf")
    w = torch.randn(c, 8, 3, 3, device="cuda", dtype=dtype) * 0.1
    b = torch.randn(c, device="cuda", dtype=dtype)
    finite = x.nan_to_num(posinf=0.0, neginf=0.0)
    tiles = [t for t in gconv_cuda.candidates(c, 3, 3, tma=True) if t.tma]
    if c > 64:  # the wide tiles only (the others ran at C = 64)
        tiles = [t for t in tiles if t.cb * 2 > 128]
    assert tiles, c
    for tile in tiles:
        twin = gconv_cuda.non_tma_twin(tile, c, 3, 3)
        n_tiles = 64 * -(-33 // tile.th) * -(-35 // tile.tw)
        ctas_per_block = -(-tile.min_ctas * gconv_cuda.num_sms(x.device) // (c // tile.cb))
        assert n_tiles > 2 * min(n_tiles, ctas_per_block)  # several tiles per CTA
        for dgrad, bias in ((False, b), (True, None)):
            for inp in (x, finite):
                outs = []
                for t in (tile, twin):
                    out = _cl(torch.full_like(x, float("nan")))
                    outs.append(gconv_cuda.fprop(inp, w, bias, out, 1, 1, t, dgrad))
                assert torch.equal(outs[0].isnan(), outs[1].isnan()), (tile.name, dgrad)
                if inp is x and twin.th != tile.th:
                    # a warp with a non-finite sum recomputes its block exactly, and blocks of
                    # tiles of other heights differ: finite outputs near the NaN/Inf may then
                    # differ in their last bits; the finite input below is compared bitwise
                    torch.testing.assert_close(outs[0], outs[1], equal_nan=True)
                    continue
                same = torch.equal(outs[0].nan_to_num(), outs[1].nan_to_num())
                assert same, (tile.name, dgrad, inp is x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("r,s,ph,pw", [(7, 7, 3, 3), (6, 6, 2, 3), (5, 7, 1, 3)])
def test_wide_kernel_row_pair_tiles_over_many_tiles(r, s, ph, pw, dtype, rng_seed):
    """The row-pair tiles for kernels past ``ROWPAIR_MAX_FRAGMENTS``: each CTA walks several
    tiles of an odd image, fprop with bias and dgrad, against fp64 by the three-way rule; a
    NaN/Inf input gives fp64's NaN/Inf pattern. (Not cuDNN's: session 22 saw its fp16 grouped
    conv miss NaN outputs over the whole 7x7 window of a NaN input, ``scripts/nan_probe.py``.)"""
    c = 64
    x = _cl(torch.randn(24, c, 33, 35, device="cuda"))
    wt = torch.randn(c, 8, r, s, device="cuda") / (8 * r * s) ** 0.5
    b = torch.randn(c, device="cuda")
    g, pad = c // 8, (ph, pw)
    ref = F.conv2d(x.double(), wt.double(), b.double(), padding=pad, groups=g)
    same = F.conv2d(x.to(dtype), wt.to(dtype), b.to(dtype), padding=pad, groups=g)
    dy = _cl(torch.randn(ref.shape, device="cuda"))
    kw = {"padding": pad, "groups": g}
    dref = torch.nn.grad.conv2d_input(x.shape, wt.double(), dy.double(), **kw)
    dsame = torch.nn.grad.conv2d_input(x.shape, wt.to(dtype), dy.to(dtype), **kw)
    bad = x.to(dtype).clone()
    bad[3, 5, 7, 9], bad[20, 60, 32, 34] = float("nan"), float("inf")
    bad_ref = F.conv2d(bad.double(), wt.to(dtype).double(), None, padding=pad, groups=g)
    tma = gconv_cuda._tma.supported(torch.cuda.current_device())
    tiles = [t for t in gconv_cuda.candidates(c, r, s, tma, wide_tiles=True) if t.rowpair]
    tiles += [gconv_cuda.non_tma_twin(t, c, r, s) for t in tiles if t.tma]
    assert tiles
    for tile in dict.fromkeys(tiles):
        tag = f"k{r}x{s} pad{pad} {tile.name} {dtype}"
        out = _cl(torch.full(same.shape, float("nan"), device="cuda", dtype=dtype))
        gconv_cuda.fprop(_cl(x.to(dtype)), wt.to(dtype), b.to(dtype), out, ph, pw, tile)
        assert_three_way(out, same, ref, ATOL[dtype], f"fprop {tag}", rng_seed, ulps=1)
        dx = _cl(torch.full(x.shape, float("nan"), device="cuda", dtype=dtype))
        gconv_cuda.fprop(
            _cl(dy.to(dtype)), wt.to(dtype), None, dx, r - 1 - ph, s - 1 - pw, tile, True
        )
        assert_three_way(dx, dsame, dref, ATOL[dtype], f"dgrad {tag}", rng_seed, ulps=1)
        out = _cl(torch.full(same.shape, 0.0, device="cuda", dtype=dtype))
        gconv_cuda.fprop(_cl(bad), wt.to(dtype), None, out, ph, pw, tile)
        assert torch.equal(out.isnan(), bad_ref.isnan()), tag
        assert torch.equal(out.isinf(), bad_ref.isinf()), tag


@pytest.mark.gpu
def test_tma_tiles_fall_back_without_the_lean_launcher(monkeypatch, caplog):
    """PyTorch's launcher cannot pass a tensor map: a TMA tile then runs as the same tile without
    TMA (said once), bitwise equal to the TMA run."""
    if not gconv_cuda._tma.supported(torch.cuda.current_device()):
        pytest.skip("no TMA on this GPU")
    x = _cl(torch.randn(2, 64, 13, 17, device="cuda", dtype=torch.float16))
    w = torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16) * 0.1
    outs = []
    for tile in gconv_cuda.TMA_TILES[:2]:
        outs.append(gconv_cuda.fprop(x, w, None, _cl(torch.full_like(x, float("nan"))), 1, 1,
                                     tile).clone())  # fmt: skip
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, signature, *dependent: None)
    gconv_cuda._log_once.cache_clear()
    with caplog.at_level("WARNING", logger=gconv_cuda.log.name):
        for tile, want in zip(gconv_cuda.TMA_TILES[:2], outs, strict=True):
            out = _cl(torch.full_like(x, float("nan")))
            assert torch.equal(gconv_cuda.fprop(x, w, None, out, 1, 1, tile), want)
    assert sum("runs without TMA" in r.message for r in caplog.records) == 2


def test_every_tma_tile_has_a_legal_twin():
    """Without the lean launcher a TMA tile runs as a non-TMA twin: same kernel and channel
    block, fewer rows where the per-chunk staging needs more shared memory (the 32x32 tile)."""
    for c in (8, 64, 256):
        for r in range(1, 8):
            for s in range(1, 8):  # every kernel, the wide-kernel tiles too
                for tile in gconv_cuda.candidates(c, r, s, tma=True, wide_tiles=True):
                    if not tile.tma:
                        continue
                    twin = gconv_cuda.non_tma_twin(tile, c, r, s)
                    assert gconv_cuda.tile_ok(c, r, s, twin) and not twin.tma, (c, r, s, tile)
                    assert (twin.tw, twin.cb, twin.warps) == (tile.tw, tile.cb, tile.warps)
    big = gconv_cuda.CudaTile(32, 32, 32, 16, 1, 2, rowpair=True, tma=2)
    assert gconv_cuda.non_tma_twin(big, 64, 3, 3).th == 16


def test_wide_tiles_are_offered_only_unshrunk():
    """The 64/128-channel one-CTA-per-SM tiles are candidates only where their channel block
    divides C (fitted down they would run one CTA of a few warps per SM, never measured)."""
    wide_shapes = {(16, 16), (8, 32), (8, 16)}  # the wide tiles' (none of another width)
    for c in (8, 24, 32, 96):
        for t in gconv_cuda.candidates(c, 3, 3, tma=True) + gconv_cuda.wgrad_candidates(
            c, 3, 3, small=False, tma=True
        ):
            assert not (t.min_ctas == 1 and t.tma and (t.th, t.tw) in wide_shapes), (c, t)
    wide = {t.cb for t in gconv_cuda.candidates(256, 3, 3, tma=True) if t.tma}
    assert {64, 128} <= wide
    assert 128 not in {t.cb for t in gconv_cuda.candidates(64, 3, 3, tma=True)}
    assert 64 not in {t.cb for t in gconv_cuda.candidates(96, 3, 3, tma=True) if t.tma}
    assert 64 in {t.cb for t in gconv_cuda.wgrad_candidates(64, 3, 3, small=False, tma=True)}
    assert 64 not in {t.cb for t in gconv_cuda.wgrad_candidates(96, 3, 3, tma=True)}


def test_wgrad_tiles_give_every_warp_a_16_pixel_row():
    """The wgrad kernels compile from a source that also holds the fprop tap kernel, whose warps
    each take at least one 16-pixel row of the tile (session 19: 8x8 tiles of 8 warps and
    128-channel tiles of 16 warps failed to compile); such tiles are not legal."""
    assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 8, 64, 8, 2, 2, tma=1))
    assert not gconv_cuda.wgrad_tile_ok(128, 3, 3, CudaTile(8, 16, 128, 16, 1, 2, tma=1))
    assert gconv_cuda.wgrad_tile_ok(64, 3, 3, CudaTile(8, 16, 64, 8, 2, 2, tma=1))
    for c in (8, 64, 256):
        for t in gconv_cuda.wgrad_candidates(c, 3, 3, tma=True):
            assert t.th * t.tw >= 16 * t.warps, t


def test_every_tma_wgrad_tile_has_a_legal_twin():
    """Without the lean launcher a TMA wgrad tile runs as its non-TMA twin: the same tap kernel,
    channel block and warps, fewer rows where the per-chunk staging needs more shared memory."""
    for c in (8, 64, 256):
        for r in range(1, 8):
            for tile in gconv_cuda.wgrad_candidates(c, r, r, small=False, tma=True):
                if tile.tma:
                    twin = gconv_cuda.wgrad_twin(tile, c, r, r)
                    assert gconv_cuda.wgrad_tile_ok(c, r, r, twin) and not twin.tma, (c, r)
                    assert (twin.tw, twin.cb, twin.warps) == (tile.tw, tile.cb, tile.warps)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16], ids=str)
def test_tma_wgrad_tiles_fall_back_without_the_lean_launcher(dtype, rng_seed, monkeypatch, caplog):
    """PyTorch's launcher cannot pass tensor maps: a TMA wgrad tile then runs as its non-TMA
    twin (said once per tile), still right by the three-way rule on the odd shapes."""
    if not gconv_cuda._tma.supported(torch.cuda.current_device()):
        pytest.skip("no TMA on this GPU")
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, signature, *dependent: None)
    gconv_cuda._log_once.cache_clear()

    def tiles_for(c, r, s):
        return [t for t in gconv_cuda.wgrad_candidates(c, r, s, False, True) if t.tma]

    with caplog.at_level("WARNING", logger=gconv_cuda.log.name):
        assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) > 0
    assert any("runs without TMA" in r.message for r in caplog.records)
    gconv_cuda._log_once.cache_clear()


def test_tma_needs_the_row_pair_kernel():
    x = torch.zeros(1, 64, 8, 8)
    with pytest.raises(ValueError, match="'tile'"):
        gconv_cuda.fprop(x, torch.zeros(64, 8, 3, 3), None, x, 1, 1, CudaTile(tma=1))


@pytest.mark.gpu
def test_nan_stays_in_its_group():
    x = _cl(torch.randn(1, 64, 12, 12, device="cuda", dtype=torch.float16))
    x[0, 3, 5, 5] = float("nan")  # group 0
    x[0, 20, 2, 2] = float("inf")  # group 2
    wt = torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16)
    ref = F.conv2d(x.float(), wt.float(), padding=1, groups=8)
    for tile in _tiles(64, 3, 3):
        out = _cl(torch.empty(1, 64, 12, 12, device="cuda", dtype=torch.float16))
        gconv_cuda.fprop(x, wt, None, out, 1, 1, tile)
        assert torch.equal(out.isnan(), ref.isnan()), tile.name
        assert torch.equal(out.isinf(), ref.isinf()), tile.name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k", [3, 5, 7])
def test_nonfinite_blocks_match_pytorch_values_too(k, dtype, rng_seed):
    """Blocks holding Inf/NaN take the row-pair and wgmma kernels' exact recompute (per-tap MMAs
    since session 35: their zero weights would otherwise meet them): NaN/Inf where PyTorch has
    them, and the block's finite outputs, with bias, by the three-way rule; fprop and dgrad,
    every tile of a k x k kernel; a weight of exactly zero meets an Inf too (NaN, as in PyTorch)."""
    n, c, h, w = 2, 64, 13, 17
    x = torch.randn(n, c, h, w, device="cuda")
    x[0, 3, 5, 5] = float("inf")
    x[1, 20, 0, 7] = float("-inf")
    x[1, 41, 12, 16] = float("nan")
    x[0, 60, 9, 2] = float("inf")
    wt = torch.randn(c, 8, k, k, device="cuda") / (8 * k * k) ** 0.5
    wt[56:64, 4, 0, 1] = 0.0  # in channel 60's weights: its Inf times an exact zero
    b = torch.randn(c, device="cuda")
    g, p = c // 8, k // 2
    ref = F.conv2d(x.double(), wt.double(), b.double(), padding=p, groups=g)
    dref = torch.nn.grad.conv2d_input(x.shape, wt.double(), x.double(), padding=p, groups=g)
    # PyTorch's own half-precision witness comes from the input with the non-finite values
    # zeroed: its fp16/bf16 conv returned non-finite values at 152 outputs whose fp64 reference
    # is finite (H100, session 7), which made their bound NaN. Every output the fp64 reference
    # has finite sees only finite inputs, so zeroing the rest leaves its same-dtype value.
    xf = x.nan_to_num(0.0, 0.0, 0.0).to(dtype)
    same = F.conv2d(xf, wt.to(dtype), b.to(dtype), padding=p, groups=g)
    dsame = torch.nn.grad.conv2d_input(x.shape, wt.to(dtype), xf, padding=p, groups=g)
    tiles = _tiles(c, k, k)
    assert any(t.rowpair for t in tiles)
    assert any(t.wgmma for t in tiles) or not _wgmma()
    for tile in tiles:
        out = _cl(torch.full(same.shape, 7.0, device="cuda", dtype=dtype))
        gconv_cuda.fprop(_cl(x.to(dtype)), wt.to(dtype), b.to(dtype), out, p, p, tile)
        dx = _cl(torch.full(x.shape, 7.0, device="cuda", dtype=dtype))
        gconv_cuda.fprop(_cl(x.to(dtype)), wt.to(dtype), None, dx, p, p, tile, True)
        for got, tw_same, r, what in ((out, same, ref, "fprop"), (dx, dsame, dref, "dgrad")):
            assert torch.equal(got.isnan(), r.isnan()), f"{what} NaN {tile.name}"
            assert torch.equal(got.isinf(), r.isinf()), f"{what} Inf {tile.name}"
            ok = r.isfinite()
            assert_three_way(got[ok], tw_same[ok], r[ok], ATOL[dtype], f"{what} {tile.name}",
                             rng_seed, ulps=1)  # fmt: skip


def _wgrad_problem(n, c, h, w, r, s, ph, pw, dtype):
    """(x, dy, dw in fp64, dw by PyTorch in ``dtype``, the dw tolerance) of a random wgrad
    problem, both tensors channels_last on the GPU."""
    x = _cl(torch.randn(n, c, h, w, device="cuda", dtype=dtype))
    wshape, pad = (c, 8, r, s), (ph, pw)
    ho, wo = h + 2 * ph - r + 1, w + 2 * pw - s + 1
    dy = _cl(torch.randn(n, c, ho, wo, device="cuda", dtype=dtype))
    ref = torch.nn.grad.conv2d_weight(x.double(), wshape, dy.double(), padding=pad, groups=c // 8)
    same = torch.nn.grad.conv2d_weight(x, wshape, dy, padding=pad, groups=c // 8)
    return x, dy, ref, same, ATOL[dtype] * (n * h * w) ** 0.5


def _check_wgrad_tiles(dtype, rng_seed, tiles_for) -> int:
    """Every tile ``tiles_for(c, r, s)`` gives on the odd shapes, dw and db by the three-way
    rule; returns how many (shape, tile) pairs ran."""
    ran = 0
    for case, (n, c, h, w, r, s, ph, pw, has_b) in enumerate(CASES):
        x, dy, ref, same, atol = _wgrad_problem(n, c, h, w, r, s, ph, pw, dtype)
        db_ref = dy.double().sum((0, 2, 3))
        for k, tile in enumerate(tiles_for(c, r, s)):
            tag = f"wgrad n{n} c{c} {h}x{w} k{r}x{s} pad({ph}, {pw}) {tile.name} {dtype}"
            # a tile writes dw channels_last (DW_CL) on every other shape it runs on, so each
            # tile met on two shapes runs both layouts (not both everywhere: a compile each)
            dw_cl = bool((case + k) % 2)
            fmt = torch.channels_last if dw_cl else torch.contiguous_format
            # with a bias: its gradient in fp32 and, written by the kernel, in the input dtype
            for db_dtype in (torch.float32, dtype) if has_b else (torch.float32,):
                dw, db = gconv_cuda.wgrad(dy, x, r, s, ph, pw, has_b, tile, db_dtype, dw_cl)
                assert dw.dtype == dtype and dw.shape == (c, 8, r, s)
                assert dw.is_contiguous(memory_format=fmt), f"dw layout, {tag} dw_cl={dw_cl}"
                assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
                if has_b:
                    assert db.dtype == db_dtype
                    db_same = dy.float().sum((0, 2, 3)).to(db_dtype)
                    assert_three_way(db, db_same, db_ref, 1e-3, f"db {tag}", rng_seed, ulps=1)
                else:
                    assert db is None
            ran += 1
    return ran


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_wgrad_tile(dtype, rng_seed):
    assert _check_wgrad_tiles(dtype, rng_seed, gconv_cuda.wgrad_candidates) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wgmma_wgrad_tiles_on_odd_shapes(dtype, rng_seed):
    """Every wgmma wgrad tile, offered or not, on every odd shape it takes (kernels of 1-7
    rows; only 5+ row ones are offered), dw in both layouts and db in both dtypes."""
    if not gconv_cuda.wgmma_usable(torch.empty(0, device="cuda")):
        pytest.skip("needs compute capability 9.0 with TMA")
    tiles = gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES

    def tiles_for(c, r, s):
        return [t for t in tiles if gconv_cuda.wgrad_tile_ok(c, r, s, t)]

    assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) >= 40


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wgmma_wgrad_over_many_units_per_cta(dtype, rng_seed):
    """The wgmma wgrad with several (image, column chunk) units a CTA (up to 4 on 132 SMs): rows
    of one unit must not reach into the next one's windows, partial chunks, padding from 0 to
    R - 1 (the odd-shape test has padding R), wide images; the workspace is left zero."""
    if not gconv_cuda.wgmma_usable(torch.empty(0, device="cuda")):
        pytest.skip("needs compute capability 9.0 with TMA")
    tiles = gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES
    assert check_wgmma_wgrad_many_units(dtype, rng_seed, tiles) >= 16


def check_wgmma_wgrad_many_units(dtype, rng_seed, tiles) -> int:
    """The body of the test above over ``tiles`` (also run by
    ``scripts/check_wgmma_wgrad_tiles.py``); returns how many (shape, tile) pairs ran."""
    shapes = (  # (n, c, h, w, r, s, pad_h, pad_w): up to ~4 units a CTA on 132 SMs
        (300, 32, 7, 70, 7, 7, 3, 3),
        (260, 16, 5, 33, 5, 5, 0, 4),
        (257, 48, 9, 17, 6, 7, 5, 2),
        (3, 64, 40, 150, 7, 5, 3, 2),
    )
    ran = 0
    for n, c, h, w, r, s, ph, pw in shapes:
        x, dy, ref, same, atol = _wgrad_problem(n, c, h, w, r, s, ph, pw, dtype)
        for tile in tiles:
            if not gconv_cuda.wgrad_tile_ok(c, r, s, tile):
                continue
            tag = f"wgrad n{n} c{c} {h}x{w} k{r}x{s} pad({ph}, {pw}) {tile.name} {dtype}"
            dw, db = gconv_cuda.wgrad(dy, x, r, s, ph, pw, True, tile)
            assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
            db_same = dy.float().sum((0, 2, 3))
            db_ref = dy.double().sum((0, 2, 3))
            db_atol = 1e-3 * dy[:, 0].numel() ** 0.5
            assert_three_way(db, db_same, db_ref, db_atol, f"db {tag}", rng_seed)
            assert workspace.all_zero(), tag
            ran += 1
    return ran


@pytest.mark.gpu
def test_wgrad_rejects_an_illegal_tile():
    x = _cl(torch.randn(1, 64, 8, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="argument 'tile'"):  # 2 rows do not divide 5
        gconv_cuda.wgrad(x, x, 5, 5, 2, 2, True, CudaTile(8, 16, 16, 2, 4, 2, tap_rows=2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_multi_row_blocks(dtype, rng_seed):
    """Row blocks of several kernel rows (``tap_rows`` 2 and 3 of 4- and 6-row kernels; no
    candidate uses them yet), clustered and with atomics, against fp64 by the three-way rule."""
    shapes = ((2, 64, 13, 11, 6, 6, 2, 3, True), (1, 32, 9, 9, 4, 4, 1, 1, True))
    tiles = (
        CudaTile(8, 16, 16, 2, 4, 2, cluster=8, tap_rows=2),
        CudaTile(8, 16, 16, 2, 4, 2, tap_rows=2),
        CudaTile(8, 16, 16, 2, 4, 2, cluster=8, tap_rows=3),
        CudaTile(8, 16, 16, 2, 4, 2, tap_rows=3),
    )
    ran = 0
    for n, c, h, w, r, s, ph, pw, has_b in shapes:
        x, dy, ref, same, atol = _wgrad_problem(n, c, h, w, r, s, ph, pw, dtype)
        for tile in tiles:
            if not gconv_cuda.wgrad_tile_ok(c, r, s, tile):
                continue
            # both dw layouts: with tap_rows > 1 a CTA's taps start mid-kernel (R < R_FULL)
            dw_cl = bool(ran % 2)
            tag = f"wgrad n{n} c{c} k{r}x{s} {tile.name} {dtype} dw_cl={dw_cl}"
            fmt = torch.channels_last if dw_cl else torch.contiguous_format
            dw, db = gconv_cuda.wgrad(dy, x, r, s, ph, pw, has_b, tile, dw_cl=dw_cl)
            assert dw.is_contiguous(memory_format=fmt), tag
            assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
            db_same = dy.float().sum((0, 2, 3))
            assert_three_way(db, db_same, dy.double().sum((0, 2, 3)), 1e-3, f"db {tag}", rng_seed)
            assert workspace.all_zero(), tag
            ran += 1
    assert ran == 6  # 6x6 takes 2- and 3-row blocks, 4x4 only 2-row ones


@pytest.mark.gpu
def test_wgrad_workspace_is_left_zero_and_graphs_replay():
    """The single-launch wgrad leaves its shared workspace zero (the next launch relies on it)
    across problem sizes, tiles and streams, and replays right inside a CUDA graph."""
    dt = torch.float16
    results = {}
    for c, hw, r in ((64, 13, 3), (256, 9, 5), (64, 21, 1)):
        x = _cl(torch.randn(3, c, hw, hw, device="cuda", dtype=dt))
        dy = _cl(torch.randn(3, c, hw + 3 - r, hw + 3 - r, device="cuda", dtype=dt))
        for tile in gconv_cuda.wgrad_candidates(c, r, r):
            dw, db = gconv_cuda.wgrad(dy, x, r, r, 1, 1, True, tile, dt)
            results[(c, r, tile)] = (x, dy, dw.clone(), db.clone())
            assert workspace.all_zero(), f"workspace not zero after {tile.name} c{c} k{r}"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # another stream has its own workspace
        for (_c, r, tile), (x, dy, dw, db) in results.items():
            dw2, db2 = gconv_cuda.wgrad(dy, x, r, r, 1, 1, True, tile, dt)
            torch.testing.assert_close(dw2, dw, rtol=2e-3, atol=1e-3)
            torch.testing.assert_close(db2, db, rtol=2e-3, atol=1e-3)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert ("cuda", torch.cuda.current_device(), side.cuda_stream) in workspace._WORKSPACES
    assert workspace.all_zero()
    before = {k: ws.data_ptr() for k, (ws, _) in workspace._WORKSPACES.items()}
    (_, r, tile), (x, dy, dw, db) = next(iter(results.items()))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the capture gets a workspace of its own (a recorded memset)
        gdw, gdb = gconv_cuda.wgrad(dy, x, r, r, 1, 1, True, tile, dt)
    assert {k: ws.data_ptr() for k, (ws, _) in workspace._WORKSPACES.items()} == before
    for _ in range(3):  # replays, then eager launches on the shared workspaces still right
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(gdw, dw, rtol=2e-3, atol=1e-3)
        torch.testing.assert_close(gdb, db, rtol=2e-3, atol=1e-3)
    dw3, _ = gconv_cuda.wgrad(dy, x, r, r, 1, 1, True, tile, dt)
    torch.testing.assert_close(dw3, dw, rtol=2e-3, atol=1e-3)
    assert workspace.all_zero()


def _rowpair_wgrad_loops(x, dy, r, s, ph, pw, th, tw):
    """The row-pair wgrad kernel's loops at matrix level (fp64): halo tiles of whole row pairs
    (rows from TH + R - 1 on zero), per pair of dy rows and per (s, k) one A block of two halo
    rows serving the even row (taps 2k + j) and the odd row (taps 2k + j - 1), then the final
    pick of each tap's two partial sums. Returns dw [C, 8, R, S]."""
    n, c, h, w = x.shape
    p, q = dy.shape[2], dy.shape[3]
    nk, hwd = r // 2 + 1, tw + s - 1
    rows = th + 2 * nk - 2
    dw = torch.zeros(c, 8, r, s, dtype=torch.float64)
    for g in range(c // 8):
        ev = torch.zeros(nk, s, 2, 8, 8, dtype=torch.float64)  # [k, s, j, ci, o]
        od = torch.zeros_like(ev)
        for ni in range(n):
            for ti in range(-(-p // th)):
                for tj in range(-(-q // tw)):
                    halo = torch.zeros(rows, hwd, 8, dtype=torch.float64)
                    for hh in range(min(rows, th + r - 1)):
                        for ww in range(hwd):
                            ih, iw = ti * th - ph + hh, tj * tw - pw + ww
                            if 0 <= ih < h and 0 <= iw < w:
                                halo[hh, ww] = x[ni, g * 8 : g * 8 + 8, ih, iw]
                    dyt = torch.zeros(th, tw, 8, dtype=torch.float64)
                    for yy in range(th):
                        for xx in range(tw):
                            oh, ow = ti * th + yy, tj * tw + xx
                            if oh < p and ow < q:
                                dyt[yy, xx] = dy[ni, g * 8 : g * 8 + 8, oh, ow]
                    for cx in range(0, tw, 16):
                        for y in range(0, th, 2):
                            for sj in range(s):
                                for k in range(nk):
                                    a = halo[y + 2 * k : y + 2 * k + 2, cx + sj : cx + sj + 16]
                                    a = a.permute(0, 2, 1)  # [j, ci, px]
                                    ev[k, sj] += a @ dyt[y, cx : cx + 16]
                                    od[k, sj] += a @ dyt[y + 1, cx : cx + 16]
        for ri in range(r):
            for sj in range(s):
                v = ev[ri // 2, sj, ri % 2] + od[(ri + 1) // 2, sj, (ri + 1) % 2]  # [ci, o]
                dw[g * 8 : g * 8 + 8, :, ri, sj] = v.t()
    return dw


@pytest.mark.parametrize(
    "n,c,h,w,r,s,ph,pw,th,tw",
    [
        (2, 16, 13, 17, 3, 3, 1, 1, 8, 16),
        (1, 8, 9, 20, 2, 3, 1, 0, 4, 16),
        (1, 8, 5, 5, 1, 1, 0, 0, 2, 16),
    ],
)
def test_rowpair_wgrad_loop_algebra(n, c, h, w, r, s, ph, pw, th, tw):
    """The experimental row-pair wgrad's tap bookkeeping, emulated on the CPU, is conv2d's weight
    gradient (odd and even R, padding, partial tiles); its CUDA transcription is GPU-tested."""
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    dy_shape = F.conv2d(x, torch.zeros(c, 8, r, s, dtype=torch.float64), padding=(ph, pw),
                        groups=c // 8).shape  # fmt: skip
    dy = torch.randn(dy_shape, dtype=torch.float64)
    want = torch.nn.grad.conv2d_weight(x, (c, 8, r, s), dy, padding=(ph, pw), groups=c // 8)
    got = _rowpair_wgrad_loops(x, dy, r, s, ph, pw, th, tw)
    torch.testing.assert_close(got, want)


def test_compiled_kernels_are_cached(monkeypatch):
    """One NVRTC compile per variant: an uncached compile cost ~19 ms per launch on the H100
    host (a decorator left on the wrong function once made every launch recompile)."""
    compiles, _ = fake_nvrtc(monkeypatch)
    x = _cl(torch.randn(2, 64, 8, 8))
    w = torch.randn(64, 8, 3, 3)
    rowpair = CudaTile(rowpair=True)
    for _ in range(3):
        gconv_cuda.fprop(x, w, None, _cl(torch.empty_like(x)), 1, 1)
        gconv_cuda.fprop(x, w, None, _cl(torch.empty_like(x)), 1, 1, dgrad=True)
        gconv_cuda.fprop(x, w, None, _cl(torch.empty_like(x)), 1, 1, rowpair)
        gconv_cuda.wgrad(x, x, 3, 3, 1, 1, True)
        gconv_cuda.wgrad(x, x, 3, 3, 1, 1, True, gconv_cuda.EXPERIMENTAL_WGRAD_TILES[0])
    assert sorted(name for name, _, _ in compiles) == [
        "tw_gconv_fprop",
        "tw_gconv_fprop",
        "tw_gconv_fprop_rp",
        "tw_gconv_wgrad",
        "tw_gconv_wgrad_rp",
    ]
    for name, src, _ in compiles:  # each entry compiled from the source that defines it
        assert f"{name}(" in src
        assert ("tw_gconv_wgrad(" in src) == (name in ("tw_gconv_fprop", "tw_gconv_wgrad"))
    gconv_cuda._kernel.cache_clear()


def test_a_wgmma_tile_without_the_lean_launcher_runs_a_plain_candidate(monkeypatch, caplog):
    """A wgmma tile needs tensor maps, which only the lean launcher passes, and has no non-TMA
    twin: without the launcher (a choice cached by a process that had it) the first candidate
    without TMA runs instead, said once, rather than the call raising. CPU: compiles faked."""
    compiles, launches = fake_nvrtc(monkeypatch)
    gconv_cuda._log_once.cache_clear()
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, signature, *dependent: None)
    x = _cl(torch.randn(2, 64, 8, 8))
    w = torch.randn(64, 8, 3, 3)
    tile = next(t for t in gconv_cuda.WGMMA_TILES if gconv_cuda.tile_ok(64, 3, 3, t))
    plain = gconv_cuda.candidates(64, 3, 3, tma=False)[0]
    try:
        with caplog.at_level("WARNING", logger=gconv_cuda.log.name):
            for _ in range(2):
                gconv_cuda.fprop(x, w, None, _cl(torch.empty_like(x)), 1, 1, tile)
    finally:
        gconv_cuda._kernel.cache_clear()
    compiled = [(name, target) for name, _, target in compiles]
    assert compiled[0] == ("tw_gconv_fprop_wg", "90a")  # compiled, then found unlaunchable
    assert [name for name, _ in compiled[1:]] == [
        gconv_cuda.source(3, 3, plain, False, 0, False, "tw_gconv_fprop")[1]
    ]
    said = [r.message for r in caplog.records if "needs the lean launcher" in r.message]
    assert len(said) == 1 and plain.name in said[0]
    assert len(launches) == 2  # by PyTorch's launcher, with the plain tile's block and memory
    for launch in launches:
        assert launch["block"][0] == plain.warps * 32
        assert launch["shared_mem"] == gconv_cuda.smem_bytes(3, 3, plain)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sumk_wgrad_tiles(dtype, rng_seed):
    """``SUMK_WGRAD_TILES`` (session 48; not candidates): clusters of 2 or 4 TMA CTAs that add
    up their sums through distributed shared memory before the atomics, on the odd shapes."""
    if not gconv_cuda._tma.supported(torch.cuda.current_device()):
        pytest.skip("needs TMA (compute capability 9.0)")

    def tiles_for(c, r, s):
        fitted = (gconv_cuda._fitted(t, c, True) for t in gconv_cuda.SUMK_WGRAD_TILES)
        return [t for t in fitted if gconv_cuda.wgrad_tile_ok(c, r, s, t)]

    assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) > 0
    # the odd shapes give each CTA one tile at most: here every CTA loops over several (512
    # tiles of 16 x 16 against 132 CTAs, 896 of 8 x 16 against 528; session 49: at first N = 16
    # for C=32, whose 448 tiles of 8 x 16 gave each CTA one), with the bias, and the whole grid
    # comes in clusters; the workspace is left zero
    for n, c, h, w in ((32, 64, 56, 56), (32, 32, 56, 56)):
        x, dy, ref, same, atol = _wgrad_problem(n, c, h, w, 3, 3, 1, 1, dtype)
        for tile in tiles_for(c, 3, 3):
            tag = f"wgrad n{n} c{c} {h}x{w} {tile.name} {dtype}"
            grid = gconv_cuda.bind_wgrad(dy, x, 3, 3, 1, 1, True, tile).grid
            assert grid[0] % tile.sumk == 0 and grid[0] < n * -(-h // tile.th) * -(-w // tile.tw)
            dw, db = gconv_cuda.wgrad(dy, x, 3, 3, 1, 1, True, tile)
            assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
            db_same, db_ref = dy.float().sum((0, 2, 3)), dy.double().sum((0, 2, 3))
            db_atol = 1e-3 * dy[:, 0].numel() ** 0.5
            assert_three_way(db, db_same, db_ref, db_atol, f"db {tag}", rng_seed)
            assert workspace.all_zero(), tag


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_slot_wgrad_tiles(dtype, rng_seed):
    """The deterministic wgrad's tiles (``CudaTile.slots``, session 49): a slot of sums per CTA
    and the dependent slot-sum kernel, on the odd shapes (dw in both layouts, db in both
    dtypes); then where every CTA loops over several tiles, with the bias: bit for bit the same
    in two runs and in a CUDA graph's replays, and the workspace untouched."""
    tma = gconv_cuda._tma.supported(torch.cuda.current_device())
    # and the slot form of the row-split tap tile (one row of taps a CTA: row blocks z > 0
    # store their taps' sums and no bias), legal though no candidate list offers it
    rows = [dataclasses.replace(t, slots=True) for t in gconv_cuda.ROW_WGRAD_TILES]
    rows = [t for t in rows if not t.cluster]
    split_ran = []

    def tiles_for(c, r, s):
        fitted = (gconv_cuda._fitted(t, c, True) for t in rows)
        split = [t for t in fitted if gconv_cuda.wgrad_tile_ok(c, r, s, t)]
        split_ran.extend(split)
        return [*gconv_cuda.slot_wgrad_candidates(c, r, s, tma), *split]

    assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) > 0
    assert split_ran, "no row-split slot tile ran"
    for n, c, h, w in ((32, 64, 56, 56), (32, 32, 56, 56)):  # 512 / 896 tiles: CTAs loop
        shape = (n, c, h, w, 3, 3, 1, 1)
        tiles = gconv_cuda.slot_wgrad_candidates(c, 3, 3, tma)
        assert tiles, shape
        _check_slot_tiles_repeat(dtype, rng_seed, shape, tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wgmma_slot_wgrad_tiles(dtype, rng_seed):
    """The warpgroup wgrad's slot forms (session 50; the deterministic mode's 5x5 and 7x7
    tiles): the CTAs of every channel block store their channels of slot blockIdx.x, their bias
    sums added over the warpgroup's warps in shared memory. On the odd shapes; with several
    units a CTA and CTAs without any (they store zeros); bit for bit the same in two runs and
    in a CUDA graph's replays."""
    if not gconv_cuda.wgmma_usable(torch.empty(0, device="cuda")):
        pytest.skip("needs compute capability 9.0 with TMA")
    tiles = [dataclasses.replace(t, slots=True) for t in gconv_cuda.WGMMA_WGRAD_TILES]

    def tiles_for(c, r, s):
        return [t for t in tiles if gconv_cuda.wgrad_tile_ok(c, r, s, t)]

    assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) >= 20
    assert check_wgmma_wgrad_many_units(dtype, rng_seed, tiles) >= 8
    # 600-1500 units on 132 CTAs a channel block (264 for the 4-CTA tile); 257 units on 88
    # (2 CTAs an SM) or 176 (4) CTAs a channel block, the last 2 or 47 without a unit
    for shape, empty in (
        ((300, 32, 7, 70, 7, 7, 3, 3), False),
        ((257, 48, 9, 17, 6, 7, 5, 2), True),
    ):
        legal = tiles_for(shape[1], shape[4], shape[5])
        assert legal, shape
        _check_slot_tiles_repeat(dtype, rng_seed, shape, legal, empty)


def _check_slot_tiles_repeat(dtype, rng_seed, shape, tiles, empty_ctas=False) -> None:
    """Each slot tile of ``tiles`` on ``shape`` (n, c, h, w, r, s, pad_h, pad_w) with a bias,
    where the CTAs loop over several units (fewer CTAs than units; with ``empty_ctas`` the last
    CTA of each channel block has none): the slot path, three-way, bit for bit the same in two
    runs and in two CUDA-graph replays, the workspace untouched."""
    n, c, h, w, r, s, ph, pw = shape
    x, dy, ref, same, atol = _wgrad_problem(n, c, h, w, r, s, ph, pw, dtype)
    db_same, db_ref = dy.float().sum((0, 2, 3)), dy.double().sum((0, 2, 3))
    db_atol = 1e-3 * dy[:, 0].numel() ** 0.5
    for tile in tiles:
        tag = f"wgrad n{n} c{c} {h}x{w} k{r}x{s} {tile.name} {dtype}"
        bound = gconv_cuda.bind_wgrad(dy, x, r, s, ph, pw, True, tile, planned=True)
        assert bound.slot_sum is not None, tag  # the slot path, not the workspace's
        units = n * -(-dy.shape[3] // tile.tw) * (1 if tile.wgmma else -(-dy.shape[2] // tile.th))
        grid = bound.grid[0]
        assert 1 < grid < units, tag
        if empty_ctas:  # the kernel's split: -(-units // grid) units a CTA, from its first on
            assert (grid - 1) * -(-units // grid) >= units, tag
        dw, db = bound(dy, x)
        assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
        assert_three_way(db, db_same, db_ref, db_atol, f"db {tag}", rng_seed)
        dw2, db2 = bound(dy, x)
        assert torch.equal(dw, dw2) and torch.equal(db, db2), f"run to run, {tag}"
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            dw3, db3 = bound(dy, x)
        for _ in range(2):
            dw3.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(dw, dw3) and torch.equal(db, db3), f"graph replay, {tag}"
        assert workspace.all_zero(), tag


# last in the file: a tile off the candidate list is the likeliest to leave a sticky CUDA error
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_experimental_wgrad_tiles(dtype, rng_seed):
    """``EXPERIMENTAL_WGRAD_TILES`` (timed beside the candidates; not candidates)."""

    tma = gconv_cuda._tma.supported(torch.cuda.current_device())

    def tiles_for(c, r, s):
        fitted = (gconv_cuda._fitted(t, c, True) for t in gconv_cuda.EXPERIMENTAL_WGRAD_TILES)
        return [
            t
            for t in fitted
            if gconv_cuda.wgrad_tile_ok(c, r, s, t) and (tma or not t.tma) and not t.tap_rows
        ]

    assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_row_split_wgrad_tiles(dtype, rng_seed):
    """Every row-split tile (``tap_rows``: the candidates' and the experimental ones, all one
    row per CTA) on the odd shapes, among them a 3 x 5 and a 2 x 4 kernel, padding 0 (the lower
    row blocks' shifted padding is negative) and padding as large as the kernel."""
    tiles = gconv_cuda.ROW_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGRAD_TILES

    def tiles_for(c, r, s):
        fitted = (gconv_cuda._fitted(t, c, True) for t in tiles if t.tap_rows)
        return [t for t in fitted if gconv_cuda.wgrad_tile_ok(c, r, s, t)]

    assert _check_wgrad_tiles(dtype, rng_seed, tiles_for) > 0


def test_dependent_launch_only_on_hopper_and_not_when_switched_off(monkeypatch):
    """The row-pair kernel's programmatic dependent launch needs ``griddepcontrol`` (sm_90+);
    ``TILEWISE_GCONV_PDL=0`` turns it off; a CPU tensor never asks for it."""
    monkeypatch.setattr(gconv_cuda, "_capability", lambda device: (9, 0))
    assert gconv_cuda.dependent_launch(torch.device("cuda", 0))
    monkeypatch.setenv(gconv_cuda.ENV_PDL, "0")
    assert not gconv_cuda.dependent_launch(torch.device("cuda", 0))
    monkeypatch.delenv(gconv_cuda.ENV_PDL)
    monkeypatch.setattr(gconv_cuda, "_capability", lambda device: (8, 0))
    assert not gconv_cuda.dependent_launch(torch.device("cuda", 0))
    monkeypatch.undo()
    assert not gconv_cuda.dependent_launch(torch.device("cpu"))


@pytest.mark.parametrize("offered", [True, False])
def test_wide_kernel_tiles_key_and_candidates_in_the_choice(offered, monkeypatch):
    """Where the NVRTC kernels run, a 7x7 choice offers the wide-kernel row-pair tiles unless
    ``TILEWISE_GCONV_WIDE_TILES=0``, and its autotune key says which (a pick cached before they
    were offered is not reused); a 3x3 key carries no such tag. CPU: the tiles are only listed,
    the chosen Triton default runs on the interpreter."""
    from tilewise.ops import gconv, gconv_library
    from tilewise.runtime import autotune

    seen = []

    def choose(op, problem, candidates, run_fn, **kw):
        seen.append((op, tuple(candidates)))
        return kw["default"]

    monkeypatch.setattr(autotune, "choose_config", choose)
    monkeypatch.setattr(gconv, "_cuda_level", lambda x, out: 2)
    monkeypatch.setattr(gconv_library, "offered", lambda x, deterministic=False: False)
    if offered:
        monkeypatch.delenv(gconv_cuda.ENV_WIDE_TILES, raising=False)
    else:
        monkeypatch.setenv(gconv_cuda.ENV_WIDE_TILES, "0")
    for k in (7, 3):
        x = torch.randn(1, 64, 5, 6).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(64, 8, k, k)
        y = gconv.forward(x, wt, None, k // 2, k // 2)
        ref = F.conv2d(x, wt, None, padding=k // 2, groups=8)
        torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    (key7, cands7), (key3, _) = seen
    rowpair = [t for t in cands7 if isinstance(t, CudaTile) and t.rowpair]
    assert bool(rowpair) is offered
    assert key7.split("@")[0].endswith("+wide" if offered else "+nowide"), key7
    assert "wide" not in key3, key3


@pytest.mark.parametrize("level", [2, 3])
def test_wgmma_tiles_in_the_choice_at_level_three_only(level, monkeypatch):
    """The grouped conv's choice offers the wgmma tiles where ``_cuda_level`` is 3 (TMA and
    compute capability 9.0), and not at 2; ``_cuda_level`` reads 3 only when the GPU takes them.
    CPU: the tiles are only listed, the chosen Triton default runs on the interpreter."""
    from tilewise.ops import gconv, gconv_library
    from tilewise.runtime import autotune

    seen = []

    def choose(op, problem, candidates, run_fn, **kw):
        seen.append(tuple(candidates))
        return kw["default"]

    monkeypatch.setattr(autotune, "choose_config", choose)
    monkeypatch.setattr(gconv, "_cuda_level", lambda x, out: level)
    monkeypatch.setattr(gconv_library, "offered", lambda x, deterministic=False: False)
    x = torch.randn(1, 64, 5, 6).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(64, 8, 5, 5)
    y = gconv.forward(x, wt, None, 2, 2)
    torch.testing.assert_close(y, F.conv2d(x, wt, None, padding=2, groups=8), atol=1e-4, rtol=1e-4)
    wgmma = [t for t in seen[0] if isinstance(t, CudaTile) and t.wgmma]
    assert bool(wgmma) is (level == 3)
    monkeypatch.undo()
    for usable, tma, wg, want in ((False, True, True, 0), (True, False, True, 1),
                                  (True, True, False, 2), (True, True, True, 3)):  # fmt: skip
        monkeypatch.setattr(gconv_cuda, "usable", lambda x, out, v=usable: v)
        monkeypatch.setattr(gconv_cuda, "tma_usable", lambda x, v=tma: v)
        monkeypatch.setattr(gconv_cuda, "wgmma_usable", lambda x, v=wg: v)
        assert gconv._cuda_level(x, x) == want
