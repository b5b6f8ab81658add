"""The persistent grids' size (session 51, ``gconv_cuda.resident_grid_x``): every CTA of a
persistent fprop/dgrad or wgrad launch resident at once, checked on the CPU with faked compiles
and launches and a faked occupancy. The kernels' results at the new grids are checked on the
GPU by ``scripts/resident_grid_probe.py`` (each new grid against PyTorch) and the GPU tests."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from checks import fake_nvrtc

from tilewise.ops import gconv_cuda, gconv_slots
from tilewise.ops.gconv_cuda import CudaTile


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
    """The driver is asked only with a CUDA device and the rule on; else the grid is as asked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gconv_cuda._resident_per_sm(object(), 128, 1024, 0) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gconv_cuda, "RESIDENT_GRID", False)
    assert gconv_cuda._resident_per_sm(object(), 128, 1024, 0) is None


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
