"""Launch configs of bias_act and layer_norm against torch.compile, in the pointwise study's own
timing path (``_pass_call``), interleaved in rotating turns that each start from L2 read out.

The study times the public functions (``tilewise.bias_act`` under ``no_grad``, CUDA events with a
lead spin, inputs rotated past L2); ``tune_pointwise.py`` calls ``ops`` directly and has read the
same kernel 1-2 points of copy higher (session 10: 0.923 against the study's 0.906-0.913). Where
the forwards tie with torch.compile (session 11 and 17: 0.90-0.92 of copy both), a config is only
worth shipping if it wins here, against compile timed in the same turns.

    python benchmarks/pointwise_ab.py --out out/ [--reps 300] [--rounds 6]
    python benchmarks/pointwise_ab.py --pass bwd --problems layer_norm:4096:none
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from dataclasses import replace
from pathlib import Path

import torch
from tune_pointwise import _base  # the shipped config of a kernel (benchmarks/ is on sys.path)

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.pointwise import SETTLE_CALLS, _arg_sets, _pass_call, implementation
from tilewise.bench.results import environment
from tilewise.bench.timing import EventTimer, interleaved
from tilewise.ops import _common
from tilewise.ops import bias_act as ba
from tilewise.ops import layernorm as ln
from tilewise.ops._common import TileConfig
from tilewise.registry import OPS, RowsProblem

MB64 = 64 << 20


def candidates(op: str, p: RowsProblem) -> dict[str, TileConfig | None]:
    """Forward: the shipped config (None), streaming, and tiles of 1-8 16-byte vectors per thread
    at 4-16 warps, one tile per program or a persistent grid pipelined 2-3 deep."""
    base = _base(f"{op}_fwd", p.m, p.n, p.elem_bytes, p.activation)
    vec = 16 // p.elem_bytes
    out: dict[str, TileConfig | None] = {"default": None}
    out["streaming"] = replace(base, streaming=not base.streaming)
    for warps in (4, 8, 16):
        for per_thread in (1, 2, 4, 8):
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


def bwd_candidates(op: str, p: RowsProblem, wide: bool = False) -> dict[str, TileConfig | None]:
    """Backward: the shipped config (None) and pipelined tiles of 1-4 rows (layer_norm: whole
    rows; bias_act: 1024-value column blocks; rows under 1024 values: 2048-8192-value tiles) at
    4-16 warps, 1-4 programs per SM, 2-4 stages, within the shared-memory budget. ``wide``
    also tries up to 64 warps per SM, 32-warp programs and register loops (stages 1, with and
    without the next step's tile prefetched into registers) at 1-16 programs per SM."""
    bn = _common.next_pow2(p.n) if op == "layer_norm" else min(1024, _common.next_pow2(p.n))
    out: dict[str, TileConfig | None] = {"default": None}
    row_counts = (1, 2, 4) if bn >= 1024 else tuple(t // bn for t in (2048, 4096, 8192))
    per_sm = (1, 2, 3, 4, 8, 16) if wide else (1, 2, 3, 4)
    for rows, warps, pps, stages in itertools.product(
        row_counts,
        (4, 8, 16, 32) if wide else (4, 8, 16),
        per_sm,
        (1, 2, 3, 4) if wide else (2, 3, 4),
    ):
        per_thread = rows * bn // (32 * warps)
        smem = pps * stages * 2 * rows * bn * p.elem_bytes if stages > 1 else 0
        least = 4 if wide else 8
        if not least <= per_thread <= 32 or smem > 220 * 1024 or pps * warps > (64 if wide else 32):
            continue
        name = f"{rows}x{bn}/w{warps} {pps}/SM st{stages}"
        out[name] = TileConfig(rows, bn, warps, pps, prefetch=False, stages=stages)
        if stages == 1 and wide:
            out[name + " pf"] = TileConfig(rows, bn, warps, pps, prefetch=True, stages=1)
    return out


def _timer(
    spec, impl: str, act: str, pass_: str, sets: list[dict], cfg=None, variant: str = ""
) -> EventTimer:
    """``variant``: "deterministic" (PyTorch's deterministic mode: stored partial rows summed by
    torch instead of fp32 atomics), "no-affine" (layer_norm without weight and bias, so no
    reduction over rows at all: the cost of the dw/db reductions, by difference) or "slotsK" (K
    accumulator copies for the atomic sums instead of ``atomic_slots``'s choice)."""
    fn = implementation(spec, impl, act)
    kernel = f"{spec.name}_{pass_}"
    if variant == "no-affine":  # layer_norm without weight and bias; bias_act without bias
        spec = replace(spec, grad_inputs=("x",))
        sets = [{**s, **{k: None for k in ("weight", "bias") if k in s}} for s in sets]
    call, args = _pass_call(fn, spec, sets, pass_)

    def timed(*a):
        if impl == "tilewise":
            if cfg is None:
                _common.CONFIG_OVERRIDES.pop(kernel, None)
            else:
                _common.CONFIG_OVERRIDES[kernel] = lambda *_: cfg
        if variant.startswith("slots"):  # accumulator copies of the atomic dw/db/dbias sums
            mod = ln if spec.name == "layer_norm" else ba
            keep, mod.atomic_slots = mod.atomic_slots, lambda *_, k=int(variant[5:]): k
            try:
                return call(*a)
            finally:
                mod.atomic_slots = keep
        if variant == "deterministic":
            torch.use_deterministic_algorithms(True, warn_only=True)
            try:
                return call(*a)
            finally:
                torch.use_deterministic_algorithms(False)
        return call(*a)

    return EventTimer(timed, args, settle=SETTLE_CALLS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--reps", type=int, default=300, help="samples per candidate")
    ap.add_argument("--rounds", type=int, default=6, help="rotating turns")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd"))
    ap.add_argument("--only-default", action="store_true", help="no config candidates")
    ap.add_argument("--wide", action="store_true", help="backward: up to 64 warps per SM")
    ap.add_argument("--no-variants", action="store_true", help="backward: no reduction variants")
    ap.add_argument("--match", default=None, help="only candidates whose name matches this regex")
    ap.add_argument(
        "--all-no-affine",
        action="store_true",
        help="every candidate without weight/bias (torch.compile keeps them: its 'x compile' "
        "then compares different problems)",
    )
    ap.add_argument(
        "--problems",
        nargs="+",
        default=["bias_act:4096:relu", "bias_act:64:relu", "layer_norm:1024:none"],
        help="op:n:activation (64 MB tensors)",
    )
    args = ap.parse_args()
    copy_bw = measure_copy_bandwidth()
    dev = torch.device("cuda")
    results = []
    for prob in args.problems:
        op, n, act = prob.split(":")
        n = int(n)
        elem = RowsProblem(1, n, args.dtype, act).elem_bytes
        p = RowsProblem(MB64 // (n * elem), n, args.dtype, act)
        spec = OPS[op]
        sets = _arg_sets(spec, p, dev)
        nbytes = spec.bytes(p, args.pass_)
        kernel = f"{op}_{args.pass_}"
        timers = {}
        try:
            timers["compile"] = _timer(spec, "compile", act, args.pass_, sets)
        except Exception as exc:  # the tilewise candidates are still compared with each other
            print(f"{op} n={n} compile: not timed ({type(exc).__name__}: {exc})"[:200])
        cands = candidates(op, p) if args.pass_ == "fwd" else bwd_candidates(op, p, args.wide)
        if args.only_default:
            cands = {"default": None}
        if args.match:
            cands = {k: v for k, v in cands.items() if k == "default" or re.search(args.match, k)}
        if args.pass_ == "bwd" and not args.no_variants:
            cands.update({"deterministic": None, "no-affine": None})
            cands.update({f"slots{k}": None for k in (1, 2, 4, 8, 16)})
        if args.pass_ == "bwd":  # plain streaming with the same traffic: 2 reads, 1 write
            ab = [tuple(torch.randn(p.m, p.n, device=dev).to(sets[0]["x"].dtype) for _ in "abo")]
            timers["eager add 2R1W"] = EventTimer(
                lambda a, b, o: torch.add(a, b, out=o), ab, settle=SETTLE_CALLS
            )
        for name, cfg in cands.items():
            variant = name if name in ("deterministic", "no-affine") or "slots" in name else ""
            variant = "no-affine" if args.all_no_affine and not variant else variant
            try:
                timers[name] = _timer(spec, "tilewise", act, args.pass_, sets, cfg, variant)
            except Exception as exc:  # a config the compiler rejects: said, not timed
                print(f"{op} n={n} {name}: skipped ({type(exc).__name__}: {exc})"[:200])
        _common.CONFIG_OVERRIDES.pop(kernel, None)
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
        comp = next((r for r in rows if r["name"] == "compile"), None)
        head = f"compile {comp['frac_copy']:.3f}" if comp else "compile not timed"
        print(f"{op} {args.pass_} {args.dtype} n={n} {act}: {head}")
        for r in rows[:16] + [r for r in rows[16:] if r["name"] == "default"]:
            print(
                f"  {r['name']:28s} {r['frac_copy']:.3f}  {r['median_s'] * 1e6:6.1f} us "
                f"(p20 {r['p20_s'] * 1e6:.1f}, p80 {r['p80_s'] * 1e6:.1f})  "
                + (f"x compile {comp['median_s'] / r['median_s']:.3f}" if comp else "")
            )
        results.append({"op": op, "pass": args.pass_, "n": n, "m": p.m, "activation": act,
                        "rows": rows})  # fmt: skip
        del sets, timers
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"pointwise_ab-{args.pass_}-{args.dtype}.json"
    payload = {"environment": environment(), "copy_bytes_per_s": copy_bw, "results": results}
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
