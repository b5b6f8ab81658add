"""Two ways session 48 tried to cut the tap wgrad's wait for its reductions, checked on the CPU.
The TMA tiles' cluster sums (``CudaTile.sumk``): which tiles are legal (their sums must fit the
stages, as the kernel's static_assert says), their twins, source and names, the host's grid
rounding and cluster-occupancy cap through a faked driver, and, where nvcc is installed, the
SASS: 1 / sumk of the reductions, the distributed shared-memory loads all in flight before the
first add, the same MMAs and tensor copies. The workspace copies
(``TILEWISE_GCONV_WGRAD_COPIES``): where they apply, the switch's values, and the SASS of the
pass that adds them up."""

from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import subprocess

import pytest
from checks import failed_import

from tilewise.bench import sass
from tilewise.ops import gconv_cuda
from tilewise.ops.gconv_cuda import CudaTile
from tilewise.runtime import cuda_launch

PLAIN = CudaTile(16, 16, 64, 8, 1, 2, tma=1)
SUM2 = dataclasses.replace(PLAIN, sumk=2)
SUM4 = dataclasses.replace(PLAIN, sumk=4)
SMALL_SUM2 = CudaTile(8, 16, 32, 4, 4, 2, tma=1, sumk=2)
#: a tile whose 3x3 sums (128 + 20 x 128 threads x 4 bytes) overrun its stages (2 x 2,688 bytes)
TOO_SMALL = CudaTile(8, 8, 8, 4, 1, 2, tma=1, sumk=2)
SUM_NAMES = (
    "cuda_t16x16c64w8m1s2_tma1_sum2",
    "cuda_t16x16c64w8m1s2_tma1_sum4",
    "cuda_t8x16c32w4m4s2_tma1_sum2",
)
NEEDS_SASS = pytest.mark.skipif(
    sass.NVCC is None or sass.cuobjdump() is None, reason="nvcc or cuobjdump missing"
)


def test_sum_tiles_names_and_table():
    """The tiles end in ``_sum2`` / ``_sum4``; tiles without sumk keep their names (the
    autotune cache's keys)."""
    sums = gconv_cuda.SUMK_WGRAD_TILES
    assert tuple(t.name for t in sums) == SUM_NAMES
    assert sums == (SUM2, SUM4, SMALL_SUM2)
    assert PLAIN.name == "cuda_t16x16c64w8m1s2_tma1"
    assert dataclasses.replace(SMALL_SUM2, sumk=0).name == "cuda_t8x16c32w4m4s2_tma1"
    assert CudaTile().name == "cuda_t8x16c32w4m4s2" and CudaTile().sumk == 0
    offered = gconv_cuda.WGRAD_TILES + gconv_cuda.CLUSTER_WGRAD_TILES + gconv_cuda.TMA_WGRAD_TILES
    assert all(t.sumk == 0 for t in offered + gconv_cuda.EXPERIMENTAL_WGRAD_TILES)


def test_sum_tiles_legal_for_c64_and_never_offered():
    """Every sum tile is legal at C=64 for 3x3, 5x5 and 7x7 and fitted to smaller C (what the
    GPU test runs), but none is a candidate: session 48 timed them slower than the plain tiles
    (``SUMK_WGRAD_TILES``)."""
    for k in (3, 5, 7):
        for tile in (SUM2, SUM4, SMALL_SUM2):
            assert gconv_cuda.wgrad_tile_ok(64, k, k, tile), (k, tile.name)
            assert gconv_cuda.sum_clusters_fit(k, k, tile), (k, tile.name)
        for tma in (True, False):
            offered = gconv_cuda.wgrad_candidates(64, k, k, small=True, tma=tma, wgmma=False)
            assert not any(t.sumk for t in offered), (k, tma)
    for c in (8, 16, 32, 96, 128):  # fitted as the GPU test fits them
        tiles = [gconv_cuda._fitted(t, c, True) for t in gconv_cuda.SUMK_WGRAD_TILES]
        legal = [t for t in tiles if gconv_cuda.wgrad_tile_ok(c, 3, 3, t)]
        assert legal and all(c % t.cb == 0 and t.sumk for t in legal), c


