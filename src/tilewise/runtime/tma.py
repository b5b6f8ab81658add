"""Tensor maps for Hopper's TMA unit (``cp.async.bulk.tensor``), built on the host with the
driver's ``cuTensorMapEncodeTiled`` and passed to NVRTC kernels by value (``Launcher``'s ``t``
arguments).

A tensor map encodes a tensor's base address, sizes, strides and the box one copy moves, so a
kernel loads a whole tile (zero-filled where the box leaves the tensor) with one instruction
instead of per-16-byte ``cp.async`` address math. Maps are cached by everything they encode:
the same activation buffer at the same shape (a training loop's usual case) costs a dict lookup.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

#: CUtensorMapDataType values of the dtypes the kernels take
DATA_TYPES = {torch.float16: 6, torch.bfloat16: 9, torch.float32: 7}
#: CUtensorMapSwizzle by the box's inner row in bytes: none for 16 bytes, else the matching mode
SWIZZLE_BY_ROW_BYTES = {16: 0, 32: 1, 64: 2, 128: 3}
_L2_PROMOTION_128B = 2
_MAP_BYTES = 128
_MAP_ALIGN = 64


@dataclass(frozen=True)
class TiledMap:
    """What ``cuTensorMapEncodeTiled`` is given besides the address: sizes and byte strides
    (innermost first; ``strides`` has one entry fewer), the box, and the swizzle mode."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int

    def validate(self) -> None:
        """``ValueError`` naming what the TMA unit cannot take (the driver would only say
        CUDA_ERROR_INVALID_VALUE)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        if self.dtype not in DATA_TYPES:
            raise ValueError(f"tensor map: argument 'dtype' {self.dtype} is not supported")
        if not 1 <= len(self.sizes) <= 5 or len(self.box) != len(self.sizes):
            raise ValueError(f"tensor map: 'sizes' {self.sizes} and 'box' {self.box} disagree")
        if len(self.strides) != len(self.sizes) - 1 or any(s % 16 for s in self.strides):
            raise ValueError(f"tensor map: 'strides' {self.strides} must be multiples of 16 bytes")
        if any(not 1 <= b <= 256 for b in self.box) or (self.box[0] * elem) % 16:
            raise ValueError(f"tensor map: 'box' {self.box} (each 1..256, inner row 16n bytes)")
        row = self.box[0] * elem
        if self.swizzle and row > 16 << self.swizzle:
            raise ValueError(f"tensor map: a {row}-byte box row exceeds swizzle {self.swizzle}")


def nhwc_halo_map(x: torch.Tensor, channels: int, box_w: int, box_h: int) -> TiledMap:
    """The map of a channels_last [N, C, H, W] tensor whose box is ``channels`` channels by
    ``box_w`` x ``box_h`` pixels of one image, swizzled by the box's row bytes. A pixel of more
    than 128 bytes (the widest swizzled row) is split into 128-byte rows: a 5-d map (row
    elements, rows, w, h, n) whose box lands in shared memory in the same order, each pixel's
    rows back to back, so the kernel's addressing does not change."""
    n, c, h, w = x.shape
    elem = x.element_size()
    row = channels * elem
    if row > 128 and row % 128 == 0 and c % (128 // elem) == 0:
        inner = 128 // elem
        return TiledMap(
            dtype=x.dtype,
            sizes=(inner, c // inner, w, h, n),
            strides=(inner * elem, c * elem, w * c * elem, h * w * c * elem),
            box=(inner, channels // inner, box_w, box_h, 1),
            swizzle=SWIZZLE_BY_ROW_BYTES[128],
        )
    if row not in SWIZZLE_BY_ROW_BYTES:
        raise ValueError(f"tensor map: argument 'channels' {channels} gives a {row}-byte row")
    return TiledMap(
        dtype=x.dtype,
        sizes=(c, w, h, n),
        strides=(c * elem, w * c * elem, h * w * c * elem),
        box=(channels, box_w, box_h, 1),
        swizzle=SWIZZLE_BY_ROW_BYTES[row],
    )


class TensorMap:
    """One encoded ``CUtensorMap`` (128 bytes at a 64-byte aligned host address); pass it to a
    ``Launcher`` argument of kind ``t``."""

    __slots__ = ("_raw", "address")

    def __init__(self) -> None:
        self._raw = ctypes.create_string_buffer(_MAP_BYTES + _MAP_ALIGN)
        base = ctypes.addressof(self._raw)
        self.address = base + (-base) % _MAP_ALIGN


@functools.cache
def _encode_fn():
    lib = torch.cuda._utils._get_gpu_runtime_library()
    fn = lib.cuTensorMapEncodeTiled  # AttributeError on a driver without TMA
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return fn


def encode(spec: TiledMap, address: int) -> TensorMap:
    """A fresh tensor map of ``spec`` at device ``address`` (16-byte aligned)."""
    if address % 16:
        raise ValueError(f"tensor map: argument 'address' {address:#x} is not 16-byte aligned")
    spec.validate()
    rank = len(spec.sizes)
    out = TensorMap()
    result = _encode_fn()(
        out.address,
        DATA_TYPES[spec.dtype],
        rank,
        address,
        (ctypes.c_uint64 * rank)(*spec.sizes),
        (ctypes.c_uint64 * max(1, rank - 1))(*spec.strides),
        (ctypes.c_uint32 * rank)(*spec.box),
        (ctypes.c_uint32 * rank)(*([1] * rank)),
        0,  # no interleave
        spec.swizzle,
        _L2_PROMOTION_128B,
        0,  # out-of-bounds elements read as zero
    )
    if result != 0:
        torch.cuda._utils._check_cuda(result)
    return out


class MapCache:
    """Encoded maps by a caller's key (which must fix everything the map encodes: address,
    sizes, strides, dtype, box), least recently used dropped past ``size`` entries."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._maps: OrderedDict[Hashable, TensorMap] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], tuple[TiledMap, int]]) -> TensorMap:
        """The map under ``key``, encoded from ``make()`` = (spec, address) on a miss."""
        with self._lock:
            found = self._maps.get(key)
            if found is not None:
                self._maps.move_to_end(key)
                return found
            made = self._maps[key] = encode(*make())
            if len(self._maps) > self.size:
                self._maps.popitem(last=False)
            return made

    def __len__(self) -> int:
        return len(self._maps)


@functools.cache
def supported(device_index: int) -> bool:
    """Compute capability 9.0 or newer and a driver with ``cuTensorMapEncodeTiled``."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        _encode_fn()
    except (AttributeError, OSError):
        return False
    return True
