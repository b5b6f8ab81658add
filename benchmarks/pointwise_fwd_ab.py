"""Forward launch configs of bias_act and layer_norm against torch.compile, in the pointwise
study's own timing path, interleaved in rotating turns.

The study times the public functions (``tilewise.bias_act`` under ``no_grad``, CUDA events with a
lead spin, inputs rotated past L2); ``tune_pointwise.py`` calls ``ops`` directly and has read the
same kernel 1-2 points of copy higher (session 10: 0.923 against the study's 0.906-0.913). Where
the forwards tie with torch.compile (session 11 and 17: 0.90-0.92 of copy both), a config is only
worth shipping if it wins here, against compile timed in the same turns.

    python benchmarks/pointwise_fwd_ab.py --out out/ [--reps 300] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.pointwise import SETTLE_CALLS, _arg_sets, implementation
from tilewise.bench.results import environment
from tilewise.bench.timing import EventTimer, interleaved
from tilewise.ops import _common
from tilewise.ops import bias_act as ba
from tilewise.ops import layernorm as ln
from tilewise.ops._common import TileConfig
from tilewise.registry import OPS, RowsProblem

MB64 = 64 << 20


def _default(op: str, p: RowsProblem) -> TileConfig:
    if op == "bias_act":
        return ba._config("bias_act_fwd", p.m, p.n, p.elem_bytes)
    return ln._config("layer_norm_fwd", p.m, p.n, p.elem_bytes)


def candidates(op: str, p: RowsProblem) -> dict[str, TileConfig | None]:
    """The shipped config (None), streaming, and tiles of 1-4 16-byte vectors per thread at
    4-16 warps, one tile per program or a persistent grid pipelined 2-3 deep."""
    base = _default(op, p)
    vec = 16 // p.elem_bytes
    out: dict[str, TileConfig | None] = {"default": None}
    out["streaming"] = replace(base, streaming=True)
    for warps in (4, 8, 16):
        for per_thread in (1, 2, 4):
            tile = 32 * warps * vec * per_thread
            bn = base.block_n if op == "layer_norm" else min(base.block_n, tile)
            if tile < bn or (op == "layer_norm" and tile // bn > 16):
                continue
            cfg = TileConfig(tile // bn, bn, warps, progs_per_sm=8, prefetch=False)
            if cfg != base:
                out[f"{tile // bn}x{bn}/w{warps}"] = cfg
    for pps, stages in ((4, 2), (8, 2), (4, 3)):
        out[f"persistent {pps}/SM st{stages}"] = replace(base, progs_per_sm=pps, stages=stages)
    return out


def _tilewise_fn(spec, act: str, kernel: str, cfg: TileConfig | None):
    fn = implementation(spec, "tilewise", act)

    def call(inputs: dict) -> torch.Tensor:
        if cfg is None:
            _common.CONFIG_OVERRIDES.pop(kernel, None)
        else:
            _common.CONFIG_OVERRIDES[kernel] = lambda *_: cfg
        with torch.no_grad():
            return fn(**inputs)

    return call


def _compile_fn(spec, act: str):
    fn = implementation(spec, "compile", act)

    def call(inputs: dict) -> torch.Tensor:
        with torch.no_grad():
            return fn(**inputs)

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--reps", type=int, default=300, help="samples per candidate")
    ap.add_argument("--rounds", type=int, default=6, help="rotating turns")
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    copy_bw = measure_copy_bandwidth()
    dev = torch.device("cuda")
    problems = [("bias_act", 4096, "relu"), ("bias_act", 64, "relu"), ("layer_norm", 1024, "none")]
    results = []
    for op, n, act in problems:
        p = RowsProblem(MB64 // (n * 2), n, args.dtype, act)
        spec = OPS[op]
        sets = [(s,) for s in _arg_sets(spec, p, dev)]
        nbytes = spec.bytes(p, "fwd")
        kernel = f"{op}_fwd"
        timers = {"compile": EventTimer(_compile_fn(spec, act), sets, settle=SETTLE_CALLS)}
        for name, cfg in candidates(op, p).items():
            try:
                timers[name] = EventTimer(
                    _tilewise_fn(spec, act, kernel, cfg), sets, settle=SETTLE_CALLS
                )
            except Exception as exc:  # a config the compiler rejects: said, not timed
                print(f"{op} n={n} {name}: skipped ({type(exc).__name__}: {exc})"[:200])
        _common.CONFIG_OVERRIDES.pop(kernel, None)
        want = timers["compile"].fn(*sets[0])
        for name in [k for k in timers if k != "compile"]:
            out = timers[name].fn(*sets[0])
            out = out[0] if isinstance(out, tuple) else out
            ref = want[0] if isinstance(want, tuple) else want
            if not torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2):
                print(f"{op} n={n} {name}: output differs from torch.compile's; not timed")
                del timers[name]
        got = interleaved(timers, args.reps, chunks=args.rounds)
        _common.CONFIG_OVERRIDES.pop(kernel, None)
        rows = []
        for name, t in got.items():
            if isinstance(t, Exception):
                print(f"{op} n={n} {name}: failed ({type(t).__name__}: {t})"[:200])
                continue
            frac = nbytes / t.median_s / copy_bw
            rows.append({"name": name, "median_s": t.median_s, "p20_s": t.p20_s,
                         "p80_s": t.p80_s, "frac_copy": frac})  # fmt: skip
        rows.sort(key=lambda r: r["median_s"])
        comp = next(r for r in rows if r["name"] == "compile")
        print(f"{op} {args.dtype} n={n} {act}: compile {comp['frac_copy']:.3f}")
        for r in rows:
            print(
                f"  {r['name']:24s} {r['frac_copy']:.3f}  {r['median_s'] * 1e6:6.1f} us "
                f"(p20 {r['p20_s'] * 1e6:.1f}, p80 {r['p80_s'] * 1e6:.1f})  "
                f"x compile {comp['median_s'] / r['median_s']:.3f}"
            )
        results.append({"op": op, "n": n, "m": p.m, "activation": act, "rows": rows})
        del sets, timers
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"pointwise_fwd_ab-{args.dtype}.json"
    payload = {"environment": environment(), "copy_bytes_per_s": copy_bw, "results": results}
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
