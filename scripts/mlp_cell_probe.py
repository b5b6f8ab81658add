"""What runs in an MLP-study cell: tilewise's GEMM choice per layer and each impl's kernels.

For cells where tilewise reads below PyTorch + CUDA graph (session 14: single layers of 4-6 us),
this prints per cell the forward choice of the first layer (``ops.linear._choose``, recorded),
whether cuBLASLt's bias + ReLU was offered and each impl's replay time as the study takes it;
with ``--profile`` also the kernels one CUDA-graph replay of each impl launches, with their
device times (torch.profiler; CUPTI stays active afterwards and slows later replays, so the
timings of a profiled run are not comparable: run the script once without it for those).

With ``--backends`` it also captures tilewise's chain with every forward forced onto each cuBLAS
backend the GEMM choice offers (``addmm`` + ReLU, ``mm`` + bias_act's epilogue, cuBLASLt's bias
+ ReLU; ``linear._choose`` patched while the chains are captured) and times
them with PyTorch + graph and tilewise in rotating turns (``bench.timing.interleaved``): whether
tilewise's pick, made from short timings of one GEMM, is the fastest in the chain (session 24:
the fused fp32 chain read 0.977x PyTorch + graph at 8 x 512 x 8192).

    python scripts/mlp_cell_probe.py [--cells fp32:1:4:128 bf16:1:4:128 ...] [--profile]
    python scripts/mlp_cell_probe.py --cells fp32:8:512:8192 fp32:8:1024:4096 --backends
    python scripts/mlp_cell_probe.py --cells fp32:8:512:4096 --row-groups

``--row-groups`` times fused Strassen's row groups (``ops.strassen.ROW_GROUPS``, session 25).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.mlp import _capture, make_mlp, tilewise_mlp
from tilewise.bench.timing import GraphTimer, interleaved, time_graph
from tilewise.ops import linear
from tilewise.registry import DTYPES
from tilewise.runtime import autotune


def _kernels(replay) -> list[tuple[str, float]]:
    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return [
        (e.name, e.device_time_total)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]


#: the cuBLAS forward backends of ``ops.linear`` the chain is forced onto, by name
_BACKENDS = {
    "cublas": linear.CUBLAS,  # addmm (bias in cuBLAS's epilogue), then ReLU in place
    "cublas+epilogue": linear.CUBLAS_EPILOGUE,  # mm, then bias_act's bias + ReLU kernel
    "cublaslt-relu": linear.CUBLAS_LT_RELU,  # cuBLASLt's fused bias + ReLU
}


def _forced(tw: nn.Module, backend: Any, forcing: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """``tw`` with every forward GEMM choice answered by ``backend`` (through the patched
    ``linear._choose`` that reads ``forcing``): tilewise's own code path on that backend."""

    def chain(x: torch.Tensor) -> torch.Tensor:
        forcing["backend"] = backend
        try:
            return tw(x)
        finally:
            forcing["backend"] = None

    return chain


def compare_backends(dtype: str, layers: int, batch: int, hidden: int, reps: int = 24) -> None:
    """PyTorch + graph, tilewise (its own picks) and each cuBLAS backend as whole chains, timed
    by graph replay in rotating turns; the first forward pick tilewise made."""
    dt = DTYPES[dtype]
    torch.manual_seed(layers * 1_000_003 + batch * 1009 + hidden)
    eager = make_mlp(layers, hidden, torch.device("cuda"), dt)
    tw = tilewise_mlp(eager)
    x = torch.randn(batch, hidden, device="cuda", dtype=dt)
    forcing: dict = {"backend": None}
    fns = {"graph": eager, "tilewise": tw}
    fns |= {name: _forced(tw, b, forcing) for name, b in _BACKENDS.items()}
    choose = linear._choose

    def forced_choose(a, b, *args, **kwargs):  # forwards only (they pass split_k=True)
        if forcing["backend"] is not None and kwargs.get("split_k"):
            return forcing["backend"]
        return choose(a, b, *args, **kwargs)

    timers, res = {}, {}
    with torch.no_grad(), autotune.recording() as picks:
        linear._choose = forced_choose
        try:
            tw(x)  # the choices, made (or loaded) before capture
            want = eager(x.clone())
            for name, fn in fns.items():
                err = (fn(x.clone()) - want).abs().max().item()
                print(f"  {name:16s} max abs diff from PyTorch {err:.2e}")
            for name, fn in fns.items():
                try:  # one backend that cannot be captured leaves the others their timings
                    timers[name] = GraphTimer(fn, [(x,)], warmup=1, rounds=2)
                except Exception as exc:
                    res[name] = exc
            res |= interleaved(timers, reps, chunks=6)
        finally:
            for t in timers.values():
                t.close()
            linear._choose = choose
    print(f"{dtype} {layers} x {batch} x {hidden} (graph replay, {reps} replays in 6 turns)")
    for op, prob, cfg in [p for p in picks if str(p[0]).startswith("linear")][:1]:
        print(f"  tilewise pick: {op} {prob} -> {cfg}")
    _print_vs_graph(res, list(fns), 16)


