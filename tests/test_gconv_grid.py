"""The persistent grids' size (session 51, ``gconv_cuda.resident_grid_x``): every CTA of a
persistent fprop/dgrad or wgrad launch resident at once, checked on the CPU with faked compiles
and launches and a faked occupancy. The kernels' results at the new grids are checked on the
GPU by ``scripts/resident_grid_probe.py`` (each new grid against PyTorch) and the GPU tests."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from checks import assert_three_way, fake_nvrtc
from test_gconv_cuda import _check_tiles, _wgrad_problem

from tilewise.ops import gconv_cuda, gconv_slots
from tilewise.ops.gconv_cuda import CudaTile
from tilewise.runtime import cuda_launch


def test_resident_grid_x_cuts_only_grids_that_do_not_fit():
    cases = [  # (wanted, blocks, per_sm, sms, want)
        (17, 16, 2, 132, 16),  # C=256 warpgroup wgrad: 272 CTAs where 264 fit
        (9, 16, 1, 132, 8),  # C=1024 64-channel TMA wgrad: 144 where 132 fit
        (17, 32, 5, 132, 17),  # 544 where 660 fit: as asked
        (17, 32, 4, 132, 16),  # 544 where 528 fit
        (66, 8, 4, 132, 66),  # exactly full
        (264, 2, 3, 132, 198),  # registers hold 3 of min_ctas 4
        (9, 128, 8, 132, 8),  # 1152 where 1056 fit
        (3, 200, 1, 132, 1),  # more channel blocks than SMs: one CTA each, in rounds
        (17, 16, None, 132, 17),  # occupancy not known: as asked
        (17, 16, 0, 132, 17),
    ]
    for wanted, blocks, per_sm, sms, want in cases:
        got = gconv_cuda.resident_grid_x(wanted, blocks, per_sm, sms)
        assert got == want, (wanted, blocks, per_sm, sms, got)
        if per_sm:
            assert got * blocks <= max(per_sm * sms, blocks)  # all resident, or one a block


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _fake(monkeypatch, per_sm):
    """Faked compiles and launches, and ``per_sm`` CTAs an SM from the faked driver (recording
    what it was asked)."""
    compiles, launches = fake_nvrtc(monkeypatch)
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, signature, *dependent: None)
    monkeypatch.setattr(gconv_cuda, "wgmma_usable", lambda x: True)
    asked = []

    def resident(kernel, threads, smem, device):
        asked.append((threads, smem))
        return per_sm

    monkeypatch.setattr(gconv_cuda, "_resident_per_sm", resident)
    return compiles, launches, asked


def test_warpgroup_slot_wgrad_grid_is_cut_to_the_resident_ctas(monkeypatch):
    """C=256 7x7, a warpgroup tile (16 channel blocks, two CTAs an SM): 17 CTAs a block would be
    272 on 264 places; 16 are launched, and the slot buffer and slot sum follow the cut grid."""
    tile = dataclasses.replace(gconv_cuda.WGMMA_WGRAD_TILES[0], slots=True)
    _, launches, asked = _fake(monkeypatch, 2)
    x, dy = _cl(torch.randn(64, 256, 16, 16)), _cl(torch.randn(64, 256, 16, 16))
    try:
        gconv_cuda.wgrad(dy, x, 7, 7, 3, 3, False, tile)
    finally:
        gconv_cuda._kernel.cache_clear()
        gconv_slots.kernel.cache_clear()
    tap, total = launches
    assert tap["grid"] == (16, 16, 1)
    assert asked == [(tile.warps * 32, gconv_cuda.wgrad_smem_bytes(7, 7, tile))]
    assert tap["args"][2].numel() == 16 * gconv_slots.slot_words(256, 7, 7)
    assert total["args"][3:] == [256, 16]  # the slot sum adds the 16 slots


@pytest.mark.parametrize("per_sm, want", [(4, 16), (5, 17), (None, 17)])
def test_tap_wgrad_grid_at_c1024(monkeypatch, per_sm, want):
    """C=1024 3x3, the 32-channel tap tile (min_ctas 4): cut to 16 a block only where the
    driver says 4 fit an SM."""
    tile = CudaTile(8, 16, 32, 4, 4, 2)
    _, launches, _ = _fake(monkeypatch, per_sm)
    x, dy = _cl(torch.randn(32, 1024, 16, 16)), _cl(torch.randn(32, 1024, 16, 16))
    try:
        gconv_cuda.wgrad(dy, x, 3, 3, 1, 1, True, tile)
    finally:
        gconv_cuda._kernel.cache_clear()
    assert launches[0]["grid"] == (want, 32, 1)


@pytest.mark.parametrize("dgrad", [False, True])
def test_fprop_grid_is_cut_to_the_resident_ctas(monkeypatch, dgrad):
    """C=1024 3x3, the 32-channel tap tile: 17 x 32 CTAs where the faked driver holds 4 an SM
    (528): 16 a channel block, asked with the kernel's own shared memory."""
    tile = CudaTile(8, 16, 32, 4, 4, 2)
    _, launches, asked = _fake(monkeypatch, 4)
    x = _cl(torch.randn(32, 1024, 16, 16, dtype=torch.float16))
    w = torch.randn(1024, 8, 3, 3, dtype=torch.float16)
    out = torch.empty_like(x)
    try:
        gconv_cuda.fprop(x, w, None, out, 1, 1, tile, dgrad)
    finally:
        gconv_cuda._kernel.cache_clear()
    assert launches[0]["grid"] == (16, 32, 1)
    assert asked == [(tile.warps * 32, gconv_cuda.smem_bytes(3, 3, tile))]


