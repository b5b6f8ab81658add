"""The NVRTC kernels' sources compiled offline with nvcc (where installed, no GPU needed): the
row-pair tiles for kernels of more than ``ROWPAIR_MAX_FRAGMENTS`` weight fragments (7x7 and
kin, ``WIDE_KERNEL_TILES``) must compile without spills within the registers their CTAs per SM
leave, as ``rowpair_registers_fit`` predicts; and the candidate lists offer them only when asked."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from checks import failed_import

from tilewise.bench import sass
from tilewise.ops import gconv_cuda
from tilewise.ops.gconv_cuda import CudaTile

NVCC = sass.NVCC
#: R x S kernels whose row-pair weights exceed ROWPAIR_MAX_FRAGMENTS (fragments: 28, 24, 21, 20)
WIDE_KERNELS = ((7, 7), (6, 6), (5, 7), (7, 5))


def _ptxas(
    src: str, tmp_path, arch: str = "sm_90", entry: str | None = None, log_out: list | None = None
) -> tuple[int, int]:
    """(registers, spill bytes) of the kernels in ``src`` by ``nvcc -cubin -Xptxas -v``: the
    most registers and all spills, or with ``entry`` that entry function's alone; ``log_out``
    (a list) gets ptxas's whole log appended."""
    log = sass.compile_cubin(src, tmp_path, arch)[1]
    if log_out is not None:
        log_out.append(log)
    return _usage(log, entry)


def _usage(log: str, entry: str | None = None) -> tuple[int, int]:
    """(registers, spill bytes) from ptxas's ``-v`` log, as ``_ptxas`` reports them."""
    if entry is not None:  # ptxas reports per function: "Compiling entry function 'name'"
        parts = re.split(r"Compiling entry function '", log)
        log = next(p for p in parts[1:] if p.startswith(entry + "'"))
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", log)]
    spills = [
        int(a) + int(b)
        for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    ]
    assert regs, log[-2000:]
    return max(regs), sum(spills)


def test_wide_kernel_tiles_only_where_offered():
    for r, s in WIDE_KERNELS:
        assert gconv_cuda.rowpair_fragments(r, s) > gconv_cuda.ROWPAIR_MAX_FRAGMENTS
        plain = gconv_cuda.candidates(64, r, s, tma=True, wide_tiles=False)
        assert plain and not any(t.rowpair for t in plain), (r, s)  # the tap kernel, as before
        wide = gconv_cuda.candidates(64, r, s, tma=True, wide_tiles=True)
        rowpair = [t for t in wide if t.rowpair]
        assert rowpair and set(plain) < set(wide), (r, s)
        assert all(gconv_cuda.rowpair_registers_fit(r, s, t) for t in rowpair)
        no_tma = gconv_cuda.candidates(64, r, s, tma=False, wide_tiles=True)
        assert any(t.rowpair for t in no_tma) and not any(t.tma for t in no_tma)
    # kernels within the verified budget keep exactly their candidates
    for r, s in ((3, 3), (5, 5), (1, 7)):
        for tma in (False, True):
            assert gconv_cuda.candidates(64, r, s, tma, True) == gconv_cuda.candidates(
                64, r, s, tma, False
            )


def test_tall_tiles_only_for_kernels_of_five_rows_or_more():
    """The tall tiles (32 rows a CTA, session 29) join the TMA candidates of 5+ row kernels only:
    at 3x3 they tied the shipped tiles, so those candidate lists stay as they were."""
    tall = set(gconv_cuda.TALL_TILES)
    for r, s in ((5, 5), (7, 7), (5, 3), (6, 6)):
        assert tall <= set(gconv_cuda.candidates(64, r, s, tma=True, wide_tiles=True)), (r, s)
        assert not tall & set(gconv_cuda.candidates(64, r, s, tma=False, wide_tiles=True))
    for r, s in ((1, 1), (3, 3), (3, 7), (4, 4)):
        assert not tall & set(gconv_cuda.candidates(64, r, s, tma=True, wide_tiles=True)), (r, s)
    assert all(t.rowpair and t.tma == 2 and t.th == 32 for t in tall)


def test_weights_in_shared_memory_tiles_are_not_candidates():
    """Session 29's ``wsmem`` tiles (correct but slower on the H100, session 30) are legal at
    3x3-7x7 but offered nowhere, and their weights do not count against the registers."""
    ws = set(gconv_cuda.EXPERIMENTAL_FPROP_TILES)
    assert ws and all(t.wsmem and t.rowpair for t in ws)
    for k in (3, 5, 7):
        assert not ws & set(gconv_cuda.candidates(64, k, k, tma=True, wide_tiles=True))
        assert all(gconv_cuda.tile_ok(64, k, k, t) for t in ws), k
    plain = CudaTile(16, 32, 32, 16, 1, 2, rowpair=True, tma=2)
    assert not gconv_cuda.tile_ok(64, 7, 7, plain)  # 112 weight registers at 128 a thread
    assert not gconv_cuda.tile_ok(64, 7, 7, CudaTile(8, 16, 32, 4, 3, 2, wsmem=True))  # tap kernel


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("k", [3, 5, 7])
def test_weights_in_shared_memory_tiles_compile_without_spills(k, tmp_path):
    """The ``wsmem`` tiles at C=64: no spills within their 128 registers a thread (ptxas, sm_90:
    110-122 at 7x7), fp16 fprop with bias and bf16 dgrad."""
    for tile in gconv_cuda.EXPERIMENTAL_FPROP_TILES:
        for bf16, bias, dgrad in ((False, True, False), (True, False, True)):
            src, _ = gconv_cuda.source(k, k, tile, bf16, bias, dgrad, "tw_gconv_fprop")
            regs, spills = _ptxas(src, tmp_path)
            assert spills == 0 and regs <= gconv_cuda.register_cap(tile), (k, tile.name, regs)


