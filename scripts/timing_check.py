"""Event timing vs graph replay vs host time for one NVRTC gconv launch and cuDNN (a check of
the CUDA-event figures, which read 6-9x the profiler's device time for tilewise on some runs).

    python scripts/timing_check.py
"""

import time

import torch
import torch.nn.functional as F

from tilewise.bench.timing import _sleep_cycles_per_s, time_events, time_graph
from tilewise.ops import gconv_cuda


def host_us(fn, iters=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / iters * 1e6, (t2 - t0) / iters * 1e6


cl = torch.channels_last
x = torch.randn(128, 64, 64, 64, device="cuda", dtype=torch.float16).contiguous(memory_format=cl)
w = torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16) * 0.1
out = torch.empty_like(x)
print(f"sleep cycles/s {_sleep_cycles_per_s(torch.cuda.current_device()):.3e}")
for name, fn in (
    ("nvrtc", lambda: gconv_cuda.fprop(x, w, None, out, 1, 1)),
    ("cudnn", lambda: F.conv2d(x, w, None, padding=1, groups=8)),
):
    h, total = host_us(fn)
    ev = time_events(fn, [()], warmup=10, reps=50).median_s * 1e6
    ev0 = time_events(fn, [()], warmup=10, reps=50, keep_ahead=False).median_s * 1e6
    gr = time_graph(fn, [()]).median_s * 1e6
    print(
        f"{name}: host {h:.1f} us/call, wall {total:.1f} us/call, events+lead {ev:.1f} us, "
        f"events {ev0:.1f} us, graph {gr:.1f} us"
    )
