"""How long the grouped conv's autotuning takes, and what it picks, with screening on or off
(``TILEWISE_AUTOTUNE_SCREEN``): run once per setting, each with an empty cache directory.

    TILEWISE_AUTOTUNE_SCREEN=1 python scripts/autotune_screen_probe.py --json screen_on.json
    TILEWISE_AUTOTUNE_SCREEN=0 python scripts/autotune_screen_probe.py --json screen_off.json
    python scripts/autotune_screen_probe.py --cold 1 --json cold.json

``--cold M`` times passes of at least M times the L2 size cold (``gconv_config.COLD_L2_MULTIPLE``;
session 20 call 1 ran it as the default against ``--warm``, now the default). Passes of at most
``gconv_config.BOTH_WAYS_MAX_BYTES`` are timed warm and cold whatever ``--cold`` says.

Each run uses fresh autotune and Triton cache directories (whatever the environment says), so
both settings start cold. Per problem (3x3, the issue's three shapes at ``--n``, fp16 / bf16) and
pass: the wall time of the
first call (compiles and autotuning), the chosen config, and the chosen config's device time
afterwards (CUDA events, three input sets rotated past L2) as a fraction of the copy bandwidth
measured in the same run; the two JSON files compared show what screening saves and whether it
costs a worse pick.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.results import environment
from tilewise.bench.timing import time_events
from tilewise.ops import gconv, gconv_config
from tilewise.runtime import autotune

SHAPES = ((64, 64), (128, 32), (256, 16))
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _passes(w):
    return {
        "fprop": lambda x, dy: gconv.forward(x, w, None, 1, 1),
        "dgrad": lambda x, dy: gconv.backward(dy, x, w, None, 1, 1, (True, False, False))[0],
        "wgrad": lambda x, dy: gconv.backward(dy, x, w, None, 1, 1, (False, True, False), False)[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cold", type=float, default=None, help="cold timing from M x the L2 size")
    args = ap.parse_args()
    if args.cold is not None:
        gconv_config.COLD_L2_MULTIPLE = args.cold
    args.warm = gconv_config.COLD_L2_MULTIPLE == float("inf")
    # fresh autotune and Triton caches every run: a cache the other setting filled would make
    # this run's first calls cheap and its picks the other run's
    os.environ[autotune.ENV_CACHE_DIR] = tempfile.mkdtemp(prefix="tw-screen-")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tw-screen-triton-")
    screen = os.environ.get(autotune.ENV_SCREEN, "1") != "0"
    copy_bw = measure_copy_bandwidth()
    rows = []
    for c, hw in SHAPES:
        for dname, dt in DTYPES.items():
            sets = [
                (_cl(torch.randn(args.n, c, hw, hw, device="cuda", dtype=dt)),
                 _cl(torch.randn(args.n, c, hw, hw, device="cuda", dtype=dt)))
                for _ in range(3)
            ]  # fmt: skip
            w = torch.randn(c, 8, 3, 3, device="cuda", dtype=dt) * 0.1
            nbytes = 2 * sets[0][0].nbytes
            for pass_, fn in _passes(w).items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                with autotune.recording() as picks:
                    fn(*sets[0])
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                picked = [str(cfg) for _, _, cfg in picks]
                sec = time_events(fn, sets, warmup=5, reps=30).median_s
                rows.append(dict(pass_=pass_, c=c, hw=hw, n=args.n, dtype=dname, screen=screen,
                                 warm=args.warm, configs=picked, first_call_s=first_s, median_s=sec,
                                 frac_copy=nbytes / sec / copy_bw))  # fmt: skip
                print(f"{pass_} C={c:3d} N={args.n} {dname} screen={int(screen)}: first call "
                      f"{first_s:6.2f} s, then {sec * 1e6:7.1f} us = "
                      f"{nbytes / sec / copy_bw:.3f} of copy; {' '.join(picked)}")  # fmt: skip
    total = sum(r["first_call_s"] for r in rows)
    print(f"first calls in all: {total:.1f} s (screen={int(screen)}, warm={int(args.warm)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "copy_bytes_per_s": copy_bw, "rows": rows},
                      f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
