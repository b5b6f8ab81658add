"""Can tensor cores give fp32-accurate GEMMs faster than cuBLAS's SIMT SGEMM? (issue 4's Strassen
cell at 512 x 4096, fp32 with TF32 off, where cuBLAS's half-size products cap Strassen at 1.04x.)

Triton splits each fp32 operand into tensor-core pieces (``tl.dot(input_precision=...)``):
``tf32x3`` (hi*hi + hi*lo + lo*hi in TF32), ``bf16x3`` and ``bf16x6`` (three bf16 pieces). Per
shape and precision this times ``ops.gemm_fp32tc``'s batched GEMM over a few tiles (session 27's
call 1 ran the same loop through a kernel of the probe's own, before that module existed), by
CUDA-graph replay over two input sets, against cuBLAS fp32 with TF32 off and on. It measures the
error against an fp64 product: the RMS and max relative error (to the output's RMS) and the worst
three-way ratio ``max |out - ref| / (2 |cublas_fp32 - ref| + atol)`` at the tests' fp32
tolerance ``atol = 1e-5 * sqrt(K) * rms`` and at a 10x tighter one.

    python scripts/fp32_tc_probe.py [--shapes 1:512:4096:4096 7:256:2048:2048] [--json F]
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.results import environment
from tilewise.bench.timing import time_graph
from tilewise.ops import gemm_fp32tc

# (BM, BN, BK, warps, stages)
TILES = (
    (128, 128, 32, 8, 3),
    (128, 128, 32, 4, 3),
    (128, 256, 32, 8, 3),
    (64, 128, 32, 4, 4),
    (128, 64, 32, 4, 4),
    (128, 128, 16, 8, 4),
)
PRECISIONS = ("tf32x3", "bf16x3", "bf16x6", "tf32")


def bgemm(a, b, c, prec, tile):
    bm, bn, bk, w, st = tile
    return gemm_fp32tc.bmm(a, b, c, gemm_fp32tc.Fp32TcConfig(bm, bn, bk, w, st, precision=prec))


def errors(out, cub, ref, k):
    o, t, r = out.double(), cub.double(), ref
    rms = r.square().mean().sqrt().item()
    err = (o - r).abs()
    row = {"rms_rel": (err.square().mean().sqrt() / rms).item(), "max_rel": err.max().item() / rms}
    for name, scale in (("ratio", 1e-5), ("ratio_tight", 1e-6)):
        atol = scale * k**0.5 * rms
        row[name] = (err / (2 * (t - r).abs() + atol)).max().item()
    return row


def probe(bt: int, m: int, n: int, k: int, device: str = "cuda") -> dict:
    dev = dict(device=device, dtype=torch.float32)
    # weights K fastest (a transposed view of [B, N, K]), as format_weights' "nt" blocks
    sets = [
        (torch.randn(bt, m, k, **dev), torch.randn(bt, n, k, **dev).transpose(1, 2))
        for _ in range(2)
    ]
    out = torch.empty(bt, m, n, **dev)
    flops = 2 * bt * m * n * k
    a0, b0 = sets[0]
    ref = torch.bmm(a0.double(), b0.double())
    row: dict = {"batch": bt, "m": m, "n": n, "k": k}
    with tf32_off():
        cub = torch.bmm(a0, b0)
        t = time_graph(lambda a, b: torch.bmm(a, b, out=out), sets, rounds=2, replays=10).median_s
    row["cublas_ieee"] = {"us": t * 1e6, "tflops": flops / t / 1e12, **errors(cub, cub, ref, k)}
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        got = torch.bmm(a0, b0)
        t = time_graph(lambda a, b: torch.bmm(a, b, out=out), sets, rounds=2, replays=10).median_s
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    row["cublas_tf32"] = {"us": t * 1e6, "tflops": flops / t / 1e12, **errors(got, cub, ref, k)}
    for prec in PRECISIONS:
        best = None
        for tile in TILES:
            try:
                got = bgemm(a0, b0, out.clone(), prec, tile)
                t = time_graph(
                    lambda a, b, p=prec, tl_=tile: bgemm(a, b, out, p, tl_),
                    sets,
                    rounds=2,
                    replays=10,
                ).median_s
            except Exception as exc:  # an unsupported precision or a tile that does not fit
                why = f"{prec} {tile}: {type(exc).__name__}: {exc}"
                row.setdefault("failed", []).append(why[:300])
                continue
            rec = {"us": t * 1e6, "tflops": flops / t / 1e12, "tile": tile}
            rec.update(errors(got, cub, ref, k))
            if best is None or rec["us"] < best["us"]:
                best = rec
        if best is not None:
            row[prec] = best
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1:512:4096:4096", "7:256:2048:2048"])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    rows = []
    for spec in args.shapes:
        bt, m, n, k = (int(v) for v in spec.split(":"))
        row = probe(bt, m, n, k, args.device)
        rows.append(row)
        print(f"{bt} x {m} x {n} x {k}")
        for name, rec in row.items():
            if isinstance(rec, dict):
                print(
                    f"  {name:12s} {rec['us']:9.1f} us {rec['tflops']:6.1f} TF/s  rms_rel "
                    f"{rec['rms_rel']:.2e} max_rel {rec['max_rel']:.2e} ratio {rec['ratio']:.3f} "
                    f"tight {rec['ratio_tight']:.3f} {rec.get('tile', '')}"
                )
        for line in row.get("failed", []):
            print("  failed:", line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
