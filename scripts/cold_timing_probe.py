"""Does the linear autotuner's cold-L2 timing predict what a layer costs with its weights in DRAM?

Session 14 saw the autotuner (``autotune._bench_cold``: L2 zeroed before each timed run) rank a
cuBLAS split-K forward first at shapes where the MLP study then ran it 1-14% slower, and time a
4096-hidden layer at 41 us that the study ran at 33 us. Zeroing leaves L2 full of dirty lines
whose write-back competes with the timed kernel. Per shape and per forward candidate of
``ops.linear`` (bias + ReLU), this prints, in microseconds:

* ``warm``: graph replay on the same operands (``autotune._bench``);
* ``cold0``: the autotuner's cold timing, L2 zeroed;
* ``coldR``: the same with L2 evicted by reading (``flush_by="read"``: no dirty lines);
* ``dram``: graph replay over enough distinct weight sets to exceed 2x L2, no flush at all:
  the weights really come from DRAM, as in a deep model; the reference for the cold columns.

    python scripts/cold_timing_probe.py [--shapes 4:4096:4096 8:2048:2048 64:1024:1024] [--json F]
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.results import environment
from tilewise.bench.timing import time_graph
from tilewise.ops import linear
from tilewise.ops._common import num_sms
from tilewise.runtime import autotune


def _candidates(m: int, k: int, n: int, dtype: torch.dtype) -> tuple:
    ieee = dtype == torch.float32
    args = (m, n, k, dtype.itemsize, ieee, True, num_sms(torch.device("cuda")))
    return linear._candidates(*args, ieee, True, True, ieee)


def probe(m: int, k: int, n: int, dtype: torch.dtype) -> list[dict]:
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    sets = max(2, -(-2 * l2 // (k * n * dtype.itemsize)))
    x = torch.randn(m, k, device=dev, dtype=dtype)
    ws = [torch.randn(n, k, device=dev, dtype=dtype) / k**0.5 for _ in range(sets)]
    bs = [torch.randn(n, device=dev, dtype=dtype) for _ in range(sets)]
    rows = []
    for cand in _candidates(m, k, n, dtype):
        linear_choose = linear._choose
        linear._choose = lambda *a, c=cand, **kw: c
        try:

            def fn(w=ws[0], b=bs[0]):
                return linear.forward(x, w, b, "relu")[0]

            row = {"candidate": repr(cand)}
            row["warm"] = autotune._bench(fn) * 1e3
            row["cold0"] = autotune._bench_cold(fn, dev, flush_by="zero") * 1e3
            row["coldR"] = autotune._bench_cold(fn, dev, flush_by="read") * 1e3
            t = time_graph(lambda w, b: fn(w, b), list(zip(ws, bs, strict=True)), rounds=2)
            row["dram"] = t.median_s * 1e6
        except Exception as exc:  # a candidate the shape rejects
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            linear._choose = linear_choose
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4:4096:4096", "8:2048:2048", "64:1024:1024"])
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    out = []
    with tf32_off():
        for spec in args.shapes:
            m, k, n = (int(v) for v in spec.split(":"))
            print(f"M={m} K={k} N={n} {args.dtype}: us warm / cold0 / coldR / dram")
            rows = probe(m, k, n, dtype)
            for r in rows:
                if "error" in r:
                    print(f"  {r['candidate'][:60]:60s} {r['error'][:60]}")
                    continue
                cols = " / ".join(f"{r[c]:7.1f}" for c in ("warm", "cold0", "coldR", "dram"))
                print(f"  {r['candidate'][:60]:60s} {cols}")
            out.append({"m": m, "k": k, "n": n, "dtype": args.dtype, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
