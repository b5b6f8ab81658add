"""What plain eager streaming kernels reach at the pointwise study's sizes, as fractions of the
1 GB copy ceiling: copy (1 read, 1 write), add (2 reads, 1 write: the traffic of a pointwise
backward) and addcmul (3 reads, 1 write), timed in rotating turns from L2 read out, as the study
times. A reference for what "0.85 of copy" asks of a 2-read, 1-write pass at 64 MB.

    python scripts/stream_mix_probe.py [--sizes-mb 64 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.results import environment
from tilewise.bench.timing import EventTimer, interleaved

KINDS = {  # name: (fn of (a, b, c, out), tensors streamed)
    "copy 1R1W": (lambda a, b, c, out: out.copy_(a), 2),
    "add 2R1W": (lambda a, b, c, out: torch.add(a, b, out=out), 3),
    "addcmul 3R1W": (lambda a, b, c, out: torch.addcmul(a, b, c, out=out), 4),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ceiling = measure_copy_bandwidth()
    rows = []
    for mb in args.sizes_mb:
        n = (mb << 20) // 2
        tensors = [tuple(torch.randn(n, device="cuda", dtype=torch.float16) for _ in range(4))]
        timers = {k: EventTimer(fn, tensors, settle=3) for k, (fn, _) in KINDS.items()}
        got = interleaved(timers, args.reps, chunks=4)
        for name, (_, streams) in KINDS.items():
            t = got[name]
            if isinstance(t, Exception):  # e.g. out of memory: said, the others still reported
                print(f"{mb:4d} MB  {name:14s} failed: {type(t).__name__}: {t}")
                continue
            frac = streams * n * 2 / t.median_s / ceiling
            rows.append({"mb": mb, "kind": name, "median_s": t.median_s, "frac_copy": frac})
            print(f"{mb:4d} MB  {name:14s} {t.median_s * 1e6:7.1f} us  {frac:.3f} of copy")
        del tensors, timers
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"environment": environment(), "copy_bytes_per_s": ceiling, "rows": rows}
        (args.out / "stream_mix.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
