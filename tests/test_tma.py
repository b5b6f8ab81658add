"""Tensor-map specs for the TMA unit (``runtime.tma``): sizes, strides, box and swizzle of a
channels_last halo map, and the limits the driver would only answer with CUDA_ERROR_INVALID_VALUE.
Encoding itself needs a Hopper GPU (the GPU tests of the TMA conv tiles run it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tilewise.runtime import tma


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(("channels", "swizzle"), [(8, 0), (16, 1), (32, 2), (64, 3)])
def test_halo_map_of_a_channels_last_tensor(channels, swizzle):
    x = _cl(torch.zeros(3, 64, 11, 13, dtype=torch.float16))
    spec = tma.nhwc_halo_map(x, channels, 18, 10)
    # innermost first: channels, width, height, images; byte strides of the outer three
    assert spec.sizes == (64, 13, 11, 3)
    assert spec.strides == (x.stride(3) * 2, x.stride(2) * 2, x.stride(0) * 2)
    assert spec.box == (channels, 18, 10, 1) and spec.swizzle == swizzle
    spec.validate()


def test_wide_pixels_split_into_128_byte_rows():
    """128 half-precision channels (256-byte pixels, wider than any swizzle row): a 5-d map of
    64-channel rows whose box covers the block's two rows of each pixel, in memory order."""
    x = _cl(torch.zeros(3, 256, 11, 13, dtype=torch.bfloat16))
    spec = tma.nhwc_halo_map(x, 128, 18, 10)
    assert spec.sizes == (64, 4, 13, 11, 3)
    assert spec.strides == (128, x.stride(3) * 2, x.stride(2) * 2, x.stride(0) * 2)
    assert spec.box == (64, 2, 18, 10, 1) and spec.swizzle == 3
    spec.validate()
    with pytest.raises(ValueError, match="'channels'"):  # 96 channels: no whole 128-byte rows
        tma.nhwc_halo_map(_cl(torch.zeros(1, 96, 8, 8, dtype=torch.float16)), 96, 8, 8)


def test_bad_maps_are_refused_naming_the_argument():
    x = _cl(torch.zeros(1, 64, 8, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="'channels'"):
        tma.nhwc_halo_map(x, 4, 8, 8)  # an 8-byte box row
    good = tma.nhwc_halo_map(x, 32, 8, 8)
    with pytest.raises(ValueError, match="'box'"):
        dataclasses.replace(good, box=(32, 300, 8, 1)).validate()
    with pytest.raises(ValueError, match="'strides'"):
        dataclasses.replace(good, strides=(8, 1024, 8192)).validate()
    with pytest.raises(ValueError, match="swizzle"):
        dataclasses.replace(good, swizzle=1).validate()  # a 64-byte row in 32-byte swizzle
    with pytest.raises(ValueError, match="'address'"):
        tma.encode(good, 0x1008)


def test_tensor_maps_sit_on_64_byte_boundaries():
    for _ in range(8):
        assert tma.TensorMap().address % 64 == 0


def test_map_cache_reuses_and_drops_the_least_recent(monkeypatch):
    made = []
    monkeypatch.setattr(tma, "encode", lambda spec, addr: made.append(addr) or object())
    cache = tma.MapCache(size=2)
    spec = tma.nhwc_halo_map(_cl(torch.zeros(1, 32, 4, 4, dtype=torch.float16)), 32, 6, 6)

    def get(addr):
        return cache.get(("x", addr), lambda: (spec, addr))

    a = get(0x1000)
    assert get(0x1000) is a and made == [0x1000]
    get(0x2000)
    get(0x1000)  # most recent again
    get(0x3000)  # drops 0x2000
    assert len(cache) == 2
    get(0x2000)
    assert made == [0x1000, 0x2000, 0x3000, 0x2000]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_not_supported_without_a_gpu():
    assert tma.supported(0) is False
