"""The grouped conv's data movement alone (``tilewise.bench.tma_copy``): TMA tile pipelines of
several shapes timed beside torch's ``copy_`` of the same bytes, in one run, by graph replay over
the same rotated sets. Says whether the 3x3 row-pair kernel's ~0.87 of a same-size copy (session
43, H200, C=64 N=128) is its pipeline's ceiling, and which box rows, stages and CTAs an SM move
more.

    python scripts/tma_copy_probe.py [--n 128 256] [--only REGEX] [--json out.json]

A config is ``mode,cb,th,tw,halo,stages,ctas[,threads]`` (``--configs``); each is checked first
(``y`` poisoned with NaN, then equal to ``x``, zero, or untouched by mode).
"""

from __future__ import annotations

import argparse
import json
import re

import torch

from tilewise.bench.results import environment
from tilewise.bench.streams import measure_stream_bandwidth
from tilewise.bench.timing import l2_cache_bytes, rotation_count, time_calls
from tilewise.bench.tma_copy import TmaCopy, TmaCopyConfig

#: the conv pick's movement (staged, 32-channel 8x16 at 4 CTAs an SM) and its neighbours: 128-byte
#: rows (64 channels) at several boxes, stages and CTAs an SM, the copy without halo or staging,
#: loads and stores alone (session 44's first run found the 64-byte rows' loads at 0.65 of the
#: read ceiling, 128-byte rows' at 0.85-0.90)
DEFAULT_CONFIGS = (
    "copy,32,8,16,0,2,4 copy,64,8,16,0,2,4 copy,64,8,16,0,3,4 copy,64,8,64,0,3,1 "
    "staged,32,8,16,2,2,4 staged,32,8,8,2,2,6 staged,32,8,64,2,2,1 "
    "staged,64,8,16,2,2,3 staged,64,8,8,2,2,4 staged,64,8,8,2,2,5 staged,64,4,16,2,2,4 "
    "staged,64,4,32,2,2,3 staged,64,8,16,2,3,2 staged,64,16,16,2,2,1 staged,64,8,32,2,2,1 "
    "staged,64,4,64,2,2,1 staged,64,4,64,2,3,1 "
    "loads,32,8,16,2,2,4 loads,64,8,16,2,2,3 stores,32,8,16,2,2,4 stores,64,8,16,2,2,3 "
    "staged,64,8,8,2,2,4,256 ldst,64,8,16,0,2,4 ldst,64,8,8,0,2,8 ldst,32,8,16,0,2,4,256"
).split()


#: the modes that move every byte both ways (``y`` ends equal to ``x``)
COPIES = ("copy", "staged", "ldst")


def parse_config(text: str) -> TmaCopyConfig:
    """``mode,cb,th,tw,halo,stages,ctas[,threads]`` as a config (``ValueError`` naming what is
    wrong)."""
    parts = text.split(",")
    if len(parts) not in (7, 8):
        raise ValueError(
            f"argument 'configs': {text!r} is not mode,cb,th,tw,halo,stages,ctas[,threads]"
        )
    mode, *nums = parts
    cb, th, tw, halo, stages, ctas, *threads = (int(v) for v in nums)
    extra = {"threads": threads[0]} if threads else {}
    return TmaCopyConfig(
        cb=cb, tw=tw, th=th, halo=halo, stages=stages, ctas=ctas, mode=mode, **extra
    )


def stream_bytes(cfg: TmaCopyConfig, x: torch.Tensor) -> int:
    """Compulsory bytes a pass of ``cfg`` moves over ``x``: read and write for the copies, one
    of them for the loads or stores alone."""
    nbytes = x.numel() * x.element_size()
    return 2 * nbytes if cfg.mode in COPIES else nbytes


def check(op: TmaCopy, cfg: TmaCopyConfig, x: torch.Tensor, y: torch.Tensor) -> None:
    """One launch into a NaN-poisoned ``y``, judged by mode; AssertionError with the mode."""
    y.fill_(float("nan"))
    op()
    torch.cuda.synchronize()
    if cfg.mode in COPIES:
        ok = torch.equal(y, x)
    elif cfg.mode == "stores":
        ok = bool((y == 0).all())
    else:
        ok = bool(y.isnan().all())
    if not ok:
        raise AssertionError(f"{cfg.name}: y is not what mode {cfg.mode!r} leaves")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--hw", type=int, default=64)
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS))
    ap.add_argument("--only", default=None, help="regex on config names")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    configs = [parse_config(c) for c in args.configs]
    if args.only:
        configs = [c for c in configs if re.search(args.only, c.name)]
    ceil = measure_stream_bandwidth(nbytes=1 << 30)
    by_mode = {"copy": "copy", "staged": "copy", "ldst": "copy", "loads": "read", "stores": "write"}
    print("  ".join(f"{k} {v / 1e12:.3f} TB/s" for k, v in ceil.items()))
    rows = []
    for n in args.n:
        shape = (n, args.c, args.hw, args.hw)
        nbytes = n * args.c * args.hw * args.hw * 2
        sets = rotation_count(2 * nbytes, l2_cache_bytes())
        pairs = []
        for _ in range(sets):
            x = torch.randn(shape, device="cuda", dtype=torch.float16)
            x = x.to(memory_format=torch.channels_last)
            pairs.append((x, torch.empty_like(x)))
        t_copy = time_calls(lambda x, y: y.copy_(x), pairs).median_s
        print(
            f"N={n}: {nbytes / 1e6:.1f} MB a tensor, {sets} sets; torch copy_ "
            f"{t_copy * 1e6:.1f} us ({2 * nbytes / t_copy / ceil['copy_bytes_per_s']:.3f} "
            "of the 1 GiB copy)"
        )
        for cfg in configs:
            try:
                ops = [TmaCopy(cfg, x, y) for x, y in pairs]
                check(ops[0], cfg, *pairs[0])
                t = time_calls(lambda op: op(), [(op,) for op in ops]).median_s
            except (ValueError, AssertionError) as exc:  # a CUDA error (sticky) ends the run
                print(f"  {cfg.name:28s} failed: {type(exc).__name__}: {exc}")
                rows.append({"n": n, "config": cfg.name, "error": str(exc)})
                continue
            moved = stream_bytes(cfg, pairs[0][0])
            ceiling = ceil[f"{by_mode[cfg.mode]}_bytes_per_s"]
            row = {
                "n": n,
                "config": cfg.name,
                "mode": cfg.mode,
                "median_s": t,
                "bytes": moved,
                "frac_ceiling": moved / t / ceiling,
                "ceiling": by_mode[cfg.mode],
                "frac_same_copy": t_copy / t if cfg.mode in COPIES else None,
                "smem": ops[0].smem,
                "grid": list(ops[0].grid),
            }
            rows.append(row)
            same = f"{row['frac_same_copy']:.3f}" if row["frac_same_copy"] else "  -  "
            print(
                f"  {cfg.name:28s} {t * 1e6:7.1f} us  {row['frac_ceiling']:.3f} of "
                f"{by_mode[cfg.mode]:5s}  {same} of same-size copy  smem {ops[0].smem}"
            )
        rows.append({"n": n, "config": "torch_copy", "median_s": t_copy, "bytes": 2 * nbytes})
        del pairs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "ceilings": ceil, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
