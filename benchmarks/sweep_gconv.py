"""Sweep the grouped-conv kernel configs on a few problems, beside cuDNN, to set the candidate
lists and heuristics in ``tilewise.ops.gconv_config``.

Every config is checked against cuDNN's output (loose relative L2, the study does the strict
fp64 check) and timed with CUDA events over inputs rotated past L2 (median). Prints, per problem
and pass, cuDNN and the best configs, and the best of each kernel variant (taps per dot for
fprop/dgrad, tap block for wgrad); writes all rows to ``$OUT/sweep_gconv.json`` (or --out).

    python benchmarks/sweep_gconv.py [--problems c64_64x64_n128 ...] [--all]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.gconv import make_activations, make_weight, pass_fn
from tilewise.bench.results import environment
from tilewise.bench.timing import l2_cache_bytes, rotation_count, time_events
from tilewise.ops import gconv as ops
from tilewise.ops import gconv_wgrad as wg
from tilewise.ops.gconv_config import GConvConfig, GConvProblem, candidate_configs

PROBLEMS = {
    "c64_64x64_n128": GConvProblem(128, 64, 64, 64, 3, 3, 1, 1, "fp16"),
    "c256_16x16_n128": GConvProblem(128, 256, 16, 16, 3, 3, 1, 1, "fp16"),
    "c128_32x32_n32": GConvProblem(32, 128, 32, 32, 3, 3, 1, 1, "fp16"),
    "c64_64x64_n8": GConvProblem(8, 64, 64, 64, 3, 3, 1, 1, "fp16"),
    "c64_64x64_n128_k7": GConvProblem(128, 64, 64, 64, 7, 7, 3, 3, "fp16"),
    "tiny_cpu": GConvProblem(1, 32, 6, 5, 3, 3, 1, 1, "fp32"),  # a smoke test on the interpreter
}


@triton.jit
def _blockdiag_probe_kernel(
    x_ptr, w_ptr, y_ptr, C, H, W, P, Q, pad_h, pad_w, tiles_q, tiles_per_image,
    sxn, sxc, sxh, sxw, swo, swi, swr, sws, syn, syc, syh, syw,
    R: tl.constexpr, S: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Experiment only (NOT NaN-exact, never shipped): the shipped fast path without its
    non-finite check and exact fallback, to measure what that check costs."""
    pid = tl.program_id(0)
    n = (pid // tiles_per_image).to(tl.int64)
    tile = pid % tiles_per_image
    m = tl.arange(0, BLOCK_P * BLOCK_Q)
    p = (tile // tiles_q) * BLOCK_P + m // BLOCK_Q
    q = (tile % tiles_q) * BLOCK_Q + m % BLOCK_Q
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    kk = tl.arange(0, BLOCK_C)
    w_offs = c[None, :] * swo + (kk % 8)[:, None] * swi
    w_mask = (kk[:, None] // 8 == tl.arange(0, BLOCK_C)[None, :] // 8) & cmask[None, :]
    acc = tl.zeros((BLOCK_P * BLOCK_Q, BLOCK_C), dtype=tl.float32)
    for t in range(0, R * S):
        r = t // S
        s = t % S
        ih = p + r - pad_h
        iw = q + s - pad_w
        ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        xt = tl.load(
            x_ptr + n * sxn + (ih * sxh + iw * sxw)[:, None] + c[None, :] * sxc,
            mask=ok[:, None] & cmask[None, :],
            other=0.0,
        )
        wt = tl.load(w_ptr + w_offs + r * swr + s * sws, mask=w_mask, other=0.0)
        acc = tl.dot(xt, wt, acc)
    y_offs = n * syn + (p * syh + q * syw)[:, None] + c[None, :] * syc
    tl.store(
        y_ptr + y_offs,
        acc.to(y_ptr.dtype.element_ty),
        mask=((p < P) & (q < Q))[:, None] & cmask[None, :],
    )


class ProbeConfig(GConvConfig):
    """A GConvConfig that runs the block-diagonal probe kernel."""

    @property
    def name(self) -> str:
        return "probe_" + super().name


def dgrad_weight(weight: torch.Tensor) -> torch.Tensor:
    """The probe's dgrad weights, made explicitly (the shipped kernel indexes them in place):
    ``w_t[ci, co_local, r, s] = w[co, ci_local, R-1-r, S-1-s]``, contiguous [C, 8, R, S]."""
    c, gw, r, s = weight.shape
    wt = weight.reshape(c // gw, gw, gw, r, s).transpose(1, 2).flip(3, 4)
    return wt.reshape(c, gw, r, s).contiguous()


def launch_probe(x, weight, out, pad_h, pad_w, cfg) -> None:
    n, c, h, w = x.shape
    p, q = out.shape[2], out.shape[3]
    tiles_q = triton.cdiv(q, cfg.block_q)
    tpi = triton.cdiv(p, cfg.block_p) * tiles_q
    _blockdiag_probe_kernel[(n * tpi, triton.cdiv(c, cfg.block_c))](
        x, weight, out, c, h, w, p, q, pad_h, pad_w, tiles_q, tpi,
        *x.stride(), *weight.stride(), *out.stride(),
        R=weight.shape[2], S=weight.shape[3], BLOCK_P=cfg.block_p, BLOCK_Q=cfg.block_q,
        BLOCK_C=cfg.block_c, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def fprop_configs(problem: GConvProblem, all_: bool) -> list[GConvConfig]:
    """The autotune candidates, a few larger tiles, and the unchecked probe at the default."""
    out = candidate_configs(problem, "fprop")
    if all_:
        for (bp, bq), bc, nw, st in itertools.product(
            ((32, 16), (16, 32), (64, 8)), (32, 64), (4, 8), (3, 4)
        ):
            out.append(GConvConfig(bp, bq, bc, nw, st))
    d = out[0]
    out.append(ProbeConfig(d.block_p, d.block_q, d.block_c, d.num_warps, d.num_stages))
    return list(dict.fromkeys(out))


def run_pass(problem, pass_, sets, w, configs, copy_bw):
    """Rows for every config of one pass, then cuDNN's row."""
    nbytes = problem.bytes(pass_)
    ph, pw = problem.pad_h, problem.pad_w
    ref = pass_fn("cudnn", pass_, problem)(
        sets[0][0], w.contiguous(memory_format=torch.channels_last), sets[0][1]
    ).float()
    rows = []
    if pass_ == "wgrad":
        runners = [
            (c, lambda x, dy, c=c: wg.launch_wgrad(dy, x, problem, c, False, False)[0])
            for c in configs
        ]
    else:
        wt = dgrad_weight(w) if pass_ == "dgrad" else w  # for the probe kernel only
        pad = (problem.r - 1 - ph, problem.s - 1 - pw) if pass_ == "dgrad" else (ph, pw)

        def conv(x, dy, c):
            src = dy if pass_ == "dgrad" else x
            out = torch.empty_like(x if pass_ == "dgrad" else dy)
            if isinstance(c, ProbeConfig):
                launch_probe(src, wt, out, pad[0], pad[1], c)
            else:
                ops.launch_fprop(src, w, None, out, pad[0], pad[1], c, pass_ == "dgrad")
            return out

        runners = [(c, lambda x, dy, c=c: conv(x, dy, c)) for c in configs]
    for cfg, fn in runners:
        try:
            got = fn(*sets[0]).float()
            if pass_ == "wgrad":
                got = got.permute(2, 3, 0, 1)
            err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
            if not err < 2e-2:
                rows.append({"config": cfg.name, "error": f"rel L2 err {err:.2e}"})
                continue
            t = time_events(fn, sets, warmup=3, reps=15).median_s
        except Exception as exc:  # a config the compiler rejects is recorded, not hidden
            rows.append({"config": cfg.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        rows.append(
            {
                "config": cfg.name,
                "s": t,
                "gbps": nbytes / t / 1e9,
                "frac_copy": nbytes / t / copy_bw,
            }
        )
    cu = pass_fn("cudnn", pass_, problem)
    w_cu = w.contiguous(memory_format=torch.channels_last)
    t = time_events(lambda x, dy: cu(x, w_cu, dy), sets, warmup=3, reps=15).median_s
    rows.append(
        {"config": "cudnn", "s": t, "gbps": nbytes / t / 1e9, "frac_copy": nbytes / t / copy_bw}
    )
    return rows


def variant(name: str) -> str:
    """cudnn, probe, c<block_c> (fprop/dgrad) or t<taps> (wgrad)."""
    if name == "cudnn" or name.startswith("probe"):
        return name.split("_")[0]
    if name.startswith("p"):
        return "c" + name.split("c")[1].split("w")[0]
    return name.rsplit("s", 1)[-1][1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    ap.add_argument("--passes", nargs="+", default=["fprop", "dgrad", "wgrad"])
    ap.add_argument("--all", action="store_true", help="larger fprop/dgrad tiles too")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    copy_bw = measure_copy_bandwidth() if torch.cuda.is_available() else float("nan")
    print(f"copy {copy_bw / 1e12:.2f} TB/s")
    results = []
    for key in args.problems:
        problem = PROBLEMS[key]
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        gen = torch.Generator(device=dev).manual_seed(0)
        rot = rotation_count(problem.bytes("fprop"), l2_cache_bytes()) if dev.type == "cuda" else 1
        sets = [make_activations(problem, dev, gen) for _ in range(rot)]
        w = make_weight(problem, dev, gen)
        for pass_ in args.passes:
            configs = (
                fprop_configs(problem, args.all)
                if pass_ != "wgrad"
                else candidate_configs(problem, "wgrad")
            )
            rows = run_pass(problem, pass_, sets, w, configs, copy_bw)
            ok = sorted((r for r in rows if "s" in r), key=lambda r: r["s"])
            cud = next(r for r in rows if r["config"] == "cudnn")
            best_by_variant = {}
            for r in ok:
                best_by_variant.setdefault(variant(r["config"]), r)
            print(f"{key} {pass_}: cuDNN {cud['gbps']:.0f} GB/s ({cud['frac_copy']:.2f})")
            for r in ok[:3]:
                print(f"   {r['config']:28s} {r['gbps']:6.0f} GB/s ({r['frac_copy']:.2f})")
            print(
                "   best per variant: "
                + ", ".join(f"{v} {r['gbps']:.0f}" for v, r in best_by_variant.items())
            )
            bad = [r for r in rows if "error" in r]
            if bad:
                print(f"   {len(bad)} configs failed, e.g. {bad[0]}")
            results.append({"problem": key, "pass": pass_, "rows": rows})
        del sets
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sweep_gconv.json"
    path.write_text(
        json.dumps(
            {"environment": environment(), "copy_bytes_per_s": copy_bw, "results": results},
            indent=1,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