def test_wgmma_tiles_only_with_tma_and_wgmma():
    """The warpgroup-MMA tiles (session 30) join the candidates of 3+ row kernels only where the
    GPU takes them (``wgmma``: compute capability 9.0, with TMA); the other lists are unchanged."""
    wg = set(gconv_cuda.WGMMA_TILES + gconv_cuda.WGMMA_DEEP_TILES + gconv_cuda.WGMMA_WIDE_TILES)
    assert wg and all(t.wgmma and t.tma == 2 and t.tw == 64 and not t.rowpair for t in wg)
    for r, s in ((3, 3), (5, 5), (7, 7), (3, 7), (6, 4)):
        with_wg = gconv_cuda.candidates(64, r, s, tma=True, wide_tiles=True, wgmma=True)
        plain = gconv_cuda.candidates(64, r, s, tma=True, wide_tiles=True)
        assert not any(t.wgmma for t in plain), (r, s)
        offered = [t for t in with_wg if t.wgmma]
        assert offered and [t for t in with_wg if not t.wgmma] == list(plain), (r, s)
        assert all(gconv_cuda.smem_bytes(r, s, t) <= gconv_cuda.SMEM_MAX for t in offered)
        assert not any(t.wgmma for t in gconv_cuda.candidates(64, r, s, False, True, True))
    for r, s in ((1, 1), (2, 3), (1, 7)):
        assert not any(t.wgmma for t in gconv_cuda.candidates(64, r, s, True, True, True))
    names = [
        t.name
        for t in gconv_cuda.WGMMA_TILES + gconv_cuda.WGMMA_DEEP_TILES + gconv_cuda.WGMMA_WIDE_TILES
    ]
    assert len(set(names)) == len(names) and all(n.startswith("cudawg_") for n in names)
    # the three-stage tiles (session 37) from 5 rows on: slower than two stages at 3x3
    deep = set(gconv_cuda.WGMMA_DEEP_TILES)
    assert deep and all(t.stages == 3 for t in deep)
    assert deep & set(gconv_cuda.candidates(64, 5, 5, True, True, True))
    assert not deep & set(gconv_cuda.candidates(64, 3, 3, True, True, True))
    # as timed: 32-channel blocks only (fitted down to 16 channels it would be a tile nobody timed)
    assert not any(t.stages == 3 for t in gconv_cuda.candidates(48, 5, 5, True, True, True))
    # three A sets at 16x64 16 channels (session 38) from 7 rows on, C taking 16-channel blocks
    wide = set(gconv_cuda.WGMMA_WIDE_TILES)
    assert wide and all(t.asets == 3 for t in wide)
    assert wide <= set(gconv_cuda.candidates(64, 7, 7, True, True, True))
    assert wide <= set(gconv_cuda.candidates(48, 7, 5, True, True, True))
    assert not wide & set(gconv_cuda.candidates(64, 5, 5, True, True, True))
    # not fitted down to 8-channel blocks (C=40): a tile nobody timed
    assert not any(t.asets == 3 for t in gconv_cuda.candidates(40, 7, 7, True, True, True))


def test_wgmma_ablation_switch_keys_the_autotune_cache():
    """``TILEWISE_WG_ABLATE`` (diagnosis only: wrong kernels) changes ``SOURCE_DIGEST``, so an
    ablated process's timings never land under the normal autotune key; unset and "0" do not."""
    code = "from tilewise.ops import gconv_cuda as g; print(g.SOURCE_DIGEST, g.WG_ABLATE)"
    env = {k: v for k, v in os.environ.items() if k != "TILEWISE_WG_ABLATE"}
    src = str(Path(gconv_cuda.__file__).resolve().parents[2])  # the tilewise this test imports
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    out = {}
    for value in (None, "0", "9"):
        e = env if value is None else {**env, "TILEWISE_WG_ABLATE": value}
        res = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        out[value] = res.stdout.split()
    assert out[None] == out["0"] and out[None][1] == "0"
    assert out["9"][1] == "9" and out["9"][0] != out[None][0]


