"""Self-cleaning fp32 workspaces for one-launch reductions.

A kernel that sums partials with atomics needs zeroed accumulators and ticket counters; zeroing
them with a memset before every launch costs a launch and its gap (a few microseconds against a
~50 us bandwidth-bound pass). Instead, every kernel that takes a workspace from here leaves it
zero again (its last program re-zeroes what it used), so one buffer per (device, stream) serves
every launch in stream order, across ops.

Under CUDA-graph capture each call gets a fresh zeroed buffer (a memset the graph records), so
graphs replayed on other streams never share one with eager launches.

Known limits: a buffer first allocated while a private memory pool is active outside capture
(torch.compile's "reduce-overhead" warm-up) lives in that pool; buffers of streams that are gone
are not freed (a few MB per stream at most).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: (device type, device index, stream[, current device, its stream]) -> (buffer, views by sizes)
_WORKSPACES: dict[tuple, tuple[torch.Tensor, dict]] = {}


def _key(device: torch.device) -> tuple:
    if device.type != "cuda":
        return (device.type, 0, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    current = torch.cuda.current_device()
    # Triton launches on the current device's stream, the NVRTC launcher on the tensor device's:
    # both are in the key, so launches on different streams never share a buffer
    key = ("cuda", index, torch._C._cuda_getCurrentRawStream(index))
    if current != index:
        key += (current, torch._C._cuda_getCurrentRawStream(current))
    return key


def _split(buf: torch.Tensor, sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    views, start = [], 0
    for size in sizes:
        views.append(buf[start : start + size])
        start += size
    return tuple(views)


def zeroed(device: torch.device, sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Consecutive zeroed fp32 regions of the given sizes on ``device`` (view a counter region as
    int32: zero is zero in both). The caller's kernel must leave every region zero; launch it inside
    ``guarded`` so a launch that raises never leaves a half-used workspace to the next one."""
    need = sum(sizes)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _split(torch.zeros(need, device=device, dtype=torch.float32), sizes)
    key = _key(device)
    entry = _WORKSPACES.get(key)
    if entry is None or entry[0].numel() < need:
        size = max(need, 1 << 14, 2 * entry[0].numel() if entry is not None else 0)
        entry = (torch.zeros(size, device=device, dtype=torch.float32), {})
        _WORKSPACES[key] = entry
    views = entry[1].get(sizes)
    if views is None:
        views = entry[1][sizes] = _split(entry[0], sizes)
    return views


def discard(device: torch.device) -> None:
    """Forget the current stream's workspace on ``device`` (after a launch that failed midway)."""
    _WORKSPACES.pop(_key(device), None)


@contextlib.contextmanager
def guarded(device: torch.device) -> Iterator[None]:
    """Around a launch that uses a workspace: a launch that raises discards it."""
    try:
        yield
    except BaseException:
        discard(device)
        raise


def all_zero() -> bool:
    """Whether every workspace is zero (tests: each kernel must leave its workspace clean)."""
    return all(not buf.any() for buf, _ in _WORKSPACES.values())
