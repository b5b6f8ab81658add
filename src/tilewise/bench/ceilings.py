"""Hardware ceilings measured in the same run as the kernels they are compared with.

Copy bandwidth is device-to-device ``dst.copy_(src)`` counting bytes read + written; the matmul
rate is ``torch.matmul`` on random n x n operands, fp32 with TF32 off. On a CPU the same
measurements run at small sizes with ``perf_counter`` and are labelled ``method="cpu"``: they
only let the tour run end to end and say nothing about a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tilewise.bench.timing import time_events
from tilewise.registry import DTYPES

CPU_COPY_BYTES = 1 << 26  # 64 MiB
CPU_MATMUL_N = 256


@dataclass(frozen=True)
class Ceilings:
    """Measured roofs: copy bandwidth (B/s, read + write) and matmul FLOP/s per dtype name."""

    copy_bytes_per_s: float
    matmul_flops_per_s: dict[str, float] = field(default_factory=dict)
    device: str = "cuda"
    method: str = "cuda-events"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        return cls(
            copy_bytes_per_s=float(d["copy_bytes_per_s"]),
            matmul_flops_per_s={k: float(v) for k, v in d.get("matmul_flops_per_s", {}).items()},
            device=str(d.get("device", "cuda")),
            method=str(d.get("method", "cuda-events")),
        )


def _device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@contextlib.contextmanager
def tf32_off() -> Iterator[None]:
    """fp32 matmuls in true fp32 inside the block; the previous setting is restored after.

    Uses ``torch.set_float32_matmul_precision`` (the legacy global that inductor also reads);
    if torch reports that the newer per-backend ``fp32_precision`` API is in use, uses that one
    instead, because recent torch refuses to mix the two.
    """
    try:
        previous = torch.get_float32_matmul_precision()
    except RuntimeError:
        previous = None
    if previous is not None:
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)
        return
    matmul = torch.backends.cuda.matmul
    previous_new = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = previous_new


def measure_copy_bandwidth(
    device: torch.device | str | None = None,
    nbytes: int = 1 << 30,
    warmup: int = 5,
    reps: int = 20,
) -> float:
    """Bytes read + written per second by ``dst.copy_(src)`` of ``nbytes`` on one device."""
    dev = _device(device)
    if dev.type != "cuda":
        nbytes = min(nbytes, CPU_COPY_BYTES)
        reps = min(reps, 5)
    numel = max(1, nbytes // 4)
    src = torch.randn(numel, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = time_events(lambda d, s: d.copy_(s), [(dst, src)], warmup=warmup, reps=reps)
    moved = 2 * numel * 4
    del src, dst
    return moved / t.median_s


def measure_matmul_rate(
    device: torch.device | str | None = None,
    dtype: str | torch.dtype = "fp16",
    n: int = 8192,
    warmup: int = 3,
    reps: int = 20,
) -> float:
    """FLOP/s (2 n^3 per product) of ``torch.matmul`` on random n x n operands.

    fp32 runs with TF32 off (the previous setting is restored), so it is the true fp32 roof.
    """
    dev = _device(device)
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if dev.type != "cuda":
        n = min(n, CPU_MATMUL_N)
        reps = min(reps, 5)
    # Never zeros: some hardware is measurably faster on zero operands.
    a = torch.randn(n, n, device=dev, dtype=torch.float32).to(dt)
    b = torch.randn(n, n, device=dev, dtype=torch.float32).to(dt)
    with tf32_off() if dt == torch.float32 else contextlib.nullcontext():
        t = time_events(torch.matmul, [(a, b)], warmup=warmup, reps=reps)
    del a, b
    return 2.0 * n**3 / t.median_s


def measure_ceilings(
    device: torch.device | str | None = None,
    dtypes: Sequence[str] = ("fp32", "fp16", "bf16"),
    copy_bytes: int = 1 << 30,
    matmul_n: int = 8192,
) -> Ceilings:
    """Copy bandwidth and the matmul rate of each dtype on ``device`` (CPU: small, labelled)."""
    dev = _device(device)
    copy = measure_copy_bandwidth(dev, copy_bytes)
    rates = {name: measure_matmul_rate(dev, name, matmul_n) for name in dtypes}
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        name, method = torch.cuda.get_device_name(dev), "cuda-events"
    else:
        name, method = "cpu", "cpu"
    return Ceilings(copy_bytes_per_s=copy, matmul_flops_per_s=rates, device=name, method=method)


def format_ceilings(c: Ceilings) -> str:
    """One short block of text: copy TB/s and matmul TFLOP/s per dtype."""
    unit, scale = ("GB/s", 1e9) if c.method == "cpu" else ("TB/s", 1e12)
    funit, fscale = ("GFLOP/s", 1e9) if c.method == "cpu" else ("TFLOP/s", 1e12)
    label = "CPU (perf_counter, small sizes)" if c.method == "cpu" else c.device
    lines = [f"Ceilings measured on {label}:"]
    lines.append(f"  copy (read + write)  {c.copy_bytes_per_s / scale:9.2f} {unit}")
    for name, rate in c.matmul_flops_per_s.items():
        note = " (TF32 off)" if name == "fp32" else ""
        lines.append(f"  matmul {name:<5}        {rate / fscale:9.1f} {funit}{note}")
    return "\n".join(lines)
