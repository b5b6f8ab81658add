"""Why one-level Strassen gains less at batch 512 than at 4096 (issue 4's 1.10x target): the
GEMM rates cuBLAS reaches on Strassen's 7 half-size products against the one full product.

Per shape (fp32, TF32 off, as the MLP study's Strassen column), CUDA-graph replay of:
* ``full``: ``F.linear(x, W)``, [M, H] x [H, H]^T, the product the fused chain runs;
* ``bmm7``: ``torch.bmm`` of [7, M/2, H/2] x [7, H/2, H/2], Strassen's products;
* ``mm7``: the same 7 products as 7 ``torch.mm`` launches in a row;
* ``mm7s``: the 7 launches spread over 7 streams (``strassen.MM7_STREAMS``), parallel branches of
  the captured graph;
* ``bmm7nt``, ``mm7nt``, ``mm7snt``: the same with the weight blocks stored contiguous as
  [7, N/2, K/2] (NT GEMMs; before session 14 the shipped layout) instead of K-major
  (``strassen.format_weights``, NN GEMMs).
Each with its own FLOP count, so ``rate / full rate`` shows what the half-size products lose,
and ``full / bmm7`` time is the speed-up bound of a Strassen layer whose prefix and suffix cost
nothing (8/7 = 1.14x when the rates are equal).

    python scripts/strassen_wave_probe.py [--shapes 512:4096 512:8192 4096:4096] [--json F]
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.results import environment
from tilewise.bench.timing import time_graph
from tilewise.ops import strassen

VARIANTS = ("bmm7", "mm7", "mm7s", "bmm7nt", "mm7nt", "mm7snt")


def _sets(make, count: int = 2) -> list[tuple]:
    return [make() for _ in range(count)]  # two input sets: weights of >= 64 MB leave L2


def probe(m: int, h: int, device: str = "cuda") -> dict:
    f32 = dict(device=device, dtype=torch.float32)
    mh, hh = m // 2, h // 2
    full = _sets(lambda: (torch.randn(m, h, **f32), torch.randn(h, h, **f32)))
    # "nn" blocks as format_weights stores them for cuBLAS (a transposed view, N fastest)
    halves = _sets(
        lambda: (torch.randn(7, mh, hh, **f32), torch.randn(7, hh, hh, **f32).transpose(1, 2))
    )
    outs = torch.empty(7, mh, hh, **f32)
    halves_nt = [(p, f.contiguous()) for p, f in halves]

    def plan(pl):
        return lambda p, f: strassen.run_products(pl, p, f, outs)

    rows = {}
    seven = 7 * 2 * mh * hh * hh
    for name, fn, sets, flops in (
        ("full", torch.nn.functional.linear, full, 2 * m * h * h),
        ("bmm7", plan(strassen.BMM), halves, seven),
        ("mm7", plan(strassen.MM7), halves, seven),
        ("mm7s", plan(strassen.MM7_STREAMS), halves, seven),
        ("bmm7nt", plan(strassen.BMM), halves_nt, seven),
        ("mm7nt", plan(strassen.MM7), halves_nt, seven),
        ("mm7snt", plan(strassen.MM7_STREAMS), halves_nt, seven),
    ):
        t = time_graph(fn, sets, warmup=3, rounds=2, replays=20).median_s
        rows[name] = {"us": t * 1e6, "tflops": flops / t / 1e12}
    for name in VARIANTS:
        rows[name]["rate_vs_full"] = rows[name]["tflops"] / rows["full"]["tflops"]
        rows[name]["strassen_bound"] = rows["full"]["us"] / rows[name]["us"]
    return {"m": m, "hidden": h, **rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes", nargs="+", default=["512:4096", "512:8192", "1024:4096", "4096:4096"]
    )
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    results = []
    with tf32_off():
        for spec in args.shapes:
            m, h = (int(v) for v in spec.split(":"))
            r = probe(m, h)
            results.append(r)
            line = (
                f"M={m:5d} H={h:5d}  full {r['full']['us']:8.1f} us {r['full']['tflops']:5.1f} TF/s"
            )
            for name in VARIANTS:
                v = r[name]
                rate, bound = v["rate_vs_full"], v["strassen_bound"]
                line += f" | {name} {v['us']:8.1f} us {rate:.2f}x rate, bound {bound:.2f}x"
            print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