def test_wgmma_tile_rules():
    """``tile_ok`` takes a wgmma tile only as the kernel is written: 64-pixel rows, whole 4-row
    bands (an even number a warpgroup where a group has several), 4 warps a warpgroup, both TMA
    copies, registers within the cap and shared memory within the SM's for its CTAs per SM."""
    ok = CudaTile(8, 64, 32, 16, 1, 2, tma=2, wgmma=True)
    assert gconv_cuda.tile_ok(64, 5, 5, ok)
    for bad in (
        dataclasses.replace(ok, tw=32),
        dataclasses.replace(ok, th=6),
        dataclasses.replace(ok, warps=12),
        dataclasses.replace(ok, warps=6),
        dataclasses.replace(ok, asets=4),
        dataclasses.replace(ok, tma=1),
        dataclasses.replace(ok, min_ctas=2),
        dataclasses.replace(ok, rowpair=True),
    ):
        assert not gconv_cuda.tile_ok(64, 5, 5, bad), bad
    assert not gconv_cuda.tile_ok(48, 5, 5, ok)  # the channel block must divide C
    # 7x7 at 32 channels: 128 registers a thread, ptxas 114 (the compile test below checks)
    assert gconv_cuda.tile_ok(64, 7, 7, ok)
    assert gconv_cuda.tile_ok(64, 7, 7, CudaTile(16, 64, 16, 8, 1, 2, tma=2, wgmma=True))
    # several CTAs an SM: shared memory for all of them (8x64 16-channel 7x7: 2 x 103 KB fit,
    # 3 do not), registers at the cap they leave (16x64 8-channel: 2 CTAs, 255; 4 CTAs, 128)
    two = CudaTile(8, 64, 16, 8, 2, 2, tma=2, wgmma=True)
    assert gconv_cuda.tile_ok(64, 7, 7, two)
    assert not gconv_cuda.tile_ok(64, 7, 7, dataclasses.replace(two, min_ctas=3))
    tall = CudaTile(16, 64, 8, 4, 2, 2, tma=2, wgmma=True)
    assert gconv_cuda.tile_ok(64, 7, 7, tall)
    assert not gconv_cuda.tile_ok(64, 7, 7, dataclasses.replace(tall, min_ctas=4))
    # two warpgroups a group, each an even number of 4-row bands (its rows on a swizzle period)
    split = CudaTile(16, 64, 16, 16, 1, 2, tma=2, wgmma=True)
    assert gconv_cuda.wgmma_split(split) == 2 and gconv_cuda.tile_ok(64, 5, 5, split)
    assert not gconv_cuda.tile_ok(64, 7, 7, split)  # ptxas spilled 240 bytes at 128 a thread
    assert not gconv_cuda.tile_ok(64, 5, 5, dataclasses.replace(split, th=8))  # one band each
    assert gconv_cuda._fitted(split, 8).warps == 8  # warpgroups a group kept
    fitted = gconv_cuda._fitted(ok, 16)  # channel block halved, a warpgroup a group kept
    assert (fitted.cb, fitted.warps) == (16, 8)
    # 8-channel blocks are legal (tile_ok) but not offered: C must take 16-channel blocks
    # (session 31: fitted down to 8 channels they read DRAM twice over)
    assert gconv_cuda.tile_ok(8, 5, 5, gconv_cuda._fitted(ok, 8))
    # fewer warpgroups than groups (session 38): each takes 2 or 4 groups in turn, kept by
    # _fitted; three A sets only where there are 3+ kernel columns (ptxas serialized 1x1)
    loop = dataclasses.replace(ok, warps=8, asets=3)
    assert gconv_cuda.wgmma_group_loop(loop) == 2 and gconv_cuda.tile_ok(64, 5, 5, loop)
    assert gconv_cuda.wgmma_group_loop(dataclasses.replace(ok, warps=4)) == 4
    assert not gconv_cuda.tile_ok(64, 2, 2, loop) and gconv_cuda.tile_ok(64, 3, 3, loop)
    assert gconv_cuda._fitted(loop, 64) == loop
    assert (gconv_cuda._fitted(loop, 16).warps, gconv_cuda._fitted(loop, 8).warps) == (4, 4)
    assert gconv_cuda.wgmma_group_loop(gconv_cuda._fitted(loop, 16)) == 2
    # bands of 2 or 4 rows; with several warpgroups a group each one's rows a multiple of 8 (a
    # swizzle period of the halo: HWD is odd at odd S)
    two = dataclasses.replace(ok, band_rows=2)
    assert gconv_cuda.wgmma_bands(two) == 4 and gconv_cuda.tile_ok(64, 5, 5, two)
    assert not gconv_cuda.tile_ok(64, 5, 5, dataclasses.replace(ok, band_rows=3))
    split2 = CudaTile(16, 64, 16, 16, 1, 2, tma=2, wgmma=True, band_rows=2)
    assert gconv_cuda.wgmma_split(split2) == 2 and gconv_cuda.tile_ok(64, 5, 5, split2)
    assert not gconv_cuda.tile_ok(64, 5, 5, dataclasses.replace(split2, th=8))  # 4 rows each
    for c in (8, 24, 40):
        assert not any(t.wgmma for t in gconv_cuda.candidates(c, 5, 5, True, True, True)), c
    assert any(t.wgmma for t in gconv_cuda.candidates(48, 5, 5, True, True, True))


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("rs", [(3, 3), (5, 5), (7, 7), (6, 4)], ids=str)
def test_wgmma_tiles_compile_without_spills_or_serialized_mmas(rs, tmp_path):
    """Every wgmma candidate (and experimental tile) at C=64 compiles for sm_90a without spills
    and without ptxas serializing the wgmmas (its C7510-C7519 notes: registers it could not keep
    in flight), fp16 fprop with bias and bf16 dgrad."""
    r, s = rs
    path = tmp_path / "k.cu"
    tiles = [t for t in gconv_cuda.candidates(64, r, s, True, True, True) if t.wgmma]
    tiles += [t for t in gconv_cuda.EXPERIMENTAL_WGMMA_TILES if gconv_cuda.tile_ok(64, r, s, t)]
    tiles += [t for t in gconv_cuda.ROLL_TILES if gconv_cuda.tile_ok(64, r, s, t)]
    for tile in tiles:
        for bf16, bias, dgrad in ((False, True, False), (True, False, True)):
            src, _ = gconv_cuda.source(r, s, tile, bf16, bias, dgrad, "tw_gconv_fprop")
            path.write_text(src)
            cmd = [NVCC, "-arch=sm_90a", "-cubin", "-o", str(tmp_path / "k.cubin"), "-Xptxas", "-v"]
            res = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=300)
            log = res.stdout + res.stderr
            assert res.returncode == 0, log[-2000:]
            assert "serialized" not in log, (rs, tile.name, log[-1500:])
            spills = re.findall(r"(\d+) bytes spill stores", log)
            # since session 35's exact path (per-tap MMAs for tiles with non-finite outputs) the
            # two 128-register 8x64 tiles at 6x4 keep a value or two in local memory, stored and
            # read back once per tile beside the mbarrier wait, outside the wgmmas: 8 bytes in
            # fp16 with bias (2 STL, 2 LDL); since session 37's early first halos 12 (3 STL, 3
            # LDL), and 4 in bf16 dgrad (1 STL, 1 LDL); none elsewhere
            tight = ("cudawg_t8x64c32w16m1s2_tma2", "cudawg_t8x64c16w8m2s2_tma2")
            limit = (4 if bf16 else 12) if rs == (6, 4) and tile.name in tight else 0
            # the experimental 2-row-band form of the first (session 38): 32 and 16 bytes
            if rs == (6, 4) and tile.name == "cudawg_t8x64c32w16m1s2b2_tma2":
                limit = 16 if bf16 else 32
            assert spills and all(int(v) <= limit for v in spills), (rs, tile.name, log[-1500:])


