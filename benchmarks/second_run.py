"""What a program's second run pays: the first training step of a transformed convnet in fresh
processes that share one cache directory.

Issue 3 asks that the kernel-config choice be cached on disk "so the second run of a program pays
nothing". Each run here is a new Python process that builds the same model (grouped convs of
3x3, 5x5 and 7x7 behind ``tilewise.transform``), runs one forward + backward + SGD step under
autocast and times it to a device sync, then times later steps (median). Runs:

1. ``cold``: empty tilewise and Triton cache directories (autotuning, NVRTC and Triton compiles);
2. ``second``: the same directories again (every choice and binary on disk);
3. ``second, no NVRTC cache``: as 2 with ``TILEWISE_NVRTC_CACHE=0`` (every NVRTC kernel compiled
   again: the cost the binary cache removes);
4. ``pytorch``: the same model untransformed (PyTorch's own first step, for scale: cuDNN and
   cuBLAS have their own start-up costs).

Each run counts NVRTC compiles and autotune timings (by wrapping PyTorch's ``_nvrtc_compile`` and
the autotuner's ``_time_each`` inside the child). ``--check`` exits 1 unless the second run
compiled no NVRTC kernel and timed nothing. Writes ``second_run.json`` under ``--out`` (default
``$OUT`` or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = (
    ("cold", {}),
    ("second", {}),
    ("second, no NVRTC cache", {"TILEWISE_NVRTC_CACHE": "0"}),
    ("pytorch", {"SECOND_RUN_PYTORCH": "1"}),
)


def child(args: argparse.Namespace) -> None:
    """One run: the model's first step and later steps, with compile and timing counts."""
    start = time.perf_counter()
    import torch
    import torch.cuda._utils as cuda_utils

    import tilewise
    from tilewise.models.convnets import block_stack
    from tilewise.runtime import autotune

    imported = time.perf_counter() - start
    counts = {"nvrtc_compiles": 0, "autotune_timings": 0}
    compile_fn, time_each = cuda_utils._nvrtc_compile, autotune._time_each

    def counting_compile(*a, **k):
        counts["nvrtc_compiles"] += 1
        return compile_fn(*a, **k)

    def counting_time_each(*a, **k):
        counts["autotune_timings"] += 1
        return time_each(*a, **k)

    cuda_utils._nvrtc_compile = counting_compile
    autotune._time_each = counting_time_each

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[
            block_stack("convfirst", args.channels, 1, kernel=k, extra=0, pool=False)
            for k in args.kernels
        ]
    )
    model = model.to(device).to(memory_format=torch.channels_last)
    pytorch = os.environ.get("SECOND_RUN_PYTORCH") == "1"
    if pytorch:  # cudnn.benchmark as the study's baseline
        torch.backends.cudnn.benchmark = True
    swapped = 0 if pytorch else len(tilewise.transform(model).swapped)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.channels, args.size, args.size, device=device)
    x = x.contiguous(memory_format=torch.channels_last)

    def step() -> None:
        with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    first = timed()
    first_counts = dict(counts)
    later = [timed() for _ in range(args.steps)]
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "import_s": imported,
        "first_step_s": first,
        "later_step_ms": statistics.median(later) * 1e3,
        "swapped": swapped,
        **first_counts,
    }
    print("RESULT " + json.dumps(result), flush=True)


def run_child(args: argparse.Namespace, env: dict[str, str]) -> dict:
    """A fresh process running ``child``; its RESULT line parsed, plus its whole wall time."""
    cmd = [sys.executable, __file__, "--child"] + _shape_args(args)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"child run failed (exit {proc.returncode})")
    return {**json.loads(lines[-1][len("RESULT ") :]), "process_s": wall}


def _shape_args(args: argparse.Namespace) -> list[str]:
    return [
        "--channels", str(args.channels),
        "--size", str(args.size),
        "--batch", str(args.batch),
        "--steps", str(args.steps),
        "--kernels", *map(str, args.kernels),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--kernels", type=int, nargs="+", default=[3, 5, 7])
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="tw-second-run-") as tmp:
        base = dict(os.environ)
        base.update(TILEWISE_CACHE_DIR=f"{tmp}/tilewise", TRITON_CACHE_DIR=f"{tmp}/triton")
        base.pop("TILEWISE_NVRTC_CACHE", None)
        for name, extra in RUNS:
            result = {"run": name, **run_child(args, {**base, **extra})}
            results.append(result)
            print(json.dumps(result), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "second_run.json").write_text(
        json.dumps({"args": vars(args), "runs": results}, indent=1)
    )
    head = ("run", "process s", "1st step s", "later ms", "nvrtc", "timed")
    print("\n{:<24} {:>9} {:>10} {:>9} {:>6} {:>6}".format(*head))
    for r in results:
        print(
            f"{r['run']:<24} {r['process_s']:9.2f} {r['first_step_s']:10.3f} "
            f"{r['later_step_ms']:9.2f} {r['nvrtc_compiles']:6d} {r['autotune_timings']:6d}"
        )
    second = results[1]
    if args.check and (second["nvrtc_compiles"] or second["autotune_timings"]):
        raise SystemExit("the second run compiled or timed again")


if __name__ == "__main__":
    main()
