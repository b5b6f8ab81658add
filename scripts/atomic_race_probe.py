"""Does ``atomic_row_sum`` ever finish a sum before every program's partial is in?

Session 23's GPU tests (8 test files at once on one H200) saw one layer_norm dbias element in
bf16 off by 1.66 against a bound of 0.46 (`test_launch_variants[bwd-prefetch-cuda-bfloat16]`):
the size of one row's missing gradient. Its only release of the other warps' relaxed atomics is
the ticket's, after a CTA barrier (CUDA's threadFenceReduction sample fences in every thread).
This probe repeats the row-reduction backwards that end in ``atomic_row_sum`` (layer_norm
dweight/dbias, bias_act dbias) many times with fixed inputs, several processes at once so the
GPU's timing varies as it did in that run, and counts results that differ from an fp64 reference
by more than rounding. Session 23 (H200, 4 processes x 12 s a case, with a per-thread fence and
without): no bad element in ~290k runs without it; the failure was the long-row backward's two
ReLU masks (``scripts/ln_failure_replay.py``), and the fence was not kept.

    usage: python scripts/atomic_race_probe.py [--seconds 20] [--procs 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace


def _cases(torch, ops_ln, device: str):
    """(name, run() -> list of outputs, fp64 references, tolerance, layer_norm config) per probed
    reduction; tiny shapes on the CPU (the interpreter, a smoke test of the script)."""
    import tilewise.ops.bias_act as ba

    dev = torch.device(device)
    cpu = dev.type == "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    ln_shapes = (
        ((33, 256 * 102, torch.bfloat16, True), (4099, 4096, torch.float32, False),
         (777, 1000, torch.float32, True))
        if not cpu else ((5, 40, torch.float32, True),)
    )  # fmt: skip
    for m, n, dt, prefetch in ln_shapes:
        x = torch.randn(m, n, device=dev, generator=g).to(dt)
        w = (1 + 0.5 * torch.randn(n, device=dev, generator=g)).to(dt)
        b = (0.5 * torch.randn(n, device=dev, generator=g)).to(dt)
        dy = torch.randn(m, n, device=dev, generator=g).to(dt)
        _, mean, rstd = ops_ln.forward(x, (n,), w, b, relu=False)
        _, dw64, db64 = ops_ln.reference_backward(
            dy.double(),
            x.double(),
            (n,),
            w.double(),
            b.double(),
            mean.double(),
            rstd.double(),
            False,
        )
        cfg = dict(prefetch=prefetch)

        def run(x=x, w=w, b=b, dy=dy, mean=mean, rstd=rstd, n=n, cfg=cfg):
            _, dw_, db_ = ops_ln.backward(dy, x, (n,), w, b, mean, rstd, relu=False)
            return [dw_, db_]

        tol = 1e-3 if dt == torch.float32 else 0.05
        out.append(
            (f"layer_norm_bwd {m}x{n} {dt} prefetch={prefetch}", run, [dw64, db64], tol, cfg)
        )
    ba_shapes = ((4096, 1024, torch.float32), (512, 4096, torch.bfloat16))
    for m, n, dt in ba_shapes if not cpu else ((6, 24, torch.float32),):
        x = torch.randn(m, n, device=dev, generator=g).to(dt)
        bias = torch.randn(n, device=dev, generator=g).to(dt)
        dy = torch.randn(m, n, device=dev, generator=g).to(dt)
        # relu at x + bias: the reference's mask from the same rounded pre-activation
        z = (x.float() + bias.float()).to(dt)
        db64 = torch.where(z > 0, dy.double(), 0.0).sum(0)

        def run(x=x, bias=bias, dy=dy):
            return [ba.backward(dy, x, bias, "relu")[1]]

        tol = 1e-3 if dt == torch.float32 else 0.05
        out.append((f"bias_act_bwd {m}x{n} {dt}", run, [db64], tol, None))
    return out


def worker(seconds: float, device: str) -> dict:
    import torch

    import tilewise.ops._common as common
    import tilewise.ops.layernorm as ops_ln

    result = {"cases": {}}
    for name, run, refs, tol, ln_cfg in _cases(torch, ops_ln, device):
        if ln_cfg is not None:

            def override(m, n, elem, ln_cfg=ln_cfg):
                base = common.TileConfig(1, common.next_pow2(n), 4, progs_per_sm=2, prefetch=False)
                return replace(base, **ln_cfg)

            common.CONFIG_OVERRIDES["layer_norm_bwd"] = override
        else:
            common.CONFIG_OVERRIDES.pop("layer_norm_bwd", None)
        bad = torch.zeros((), dtype=torch.int64, device=device)
        worst = torch.zeros((), dtype=torch.float64, device=device)
        runs = 0
        end = time.time() + seconds
        while time.time() < end:
            for _ in range(50):
                for o, r in zip(run(), refs, strict=True):
                    err = (o.double() - r).abs()
                    bad += (err > tol * (1 + r.abs())).sum()
                    worst = torch.maximum(worst, err.max())
                runs += 1
            if device == "cuda":
                torch.cuda.synchronize()
        result["cases"][name] = {"runs": runs, "bad_elements": int(bad), "worst_err": float(worst)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0, help="per case and setting")
    ap.add_argument("--procs", type=int, default=4, help="processes at once per setting")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.seconds, a.device)))
        return
    cmd = [sys.executable, __file__, "--worker", "--seconds", str(a.seconds), "--device", a.device]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(a.procs)]
    report = []
    for p in procs:
        out, _ = p.communicate()
        lines = [x for x in out.splitlines() if x.startswith("{")]
        report.append(json.loads(lines[-1]) if lines else {"error": f"rc {p.returncode}"})
    for i, r in enumerate(report):
        for name, c in r.get("cases", {}).items():
            print(
                f"proc {i} {name:48s} runs {c['runs']:7d} bad {c['bad_elements']:4d}"
                f" worst {c['worst_err']:.3g}"
            )
        if "error" in r:
            print(f"proc {i}: {r['error']}")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "atomic-race-probe.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
