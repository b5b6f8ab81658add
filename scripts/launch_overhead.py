"""Host cost of one launch: torch ops, a bare Triton kernel (3 and 25 arguments), and the
grouped conv's layers (public function, op body, kernel launch alone). Tiny tensors, so every
figure is host time; the GPU never falls behind.

python scripts/launch_overhead.py [--profile]
"""

import sys

import torch
import triton
import triton.language as tl

import tilewise
from tilewise.bench.timing import host_us_per_call
from tilewise.ops import gconv
from tilewise.ops.gconv_config import GConvProblem, default_config


@triton.jit
def _k3(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


@triton.jit
def _k25(
    x_ptr,
    y_ptr,
    a_ptr,
    b_ptr,
    n,
    c,
    h,
    w,
    p,
    q,
    e,
    f,
    g,
    s0,
    s1,
    s2,
    s3,
    t0,
    t1,
    t2,
    t3,
    A: tl.constexpr,
    B: tl.constexpr,
    C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


x = torch.randn(1024, device="cuda")
y = torch.empty_like(x)
xc = torch.randn(1, 64, 16, 16, device="cuda", dtype=torch.float16)
xc = xc.contiguous(memory_format=torch.channels_last)
wc = torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.float16) * 0.1
out = torch.empty_like(xc)
cfg = default_config(GConvProblem.from_tensors(xc, wc, None, 1, 1), "fprop", 132)
ints = list(range(1, 18))
rows = {
    "torch.add": lambda: torch.add(x, x, out=y),
    "torch.empty (channels_last)": lambda: torch.empty(
        xc.shape, dtype=xc.dtype, device="cuda", memory_format=torch.channels_last
    ),
    "triton 3 args": lambda: _k3[(1,)](x, y, 1024, BLOCK=1024),
    "triton 25 args": lambda: _k25[(1,)](x, y, x, y, 1024, *ints[:16], A=1, B=2, C=3, BLOCK=1024),
    "gconv launch_fprop": lambda: gconv.launch_fprop(xc, wc, None, out, 1, 1, cfg),
    "gconv.forward (op body)": lambda: gconv.forward(xc, wc, None, 1, 1),
    "tilewise.grouped_conv2d": lambda: tilewise.grouped_conv2d(xc, wc, None, padding=1),
    "F.conv2d (cuDNN)": lambda: torch.nn.functional.conv2d(xc, wc, None, padding=1, groups=8),
}
print(f"triton {triton.__version__}, torch {torch.__version__}")
for name, fn in rows.items():
    print(f"{name:30s} {host_us_per_call(fn, iters=2000):8.1f} us/call")

if "--profile" in sys.argv:
    import cProfile
    import pstats

    for name in ("triton 3 args", "tilewise.grouped_conv2d"):
        fn = rows[name]
        print(f"--- cProfile: {name}")
        cProfile.run("for _ in range(2000): fn()", "/tmp/launch.prof")
        pstats.Stats("/tmp/launch.prof").sort_stats("tottime").print_stats(14)
