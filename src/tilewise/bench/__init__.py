"""Benchmark harness: ceilings, timers, metrics, result files, plots and the studies.

Figures are quoted as fractions of ceilings measured in the same run (docs: anchors.md).
``plots`` (matplotlib) and the studies are imported on use, not here.
"""

from tilewise.bench.ceilings import (
    Ceilings,
    measure_ceilings,
    measure_copy_bandwidth,
    measure_matmul_rate,
)
from tilewise.bench.metrics import (
    achieved_flops,
    effective_bandwidth,
    fraction,
    fraction_of_copy,
    fraction_of_matmul,
    speedup,
)
from tilewise.bench.results import environment, load_results, save_results
from tilewise.bench.timing import (
    KernelProfile,
    KernelStat,
    Timing,
    l2_cache_bytes,
    profile_kernels,
    rotation_count,
    time_events,
    time_graph,
)

__all__ = [
    "Ceilings",
    "KernelProfile",
    "KernelStat",
    "Timing",
    "achieved_flops",
    "effective_bandwidth",
    "environment",
    "fraction",
    "fraction_of_copy",
    "fraction_of_matmul",
    "l2_cache_bytes",
    "load_results",
    "measure_ceilings",
    "measure_copy_bandwidth",
    "measure_matmul_rate",
    "profile_kernels",
    "rotation_count",
    "save_results",
    "speedup",
    "time_events",
    "time_graph",
]
