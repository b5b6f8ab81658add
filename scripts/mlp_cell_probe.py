"""What runs in an MLP-study cell: tilewise's GEMM choice per layer and each impl's kernels.

For cells where tilewise reads below PyTorch + CUDA graph (session 14: single layers of 4-6 us),
this prints per cell the forward choice of the first layer (``ops.linear._choose``, recorded),
whether cuBLASLt's bias + ReLU was offered and each impl's replay time as the study takes it;
with ``--profile`` also the kernels one CUDA-graph replay of each impl launches, with their
device times (torch.profiler; CUPTI stays active afterwards and slows later replays, so the
timings of a profiled run are not comparable: run the script once without it for those).

    python scripts/mlp_cell_probe.py [--cells fp32:1:4:128 bf16:1:4:128 ...] [--profile]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from tilewise.bench.ceilings import tf32_off
from tilewise.bench.mlp import _capture, make_mlp, tilewise_mlp
from tilewise.bench.timing import time_graph
from tilewise.ops import linear
from tilewise.registry import DTYPES


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
    args = ap.parse_args()
    with tf32_off():
        for spec in args.cells:
            d, layers, batch, hidden = spec.split(":")
            probe(d, int(layers), int(batch), int(hidden), args.profile)


if __name__ == "__main__":
    main()