def _print_vs_graph(res: dict, names: list[str], width: int) -> None:
    """Each timing in us and against ``res["graph"]`` (nan where graph failed), or its failure."""
    base = res["graph"]
    for name in names:
        t = res[name]
        if isinstance(t, Exception):
            print(f"  {name:{width}s} failed: {t!r}")
            continue
        ratio = base.median_s / t.median_s if not isinstance(base, Exception) else float("nan")
        print(f"  {name:{width}s} {t.median_s * 1e6:10.1f} us  x graph {ratio:.3f}")


def compare_row_groups(dtype: str, layers: int, batch: int, hidden: int, reps: int = 24) -> None:
    """PyTorch + graph, fused Strassen with 1, 2 and 4 row groups forced (``ops.strassen.forward``,
    ``groups=``) and with its own timed choice, whole chains by graph replay in rotating turns."""
    from tilewise.nn.strassen import StrassenMLP
    from tilewise.ops import strassen

    dt = DTYPES[dtype]
    torch.manual_seed(layers * 1_000_003 + batch * 1009 + hidden)
    eager = make_mlp(layers, hidden, torch.device("cuda"), dt)
    model = StrassenMLP.from_modules(eager, mode="strassen")
    x = torch.randn(batch, hidden, device="cuda", dtype=dt)
    blocks = [getattr(model, f"blocks{i}") for i in range(layers)]
    biases = [lin.bias.detach() for lin in model.layers]
    # beyond what the library offers (MIN_GROUP_ROWS rows a group): any count of >= 128 rows a group
    counts = [g for g in strassen.ROW_GROUPS if g == 1 or batch >= g * 128]

    def grouped(g: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: strassen.forward(t, blocks, biases, model.activations, model.sizes, g)

    fns = {"graph": eager, "strassen (chosen)": model}
    fns |= {f"strassen groups={g}": grouped(g) for g in counts}
    timers = {}
    with torch.no_grad(), autotune.recording() as picks:
        want = eager(x.clone())
        for name, fn in fns.items():
            err = (fn(x.clone()) - want).abs().max().item()  # also makes the choices
            print(f"  {name:20s} max abs diff from PyTorch {err:.2e}")
        try:
            timers = {name: GraphTimer(fn, [(x,)], warmup=1, rounds=2) for name, fn in fns.items()}
            res = interleaved(timers, reps, chunks=6)
        finally:
            for t in timers.values():
                t.close()
    print(f"{dtype} {layers} x {batch} x {hidden} (graph replay, {reps} replays in 6 turns)")
    for op, prob, cfg in picks:
        if str(op).endswith("row_groups"):
            print(f"  row-group pick: {prob} -> {cfg}")
    _print_vs_graph(res, list(fns), 20)


def probe(dtype: str, layers: int, batch: int, hidden: int, profile: bool) -> None:
    dt = DTYPES[dtype]
    torch.manual_seed(layers * 1_000_003 + batch * 1009 + hidden)
    eager = make_mlp(layers, hidden, torch.device("cuda"), dt)
    tw = tilewise_mlp(eager)
    x = torch.randn(batch, hidden, device="cuda", dtype=dt)
    chosen = []
    choose = linear._choose

    def recording(a, b, *args, **kwargs):
        ch = choose(a, b, *args, **kwargs)
        chosen.append((tuple(a.shape), kwargs.get("lt_relu"), ch))
        return ch

    linear._choose = recording
    try:
        with torch.no_grad():
            impls = {"graph": _capture(eager, x), "tilewise": _capture(tw, x)}
            models = {"graph": eager, "tilewise": tw}
            times = {n: time_graph(models[n], [(x,)], 1, 4, 12).median_s * 1e6 for n in impls}
            print(f"{dtype} {layers} x {batch} x {hidden}")
            for shape, lt, ch in chosen[:1]:
                print(f"  tilewise layer choice: {ch} (a {shape}, lt_relu offered {lt})")
            for name, fn in impls.items():
                if not profile:
                    print(f"  {name:8s} study-like {times[name]:6.2f} us")
                    continue
                ks = _kernels(fn)
                total = sum(d for _, d in ks)
                print(f"  {name:8s} study-like {times[name]:6.2f} us; one replay {len(ks)} "
                      f"kernels, {total:.2f} us device:")  # fmt: skip
                for k, d in ks[: 2 * layers + 2]:
                    print(f"     {d:7.2f} us  {k[:100]}")
    finally:
        linear._choose = choose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cells",
        nargs="+",
        default=["fp32:1:4:128", "fp32:1:2:256", "fp32:1:2:128", "bf16:1:4:128", "bf16:1:64:128"],
    )
    ap.add_argument("--profile", action="store_true", help="also list each replay's kernels")
    ap.add_argument(
        "--backends",
        action="store_true",
        help="time whole chains on each cuBLAS forward backend beside graph and tilewise",
    )
    ap.add_argument(
        "--row-groups",
        action="store_true",
        help="time fused Strassen with 1, 2, 4 row groups (and its choice) beside graph",
    )
    args = ap.parse_args()
    with tf32_off():
        for spec in args.cells:
            d, layers, batch, hidden = spec.split(":")
            if args.row_groups:
                compare_row_groups(d, int(layers), int(batch), int(hidden))
            elif args.backends:
                compare_backends(d, int(layers), int(batch), int(hidden))
            else:
                probe(d, int(layers), int(batch), int(hidden), args.profile)


if __name__ == "__main__":
    main()
