"""Where the tap wgrad's finish spends its time, by clock stamps inside one launch (session 47).
Session 46's ablation put 2.8-4.5 us of the 3x3 pick in the last CTA's pass over 4,608 sums,
and coalescing that pass (session 46's workspace order) took only 0.2-0.4 us of it
(``TILEWISE_GCONV_WGRAD_FINISH_ORDER`` picks the pass's order; since session 47 "pairs").

``gconv_cuda.WGRAD_STAMPS`` (set here before the first compile) makes thread 0 of every CTA
write ``%globaltimer`` at its start, before its finish and after its count, and the last CTA
its pass's phases (``%globaltimer`` and ``clock64``). Each launch runs eagerly after a sync, the
stamps zeroed before it; the table takes each phase's median over the launches, in ns from the
first CTA's start. The same process also times the stamped kernel by graph replay, to show what
the stamps cost against the ablation probe's figure. With ``TILEWISE_GCONV_WGRAD_ABLATE`` set the
results are wrong (its error printed, not checked): bit 1 no atomics, 64 the pass's loads alone,
128 plain stores for the reductions. Since session 48 each CTA also stamps its main loop's end.

    python scripts/wgrad_stamp_probe.py [--n 8 128] [--reps 30] [--dw-cl] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wgrad_ablate_probe import DEFAULT_TILE, SIDES, _tile, input_sets, relative_error  # noqa: E402

from tilewise.bench.results import environment  # noqa: E402
from tilewise.bench.timing import time_calls  # noqa: E402
from tilewise.ops import gconv_cuda  # noqa: E402

MAX_CTAS = 4096
#: the last CTA's stamp words (as the kernel's STAMP_LAST) and what ends at each
LAST_PHASES = {0: "count seen", 1: "fence after it", 30: "pass done"}


def _launch_phases(buf: torch.Tensor, rounds: int) -> dict:
    """One launch's stamps as phases in ns from the first CTA's start."""
    words = buf.cpu().tolist()
    cta = [words[64 + 4 * b : 68 + 4 * b] for b in range(MAX_CTAS)]
    cta = [w for w in cta if w[0]]
    t0 = min(w[0] for w in cta)
    starts = sorted(w[0] - t0 for w in cta)
    at_finish = sorted(w[1] - t0 for w in cta)
    counted = sorted(w[2] - t0 for w in cta)
    looped = sorted(w[3] - t0 for w in cta)  # session 48: the main loop's end
    out = {
        "ctas": len(cta),
        "last start": starts[-1],
        "median loop done": looped[len(looped) // 2],
        "last loop done": looped[-1],
        "first at finish": at_finish[0],
        "median at finish": at_finish[len(at_finish) // 2],
        "last at finish": at_finish[-1],
        "last counted": counted[-1],
    }
    for k, name in LAST_PHASES.items():
        out[f"last CTA: {name}"] = words[k] - t0
    for r in range(rounds):  # the rounds the kernel ran (the order's, not the dw_out one's)
        if words[10 + r]:
            out[f"last CTA: round {r} loads back"] = words[10 + r] - t0
        if words[2 + r]:
            out[f"last CTA: round {r} stored"] = words[2 + r] - t0
    # clock64 of the last CTA, as cycles after its count was seen
    out["cycles: fence"] = words[33] - words[32]
    out["cycles: pass"] = words[62] - words[33]
    return out


def _row(n: int, c: int, k: int, tile, reps: int, dw_cl: bool, buf: torch.Tensor) -> dict:
    pad = k // 2
    sets = input_sets(n, c)

    def fn(dy, x):
        return gconv_cuda.wgrad(dy, x, k, k, pad, pad, False, tile, dw_cl=dw_cl)[0]

    dy, x = sets[0]
    grid = gconv_cuda.bind_wgrad(dy, x, k, k, pad, pad, False, tile, dw_cl=dw_cl).grid
    if grid[0] * grid[1] * grid[2] > MAX_CTAS:  # the kernel would write past the buffer
        raise ValueError(f"argument '--n': {n} launches {grid} CTAs, more than {MAX_CTAS}")
    err = relative_error(fn, dy, x, k)
    rounds = -(-(tile.cb * 8 * k * k) // (8 * tile.warps * 32))  # the pass's load rounds (FB 8)
    launches = []
    for i in range(reps + 3):
        buf.zero_()
        torch.cuda.synchronize()
        fn(*sets[i % 3])
        torch.cuda.synchronize()
        if i >= 3:  # the first launches warm up
            launches.append(_launch_phases(buf, rounds))
    keys = [k for k in launches[0] if all(k in p for p in launches)]
    phases = {key: statistics.median(p[key] for p in launches) for key in keys}
    return {
        "n": n,
        "c": c,
        "k": k,
        "tile": tile.name,
        "dw_cl": dw_cl,
        "finish_order": gconv_cuda.WGRAD_FINISH_ORDER,
        "ablate": gconv_cuda.WGRAD_ABLATE,
        "graph_us": time_calls(fn, sets).median_s * 1e6,
        "rel_err": err,
        "phases_ns": phases,
        "launches": launches,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8, 128])
    ap.add_argument("--channels", type=int, default=64, choices=sorted(SIDES))
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--tile", default=DEFAULT_TILE)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--dw-cl", action="store_true", help="dw in a channels_last weight's layout")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tile = _tile(args.tile)
    if tile.rowpair or tile.wgmma:  # only the tap kernel stamps its CTAs' starts
        raise ValueError(f"argument '--tile': {tile.name} is no tap wgrad tile")
    if gconv_cuda.WGRAD_ABLATE & (2 | 16):  # no finish, or no pass: nothing to stamp
        raise ValueError("TILEWISE_GCONV_WGRAD_ABLATE bits 2 and 16 leave no pass to stamp")
    buf = torch.zeros(64 + 4 * MAX_CTAS, dtype=torch.int64, device="cuda")
    gconv_cuda.WGRAD_STAMPS = buf.data_ptr()
    rows = []
    for n in args.n:
        row = _row(n, args.channels, args.kernel, tile, args.reps, args.dw_cl, buf)
        rows.append(row)
        print(
            f"stamps C={row['c']} {row['k']}x{row['k']} N={n} {row['tile']} {row['finish_order']} "
            f"ablate {row['ablate']}{' cl' if args.dw_cl else ''}: "
            f"{row['graph_us']:.1f} us by graph replay (stamped), err {row['rel_err']:.1e}"
        )
        for key, v in row["phases_ns"].items():
            print(f"stamps N={n:4d} {key:28s} {v:9.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
