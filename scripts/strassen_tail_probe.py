"""Can Strassen's 7 half-size products beat cuBLAS's wave quantization at batch 512?

At M x H = 512 x 4096 (fp32, TF32 off) each product [256 x 2048] x [2048 x 2048] is ~32 output
tiles, so the 7 run as ~224 tiles on 132 SMs: two waves for 1.7 waves of work, which is why the
one ``bmm`` reaches only ~0.90x the full product's rate (session 14). Here ``full`` products run
whole in one ``bmm`` on the current stream while the other ``7 - full`` run split over K in
``split`` slices (one ``bmm`` over strided K slices each, on side streams: parallel branches of
the captured graph), so the tail of the schedule is made of smaller pieces; the fp32 partial
products are then summed (``+sum``: that sum timed too; a suffix kernel could fuse it).

    python scripts/strassen_tail_probe.py [--shapes 512:4096 512:8192 1024:4096] [--json F]
"""

from __future__ import annotations

import argparse
import json

import torch

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.results import environment
from tilewise.bench.timing import time_graph
from tilewise.ops import strassen


def tail_products(p, blocks, out, scratch, full: int, split: int, streams, reduce: bool):
    """out[:full] by one bmm; products full.. as split-K partials into scratch (summed into
    out[full:] when ``reduce``)."""
    current = torch.cuda.current_stream(p.device)
    for s in streams:
        s.wait_stream(current)
    try:
        if full:
            torch.bmm(p[:full], blocks[:full].transpose(1, 2), out=out[:full])
        kh = p.shape[2]
        ks = kh // split
        for j, i in enumerate(range(full, 7)):
            with torch.cuda.stream(streams[j % len(streams)]):
                a = p[i].as_strided((split, p.shape[1], ks), (ks, kh, 1))
                b = blocks[i].as_strided(
                    (split, ks, blocks.shape[1]),
                    (ks * blocks.stride(2), blocks.stride(2), blocks.stride(1)),
                )
                torch.bmm(a, b, out=scratch[j])
    finally:
        for s in streams:
            current.wait_stream(s)
    if reduce:
        torch.sum(scratch, dim=1, out=out[full:])
    return out


def probe(m: int, h: int) -> dict:
    f32 = dict(device="cuda", dtype=torch.float32)
    mh, hh = m // 2, h // 2
    full_sets = [(torch.randn(m, h, **f32), torch.randn(h, h, **f32)) for _ in range(2)]
    halves = [
        (
            torch.randn(7, mh, hh, **f32),
            strassen.format_weights(torch.randn(h, h, **f32), layout="nn"),
        )
        for _ in range(2)
    ]
    out = torch.empty(7, mh, hh, **f32)
    streams = [torch.cuda.Stream() for _ in range(7)]
    rows = {}
    t = time_graph(torch.nn.functional.linear, full_sets, warmup=3, rounds=2, replays=30)
    rows["full"] = t.median_s * 1e6
    t = time_graph(lambda p, f: strassen.run_products(strassen.BMM, p, f, out), halves, 3, 2, 30)
    rows["bmm7"] = t.median_s * 1e6
    ref = torch.bmm(halves[0][0], halves[0][1].transpose(1, 2))
    for full in (3, 4, 5):
        for split in (2, 4, 8):
            scratch = torch.empty(7 - full, split, mh, hh, **f32)
            for reduce in (False, True):

                def fn(p, f, full=full, split=split, scratch=scratch, reduce=reduce):
                    return tail_products(p, f, out, scratch, full, split, streams, reduce)

                name = f"tail{full}x{split}" + ("+sum" if reduce else "")
                t = time_graph(fn, halves, 3, 2, 30)
                rows[name] = t.median_s * 1e6
                if reduce:
                    fn(*halves[0])
                    torch.cuda.synchronize()
                    err = (out - ref).abs().max().item() / ref.abs().max().item()
                    rows[name + "_relerr"] = err
    return {"m": m, "hidden": h, "us": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["512:4096", "512:8192", "1024:4096"])
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    with tf32_off():
        for shape in args.shapes:
            m, h = map(int, shape.split(":"))
            r = probe(m, h)
            results.append(r)
            us = r["us"]
            print(
                f"M={m} H={h}: full {us['full']:.1f} us, bmm7 {us['bmm7']:.1f} us "
                f"(bound {us['full'] / us['bmm7']:.3f}x)"
            )
            for k, v in us.items():
                if k.startswith("tail") and not k.endswith("_relerr"):
                    err = us.get(k + "_relerr")
                    extra = f" relerr {err:.1e}" if err is not None else ""
                    print(f"  {k:14s} {v:8.1f} us  bound {us['full'] / v:.3f}x{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
