"""The wgrad's slots (``CudaTile.slots``, ``ops.gconv_slots``; session 49), checked on the CPU:
which tiles are legal (the tap tiles', and since session 50 the warpgroup tiles'), the
deterministic wgrad's candidates, the source switches, the two
launches (faked) and their buffers, and, where nvcc is installed, the SASS: no reductions, no
atomics, no fence; one plain store per sum; the slot-sum kernel's wait before its first load.
The kernels' results are checked on the GPU (``test_gconv_cuda.py::test_slot_wgrad_tiles``)."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch
from checks import failed_import, fake_nvrtc

from tilewise.bench import sass
from tilewise.ops import gconv_cuda, gconv_slots, gconv_slots_src, gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem
from tilewise.ops.gconv_cuda import CudaTile

PICK = CudaTile(16, 16, 64, 8, 1, 2, tma=1)
SLOT = dataclasses.replace(PICK, slots=True)
PLAIN_SLOT = CudaTile(8, 16, 32, 4, 4, 2, slots=True)
WG = gconv_cuda.WGMMA_WGRAD_TILES[0]  # 16 channels, 2 warpgroups and 2 producer warps
WG_SLOT = dataclasses.replace(WG, slots=True)
NEEDS_SASS = pytest.mark.skipif(
    sass.NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing"
)


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def test_slot_tiles_names_and_legality():
    assert SLOT.name == "cuda_t16x16c64w8m1s2_tma1_slot"
    assert PLAIN_SLOT.name == "cuda_t8x16c32w4m4s2_slot"
    for tile in (SLOT, PLAIN_SLOT, dataclasses.replace(PLAIN_SLOT, tap_rows=1)):
        assert gconv_cuda.wgrad_tile_ok(64, 3, 3, tile), tile.name
    # two warps a group would store the same words; the other epilogues are not slots
    illegal = (
        CudaTile(16, 16, 32, 8, 2, 2, slots=True),
        dataclasses.replace(PLAIN_SLOT, rowpair=True),
        CudaTile(8, 16, 16, 2, 4, 2, cluster=8, slots=True),
        dataclasses.replace(SLOT, sumk=2),
    )
    for tile in illegal:
        assert not gconv_cuda.wgrad_tile_ok(64, 3, 3, tile), tile.name
    # the warpgroup wgrad's slot form (session 50): each warpgroup's sums are its own
    assert WG_SLOT.name == WG.name + "_slot"
    for r in (3, 5, 7):
        assert gconv_cuda.wgrad_tile_ok(64, r, r, WG_SLOT), r
    assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, dataclasses.replace(WG_SLOT, sumk=2))
    # not the experimental tensor-copy or staged forms (their slot forms are untested)
    for tile in gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES:
        if tile.tma:
            assert gconv_cuda.wgrad_tile_ok(64, 7, 7, tile), tile.name
            assert not gconv_cuda.wgrad_tile_ok(64, 7, 7, dataclasses.replace(tile, slots=True))


@pytest.mark.parametrize("c", [8, 64, 256])
@pytest.mark.parametrize("tma", [False, True])
def test_slot_candidates_are_legal_slot_tiles(c, tma):
    for r, s in ((1, 1), (3, 3), (5, 5), (7, 7)):
        tiles = gconv_cuda.slot_wgrad_candidates(c, r, s, tma)
        assert tiles, (c, r, s, tma)
        assert all(t.slots and gconv_cuda.wgrad_tile_ok(c, r, s, t) for t in tiles)
        assert all(not (t.rowpair or t.cluster or t.sumk or t.wgmma) for t in tiles)
        if not tma:
            assert not any(t.tma for t in tiles), (c, r, tiles)
        assert len(set(tiles)) == len(tiles)
        # with the warpgroup wgrad (it needs TMA): its slot forms first, at 5 rows or more
        with_wg = gconv_cuda.slot_wgrad_candidates(c, r, s, tma, wgmma=True)
        wg = [t for t in with_wg if t.wgmma]
        assert with_wg[len(wg) :] == tiles
        assert all(t.slots and gconv_cuda.wgrad_tile_ok(c, r, s, t) for t in wg)
        offered = [t for t in gconv_cuda.WGMMA_WGRAD_TILES if c % t.cb == 0]
        want = tma and r >= gconv_cuda.WGMMA_WGRAD_MIN_ROWS and offered
        assert {t.name for t in wg} == ({f"{t.name}_slot" for t in offered} if want else set())
    # the 3x3 pick's slot form first, where TMA is there and C takes 64-channel blocks
    if tma and c % 64 == 0:
        assert gconv_cuda.slot_wgrad_candidates(c, 3, 3, tma)[0] == SLOT


def test_deterministic_choice_offers_slot_tiles_only_there():
    problem = GConvProblem(n=2, c=64, h=8, w=8, r=3, s=3, pad_h=1, pad_w=1)
    det = gconv_wgrad._candidates(problem, 132, False, True, False, False, True)
    fast = gconv_wgrad._candidates(problem, 132, True, True, False, False, False)
    det_tiles = [t for t in det if isinstance(t, CudaTile)]
    fast_tiles = [t for t in fast if isinstance(t, CudaTile)]
    assert det_tiles and all(t.slots for t in det_tiles)
    assert det[: len(det_tiles)] == tuple(det_tiles)  # before the Triton configs
    # the fast mode offers the slot forms of the TMA tiles too (and, without TMA, none)
    assert {t for t in fast_tiles if t.slots} == {t for t in det_tiles if t.tma}
    no_tma = gconv_wgrad._candidates(problem, 132, True, False, False, False, False)
    assert not any(isinstance(t, CudaTile) and t.slots for t in no_tma)
    none = gconv_wgrad._candidates(problem, 132, False, False, False, False, False)
    assert not any(isinstance(t, CudaTile) for t in none)
    # 7x7 with the warpgroup wgrad: the deterministic mode has its slot forms (first), the fast
    # mode its slot forms (first) and its atomic forms
    p7 = dataclasses.replace(problem, r=7, s=7, pad_h=3, pad_w=3)
    det = gconv_wgrad._candidates(p7, 132, False, True, False, True, True)
    fast = gconv_wgrad._candidates(p7, 132, True, True, False, True, False)
    det_wg = [t for t in det if isinstance(t, CudaTile) and t.wgmma]
    fast_wg = [t for t in fast if isinstance(t, CudaTile) and t.wgmma]
    assert det_wg and det[: len(det_wg)] == tuple(det_wg) and all(t.slots for t in det_wg)
    assert fast[: len(det_wg)] == tuple(det_wg)
    atomic = fast_wg[len(det_wg) :]
    assert atomic and not any(t.slots for t in atomic)
    assert {t.name for t in det_wg} == {f"{t.name}_slot" for t in atomic}


def test_source_switches_for_slots(monkeypatch):
    monkeypatch.setattr(gconv_cuda, "WGRAD_RED4", True)
    monkeypatch.setattr(gconv_cuda, "WGRAD_COPIES", 4)
    src, entry = gconv_cuda.source(3, 3, SLOT, False, 1, False, "tw_gconv_wgrad")
    assert entry == "tw_gconv_wgrad"
    assert "#define WSLOTS 1\n" in src and "#define RED4 (0 && " in src
    assert gconv_cuda.wgrad_copies(3, 3, SLOT) == 1
    assert "#define WSLOTS 0\n" in gconv_cuda.source(3, 3, PICK, False, 1, False, entry)[0]
    monkeypatch.setattr(gconv_cuda, "SLOT_TRIGGER", "late")
    src = gconv_cuda.source(3, 3, SLOT, False, 1, False, entry)[0]
    assert "#define SLOT_EARLY 0\n" in src  # the trigger once the slot is stored, by default
    monkeypatch.setattr(gconv_cuda, "SLOT_TRIGGER", "early")
    assert "#define SLOT_EARLY 1\n" in gconv_cuda.source(3, 3, SLOT, False, 1, False, entry)[0]
    # only slot kernels change with the switch (the others keep their source and their cache)
    assert "#define SLOT_EARLY 0\n" in gconv_cuda.source(3, 3, PICK, False, 1, False, entry)[0]


def test_slot_trigger_switch():
    if "TILEWISE_GCONV_SLOT_TRIGGER" not in os.environ:
        assert gconv_cuda.SLOT_TRIGGER == "late"
    for bad in ("soon", "0"):
        assert "TILEWISE_GCONV_SLOT_TRIGGER" in failed_import(
            "tilewise.ops.gconv_cuda", TILEWISE_GCONV_SLOT_TRIGGER=bad
        )


def test_slot_sum_grid_and_words():
    assert gconv_slots.slot_words(64, 3, 3) == 9 * 64 * 8 + 64
    assert gconv_slots.sum_grid(64, 3, 3, False) == ((144, 1, 1), (256, 1, 1))
    assert gconv_slots.sum_grid(64, 3, 3, True) == ((146, 1, 1), (256, 1, 1))
    assert gconv_slots.sum_grid(8, 1, 1, True)[0] == (3, 1, 1)  # 64 + 8 elements
    for dw_cl in (False, True):
        for db_mode in (0, 1, 2):
            src = gconv_slots.source(5, 7, True, db_mode, dw_cl)
            assert f"#define DW_CL {int(dw_cl)}\n" in src and "#define S 7\n" in src
            assert f"#define HAS_BIAS {int(db_mode > 0)}\n" in src
            assert f"#define DB_HALF {int(db_mode == 2)}\n" in src


def _faked_wgrad(monkeypatch, tile: CudaTile, need_db: bool, k: int = 3):
    """``gconv_cuda.wgrad`` of a small k x k C=64 problem with ``tile``, compiles and launches
    faked on the CPU through PyTorch's launcher: (compiles, launches, dw, db)."""
    compiles, launches = fake_nvrtc(monkeypatch)
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, signature, *dependent: None)
    monkeypatch.setattr(gconv_cuda, "wgmma_usable", lambda x: True)
    x = _cl(torch.randn(2, 64, 8, 8))
    dy = _cl(torch.randn(2, 64, 8, 8))
    try:
        dw, db = gconv_cuda.wgrad(dy, x, k, k, k // 2, k // 2, need_db, tile)
    finally:
        gconv_cuda._kernel.cache_clear()
        gconv_slots.kernel.cache_clear()
    return compiles, launches, dw, db


@pytest.mark.parametrize("need_db", [False, True])
def test_slot_tile_launches_the_tap_kernel_then_the_slot_sum(monkeypatch, need_db):
    """Faked compiles and launches (PyTorch's launcher): the tap kernel gets one slot buffer
    (as sums, bias sums and counters: none of them is touched otherwise) of a slot per CTA
    column, then the slot-sum kernel adds those slots into dw and db."""
    compiles, launches, dw, db = _faked_wgrad(monkeypatch, PLAIN_SLOT, need_db)
    assert [name for name, _, _ in compiles] == ["tw_gconv_wgrad", "tw_gconv_wgrad_slot_sum"]
    assert "#define WSLOTS 1\n" in compiles[0][1]
    tap, total = launches
    grid_x = tap["grid"][0]
    assert tap["grid"] == (grid_x, 2, 1) and grid_x == 2 * 1 * 1  # 2 images x one 8x16 tile
    slots = tap["args"][2]
    assert slots.dtype == torch.float32 and slots.numel() == grid_x * (9 * 64 * 8 + 64)
    assert tap["args"][3] is slots and tap["args"][6] is slots
    assert tap["args"][4] is dw and dw.shape == (64, 8, 3, 3)
    want = gconv_slots.sum_grid(64, 3, 3, need_db)
    assert (tuple(total["grid"]), tuple(total["block"])) == want
    assert total["shared_mem"] == 0
    assert total["args"][:2] == [slots, dw] and total["args"][3:] == [64, grid_x]
    assert total["args"][2] is (db if need_db else dw)
    assert (db is None) is (not need_db)


@pytest.mark.parametrize("need_db", [False, True])
def test_wgmma_slot_tile_launches_the_warpgroup_kernel_then_the_slot_sum(monkeypatch, need_db):
    """The warpgroup wgrad's slot form (faked, 7x7): one slot per CTA column, which the CTAs
    of the 4 channel blocks (16 channels each) fill together; then the slot sum."""
    compiles, launches, dw, db = _faked_wgrad(monkeypatch, WG_SLOT, need_db, k=7)
    names = [name for name, _, _ in compiles]
    assert names == ["tw_gconv_wgrad_wg", "tw_gconv_wgrad_slot_sum"]
    assert "#define WSLOTS 1\n" in compiles[0][1] and "#define SLOT_EARLY 0\n" in compiles[0][1]
    tap, total = launches
    grid_x = tap["grid"][0]
    assert tap["grid"] == (grid_x, 4, 1) and grid_x == 2  # 2 units (image, 64-column chunk)
    slots = tap["args"][2]
    assert slots.numel() == grid_x * gconv_slots.slot_words(64, 7, 7)
    assert tap["args"][3] is slots and tap["args"][6] is slots and tap["args"][4] is dw
    assert tuple(total["grid"]) == gconv_slots.sum_grid(64, 7, 7, need_db)[0]
    assert total["args"][:2] == [slots, dw] and total["args"][3:] == [64, grid_x]
    assert total["args"][2] is (db if need_db else dw)


def test_tma_slot_tile_without_the_lean_launcher_runs_its_twin_with_slots(monkeypatch):
    """Without the lean launcher (no tensor maps) the TMA slot pick runs as its non-TMA twin,
    which keeps its slots, and the slot sum still follows it."""
    compiles, launches, dw, db = _faked_wgrad(monkeypatch, SLOT, True)
    names = [name for name, _, _ in compiles]
    assert names == ["tw_gconv_wgrad", "tw_gconv_wgrad", "tw_gconv_wgrad_slot_sum"]
    twin = compiles[1][1]
    assert "#define TMA 0\n" in twin and "#define WSLOTS 1\n" in twin
    tap, total = launches
    assert tap["args"][2] is total["args"][0]
    assert total["args"][1] is dw and total["args"][2] is db


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """SASS opcodes of the 3x3 C=64 wgrad of the TMA pick and its slot form, with and without
    the bias, and of the slot-sum kernel; and ptxas's logs."""
    if sass.NVCC is None or sass.cuobjdump() is None:
        pytest.skip("nvcc or cuobjdump missing")
    out = {}
    for tile in (PICK, SLOT):
        for bias in (0, 1):
            src, entry = gconv_cuda.source(3, 3, tile, False, bias, False, "tw_gconv_wgrad")
            cubin, log = sass.compile_cubin(src, tmp_path_factory.mktemp(tile.name), "sm_90a")
            out[tile.slots, bias] = sass.opcodes(cubin, entry), log
    src = gconv_slots.source(3, 3, False, 1, False)
    cubin, log = sass.compile_cubin(src, tmp_path_factory.mktemp("sum"), "sm_90a")
    out["sum"] = sass.opcodes(cubin, gconv_slots.ENTRY), log
    return out


def _count(ops: list[str], prefix: str) -> int:
    return sum(o.startswith(prefix) for o in ops)


@NEEDS_SASS
def test_slot_tile_stores_each_sum_once_without_atomics(compiled):
    """3x3: a thread's 9 taps x 2 channels = 18 sums, 18 plain stores (the bias: one more, by
    the CTA's first CB threads); no reduction, atomic or GPU-scope fence (no count, no finish),
    the same MMAs and tensor copies as the pick, and the dependent launch's trigger after the
    stores (``SLOT_TRIGGER`` "late")."""
    for bias in (0, 1):
        ops, log = compiled[True, bias]
        pick = compiled[False, bias][0]
        assert "0 bytes spill stores" in log
        assert _count(ops, "RED") == _count(ops, "ATOM") == 0
        assert _count(ops, "MEMBAR.SC.GPU") == 0 and _count(pick, "MEMBAR.SC.GPU") > 0
        assert _count(ops, "STG") == 18 + bias, bias
        for prefix in ("HMMA", "UTMALDG", "LDSM"):
            assert _count(ops, prefix) == _count(pick, prefix) > 0, prefix
        # the dependent launch's trigger once the slot is stored: after every store
        stores = [i for i, o in enumerate(ops) if o.startswith("STG")]
        assert ops.count("PREEXIT") == 1 and ops.index("PREEXIT") > max(stores)


@NEEDS_SASS
def test_slot_sum_waits_then_loads_in_batches(compiled):
    """The slot-sum kernel waits for the tap kernel (``griddepcontrol.wait``: ACQBULK) before
    its first load, and has a batch of BATCH slot loads in flight before its first add."""
    ops, log = compiled["sum"]
    assert "0 bytes spill stores" in log
    loads = [i for i, o in enumerate(ops) if o.startswith("LDG")]
    assert loads and ops.index("ACQBULK") < loads[0]
    first_add = next(i for i, o in enumerate(ops) if o.startswith("FADD") and i > loads[0])
    assert sum(i < first_add for i in loads) >= gconv_slots_src.BATCH  # a batch, then adds


@pytest.fixture(scope="module")
def compiled_wg(tmp_path_factory):
    """SASS opcodes and ptxas logs of the offered warpgroup wgrad tiles' slot forms at 7x7
    C=64 (fp16, an fp32 bias gradient), keyed by name; the first one's also without the bias,
    and its atomic form's."""
    if sass.NVCC is None or sass.cuobjdump() is None:
        pytest.skip("nvcc or cuobjdump missing")
    out = {}
    runs = [(dataclasses.replace(t, slots=True), 1) for t in gconv_cuda.WGMMA_WGRAD_TILES]
    runs += [(WG_SLOT, 0), (WG, 1)]
    for tile, bias in runs:
        src, entry = gconv_cuda.source(7, 7, tile, False, bias, False, "tw_gconv_wgrad")
        assert entry == "tw_gconv_wgrad_wg"
        cubin, log = sass.compile_cubin(src, tmp_path_factory.mktemp(tile.name), "sm_90a")
        out[tile.name, bias] = sass.opcodes(cubin, entry), log
    return out


@NEEDS_SASS
def test_wgmma_slot_tiles_store_each_sum_once_without_atomics(compiled_wg):
    """The warpgroup slot forms at 7x7: a thread's 7 kernel columns x 4 sums by 7 16-byte plain
    stores (the bias: one more, by the CTA's first CB threads); no reduction, atomic or
    GPU-scope fence; no spills, no serialized wgmmas, registers within the SM's for its CTAs;
    the trigger after every store; the same MMAs as the atomic form."""
    for tile in gconv_cuda.WGMMA_WGRAD_TILES:
        slot = dataclasses.replace(tile, slots=True)
        ops, log = compiled_wg[slot.name, 1]
        assert "0 bytes spill stores" in log and "serialized" not in log, slot.name
        regs = int(re.search(r"Used (\d+) registers", log).group(1))
        assert regs * tile.warps * 32 * tile.min_ctas <= 65536, (slot.name, regs)
        assert _count(ops, "RED") == _count(ops, "ATOM") == _count(ops, "MEMBAR.SC.GPU") == 0
        assert _count(ops, "STG.E.128") == 7 and _count(ops, "STG") == 8, slot.name
        stores = [i for i, o in enumerate(ops) if o.startswith("STG")]
        assert ops.count("PREEXIT") == 1 and ops.index("PREEXIT") > max(stores), slot.name
    no_bias = compiled_wg[WG_SLOT.name, 0][0]
    assert _count(no_bias, "STG") == _count(no_bias, "STG.E.128") == 7
    atomic = compiled_wg[WG.name, 1][0]
    assert _count(atomic, "RED") > 0 and "PREEXIT" not in atomic
    assert _count(compiled_wg[WG_SLOT.name, 1][0], "HGMMA") == _count(atomic, "HGMMA") > 0
