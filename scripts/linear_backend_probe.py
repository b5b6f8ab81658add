"""Which GEMM backend tilewise.linear picks per shape, and what each costs timed three ways.

Diagnoses the fp32 small-hidden gap of ``mlp-quick-fp32`` (tilewise 13 us per layer against
cuBLAS's 5 us under graph replay): the autotuner's choice, its ``do_bench`` times, and graph-replay
times of each backend (what the MLP study measures).

python scripts/linear_backend_probe.py
"""

import torch
import triton.testing

from tilewise.ops import linear as lin
from tilewise.runtime import autotune

torch.backends.cuda.matmul.allow_tf32 = False
rows = []
for dtype in (torch.float32, torch.float16):
    for m, n, k in ((64, 256, 256), (2, 256, 256), (64, 1024, 1024), (512, 4096, 4096)):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        b = torch.randn(n, device="cuda", dtype=dtype)
        wt = w.t()

        def run(ch, x=x, wt=wt, b=b):
            if ch == lin.CUBLAS:
                return lin._bias_act.forward(torch.addmm(b, x, wt), None, "relu")
            return lin._launch(x, wt, x.dtype, False, b, "relu", False, cfg=ch)[0]

        chosen = lin._choose(x, wt, False, "relu+bias", run)
        t = {}
        for be in (lin.gemm_config(m, n, k, x.element_size(), x.device), lin.CUBLAS):
            f = lambda be=be: run(be)  # noqa: E731
            name = "cublas" if be == lin.CUBLAS else "triton"
            t[name, "do_bench"] = triton.testing.do_bench(f, return_mode="median") * 1e3
            t[name, "graph"] = triton.testing.do_bench_cudagraph(f, return_mode="median") * 1e3
        rows.append((str(dtype)[6:], m, n, k, str(chosen), t))
print(
    f"{'dtype':8s} {'m':>4s} {'n':>5s} {'k':>5s} {'chosen':8s} "
    "triton(do_bench/graph us)  cublas(do_bench/graph us)"
)
for dt, m, n, k, ch, t in rows:
    print(
        f"{dt:8s} {m:4d} {n:5d} {k:5d} {ch[:8]:8s} {t['triton', 'do_bench']:8.1f} / "
        f"{t['triton', 'graph']:6.1f}        {t['cublas', 'do_bench']:8.1f} / "
        f"{t['cublas', 'graph']:6.1f}"
    )
print("autotune cache:", autotune.cache_path())