@pytest.mark.parametrize(
    "change",
    [
        dict(sumk=3),
        dict(sumk=8),
        dict(sumk=1),
        dict(tma=0),
        dict(cluster=2),
        dict(tap_rows=1),
        dict(rowpair=True),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_sum_tiles_illegal_outside_the_design(change):
    """Clusters of 2 or 4 only, and only for the TMA tap kernel's persistent CTAs: not without
    TMA, not with a cluster grid, a row split or the row-pair kernel."""
    tile = dataclasses.replace(SUM2, **change)
    for k in (3, 5, 7):
        assert not gconv_cuda.sum_clusters_fit(k, k, tile), (k, tile)
        assert not gconv_cuda.wgrad_tile_ok(64, k, k, tile), (k, tile)
    if change == dict(tma=0):  # legal without sumk: the sumk rule alone refuses it
        assert gconv_cuda.wgrad_tile_ok(64, 3, 3, dataclasses.replace(tile, sumk=0))


def test_sums_that_overrun_the_stages_are_illegal():
    """Few pixels a stage against many threads and taps: the sums do not fit the dead stages,
    so the tile is refused though it is legal without sumk; the host's arithmetic is the
    kernel's static_assert (``128 + TP * 4 * NT * 4 <= stages``)."""
    for k in (3, 5, 7):
        assert gconv_cuda.wgrad_tile_ok(64, k, k, dataclasses.replace(TOO_SMALL, sumk=0)), k
        assert not gconv_cuda.sum_clusters_fit(k, k, TOO_SMALL), k
        assert not gconv_cuda.wgrad_tile_ok(64, k, k, TOO_SMALL), k
    # 3x3: 5 tap pairs x 4 sums x 128 threads x 4 bytes past a 128-byte head; stages of 10 x 10
    # and 8 x 8 pixels of 16 bytes, on the 128-byte swizzle period
    assert 128 + 5 * 4 * 128 * 4 == 10368 > 2 * (13 * 128 + 8 * 128) == 5376
    # more taps, more sums: the 32-channel 16x16 tile of 8 warps fits at 5x5, not at 7x7
    edge = CudaTile(16, 16, 32, 8, 1, 2, tma=1, sumk=2)
    assert gconv_cuda.sum_clusters_fit(5, 5, edge) and not gconv_cuda.sum_clusters_fit(7, 7, edge)


def _cpp_true(src: str, conditions: tuple[str, ...], tmp_path) -> list[bool]:
    """Whether each C condition holds over ``src``'s macros, by the C preprocessor's ``#if``
    (skips the test where none is installed)."""
    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor on this machine")
    tail = "".join(
        f"\n#if {c}\ntw_cond_{i} = 1;\n#else\ntw_cond_{i} = 0;\n#endif\n"
        for i, c in enumerate(conditions)
    )
    path = tmp_path / "k.cu"
    path.write_text(src + tail)
    out = subprocess.run([cpp, "-P", str(path)], capture_output=True, text=True).stdout
    found = [re.findall(rf"tw_cond_{i} = ([01]);", out) for i in range(len(conditions))]
    assert all(len(f) == 1 for f in found), out[-500:]
    return [f[0] == "1" for f in found]


def _host_stages(r: int, s: int, tile: CudaTile) -> int:
    """The stages' bytes as ``sum_clusters_fit`` counts them (``_tma_stage`` of halo and dy)."""
    halo = (tile.th + r - 1) * (tile.tw + s - 1) * tile.cb * 2
    dy = tile.th * tile.tw * tile.cb * 2
    return tile.stages * (gconv_cuda._tma_stage(halo, tile.cb) + gconv_cuda._tma_stage(dy, tile.cb))


def test_host_rule_agrees_with_the_kernel_static_assert(tmp_path):
    """``sum_clusters_fit`` against the kernel's own static_assert condition, evaluated over its
    macros by the C preprocessor (and its stages ``WZT`` equal to the host's count), over tiles
    that fit and tiles that do not."""
    tiles = (SUM2, SUM4, SMALL_SUM2, TOO_SMALL, CudaTile(16, 16, 32, 8, 1, 2, tma=1, sumk=4))
    tiles += (CudaTile(8, 16, 16, 8, 1, 3, tma=1, sumk=2), CudaTile(8, 8, 64, 4, 1, 2, tma=1))
    seen = set()
    for tile in tiles:
        tile = dataclasses.replace(tile, sumk=tile.sumk or 2)
        for r, s in ((3, 3), (5, 5), (7, 7), (1, 1), (3, 7)):
            src, entry = gconv_cuda.source(r, s, tile, False, 0, False, "tw_gconv_wgrad")
            assert entry == "tw_gconv_wgrad"
            same, fits = _cpp_true(
                src,
                (
                    f"WZT == {_host_stages(r, s, tile)}",
                    "TP * 4 % SUMK == 0 && 128 + TP * 4 * WARPS * 32 * 4 <= WZT",
                ),
                tmp_path,
            )
            assert same, (r, s, tile.name)
            assert gconv_cuda.sum_clusters_fit(r, s, tile) == fits, (r, s, tile.name)
            seen.add(fits)
    assert seen == {True, False}


def test_non_tma_twin_drops_sumk():
    """Without the lean launcher a sum tile runs as its non-TMA twin: no sumk (the sums wait in
    the TMA stages), no TMA, legal, the same columns, channels and warps."""
    for tile in (SUM2, SUM4, SMALL_SUM2):
        for k in (3, 5, 7):
            for twin in (
                gconv_cuda.non_tma_twin(tile, 64, k, k, gconv_cuda.wgrad_tile_ok),
                gconv_cuda.wgrad_twin(tile, 64, k, k),
            ):
                assert twin.sumk == 0 and twin.tma == 0, (k, twin)
                assert gconv_cuda.wgrad_tile_ok(64, k, k, twin), (k, twin)
                assert (twin.tw, twin.cb, twin.warps) == (tile.tw, tile.cb, tile.warps)
                assert "_sum" not in twin.name


def test_source_defines_sumk():
    """The template takes the tile's sumk (0 for the plain tile: no cluster dims, no sums)."""
    for tile, want in ((PLAIN, 0), (SUM2, 2), (SUM4, 4), (SMALL_SUM2, 2)):
        src, entry = gconv_cuda.source(3, 3, tile, False, 0, False, "tw_gconv_wgrad")
        assert entry == "tw_gconv_wgrad" and f"#define SUMK {want}\n" in src, tile.name
        assert "#define TMA 1\n" in src and "#define CLUSTER 0\n" in src


class _Clusters:
    """A fake ``cuda_launch.max_active_clusters``: a fixed answer, the calls recorded."""

    def __init__(self, most):
        self.most, self.calls = most, []

    def __call__(self, kernel, grid, block, shared_mem, lib=None):
        self.calls.append((kernel, tuple(grid), tuple(block), shared_mem))
        return self.most


@pytest.fixture
def logged(monkeypatch):
    """``gconv_cuda._log_once``'s messages (not cached across tests)."""
    messages = []
    monkeypatch.setattr(gconv_cuda, "_log_once", messages.append)
    return messages


def _grid(monkeypatch, most, grid_x, ctas, blocks, tile=SUM2, smem=1000):
    fake = _Clusters(most)
    monkeypatch.setattr(gconv_cuda.cuda_launch, "max_active_clusters", fake)
    got = gconv_cuda._sum_grid("kernel", grid_x, ctas, blocks, tile, smem)
    (call,) = fake.calls
    return got, call


def test_sum_grid_rounds_to_whole_clusters(monkeypatch, logged):
    """Without the driver's answer (None) the grid is only rounded: up to whole clusters where
    that stays within ``ctas``, else down (never below one cluster); the driver is asked about
    the rounded grid, and the missing answer logged."""
    cases = [  # (grid_x, ctas, k, want)
        (5, 8, 2, 6),  # up, within ctas
        (6, 8, 2, 6),  # whole already
        (7, 7, 2, 6),  # up would be 8 > 7: down
        (1, 1, 2, 2),  # one cluster at least, past ctas
        (1, 132, 4, 4),  # fewer tiles than a cluster: CTAs without tiles add zeros
        (131, 132, 4, 132),
        (133, 133, 4, 132),
        (3, 3, 4, 4),
    ]
    for grid_x, ctas, k, want in cases:
        tile = dataclasses.replace(SUM2, sumk=k)
        got, call = _grid(monkeypatch, None, grid_x, ctas, 3, tile, 777)
        assert got == want and got % k == 0, (grid_x, ctas, k, got)
        assert call == ("kernel", (want, 3, 1), (tile.warps * 32, 1, 1), 777)
    assert len(logged) == len(cases) and all("cluster occupancy" in m for m in logged)


def test_sum_grid_capped_by_the_clusters_the_gpu_holds(monkeypatch, logged):
    """With the driver's answer the grid keeps to the clusters that are resident at once: at
    most ``most // blocks`` clusters a channel block; a large answer changes nothing."""
    assert _grid(monkeypatch, 10_000, 65, 66, 2)[0] == 66
    assert _grid(monkeypatch, 66, 66, 66, 1)[0] == 66  # 33 clusters of 2, 66 resident
    assert _grid(monkeypatch, 20, 65, 66, 2)[0] == 20  # 10 clusters of 2 a block
    assert _grid(monkeypatch, 21, 65, 66, 2)[0] == 20  # whole clusters a block
    assert _grid(monkeypatch, 33, 132, 132, 1, SUM4)[0] == 132  # 132 SMs, clusters of 4
    assert _grid(monkeypatch, 32, 132, 132, 1, SUM4)[0] == 128
    assert _grid(monkeypatch, 7, 130, 132, 3, SUM4)[0] == 8  # 2 clusters of 4 a block
    assert _grid(monkeypatch, 3, 130, 132, 3, SUM4)[0] == 4  # one each, all resident
    # fewer clusters than channel blocks: left as rounded (the atomics need no co-residency)
    assert _grid(monkeypatch, 2, 65, 66, 3)[0] == 66
    assert not logged


class _Driver:
    """A fake driver library whose ``cuOccupancyMaxActiveClusters`` writes ``most`` through the
    by-reference int and returns ``result``; it keeps what it was given."""

    def __init__(self, most: int, result: int = 0) -> None:
        self.most, self.result, self.seen = most, result, None

    def cuOccupancyMaxActiveClusters(self, pmost, func, pcfg):  # noqa: N802
        cfg = ctypes.cast(pcfg, ctypes.POINTER(cuda_launch._LaunchConfig)).contents
        self.seen = (func, tuple(cfg.grid), tuple(cfg.block), cfg.shared_mem, cfg.num_attrs)
        ctypes.cast(pmost, ctypes.POINTER(ctypes.c_int)).contents.value = self.most
        return self.result


class _Kernel:
    func = ctypes.c_void_p(0xF00D)


def test_max_active_clusters_reads_the_driver():
    """``cuda_launch.max_active_clusters``: the driver's count where it answers 0 (success),
    None where it fails or lacks the call; the launch shape reaches it as given."""
    drv = _Driver(17)
    most = cuda_launch.max_active_clusters(_Kernel(), (66, 2, 1), (256, 1, 1), 150672, lib=drv)
    assert most == 17
    assert drv.seen == (_Kernel.func, (66, 2, 1), (256, 1, 1), 150672, 0)
    assert cuda_launch.max_active_clusters(_Kernel(), (4, 1, 1), (128, 1, 1), 0, _Driver(0)) == 0
    failing = _Driver(17, result=1)  # CUDA_ERROR_INVALID_VALUE
    assert cuda_launch.max_active_clusters(_Kernel(), (2, 1, 1), (128, 1, 1), 0, failing) is None
    assert cuda_launch.max_active_clusters(_Kernel(), (2, 1, 1), (128, 1, 1), 0, object()) is None


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The 3x3 C=64 wgrad (no bias) of the plain tile and its sum2 and sum4 forms for sm_90a,
    once: name -> (SASS opcodes of the wgrad entry, ptxas log)."""
    if sass.NVCC is None or sass.cuobjdump() is None:
        pytest.skip("nvcc or cuobjdump missing")
    out = {}
    for tile in (PLAIN, SUM2, SUM4):
        src, entry = gconv_cuda.source(3, 3, tile, False, 0, False, "tw_gconv_wgrad")
        cubin, log = sass.compile_cubin(src, tmp_path_factory.mktemp(tile.name), "sm_90a")
        out[tile.sumk] = sass.opcodes(cubin, entry), log
    return out


def _spills(log: str) -> int:
    """All spill bytes (stores and loads) in ptxas's ``-v`` log."""
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert found, log[-2000:]
    return sum(int(a) + int(b) for a, b in found)


@NEEDS_SASS
def test_sum_tiles_compile_without_spills_and_send_a_share(compiled):
    """3x3 (9 taps, a thread's 5 tap pairs x 4 sums = 20): the plain tile sends 18 reductions a
    thread, sum2 10 and sum4 5 (every sumk-th of the 20, each behind the tap < 9 test), after
    20 distributed shared-memory loads (sumk peers x 20 / sumk); no spills in any."""
    for k, want in ((0, 18), (2, 10), (4, 5)):
        ops, log = compiled[k]
        assert _spills(log) == 0, k
        assert sum(o.startswith("RED") for o in ops) == want, k
        loads = sum(o.startswith("LD.E") for o in ops)  # generic loads: ld.shared::cluster
        assert loads == (20 if k else 0), (k, loads)


@NEEDS_SASS
def test_sum_tiles_cluster_barriers_and_load_batch(compiled):
    """The sum tiles arrive at the cluster barrier twice (``cluster_sync`` after the stores of
    the sums, then once the peers' sums are loaded) and wait twice (in ``cluster_sync``, and
    before leaving); all loads are issued before the arrive that frees the peers and before the
    first reduction; the plain tile has no cluster barrier."""
    plain = compiled[0][0]
    assert not [o for o in plain if o.startswith("UCGABAR")]
    for k in (2, 4):
        ops = compiled[k][0]
        arrives = [i for i, o in enumerate(ops) if o.startswith("UCGABAR_ARV")]
        waits = [i for i, o in enumerate(ops) if o.startswith("UCGABAR_WAIT")]
        loads = [i for i, o in enumerate(ops) if o.startswith("LD.E")]
        reds = [i for i, o in enumerate(ops) if o.startswith("RED")]
        exits = [i for i, o in enumerate(ops) if o == "EXIT"]
        assert len(arrives) >= 2 and len(waits) == 2, (k, arrives, waits)
        assert arrives[0] < waits[0] < loads[0]  # the sums stored everywhere before any load
        assert loads[-1] < arrives[1] < reds[0], k  # one batch, then the peers are free
        assert loads[-1] - loads[0] < 2 * len(loads), k  # back to back, no adds between
        assert waits[-1] > max(i for i, o in enumerate(ops) if o.startswith("ATOM")), k
        assert exits and min(exits) > waits[-1], k  # nobody leaves before the final wait


@NEEDS_SASS
def test_sum_tiles_keep_the_mmas_and_tensor_copies(compiled):
    """The sums' exchange changes only the epilogue: the same MMAs and tensor copies as the
    plain tile."""
    for prefix in ("HMMA", "UTMALDG", "LDSM"):
        counts = [sum(o.startswith(prefix) for o in compiled[k][0]) for k in (0, 2, 4)]
        assert counts[0] > 0 and len(set(counts)) == 1, (prefix, counts)


@pytest.mark.skipif(sass.NVCC is None, reason="nvcc is not installed")
def test_overrunning_sums_fail_the_kernel_static_assert(tmp_path):
    """A tile the host refuses (``TOO_SMALL``) does not compile either: the same rule."""
    src, _ = gconv_cuda.source(3, 3, TOO_SMALL, False, 0, False, "tw_gconv_wgrad")
    with pytest.raises(RuntimeError, match="the sums overrun the stages"):
        sass.compile_cubin(src, tmp_path, "sm_90a")


def test_wgrad_copies_switch_and_where_it_applies(monkeypatch):
    """``TILEWISE_GCONV_WGRAD_COPIES`` is 1, 2, 4 or 8 (another value stops the import with a
    ValueError naming it); off (1) by default. It applies to the persistent tap kernel where
    the finish runs over channel pairs (a thread's share at most 24 sums), nowhere else."""
    err = failed_import("tilewise.ops.gconv_cuda", TILEWISE_GCONV_WGRAD_COPIES="3")
    assert "ValueError" in err and "TILEWISE_GCONV_WGRAD_COPIES=3" in err
    assert gconv_cuda.WGRAD_COPIES_DEFAULT == 1
    monkeypatch.setattr(gconv_cuda, "WGRAD_COPIES", 4)
    assert gconv_cuda.wgrad_copies(3, 3, PLAIN) == 4  # 2 pairs x 9 taps = 18 sums a thread
    assert gconv_cuda.wgrad_copies(1, 1, PLAIN) == 4
    assert gconv_cuda.wgrad_copies(5, 5, PLAIN) == 1  # 50 sums: the dw_out-order loop
    assert gconv_cuda.wgrad_copies(3, 3, SUM2) == 4  # the cluster sums' CTAs take copies too
    for other in gconv_cuda.CLUSTER_WGRAD_TILES + gconv_cuda.ROW_WGRAD_TILES:
        # cluster grids write dw themselves; persistent row-split CTAs take copies (their pass
        # runs over pairs: 3 taps x 2 pairs a thread)
        want = 1 if other.cluster else 4
        assert gconv_cuda.wgrad_copies(3, 3, other) == want, other.name
    wg = next(t for t in gconv_cuda.WGMMA_WGRAD_TILES)
    assert gconv_cuda.wgrad_copies(5, 5, wg) == 1
    src, _ = gconv_cuda.source(3, 3, PLAIN, False, 0, False, "tw_gconv_wgrad")
    assert "#define WCOPIES 4\n" in src
    fprop, _ = gconv_cuda.source(3, 3, PLAIN, False, 0, False, "tw_gconv_fprop")
    assert "#define WCOPIES 1\n" in fprop
    monkeypatch.setattr(gconv_cuda, "WGRAD_FINISH_ORDER", "dw_out")  # no pairs' pass: one copy
    assert gconv_cuda.wgrad_copies(3, 3, PLAIN) == 1


@NEEDS_SASS
def test_wgrad_copies_compile_into_the_pass(tmp_path, monkeypatch):
    """With 4 copies the 3x3 pick compiles without spills; its reductions are the same 18 a
    thread, and the last CTA's pass loads and zeroes 4 x 18 sums (all loads before the first
    store) where one copy has 18."""
    ops = {}
    for copies in (1, 4):
        monkeypatch.setattr(gconv_cuda, "WGRAD_COPIES", copies)
        src, entry = gconv_cuda.source(3, 3, PLAIN, False, 0, False, "tw_gconv_wgrad")
        cubin, log = sass.compile_cubin(src, tmp_path, "sm_90a")
        part = next(p for p in log.split("Compiling entry function '") if p.startswith(entry))
        assert re.search(r"0 bytes spill stores, 0 bytes spill loads", part), part[-500:]
        ops[copies] = sass.opcodes(cubin, entry)

    def count(copies, prefix):
        return sum(op.startswith(prefix) for op in ops[copies])

    for copies in (1, 4):
        assert count(copies, "RED") == 18 and count(copies, "ATOM") == 1
        assert count(copies, "LDG") == 18 * copies  # the pass's loads, nothing else
        assert count(copies, "STG.E.STRONG") == 18 * copies  # its zeroing
        first_store = next(i for i, op in enumerate(ops[copies]) if op.startswith("STG.E.STRONG"))
        last_load = max(i for i, op in enumerate(ops[copies]) if op.startswith("LDG"))
        assert last_load < first_store, copies
