"""Host overhead per grouped-conv call at N=1 (launch-bound): tilewise vs cuDNN, fwd and fwd+bwd.

python scripts/host_overhead.py
"""

import torch
import torch.nn.functional as F

import tilewise
from tilewise.bench.timing import host_us_per_call

x = torch.randn(1, 64, 16, 16, device="cuda", dtype=torch.float16)
x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
w = (torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16) * 0.1).requires_grad_()
rows = {
    "tilewise fwd": lambda: tilewise.grouped_conv2d(x, w, None, padding=1),
    "cudnn fwd": lambda: F.conv2d(x, w, None, padding=1, groups=8),
    "tilewise fwd+bwd": lambda: tilewise.grouped_conv2d(x, w, None, padding=1).sum().backward(),
    "cudnn fwd+bwd": lambda: F.conv2d(x, w, None, padding=1, groups=8).sum().backward(),
}
for name, fn in rows.items():
    print(f"{name:18s} {host_us_per_call(fn, iters=200):8.1f} us/call")

if __import__("sys").argv[1:] == ["--profile"]:
    import cProfile
    import pstats

    fn = rows["tilewise fwd+bwd"]
    cProfile.run("for _ in range(200): fn()", "/tmp/host.prof")
    pstats.Stats("/tmp/host.prof").sort_stats("tottime").print_stats(22)
