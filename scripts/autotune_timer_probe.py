"""Which of the autotuner's timers ranks the grouped conv's candidates as the study does (session
41: on the H200, whose L2 holds 60 MB, the study's warm-timed picks at C=64 3x3 N = 128 / 256 ran
42.4 / 82.2 us by graph replay while the wide probe read another tile at 40.3-41.6 / 75.3-76.4).

Per problem and pass, every candidate the autotuner would time (the NVRTC tiles and cuDNN; the
Triton configs with ``--triton``) is read four ways: ``warm`` (``autotune._bench``: graph replays
of one input set, what a pass above ``BOTH_WAYS_MAX_BYTES`` is chosen by), ``screen`` (the brief
warm reading that drops candidates first), ``cold`` (``autotune._bench_cold``: L2 read out
before each run) and ``rotated`` (a CUDA graph over three input sets, the study's graph column).
The table is sorted by ``rotated`` (or the first of ``--timers``); the last lines say what each
timer would pick and what that pick costs in that time.

Session 46: ``--rounds R`` walks the candidates R times in turn (each read by every timer before
the next; the table takes each timer's median over the rounds, the JSON keeps every reading in
the order taken), and ``--clocks`` notes the SM clock, power and throttle
reasons (``nvidia-smi``) after each candidate's readings, to tell whether a candidate's warm
reading depends on what ran before it (the MBConv C=1024 16x16 N=256 fprop's 8x8 64-channel tile
read 74 us by the screen and 88-91 us by the full warm timing, twice, on one machine). ``--side``
and ``--weight`` give problems off the study's shapes and a channels_last weight.

    python scripts/autotune_timer_probe.py [--n 128 256] [--kernels 3] [--channels 64]
        [--dtypes fp16] [--passes fprop dgrad] [--side H] [--weight contiguous|channels_last]
        [--rounds 1] [--clocks] [--timers warm screen cold rotated] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import subprocess

import torch

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.gconv import SHAPES, make_activations, make_weight
from tilewise.bench.results import environment
from tilewise.bench.timing import GraphTimer
from tilewise.ops import gconv, gconv_cuda, gconv_library
from tilewise.ops._common import num_sms
from tilewise.ops.gconv_config import GConvProblem
from tilewise.runtime import autotune

#: the study's shapes: channels -> image side
SIDES = {c: h for c, h, _ in SHAPES}
TIMERS = ("warm", "screen", "cold", "rotated")


def _name(cfg) -> str:
    return getattr(cfg, "name", None) or str(cfg)


def _clocks() -> str:
    """The SM clock (MHz), power (W) and active throttle reasons, as ``nvidia-smi`` reads them
    now ('' where it cannot)."""
    query = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        got = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return got.stdout.strip()


def _read(fn, sets, device, timers=TIMERS) -> dict[str, float]:
    """Milliseconds of ``fn`` by each of ``timers`` (inf where one fails; the others absent)."""
    out = {}
    for timer, read in (
        ("warm", lambda: autotune._bench(lambda: fn(*sets[0]))),
        ("screen", lambda: autotune._bench_screen(lambda: fn(*sets[0]))),
        ("cold", lambda: autotune._bench_cold(lambda: fn(*sets[0]), device)),
        ("rotated", lambda: statistics.median(GraphTimer(fn, sets).sample(20)) * 1e3),
    ):
        if timer not in timers:
            continue
        try:
            out[timer] = float(read())
        except Exception as exc:  # a tile the compiler or device rejects: no reading
            print(f"  {timer} failed: {exc}")
            out[timer] = math.inf
    return out


def probe(
    c: int,
    k: int,
    n: int,
    dname: str,
    pass_: str,
    triton: bool,
    copy_bw: float,
    only: str = "",
    opts: argparse.Namespace | None = None,
) -> dict:
    side, weight = (opts.side, opts.weight) if opts else (None, "contiguous")
    rounds, clocks = (opts.rounds, opts.clocks) if opts else (1, False)
    timers = tuple(opts.timers) if opts else TIMERS
    hw, pad, dev = side or SIDES[c], k // 2, torch.device("cuda")
    problem = GConvProblem(n, c, hw, hw, k, k, pad, pad, dname)
    sets = []
    for _ in range(3):  # three sets: each call reads inputs the L2 no longer holds
        x, dy = make_activations(problem, dev)  # dy's shape and layout: the output buffer
        w = make_weight(problem, dev)
        if weight == "channels_last":  # a model's weight after .to(memory_format=channels_last)
            w = w.contiguous(memory_format=torch.channels_last)
        sets.append((x, w, dy))
    dgrad = pass_ == "dgrad"
    x0, w0, _ = sets[0]
    level = gconv._cuda_level(x0, sets[0][2])
    library = gconv_library.offered(x0, False)
    sms = num_sms(x0.device)
    cands = gconv._candidates(problem, pass_, sms, level, library, gconv_cuda.wide_tiles_offered())
    if not triton:
        cands = tuple(cf for cf in cands if not hasattr(cf, "block_m"))
    if only:  # e.g. a device call's few tiles, and a control the change under study leaves alone
        cands = tuple(cf for cf in cands if re.search(only, _name(cf)))
        if not cands:
            raise ValueError(f"argument '--only' {only!r} keeps no candidate")

    rows = []
    for rnd, cfg in itertools.product(range(rounds), cands):

        def fn(x, w, o, cfg=cfg, p=k - 1 - pad if dgrad else pad):  # dgrad: R - 1 - pad
            return gconv._launch(x, w, None, o, p, p, cfg, dgrad)

        ms = _read(fn, sets, x0.device, timers)
        row = dict(config=_name(cfg), round=rnd, seq=len(rows), **ms)  # seq: the order they ran
        if clocks:
            row["clocks"] = _clocks()  # sm MHz, mem MHz, W, C, throttle reasons
        if rounds > 1 or clocks:  # the sequence as it ran
            cols = " ".join(f"{t} {ms[t] * 1e3:6.1f}" for t in timers)
            print(f"  round {rnd} {row['config']:40s} {cols}  {row.get('clocks', '')}")
        rows.append(row)
    nbytes = 2 * x0.nbytes + w0.nbytes
    order = "rotated" if "rotated" in timers else timers[0]
    # one line a config: each timer's median over the rounds
    table = []
    for name in dict.fromkeys(r["config"] for r in rows):
        got = [r for r in rows if r["config"] == name]
        table.append(dict(config=name, **{t: statistics.median(r[t] for r in got) for t in timers}))
    if not any(math.isfinite(r[order]) for r in table):
        raise RuntimeError(f"no candidate of {pass_} C={c} {k}x{k} N={n} {dname} gave a time")
    table.sort(key=lambda r: r[order])
    per = f"median of {rounds} rounds; " if rounds > 1 else ""
    print(f"\n{pass_} C={c} {k}x{k} N={n} {dname} ({len(table)} candidates; {per}us; {order} "
          "also as fraction of copy)")  # fmt: skip
    print(f"{'config':44s}" + "".join(f"{t:>10s}" for t in timers) + "      frac")
    for r in table:
        frac = nbytes / (r[order] * 1e-3) / copy_bw if math.isfinite(r[order]) else 0.0
        cols = "".join(f"{r[t] * 1e3:10.1f}" for t in timers)
        print(f"{r['config']:44s}{cols}{frac:10.3f}")
    best = table[0][order]
    picks = {}
    for t in timers:
        pick = min(table, key=lambda r, t=t: r[t])
        loss = pick[order] / best
        picks[t] = dict(config=pick["config"], time=pick[order], loss=loss)
        print(f"  {t:8s} picks {pick['config']:44s} {order} {pick[order] * 1e3:7.1f} us "
              f"({loss:.3f}x the best)")  # fmt: skip

    def plain(r: dict) -> dict:  # strict JSON: a failed reading as null
        bad = [k for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
        return {**r, **dict.fromkeys(bad)}

    return dict(
        c=c, k=k, n=n, side=hw, weight=weight, dtype=dname, pass_=pass_, bytes=nbytes,
        timed_by=order, rows=[plain(r) for r in table], readings=[plain(r) for r in rows],
        picks=picks,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--kernels", type=int, nargs="+", default=[3])
    ap.add_argument("--channels", type=int, nargs="+", default=[64])
    ap.add_argument("--side", type=int, default=None, help="image side (default: the study's)")
    ap.add_argument("--weight", default="contiguous", choices=["contiguous", "channels_last"])
    ap.add_argument("--rounds", type=int, default=1, help="walks over the candidates, in turn")
    ap.add_argument("--clocks", action="store_true", help="nvidia-smi's clocks after each")
    ap.add_argument("--timers", nargs="+", default=list(TIMERS), choices=TIMERS)
    ap.add_argument("--dtypes", nargs="+", default=["fp16"], choices=["fp16", "bf16"])
    ap.add_argument("--passes", nargs="+", default=["fprop", "dgrad"], choices=["fprop", "dgrad"])
    ap.add_argument("--triton", action="store_true", help="the Triton configs too")
    ap.add_argument("--only", default="", help="a regex: time only the candidates it matches")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.rounds < 1:
        raise ValueError(f"argument '--rounds' must be at least 1, got {args.rounds}")
    if args.side is None and any(c not in SIDES for c in args.channels):
        raise ValueError(f"argument '--side' is needed for channels outside {sorted(SIDES)}")
    copy_bw = measure_copy_bandwidth()
    print(f"copy: {copy_bw / 1e12:.3f} TB/s")
    grid = itertools.product(args.channels, args.kernels, args.n, args.dtypes, args.passes)
    out = [probe(*cell, args.triton, copy_bw, args.only, args) for cell in grid]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "copy_bytes_per_s": copy_bw, "problems": out},
                      f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