def test_no_occupancy_without_cuda_or_with_the_rule_off(monkeypatch):
    """The driver is asked only with a CUDA device, the rule on and a real function handle;
    else the grid is as asked."""

    class Kernel:
        func = ctypes.c_void_p(0xF00D)

    asked = []
    monkeypatch.setattr(gconv_cuda, "_RESIDENT", {})
    monkeypatch.setattr(gconv_cuda.cuda_launch, "on_device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(
        gconv_cuda.cuda_launch, "max_active_blocks", lambda *a: asked.append(a) or 3
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gconv_cuda._resident_per_sm(Kernel(), 128, 1024, 0) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gconv_cuda, "RESIDENT_GRID", False)
    assert gconv_cuda._resident_per_sm(Kernel(), 128, 1024, 0) is None
    monkeypatch.setattr(gconv_cuda, "RESIDENT_GRID", True)
    assert gconv_cuda._resident_per_sm(object(), 128, 1024, 0) is None  # no handle: a fake
    assert not asked
    kernel = Kernel()
    for _ in range(3):  # asked once per kernel, threads and shared memory
        assert gconv_cuda._resident_per_sm(kernel, 128, 1024, 0) == 3
    assert gconv_cuda._resident_per_sm(kernel, 256, 1024, 0) == 3
    assert [a[1:] for a in asked] == [(128, 1024), (256, 1024)]
    # the cache keeps the kernel, so its id stays its own while the answer stands
    assert all(entry[0] is kernel for entry in gconv_cuda._RESIDENT.values())


class _Driver:
    """A fake ``cuOccupancyMaxActiveBlocksPerMultiprocessor``: writes ``most`` through the
    by-reference int, returns ``result`` and keeps what it was given."""

    def __init__(self, most: int, result: int = 0) -> None:
        self.most, self.result, self.seen = most, result, None

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, pmost, func, threads, smem):  # noqa: N802
        self.seen = (func, threads.value, smem.value)
        ctypes.cast(pmost, ctypes.POINTER(ctypes.c_int)).contents.value = self.most
        return self.result


def test_max_active_blocks_reads_the_driver():
    """``cuda_launch.max_active_blocks``: the driver's count where it answers 0 (success), None
    where it fails or lacks the call; threads and shared memory reach it as given."""

    class Kernel:
        func = ctypes.c_void_p(0xF00D)

    drv = _Driver(5)
    assert cuda_launch.max_active_blocks(Kernel(), 128, 40528, lib=drv) == 5
    assert drv.seen == (Kernel.func, 128, 40528)
    assert cuda_launch.max_active_blocks(Kernel(), 128, 0, lib=_Driver(0)) == 0
    assert cuda_launch.max_active_blocks(Kernel(), 128, 0, lib=_Driver(5, result=1)) is None
    assert cuda_launch.max_active_blocks(Kernel(), 128, 0, lib=object()) is None


def test_rule_switch_is_part_of_the_source_digest():
    """``TILEWISE_GCONV_RESIDENT_GRID=0`` (the old grids) changes ``SOURCE_DIGEST``: a choice
    timed with one rule is not reused under the other."""
    code = "from tilewise.ops import gconv_cuda as g; print(g.SOURCE_DIGEST, g.RESIDENT_GRID)"
    digests = {}
    for value in ("0", "1"):
        env = dict(os.environ, TILEWISE_GCONV_RESIDENT_GRID=value)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        digests[value] = out
    assert digests["0"][1] == "False" and digests["1"][1] == "True"
    assert digests["0"][0] != digests["1"][0]


