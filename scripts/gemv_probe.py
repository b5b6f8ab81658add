"""The few-row fp32 forward GEMV (``ops.gemv_cuda``) against PyTorch and tilewise's choice.

Per shape (M rows, K, N) and dtype, graph replay of back-to-back layers with distinct weights
(as in a deep MLP; at least 8 sets and more than twice L2 in all, so the weights come from DRAM
where the model's would), bias + ReLU, in microseconds per layer and the weights' read rate:

* ``torch``: ``relu(F.linear(x, W, b))``, what PyTorch + CUDA graph runs;
* ``tilewise``: ``ops.linear.forward`` with the autotuner's choice (printed);
* each ``GemvConfig`` candidate, forced, and the same with twice and half the K split.

    python scripts/gemv_probe.py [--shapes 16:1024:1024 ...] [--dtype fp32] [--json F]
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.results import environment
from tilewise.bench.timing import time_graph
from tilewise.ops import gemv_cuda, linear
from tilewise.ops._common import num_sms

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _variants(m: int, n: int, k: int, sms: int) -> list[gemv_cuda.GemvConfig]:
    """The autotuner's candidates and, per candidate, twice and half its K split."""
    base = list(gemv_cuda.candidates(m, n, k, sms))
    extra = []
    for c in base:
        for sp in (2 * c.split_k, c.split_k // 2):
            if sp >= 1:
                extra.append(gemv_cuda.GemvConfig(c.rows_per_warp, c.warps, sp))
    return list(dict.fromkeys(base + extra))


def probe(m: int, k: int, n: int, dtype: torch.dtype) -> dict:
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    sets = max(8, -(-2 * l2 // (k * n * dtype.itemsize)))
    x = torch.randn(m, k, device=dev, dtype=dtype)
    args = [
        (
            torch.randn(n, k, device=dev, dtype=dtype) / k**0.5,
            torch.randn(n, device=dev, dtype=dtype),
        )
        for _ in range(sets)
    ]
    wbytes = n * k * dtype.itemsize
    rows = {}

    def timed(name: str, fn) -> None:
        try:
            t = time_graph(fn, args, rounds=2).median_s
            rows[name] = {"us": t * 1e6, "weights_gbps": wbytes / t / 1e9}
        except Exception as exc:  # a config the compiler or the shape rejects
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}

    timed("torch", lambda w, b: torch.relu_(torch.nn.functional.linear(x, w, b)))
    timed("tilewise", lambda w, b: linear.forward(x, w, b, "relu")[0])
    for cfg in _variants(m, n, k, num_sms(dev)):
        timed(repr(cfg), lambda w, b, c=cfg: gemv_cuda.forward(x, w, b, "relu", c))
        if "error" in rows[repr(cfg)]:
            continue
        # correctness of what was timed, against PyTorch in fp64
        y = gemv_cuda.forward(x, args[0][0], args[0][1], "relu", cfg).double()
        ref = torch.relu(x.double() @ args[0][0].double().t() + args[0][1].double())
        rows[repr(cfg)]["max_err"] = (y - ref).abs().max().item()
    return {"m": m, "k": k, "n": n, "sets": sets, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes",
        nargs="+",
        default=["2:1024:1024", "8:1024:1024", "16:1024:1024", "2:2048:2048", "16:4096:4096"],
    )
    ap.add_argument("--dtype", default="fp32", choices=tuple(DTYPES))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    out = []
    with tf32_off():
        for spec in args.shapes:
            m, k, n = (int(v) for v in spec.split(":"))
            res = probe(m, k, n, dtype)
            res["dtype"] = args.dtype
            out.append(res)
            print(f"M={m} K={k} N={n} {args.dtype} ({res['sets']} weight sets): us/layer, GB/s")
            for name, r in res["rows"].items():
                if "error" in r:
                    print(f"  {name[:72]:72s} {r['error'][:60]}")
                else:
                    err = f"  err {r['max_err']:.1e}" if "max_err" in r else ""
                    print(f"  {name[:72]:72s} {r['us']:7.2f} {r['weights_gbps']:7.0f}{err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
