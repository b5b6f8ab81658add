"""Batch-1 grouped-conv wgrad, every candidate beside cuDNN: where tilewise's autotuned choice
is below cuDNN (issue 3: "never slower than cuDNN at any size"), is any candidate faster?

Times, per shape and dtype, cuDNN (``cudnn.benchmark`` on), tilewise's autotuned choice, every
NVRTC wgrad tile (the candidates, the cluster and row-split tiles and
``EXPERIMENTAL_WGRAD_TILES``) and every Triton config (``--no-triton``: not each one), each by
CUDA-graph replay (device time, no host launch cost: what a captured step pays and what the
autotuner compares). dW only, as cuDNN's call computes (no bias gradient). Each candidate's dW
is first checked against fp64 with a loose bound, 2 |cuDNN - fp64| + 1% of max |fp64|: a sanity
check of what is timed; tests/test_gconv_cuda.py applies the three-way rule.

    python scripts/wgrad_n1_probe.py [--shapes 128:32:5 128:32:7 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.bench.results import environment
from tilewise.bench.timing import time_graph
from tilewise.ops import gconv_cuda, gconv_wgrad
from tilewise.ops._common import num_sms
from tilewise.ops.gconv_config import GConvProblem

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: C:HW:K, the batch-1 cells below cuDNN in session 11 (and a 3x3 control)
DEFAULT_SHAPES = ("128:32:5", "128:32:7", "64:64:5", "256:16:5", "256:16:7", "128:32:3")


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _nvrtc_tiles(c: int, k: int) -> list:
    tiles = gconv_cuda.WGRAD_TILES + gconv_cuda.CLUSTER_WGRAD_TILES
    tiles += gconv_cuda.ROW_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGRAD_TILES
    fitted = (gconv_cuda._fitted(t, c, True) for t in tiles)
    return list(dict.fromkeys(t for t in fitted if gconv_cuda.wgrad_tile_ok(c, k, k, t)))


def probe(
    c: int, hw: int, k: int, dname: str, sets: int = 4, triton: bool = True, n: int = 1
) -> list[dict]:
    dt = DTYPES[dname]
    pad = k // 2
    xs = [(_cl(torch.randn(n, c, hw, hw, device="cuda", dtype=dt)),) for _ in range(sets)]
    args = [(x, _cl(torch.randn_like(x))) for (x,) in xs]
    w_shape = (c, 8, k, k)
    prob = GConvProblem.from_tensors(args[0][0], torch.empty(w_shape), None, pad, pad)
    impls = {
        "cudnn": lambda x, dy: torch.nn.grad.conv2d_weight(
            x, w_shape, dy, padding=pad, groups=c // 8
        ),
        "tilewise": lambda x, dy: gconv_wgrad.wgrad(dy, x, prob, False, False)[0],
    }
    for tile in _nvrtc_tiles(c, k):
        impls[tile.name] = lambda x, dy, t=tile: gconv_cuda.wgrad(dy, x, k, k, pad, pad, False, t)[
            0
        ]
    configs = gconv_wgrad.wgrad_candidates(prob, num_sms(args[0][0].device)) if triton else ()
    for cfg in configs:
        name = (
            f"triton_m{cfg.block_m}c{cfg.block_c}t{cfg.tap_block}s{cfg.chunk_steps}w{cfg.num_warps}"
        )
        impls[name] = lambda x, dy, cfg=cfg: gconv_wgrad.launch_wgrad(
            dy, x, prob, cfg, False, False
        )[0]
    x0, dy0 = args[0]
    ref = torch.nn.grad.conv2d_weight(
        x0.double(), w_shape, dy0.double(), padding=pad, groups=c // 8
    )
    same = impls["cudnn"](x0, dy0).double()
    rows = []
    for name, fn in impls.items():
        row = dict(c=c, hw=hw, k=k, n=n, dtype=dname, impl=name)
        try:
            out = fn(x0, dy0).double()
            err = (out - ref).abs()
            bound = 2 * (same - ref).abs() + 1e-2 * ref.abs().max()
            row["check"] = "ok" if bool((err <= bound).all()) else "BAD"
            row["max_err"] = err.max().item()
            row["median_s"] = time_graph(fn, args, warmup=3, rounds=4, replays=25).median_s
        except Exception as exc:  # a tile that fails to compile or launch is reported
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    base = next((r.get("median_s") for r in rows if r["impl"] == "cudnn"), None)
    for r in rows:
        if r.get("median_s") and base:
            r["x_cudnn"] = base / r["median_s"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="C:HW:K")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    ap.add_argument("--no-triton", action="store_true", help="skip timing each Triton config")
    ap.add_argument("--n", type=int, default=1, help="batch size (default 1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    for shape in args.shapes:
        c, hw, k = (int(v) for v in shape.split(":"))
        for dname in args.dtypes:
            got = probe(c, hw, k, dname, triton=not args.no_triton, n=args.n)
            rows += got
            timed = sorted((r for r in got if "median_s" in r), key=lambda r: r["median_s"])
            print(f"--- C={c} {hw}x{hw} {k}x{k} N={args.n} {dname}")
            for r in timed[:8] + [r for r in timed[8:] if r["impl"] in ("tilewise", "cudnn")]:
                ratio = f"{r['x_cudnn']:.2f}x cuDNN" if "x_cudnn" in r else "(no cuDNN time)"
                print(f"  {r['impl']:34s} {r['median_s'] * 1e6:7.2f} us  {ratio}  {r['check']}")
            for r in got:
                if "error" in r or r.get("check") == "BAD":
                    what = r.get("error") or f"BAD, max err {r['max_err']:.3g}"
                    print(f"  {r['impl']}: {what}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "records": rows}, f, indent=1)


if __name__ == "__main__":
    main()
