"""Read-only and write-only bandwidth: the two halves of the copy ceiling, measured apart.

Session 41 (H200) found the grouped conv's 3x3 kernels bound by their memory traffic, with the
halo loads and the output stores each slower alone than half a copy, and no read-only ceiling to
judge the loads by (torch's int32 ``sum``, tried, is not memory-bound: 0.77 TB/s). The read
stream here is a Triton kernel that loads 16-byte vectors and keeps one int32 sum per program, so
it moves ``nbytes`` in and a few bytes out; the write stream is ``fill_``. Both are timed as the
copy ceiling is (``bench.timing.time_events``) and reported in bytes moved per second.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilewise.bench.ceilings import CPU_COPY_BYTES, measure_copy_bandwidth
from tilewise.bench.timing import time_events

#: int32 elements a program reads per step (16 a thread at 8 warps: four 16-byte loads)
READ_BLOCK = 4096
#: steps a program takes: programs of 128 KiB each
READ_STEPS = 8


@triton.jit
def _read_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    base = pid.to(tl.int64) * BLOCK * STEPS  # 64-bit: tensors past 2^31 elements (8 GiB)
    for i in range(STEPS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_sum(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-program int32 sums (wrapping) of the contiguous int32 tensor ``x``: every element
    read once. ``out`` (optional) holds one int32 per program."""
    if x.dtype != torch.int32 or not x.is_contiguous():
        raise ValueError(
            f"argument 'x' must be a contiguous int32 tensor, got {x.dtype} "
            f"({'contiguous' if x.is_contiguous() else 'not contiguous'})"
        )
    n = x.numel()
    programs = triton.cdiv(max(n, 1), READ_BLOCK * READ_STEPS)
    if out is None:
        out = torch.empty(programs, dtype=torch.int32, device=x.device)
    elif out.numel() != programs or out.dtype != torch.int32:
        raise ValueError(f"argument 'out' must hold {programs} int32 values")
    _read_sum_kernel[(programs,)](x, out, n, BLOCK=READ_BLOCK, STEPS=READ_STEPS, num_warps=8)
    return out


def measure_stream_bandwidth(
    device: torch.device | str | None = None,
    nbytes: int = 1 << 30,
    warmup: int = 5,
    reps: int = 20,
) -> dict[str, float]:
    """Bytes per second of a read-only stream (``read_sum``), a write-only one (``fill_``) and
    the copy ceiling (read + write), ``nbytes`` each, on one device."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda":
        nbytes = min(nbytes, CPU_COPY_BYTES)
        reps = min(reps, 5)
    numel = max(1, nbytes // 4)
    x = torch.randint(-8, 8, (numel,), device=dev, dtype=torch.int32)
    out = read_sum(x)
    read = time_events(lambda a, o: read_sum(a, o), [(x, out)], warmup=warmup, reps=reps)
    write = time_events(lambda a: a.fill_(1), [(x,)], warmup=warmup, reps=reps)
    moved = numel * 4
    del x, out
    copy = measure_copy_bandwidth(dev, nbytes, warmup, reps)
    return {
        "read_bytes_per_s": moved / read.median_s,
        "write_bytes_per_s": moved / write.median_s,
        "copy_bytes_per_s": copy,
    }
