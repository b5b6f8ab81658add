"""Every row-pair fprop/dgrad candidate of a grouped conv timed on its own (session 29: the 5x5/7x7
tall tiles beside the others; session 30: and the warpgroup-MMA tiles on an sm_90), C=64 64x64
(``--channels``: 128 at 32x32, 256 at 16x16), fp16 / bf16, as fraction of the copy bandwidth
measured in the same run, with cuDNN beside them. Each tile's output is checked against cuDNN's
first (a relative error).

    python scripts/gconv_wide_probe.py [--kernels 7 5] [--n 128 256] [--json out.json]
        [--extra "32,8,32,4,2,2,rowpair=True,tma=2" ...]   (CudaTile arguments: tiles to time
        beside the candidates, where legal) [--experimental]   (and the EXPERIMENTAL_WGMMA_TILES)
        [--roll]   (and the ROLL_TILES) [--only REGEX]   (only tiles whose name matches)
"""

from __future__ import annotations

import argparse
import json
import re

import torch
import torch.nn.functional as F

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.results import environment
from tilewise.bench.timing import TIMERS, time_calls
from tilewise.ops import gconv_cuda
from tilewise.ops.gconv_config import channels_last_copy
from tilewise.ops.gconv_cuda import CudaTile

#: the issue's shapes: channels -> image side
SIDES = {64: 64, 128: 32, 256: 16}


def _rows(
    k: int,
    n: int,
    dname: str,
    dt: torch.dtype,
    copy_bw: float,
    extra: list[CudaTile],
    c: int = 64,
    only: str | None = None,
    timer: str = "graph",
) -> list[dict]:
    hw, pad = SIDES[c], k // 2
    sets = []
    for _ in range(3):  # 3 x 67 MB at N = 128: each call reads inputs the L2 no longer holds
        x = channels_last_copy(torch.randn(n, c, hw, hw, device="cuda", dtype=dt))
        w = (torch.randn(c, 8, k, k, device="cuda") / (8 * k * k) ** 0.5).to(dt)
        sets.append((x, w, torch.empty_like(x)))  # empty_like keeps x's channels_last
    nbytes = 2 * sets[0][0].nbytes + sets[0][1].nbytes
    wgmma = gconv_cuda.wgmma_usable(sets[0][0])  # the warpgroup-MMA tiles too, on an sm_90
    pool = gconv_cuda.candidates(c, k, k, tma=True, wide_tiles=True, wgmma=wgmma)
    tiles = [t for t in pool if t.rowpair or t.wgmma]
    fitted = (gconv_cuda._fitted(t, c) for t in extra)
    tiles += [t for t in fitted if gconv_cuda.tile_ok(c, k, k, t) and t not in tiles]
    tiles = [t for t in tiles if only is None or re.search(only, t.name)]
    rows, g = [], c // 8
    for dgrad in (False, True):
        impls = {
            "cudnn": (
                (lambda x, w, o: torch.nn.grad.conv2d_input(x.shape, w, x, padding=pad, groups=g))
                if dgrad
                else (lambda x, w, o: F.conv2d(x, w, None, padding=pad, groups=g))
            )
        }
        for t in tiles:
            impls[t.name] = lambda x, w, o, t=t, d=dgrad: gconv_cuda.fprop(
                x, w, None, o, pad, pad, t, d
            )
        x, w, _ = sets[0]
        want = impls["cudnn"](x, w, None).float()
        res = {}
        for name, fn in impls.items():
            try:
                out = torch.full_like(x, float("nan"))
                got = fn(x, w, out)
                err = float((got.float() - want).abs().max() / want.abs().max())
                res[name] = (time_calls(fn, sets, timer).median_s, err)
            except Exception as exc:  # a tile that fails to compile or launch is reported
                print(f"  {name}: {type(exc).__name__}: {exc}"[:300])
        base = res.get("cudnn", (None,))[0]
        for name, (sec, err) in res.items():
            row = dict(pass_="dgrad" if dgrad else "fprop", k=k, c=c, n=n, dtype=dname, impl=name,
                       median_s=sec, frac_copy=nbytes / sec / copy_bw,
                       x_cudnn=base / sec if base else None, rel_err=err, timer=timer)  # fmt: skip
            rows.append(row)
            print(
                f"{row['pass_']:5} C={c} {k}x{k} N={n} {dname} {name:34s} {sec * 1e6:8.1f} us "
                f"{row['frac_copy']:.3f} of copy {row['x_cudnn'] or 0:5.2f}x cuDNN err {err:.1e}"
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[7, 5])
    ap.add_argument("--n", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--channels", type=int, nargs="+", default=[64], choices=sorted(SIDES))
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--extra", nargs="*", default=[], help="CudaTile arguments, one tile each")
    ap.add_argument("--experimental", action="store_true", help="the EXPERIMENTAL_WGMMA_TILES too")
    ap.add_argument("--roll", action="store_true", help="the ROLL_TILES too")
    ap.add_argument("--only", default=None, help="time only tiles whose name matches this regex")
    ap.add_argument("--timer", choices=TIMERS, default="graph", help="before session 42: events")
    args = ap.parse_args()
    extra = [eval(f"CudaTile({spec})") for spec in args.extra]  # a developer's arguments
    extra += list(gconv_cuda.EXPERIMENTAL_WGMMA_TILES) if args.experimental else []
    extra += list(gconv_cuda.ROLL_TILES) if args.roll else []
    torch.backends.cudnn.benchmark = True
    copy_bw = measure_copy_bandwidth()
    print(f"copy: {copy_bw / 1e12:.3f} TB/s; timer: {args.timer}")
    dts = {"fp16": torch.float16, "bf16": torch.bfloat16}
    rows = []
    for c in args.channels:
        for k in args.kernels:
            for n in args.n:
                for dname in args.dtypes:
                    rows += _rows(k, n, dname, dts[dname], copy_bw, extra, c, args.only, args.timer)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": environment(), "copy_bw": copy_bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
