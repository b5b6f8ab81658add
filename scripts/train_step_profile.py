"""Where the MLP training step's time goes: per-kernel device time of one step, per impl.

Builds `tilewise bench mlp`'s training problem (8 x Linear(1024) + ReLU, batch 64, AdamW; fp32
with TF32 off unless --dtype says otherwise) and, for eager PyTorch, torch.compile and tilewise
(graph-captured), prints the median step time (CUDA events) and the kernels one step launches
(torch.profiler: launches per step, device us per step). A GPU diagnostic, not a benchmark.

    python scripts/train_step_profile.py [--dtype fp32] [--impls eager compile tilewise] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json

import torch

from tilewise.bench.mlp import _capture, _make_step, _precision, make_mlp, tilewise_mlp
from tilewise.bench.timing import profile_kernels, time_events
from tilewise.registry import DTYPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--shape", nargs=3, type=int, default=(8, 1024, 64), help="layers hidden batch")
    ap.add_argument("--impls", nargs="+", default=["eager", "compile", "tilewise"])
    ap.add_argument("--compile-mode", default="max-autotune")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per impl")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    from tilewise.optim import FusedAdamW

    layers, hidden, batch = args.shape
    dt = DTYPES[args.dtype]
    torch.manual_seed(0)
    out: dict = {"shape": args.shape, "dtype": args.dtype, "impls": {}}
    with _precision(dt):
        model = make_mlp(layers, hidden, "cuda", dt).train()
        x, y = (torch.randn(batch, hidden, device="cuda", dtype=dt) for _ in range(2))
        for impl in args.impls:
            m = copy.deepcopy(model)
            if impl == "tilewise":
                m = tilewise_mlp(m).train()
                step = _make_step(m, FusedAdamW(m.parameters()), x, y)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    losses = [float(step()) for _ in range(3)]
                torch.cuda.current_stream().wait_stream(side)
                step = _capture(step, warm=0)
            else:
                step = _make_step(m, torch.optim.AdamW(m.parameters()), x, y)
                if impl == "compile":
                    step = torch.compile(step, mode=args.compile_mode)
                losses = [float(step()) for _ in range(3)]
            t = time_events(lambda _x, s=step: s(), [(x,)], 10, 100, False)
            prof = profile_kernels(lambda _x, s=step: s(), [(x,)], iters=20, warmup=3)
            per_step = prof.per_call_s * 1e6
            print(
                f"\n== {impl}: step {t.median_s * 1e6:.1f} us (events, median); "
                f"kernels {per_step:.1f} us device per step; losses {losses}"
            )
            rows = []
            for k in prof.kernels[: args.top]:
                launches = k.count / prof.calls
                us = k.total_s / prof.calls * 1e6
                rows.append({"name": k.name[:90], "launches": launches, "us": us})
                print(f"  {us:8.1f} us  x{launches:5.1f}  {k.name[:90]}")
            total_launches = sum(k.count for k in prof.kernels) / prof.calls
            print(f"  launches per step: {total_launches:.0f}")
            out["impls"][impl] = {
                "step_us": t.median_s * 1e6,
                "device_us": per_step,
                "launches": total_launches,
                "top": rows,
                "losses": losses,
            }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