# --- the GPU: tiles whose grids the rule cuts, at full size --------------------------------

#: (case as test_gconv_cuda's: n, c, h, w, r, s, pad_h, pad_w, bias; tile names) where the
#: old rule asked for more CTAs than an H100/H200 (132 SMs) holds: MBConv's C=1024 layer (the
#: 64-channel tiles: 9 or 17 a channel block, one or two an SM) and issue 3's C=256 7x7 wgrad
FPROP_CUT = ((24, 1024, 16, 16, 3, 3, 1, 1, True),
             ("cudarp_t16x16c64w8m1s2_tma2", "cudarp_t8x16c64w8m2s3_tma2"))  # fmt: skip
WGRAD_CUT = (
    ((24, 1024, 16, 16, 3, 3, 1, 1, True),
     ("cuda_t16x16c64w8m1s2_tma1", "cuda_t16x16c64w8m1s2_tma1_slot")),
    ((40, 256, 16, 16, 7, 7, 3, 3, True), ("cudawg_t4x16c32w18m1s4_ws_slot",)),
)  # fmt: skip


def _named(tiles, names) -> list[CudaTile]:
    found = [t for t in tiles if t.name in names]
    assert len(found) == len(names), (names, [t.name for t in tiles])
    return found


def _assert_resident(bound, tile: CudaTile, blocks: int) -> bool:
    """The launch's whole grid fits the GPU at once, by the driver's count for its kernel, its
    block and the shared memory it asks for (a dependent launch's padded size included);
    returns whether it is smaller than the old rule's (``min_ctas`` x SMs rounded up)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = cuda_launch.max_active_blocks(bound.kernel, bound.block[0], bound.smem)
    assert per_sm, tile.name
    assert bound.grid[0] * blocks <= max(per_sm * sms, blocks), (tile.name, bound.grid, per_sm)
    return bound.grid[0] < -(-tile.min_ctas * sms // blocks)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cut_grids_compute_the_conv(dtype, rng_seed):
    """fprop, dgrad, wgrad and db of the tiles whose grids the rule cuts, by the three-way rule
    against fp64 (their CTAs walk more tiles each than under the old grids), and each launch's
    whole grid resident at once by the driver's count for the very kernel checked."""
    if not gconv_cuda.RESIDENT_GRID:
        pytest.skip("TILEWISE_GCONV_RESIDENT_GRID=0: the old grids")
    if not gconv_cuda.wgmma_usable(torch.empty(0, device="cuda")):
        pytest.skip("needs compute capability 9.0 with TMA (the tiles are TMA and wgmma tiles)")
    cut = 0
    case, names = FPROP_CUT
    n, c, h, w, r, s, ph, pw, _ = case
    tiles = _named(gconv_cuda.candidates(c, r, s, tma=True, wgmma=True), names)
    _check_tiles(case, dtype, rng_seed, tiles)  # fprop with a bias, dgrad without
    x = _cl(torch.randn(n, c, h, w, device="cuda", dtype=dtype))
    wt = torch.randn(c, 8, r, s, device="cuda", dtype=dtype)
    b = torch.randn(c, device="cuda", dtype=dtype)
    for tile in tiles:
        for bias, dgrad in ((b, False), (None, True)):  # the kernels _check_tiles ran
            out = torch.empty_like(x)
            bound = gconv_cuda.bind_fprop(x, wt, bias, out, ph, pw, tile, dgrad)
            cut += _assert_resident(bound, tile, c // tile.cb)
    for case, names in WGRAD_CUT:
        n, c, h, w, r, s, ph, pw, _ = case
        x, dy, ref, same, atol = _wgrad_problem(n, c, h, w, r, s, ph, pw, dtype)
        db_ref, db_same = dy.double().sum((0, 2, 3)), dy.float().sum((0, 2, 3))
        tiles = _named(gconv_cuda.wgrad_candidates(c, r, s, False, True, True), names)
        for tile in tiles:
            tag = f"wgrad n{n} c{c} {h}x{w} k{r}x{s} {tile.name} {dtype}"
            dw, db = gconv_cuda.wgrad(dy, x, r, s, ph, pw, True, tile, torch.float32, True)
            assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
            assert_three_way(db, db_same, db_ref, 1e-3, f"db {tag}", rng_seed, ulps=1)
            bound = gconv_cuda.bind_wgrad(dy, x, r, s, ph, pw, True, tile, dw_cl=True)
            cut += _assert_resident(bound, tile, c // tile.cb)
    # on 132 SMs every one of these grids is cut (fprop and dgrad: two kernels a tile)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert cut == 7
