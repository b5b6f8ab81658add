"""GPU kernel time vs wall time of one tilewise grouped-conv fwd+bwd at N=1 (torch.profiler).

python scripts/host_overhead_prof.py
"""

import torch
from torch.profiler import ProfilerActivity, profile

import tilewise

x = torch.randn(1, 64, 16, 16, device="cuda", dtype=torch.float16)
x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
w = (torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16) * 0.1).requires_grad_()
for _ in range(20):
    tilewise.grouped_conv2d(x, w, None, padding=1).sum().backward()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        tilewise.grouped_conv2d(x, w, None, padding=1).sum().backward()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=10))