def test_wide_kernel_tiles_follow_the_environment(monkeypatch):
    monkeypatch.delenv(gconv_cuda.ENV_WIDE_TILES, raising=False)
    assert any(t.rowpair for t in gconv_cuda.candidates(64, 7, 7, True))  # the default
    monkeypatch.setenv(gconv_cuda.ENV_WIDE_TILES, "0")
    assert not any(t.rowpair for t in gconv_cuda.candidates(64, 7, 7, True))


def test_register_rule_keeps_the_verified_tiles():
    """Every shipped tile is still legal where it was, and none of them takes 7x7 at 4+ CTAs."""
    for tile in gconv_cuda.TILES + gconv_cuda.TMA_TILES:
        for r, s in ((3, 3), (5, 5), (3, 5)):
            assert gconv_cuda.tile_ok(64 if tile.cb <= 64 else 128, r, s, tile), (tile, r, s)
        if tile.rowpair and tile.min_ctas >= 3:
            assert not gconv_cuda.tile_ok(64, 7, 7, tile), tile
    fits = gconv_cuda.rowpair_registers_fit
    assert fits(7, 7, CudaTile(8, 16, 32, 4, 3, 2, rowpair=True, tma=2))
    assert not fits(7, 7, CudaTile(8, 16, 32, 4, 4, 2, rowpair=True, tma=2))
    assert not fits(7, 7, CudaTile(8, 16, 32, 4, 3, 2, rowpair=True))  # it spilled (ptxas)
    assert fits(7, 7, CudaTile(8, 16, 32, 4, 2, 2, rowpair=True))
    twin = gconv_cuda.non_tma_twin(CudaTile(8, 16, 32, 4, 3, 2, rowpair=True, tma=2), 64, 7, 7)
    assert (twin.th, twin.min_ctas, twin.tma) == (8, 2, 0)


#: every kernel of 1..7 x 1..7 past the fragment budget
ALL_WIDE = [
    (r, s)
    for r in range(1, 8)
    for s in range(1, 8)
    if gconv_cuda.rowpair_fragments(r, s) > gconv_cuda.ROWPAIR_MAX_FRAGMENTS
]


def _row_pair_tiles(c: int, r: int, s: int) -> list[CudaTile]:
    tiles = [t for t in gconv_cuda.candidates(c, r, s, True, True) if t.rowpair]
    return list(
        dict.fromkeys(tiles + [gconv_cuda.non_tma_twin(t, c, r, s) for t in tiles if t.tma])
    )


def _check_compiles(c: int, r: int, s: int, variants, tmp_path) -> None:
    for tile in _row_pair_tiles(c, r, s):
        cap = gconv_cuda.register_cap(tile)
        for bf16, bias, dgrad in variants:
            src, _ = gconv_cuda.source(r, s, tile, bf16, bias, dgrad, "tw_gconv_fprop")
            regs, spills = _ptxas(src, tmp_path)
            assert spills == 0, (c, r, s, tile.name, bf16, regs)
            assert regs <= cap, (c, r, s, tile.name, regs, cap)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("r,s", ALL_WIDE)
def test_wide_kernel_tiles_compile_without_spills(r, s, tmp_path):
    """Each wide-kernel row-pair tile at C=64 (and its non-TMA twin), fp16 fprop with bias
    (7x7 also bf16 dgrad): no spills, registers within the cap of its CTAs per SM."""
    variants = [(False, True, False)] + ([(True, False, True)] if (r, s) == (7, 7) else [])
    _check_compiles(64, r, s, variants, tmp_path)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("c", [8, 16, 128])
