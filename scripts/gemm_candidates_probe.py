"""Every GEMM candidate of tilewise.linear on the MLP training step's three GEMMs, timed alone.

For each of forward (relu + bias epilogue), dx (relu-derivative prologue) and dW (prologue plus
bias-gradient sum), batch 64 x hidden 1024 by default: the first call's wall time (compile
included), the graph-replay device time the autotuner would see, or the exception a candidate
raised, and which candidate the autotuner picks. A GPU diagnostic, not a benchmark.

    python scripts/gemm_candidates_probe.py [--dtype fp32] [--m 64] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import time
import traceback

import torch

from tilewise.ops import linear as lin
from tilewise.registry import DTYPES
from tilewise.runtime import autotune


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    dt = DTYPES[args.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    m, h = args.m, args.hidden
    x = torch.randn(m, h, device="cuda", dtype=dt)
    w = torch.randn(h, h, device="cuda", dtype=dt) / h**0.5
    b = torch.randn(h, device="cuda", dtype=dt)
    dy = torch.randn(m, h, device="cuda", dtype=dt)
    y = torch.relu(x @ w.t() + b)
    db = torch.empty(h, device="cuda", dtype=dt)
    gemms = {
        "fwd relu+bias": (x, w.t(), lambda c: lin._launch(x, w.t(), dt, False, b, "relu", cfg=c)),
        "dx dact:relu": (
            dy,
            w,
            lambda c: lin._launch(dy, w, dt, False, cfg=c, dact=("relu", y, None, 1)),
        ),
        "dW dact:relu+db": (
            dy.t(),
            x,
            lambda c: lin._launch(
                dy.t(), x, dt, False, cfg=c, dact=("relu", y.t(), None, 2), db=db
            ),
        ),
    }
    for name, (a, bmat, run) in gemms.items():
        mm, kk = a.shape
        nn_ = bmat.shape[1]
        ieee = dt == torch.float32
        cands = lin._candidates(mm, nn_, kk, a.element_size(), ieee, True, 132)
        print(f"\n== {name}: M={mm} N={nn_} K={kk} {args.dtype}")
        cublas_us = autotune._bench(lambda a=a, bmat=bmat: torch.mm(a, bmat)) * 1e3
        print(f"  {'cublas mm alone':44s} {cublas_us:8.1f} us")
        for c in cands:
            if c == lin.CUBLAS:
                continue
            tag = f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}"
            try:
                t0 = time.perf_counter()
                run(c)
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                us = autotune._bench(lambda c=c, run=run: run(c)) * 1e3
                print(f"  {tag:44s} {us:8.1f} us   (first call {first:.2f} s)")
            except Exception as exc:  # noqa: BLE001 - report every failure
                print(f"  {tag:44s} FAILED {type(exc).__name__}: {str(exc)[:200]}")
                traceback.print_exc(limit=2)


if __name__ == "__main__":
    main()
