"""Is the linear weight-gradient GEMM (``ops.linear._launch`` with the bias-gradient sum fused)
exact run after run on this GPU? Session 8's `test_linear.py` saw 135 of 16.7M fp16 dweight
elements off by up to 8 (values ~50) at x [2048, 4096], n = 4096, with a bias and no activation.

Runs the dW GEMM ``dy^T @ x`` repeatedly per config (pipeline stages, with and without the fused
bias-gradient sum) and counts elements farther than 4 half-precision ulps from an fp32 product.
A GPU diagnostic, not a test:

    python scripts/linear_dw_diag.py [--reps 5] [--m 2048] [--n 4096] [--k 4096] [--time]

``--time`` also times each config (median of CUDA events), with the fused bias-gradient sum and
with a GELU derivative prologue, pipelined as configured and unpipelined (what tilewise runs
for half-precision backward GEMMs, ``gemm.PIPELINE_HALF_BACKWARD``), beside cuBLAS's
``dy^T @ x`` alone.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from tilewise.bench.timing import time_events
from tilewise.ops import gemm, linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--m", type=int, default=2048, help="rows of x (the GEMM's K)")
    ap.add_argument("--n", type=int, default=4096, help="out features")
    ap.add_argument("--k", type=int, default=4096, help="in features")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--time", action="store_true", help="time pipelined against unpipelined")
    args = ap.parse_args()
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(args.m, args.k, device="cuda").to(dt)
    dy = torch.randn(args.m, args.n, device="cuda").to(dt)
    ref = dy.float().t() @ x.float()
    db_ref = dy.float().sum(0)
    tol = 4 * torch.finfo(dt).eps * ref.abs() + 1e-3
    base = linear.gemm_config(args.n, args.k, args.m, x.element_size(), x.device)
    gemm.PIPELINE_HALF_BACKWARD = True  # the configs' own stages (tilewise runs these at 1)
    for stages in (base.num_stages, 2, 1):
        cfg = dataclasses.replace(base, num_stages=stages)
        for with_db in (True, False):
            bad_runs = []
            for _ in range(args.reps):
                db = torch.full((args.n,), float("nan"), device="cuda") if with_db else None
                dw = linear._launch(dy.t(), x, dt, False, cfg=cfg, db=db)[0]
                bad = int(((dw.float() - ref).abs() > tol).sum())
                db_bad = int(((db - db_ref).abs() > 1e-2).sum()) if with_db else 0
                bad_runs.append((bad, db_bad))
            print(f"{cfg} db={with_db}: bad dw/db elements per run {bad_runs}", flush=True)
    if args.time:
        _time(base, x, dy, dt)


def _time(base, x: torch.Tensor, dy: torch.Tensor, dt: torch.dtype) -> None:
    """Median times (us) of the dW GEMM per stage count: + db, + GELU prologue + db; cuBLAS."""
    saved = torch.randn_like(dy)
    db = torch.empty(dy.shape[1], device="cuda", dtype=torch.float32)
    sets = [(dy.t(), x)]
    cublas = time_events(lambda a, b: a @ b, sets, warmup=5, reps=30).median_s
    print(f"cuBLAS dy^T @ x: {cublas * 1e6:.1f} us", flush=True)
    for stages in sorted({base.num_stages, 2, 1}, reverse=True):
        cfg = dataclasses.replace(base, num_stages=stages)
        for label, dact in (("db", None), ("gelu+db", ("gelu", saved.t(), None, 0))):

            def run(a, b, cfg=cfg, dact=dact):
                return linear._launch(a, b, dt, False, cfg=cfg, db=db, dact=dact)

            sec = time_events(run, sets, warmup=5, reps=30).median_s
            print(f"stages={stages} {label}: {sec * 1e6:.1f} us ({cublas / sec:.2f}x cuBLAS mm)")


if __name__ == "__main__":
    main()