def test_fitted_wide_kernel_tiles_compile_without_spills(c, tmp_path):
    """The same tiles fitted to other channel counts (fewer warps, other CTA budgets), 7x7."""
    _check_compiles(c, 7, 7, [(False, True, False)], tmp_path)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_channels_last_dw_variants_compile_and_cost_no_registers(tmp_path):
    """``DW_CL`` (dw written in a channels_last weight's layout) changes only the finish pass's
    and the cluster reduction's store index: the tap, cluster, row-split and row-pair wgrad
    kernels compile with it, without spills and with at most a few more registers."""
    tiles = (
        gconv_cuda.WGRAD_TILES[0],  # tap kernel, atomics + last-CTA finish pass
        gconv_cuda.WGRAD_TILES[3],  # row-pair wgrad kernel
        gconv_cuda.CLUSTER_WGRAD_TILES[0],  # cluster reduction through distributed smem
        gconv_cuda.ROW_WGRAD_TILES[3],  # one row of taps per CTA (blockIdx.z rows)
    )
    for tile in tiles:
        r = s = 5 if not tile.rowpair else 3
        regs = {}
        for dw_cl in (False, True):
            src, entry = gconv_cuda.source(r, s, tile, True, 2, False, "tw_gconv_wgrad", dw_cl)
            regs[dw_cl], spills = _ptxas(src, tmp_path, entry=entry)
            assert spills == 0, (tile.name, dw_cl)
        assert regs[True] <= regs[False] + 8, (tile.name, regs)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("rs", [(3, 3), (5, 5), (7, 7), (6, 4)], ids=str)
def test_wgmma_wgrad_tiles_compile_without_spills(rs, tmp_path):
    """Every wgmma wgrad tile (offered or experimental) at C=64 compiles for sm_90a without
    spills, within the registers its CTAs per SM leave (65536 an SM), fp16 with an fp32 bias
    gradient and bf16 with one in bf16 and a channels_last dw; and without ptxas serializing the
    wgmmas (session 32 timed the producer-warp tiles with them serialized, C7520: a role branch
    ptxas could not prove warpgroup-uniform)."""
    r, s = rs
    tiles = gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES
    for tile in tiles:
        assert gconv_cuda.wgrad_tile_ok(64, r, s, tile), (rs, tile.name)
        for bf16, bias, dw_cl in ((False, 1, False), (True, 2, True)):
            src, entry = gconv_cuda.source(r, s, tile, bf16, bias, False, "tw_gconv_wgrad", dw_cl)
            logs: list = []
            regs, spills = _ptxas(src, tmp_path, "sm_90a", entry, logs)
            assert spills == 0, (rs, tile.name)
            assert regs * tile.warps * 32 * tile.min_ctas <= 65536, (rs, tile.name, regs)
            assert "serialized" not in logs[0], (rs, tile.name, logs[0][-1500:])


@pytest.mark.skipif(NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing")
@pytest.mark.parametrize("k", [5, 7])
def test_wgmma_descriptors_stay_on_the_uniform_datapath(k, tmp_path):
    """The wgmma fprop/dgrad kernel's descriptors are built in uniform registers (session 40: the
    base read from lane 0): fewer `R2UR` moves than wgmmas in the SASS of every candidate, where
    the vector-register form took ~2.5 a wgmma (5x5 8x64: 101 for 40 `HGMMA`)."""
    tiles = [t for t in gconv_cuda.candidates(64, k, k, True, True, True) if t.wgmma]
    assert tiles
    for tile in tiles:
        src, _ = gconv_cuda.source(k, k, tile, False, True, False, "tw_gconv_fprop")
        ops = sass.opcodes(sass.compile_cubin(src, tmp_path)[0])
        hgmma = sum(op.startswith("HGMMA") for op in ops)
        r2ur = sum(op.startswith("R2UR") for op in ops)
        assert hgmma >= 40 and r2ur < hgmma, (k, tile.name, r2ur, hgmma)


@pytest.mark.skipif(NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing")
@pytest.mark.parametrize("k", [3, 5])
def test_four_wide_wgrad_atomics_compile_and_quarter_the_reds(k, tmp_path, monkeypatch):
    """``TILEWISE_GCONV_WGRAD_RED4`` (session 42): the tap wgrad's sums leave by
    red.global.add.v4.f32 after a four-lane transpose. Every non-cluster tap wgrad candidate at
    C=64 compiles for sm_90a with it, with no spill and at most a few more registers, one
    reduction a tap pair and lane instead of one per sum (the bias gradient's one atomic
    aside); for sm_80 the switch leaves the scalar atomics. Structure only: the values are the
    GPU tests' (device step ``red4-s42``)."""
    tiles = [
        t
        for t in gconv_cuda.wgrad_candidates(64, k, k, small=True, tma=True, wgmma=False)
        if not (t.rowpair or t.wgmma or t.cluster or t.slots)  # slots: no reductions at all
    ]
    assert tiles
    for tile in tiles:
        taps = (tile.tap_rows or k) * k  # a row-split tile's CTA takes tap_rows kernel rows
        counts, regs = {}, {}
        for arch, red4 in (("sm_90a", False), ("sm_90a", True), ("sm_80", True)):
            if tile.tma and arch == "sm_80":
                continue
            monkeypatch.setattr(gconv_cuda, "WGRAD_RED4", red4)
            src, entry = gconv_cuda.source(k, k, tile, False, 1, False, "tw_gconv_wgrad")
            cubin, log = sass.compile_cubin(src, tmp_path, arch)
            regs[arch, red4], spills = _usage(log, entry)
            assert spills == 0, (k, tile.name, arch, red4)
            ops = sass.opcodes(cubin)
            counts[arch, red4] = sum(op.startswith("RED") for op in ops)
        assert counts["sm_90a", False] == 2 * taps + 1, (k, tile.name, counts)
        assert counts["sm_90a", True] == (taps + 1) // 2 + 1, (k, tile.name, counts)
        assert regs["sm_90a", True] <= regs["sm_90a", False] + 8, (k, tile.name, regs)
        if not tile.tma:
            assert counts["sm_80", True] == 2 * taps + 1, (k, tile.name, counts)


@pytest.mark.skipif(NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing")
def test_wgrad_ablation_takes_out_what_each_bit_says(tmp_path, monkeypatch):
    """``TILEWISE_GCONV_WGRAD_ABLATE`` (session 45, for timing only): on the 3x3 wgrad pick (the
    TMA tap tile), bit 1 leaves no reductions, 2 no finish (its counter atomic and its
    write-out), 4 no MMAs, 8 no tensor copies, 16 the finish's count alone, 32 no fence before
    the count (session 46), 64 the pass's loads without its stores (session 47), and each leaves
    the rest (bit 1 keeps the MMAs whose sums no longer
    leave); 0 is the kernel as it is; all compiled for sm_90a without spills."""
    (tile,) = [t for t in gconv_cuda.TMA_WGRAD_TILES if t.name == "cuda_t16x16c64w8m1s2_tma1"]
    ops = {}
    for bits in (0, 1, 2, 4, 8, 16, 32, 64):
        monkeypatch.setattr(gconv_cuda, "WGRAD_ABLATE", bits)
        src, entry = gconv_cuda.source(3, 3, tile, False, 0, False, "tw_gconv_wgrad")
        cubin, log = sass.compile_cubin(src, tmp_path, "sm_90a")
        assert _usage(log, entry)[1] == 0, bits
        ops[bits] = sass.opcodes(cubin, entry)  # the source holds the fprop kernel too

    def count(bits, prefix):
        return sum(op.startswith(prefix) for op in ops[bits])

    assert count(0, "RED") == 2 * 9 and count(1, "RED") == 0 and count(2, "RED") == 2 * 9
    for prefix in ("HMMA", "LDSM", "UTMALDG"):  # no atomics, the same MMAs and loads
        assert count(1, prefix) == count(0, prefix) > 0, prefix
    assert count(0, "ATOM") >= 1 and count(2, "ATOM") == 0 and count(1, "ATOM") >= 1
    assert count(0, "HMMA") > 0 and count(4, "HMMA") == 0 and count(8, "HMMA") > 0
    assert count(0, "UTMALDG") > 0 and count(8, "UTMALDG") == 0 and count(4, "UTMALDG") > 0
    # inside the finish (session 46): 16 the count alone (no pass: no loads, no write-out),
    # 32 no fence before the count; both keep the count and the reductions
    assert count(16, "LDG") == 0 < count(0, "LDG") and count(16, "STG.E.U16") == 0
    assert count(32, "LDG") == count(0, "LDG") and count(32, "STG.E.U16") == count(0, "STG.E.U16")
    # 64: the pass's loads stay, its u16 write-out and fp32 zeroing go
    assert count(64, "LDG") == count(0, "LDG") and count(64, "STG.E.U16") == 1  # never runs
    assert count(64, "STG.E.STRONG") == 0 < count(0, "STG.E.STRONG")
    for bits in (16, 32):
        assert count(bits, "MEMBAR.SC.GPU") == count(0, "MEMBAR.SC.GPU") - 1, bits
        assert count(bits, "ATOM") == count(0, "ATOM") and count(bits, "RED") == count(0, "RED")
    assert gconv_cuda.ENV_WGRAD_ABLATE == "TILEWISE_GCONV_WGRAD_ABLATE"


@pytest.mark.skipif(NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing")
@pytest.mark.parametrize("dw_cl", [False, True])
def test_wgrad_finish_orders_compile_alike(dw_cl, tmp_path, monkeypatch):
    """``TILEWISE_GCONV_WGRAD_FINISH_ORDER`` (session 47; its values are the GPU tests'): the 3x3
    wgrad pick compiles for sm_90a without spills in each finish order, with the same kinds of
    loads and atomics; the pairs' order (the default) keeps all 18 of a thread's loads in flight
    at once (one batch before the first store), needs no integer division, and stages a
    contiguous dw_out in shared memory."""
    (tile,) = [t for t in gconv_cuda.TMA_WGRAD_TILES if t.name == "cuda_t16x16c64w8m1s2_tma1"]
    assert gconv_cuda.FINISH_ORDERS[0] == "pairs"  # the default, unless the variable names another
    ops, srcs = {}, {}
    for order in gconv_cuda.FINISH_ORDERS:  # no bias: its u16 and word stores would blur the count
        monkeypatch.setattr(gconv_cuda, "WGRAD_FINISH_ORDER", order)
        src, entry = gconv_cuda.source(3, 3, tile, False, 0, False, "tw_gconv_wgrad", dw_cl)
        assert f"#define FIN_ORDER {gconv_cuda.FINISH_ORDERS.index(order)}" in src
        cubin, log = sass.compile_cubin(src, tmp_path, "sm_90a")
        assert _usage(log, entry)[1] == 0, order
        ops[order], srcs[order] = sass.opcodes(cubin, entry), src
    for prefix in ("LDG", "ATOM", "RED"):
        kinds = [{o for o in ops[order] if o.startswith(prefix)} for order in ops]
        assert kinds[0] == kinds[1] == kinds[2] and kinds[0], prefix
    pairs = ops["pairs"]  # the pass starts after the last CTA's fence (the second)
    start = [i for i, o in enumerate(pairs) if o == "MEMBAR.SC.GPU"][1]
    first_store = min(i for i, o in enumerate(pairs) if i > start and o.startswith("STG"))
    batch = pairs[start:first_store]
    assert batch.count("LDG.E.STRONG.GPU") == 18 and not [o for o in batch if o == "BRA"]
    assert not [o for o in batch if o.startswith("IMAD.HI")]  # no division by the taps

    # a contiguous dw_out is staged in shared memory and leaves as words (a halves' fallback for
    # an odd address); a channels_last one is stored from the registers. The dw_out order's one
    # 32-bit store is the counter's reset, its u16 stores its write-out (one a round, unrolled)
    def count(order, op):
        return ops[order][start if order == "pairs" else 0 :].count(op)

    shared = [o for o in pairs[start:] if o.startswith(("STS", "LDS"))]
    assert ops["dw_out"].count("STG.E") == 1
    if dw_cl:
        assert not shared and count("pairs", "STG.E") == 1
        assert count("pairs", "STG.E.U16") == 18  # every sum of the thread from the registers
    else:
        assert "STS.U16" in shared and [o for o in shared if o.startswith("LDS")]
        assert count("pairs", "STG.E") > 1 and count("pairs", "STG.E.U16") >= 1
    assert len(set(srcs.values())) == 3
    assert gconv_cuda.ENV_WGRAD_FINISH_ORDER == "TILEWISE_GCONV_WGRAD_FINISH_ORDER"


@pytest.mark.skipif(NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing")
@pytest.mark.parametrize("k", [3, 5])
def test_dynamic_tile_counters_compile_without_new_spills(k, tmp_path, monkeypatch):
    """``TILEWISE_GCONV_DYNAMIC_TILES`` (session 43): every row-pair TMA candidate at C=64
    compiles for sm_90a with its tiles from counters (fprop and dgrad), with at most a few
    bytes more spills than the static kernel, its only global atomics the counters' (a ticket
    before the loop and one a tile, the finish count, the reset); it asks for the 4 bytes a
    stage its tile indices take.
    Structure only: the values are the GPU test's
    (``test_dynamic_tiles_equal_static_and_leave_counters_zero``)."""
    tiles = [t for t in gconv_cuda.candidates(64, k, k, tma=True) if t.rowpair and t.tma]
    assert tiles
    for tile in tiles:
        spills, atomics = {}, {}
        for dyn in (False, True):
            monkeypatch.setattr(gconv_cuda, "DYNAMIC_TILES", dyn)
            assert gconv_cuda.dynamic_tiles(tile) == dyn
            for dgrad in (False, True):
                src, entry = gconv_cuda.source(k, k, tile, False, int(not dgrad), dgrad,
                                               "tw_gconv_fprop")  # fmt: skip
                assert ("#define DYN 1" in src) == dyn and ("#define DYN 0" in src) != dyn
                cubin, log = sass.compile_cubin(src, tmp_path, "sm_90a")
                spills[dyn, dgrad] = _usage(log, entry)[1]
                ops = sass.opcodes(cubin)
                atomics[dyn, dgrad] = sum(op.startswith(("ATOM", "RED")) for op in ops)
        monkeypatch.setattr(gconv_cuda, "DYNAMIC_TILES", False)
        off = gconv_cuda.smem_bytes(k, k, tile)
        monkeypatch.setattr(gconv_cuda, "DYNAMIC_TILES", True)
        assert gconv_cuda.smem_bytes(k, k, tile) == off + 4 * tile.stages, tile.name
        for dgrad in (False, True):
            assert atomics[False, dgrad] == 0, (k, tile.name, atomics)
            assert 3 <= atomics[True, dgrad] <= 5, (k, tile.name, atomics)
            # ptxas holds the launch bounds; the ticket a register more, a few bytes of spills
            # where the static kernel is at its cap (offline: 3x3 32x32 1-CTA fprop 0 -> 16
            # bytes, 5x5 8x16 5-CTA fprop 8 -> 36, 6-CTA 84 -> 96, 32x32 dgrad 72 -> 108)
            assert spills[True, dgrad] <= spills[False, dgrad] + 48, (k, tile.name, spills)


def test_wide_row_tiles_only_at_1x1_and_3x3_and_64_channel_blocks():
    """Session 44's 64-channel row-pair tiles at several CTAs an SM join the TMA candidates of
    3x3 kernels (measured) and 1x1 ones (GPU-tested) where C takes 64-channel blocks; nowhere
    else, and never fitted down to a tile nobody timed."""
    wide = set(gconv_cuda.WIDE_ROW_TILES)
    assert wide and all(t.rowpair and t.tma == 2 and t.cb == 64 and t.min_ctas > 1 for t in wide)
    for c in (64, 128, 256):
        for r, s in ((1, 1), (3, 3)):
            assert wide <= set(gconv_cuda.candidates(c, r, s, tma=True)), (c, r, s)
            assert not wide & set(gconv_cuda.candidates(c, r, s, tma=False)), (c, r, s)
    for c in (8, 16, 24, 32, 48, 64, 96, 128, 160, 256):
        for r, s in ((1, 1), (3, 3), (1, 3), (3, 1), (2, 2), (5, 5), (3, 5), (7, 7)):
            got = set(gconv_cuda.candidates(c, r, s, tma=True))
            if c % 64 or (r, s) not in ((1, 1), (3, 3)):
                assert not wide & got, (c, r, s)
            if c % 64:  # nor their fitted-down forms
                assert not {gconv_cuda._fitted(t, c) for t in wide} & got, (c, r, s)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dgrad", [False, True])
def test_wide_row_tiles_compile_without_spills(tmp_path, dgrad):
    for i, tile in enumerate(gconv_cuda.WIDE_ROW_TILES):
        out = tmp_path / str(i)
        out.mkdir()
        src, _ = gconv_cuda.source(3, 3, tile, False, True, dgrad, "tw_gconv_fprop")
        regs, spills = _ptxas(src, out, "sm_90a")
        assert spills == 0 and regs <= 65536 // (tile.min_ctas * tile.warps * 32), (tile, regs)


@pytest.mark.skipif(NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing")
def test_wgrad_stamps_compile_only_when_set(tmp_path, monkeypatch):
    """``gconv_cuda.WGRAD_STAMPS`` (session 47, diagnosis only): with an address set, the 3x3
    wgrad pick reads its timers and stores its stamps, without spills and with the kernel's own
    global loads, stores and atomics unchanged; the stamps' values are the GPU probe's."""
    (tile,) = [t for t in gconv_cuda.TMA_WGRAD_TILES if t.name == "cuda_t16x16c64w8m1s2_tma1"]
    ops = {}
    for addr in (0, 0x7F0000000000):
        monkeypatch.setattr(gconv_cuda, "WGRAD_STAMPS", addr)
        src, entry = gconv_cuda.source(3, 3, tile, False, 2, False, "tw_gconv_wgrad", False)
        assert f"#define STAMPS {addr}ULL" in src
        cubin, log = sass.compile_cubin(src, tmp_path, "sm_90a")
        assert _usage(log, entry)[1] == 0, addr
        ops[addr] = sass.opcodes(cubin, entry)
    # the stamps: timer reads (CS2R) and 64-bit generic stores (the address is an integer) added;
    # the kernel's own global memory operations unchanged
    for prefix in ("LDG", "STG", "ATOM", "RED"):
        mem = [sorted(o for o in ops[a] if o.startswith(prefix)) for a in (0, 0x7F0000000000)]
        assert mem[0] == mem[1], prefix
    count = {a: sum(o == "CS2R" for o in ops[a]) for a in ops}
    assert count[0x7F0000000000] > count[0]
    assert sum(o == "ST.E.64" for o in ops[0x7F0000000000]) > sum(o == "ST.E.64" for o in ops[0])


def test_wgrad_finish_order_switch_rejects_unknown_orders(monkeypatch):
    """``TILEWISE_GCONV_WGRAD_FINISH_ORDER`` names one of ``FINISH_ORDERS``: another value stops
    the import with a ValueError naming the variable, where a silent default would time or ship
    a kernel nobody asked for. The default source carries FIN_ORDER 0 and, as FIN_SMEM, the
    wgrad kernel's dynamic shared memory but its tail (0 in the fprop's module)."""
    err = failed_import("tilewise.ops.gconv_cuda", TILEWISE_GCONV_WGRAD_FINISH_ORDER="rows")
    assert "ValueError" in err and "TILEWISE_GCONV_WGRAD_FINISH_ORDER='rows'" in err
    (tile,) = [t for t in gconv_cuda.TMA_WGRAD_TILES if t.name == "cuda_t16x16c64w8m1s2_tma1"]
    monkeypatch.setattr(gconv_cuda, "WGRAD_FINISH_ORDER", gconv_cuda.FINISH_ORDERS[0])
    default, _ = gconv_cuda.source(3, 3, tile, False, 0, False, "tw_gconv_wgrad")
    assert "#define FIN_ORDER 0\n" in default
    staging = gconv_cuda.finish_staging_bytes(3, 3, tile)  # all but the mbarriers' tail
    assert 0 < staging < gconv_cuda.wgrad_smem_bytes(3, 3, tile)
    assert f"#define FIN_SMEM {staging}\n" in default
    fprop, _ = gconv_cuda.source(3, 3, tile, False, 0, False, "tw_gconv_fprop")
    assert "#define FIN_SMEM 0\n" in fprop  # no wgrad launch from the fprop's module
