"""Host time of one grouped conv, piece by piece: where an uncaptured call's microseconds go.

Session 26 measured a tilewise forward + backward at 882 us of host time against cuDNN's 294
(``host_overhead.py``, N = 1), while the Python before the CUDA-only code costs ~80 us on a CPU.
This script times each layer of the call on its own (wall time per call over a loop, synchronised
at both ends; the problems are small enough that the GPU never holds the host back) and prints
the configs the autotuner picked, so a launch plan can cut what costs the most.

    python scripts/host_breakdown.py [--shape 1,64,16,3] [--shape 32,1024,16,3] [--iters 300]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from host_profile_step import IdentityFunction  # this folder: the do-nothing autograd node

import tilewise
from tilewise.bench.timing import host_us_per_call
from tilewise.ops import gconv, gconv_cuda, gconv_library, gconv_wgrad
from tilewise.ops._common import l2_bytes, num_sms
from tilewise.ops.gconv_config import GConvProblem, timing_mode
from tilewise.runtime import alloc, autotune, cuda_launch, plans


def rows_for(n: int, c: int, hw: int, k: int, dtype: torch.dtype) -> dict:
    pad = k // 2
    dev = torch.device("cuda")
    x = torch.randn(n, c, hw, hw, device=dev, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    w = (torch.randn(c, 8, k, k, device=dev, dtype=dtype) * 0.1).requires_grad_()
    g = torch.randn_like(x).contiguous(memory_format=torch.channels_last)
    xd, wd = x.detach(), w.detach()
    out = torch.empty_like(xd, memory_format=torch.channels_last)
    problem = GConvProblem.from_tensors(xd, wd, None, pad, pad)
    tilewise.grouped_conv2d(x, w, None, padding=pad).backward(g)  # autotunes on first use
    plans.clear_all()  # a planned call chooses nothing: the picks below come from the full path
    with autotune.recording() as picks:  # the backward runs on autograd's thread: call it here
        gconv.forward(xd, wd, None, pad, pad)
        gconv.backward(g, xd, wd, None, pad, pad, deterministic=False)
    torch.cuda.synchronize()
    chosen = {}
    for op, _, cfg in picks:
        chosen[op.split("@")[0]] = cfg
        print(f"  pick {op.split('@')[0]:40s} {getattr(cfg, 'name', cfg)}")
    fprop_cfg = next(v for k_, v in chosen.items() if ".fprop" in k_)
    dgrad_cfg = next(v for k_, v in chosen.items() if ".dgrad" in k_)
    wgrad_cfg = next(v for k_, v in chosen.items() if "one-launch" in k_)

    y_tw = tilewise.grouped_conv2d(x, w, None, padding=pad)
    y_cd = F.conv2d(x, w, None, padding=pad, groups=c // 8)

    rows = {
        "tilewise bwd only (retain_graph)": lambda: y_tw.backward(g, retain_graph=True),
        "cudnn bwd only (retain_graph)": lambda: y_cd.backward(g, retain_graph=True),
        "Python Function fwd+bwd (identity)": lambda: IdentityFunction.apply(x).backward(g),
        "cudnn F.conv2d fwd": lambda: F.conv2d(xd, wd, None, padding=pad, groups=c // 8),
        "cudnn fwd+bwd (autograd)": lambda: F.conv2d(
            x, w, None, padding=pad, groups=c // 8
        ).backward(g),
        "tilewise fwd (functional)": lambda: tilewise.grouped_conv2d(xd, wd, None, padding=pad),
        "tilewise fwd+bwd (autograd)": lambda: tilewise.grouped_conv2d(
            x, w, None, padding=pad
        ).backward(g),
        "gconv.forward": lambda: gconv.forward(xd, wd, None, pad, pad),
        "gconv.backward (one-launch)": lambda: gconv.backward(
            g, xd, wd, None, pad, pad, deterministic=False
        ),
        "gconv._choose fprop (memoized answer)": lambda: gconv._choose(
            gconv.OP, "fprop", problem, xd, wd, None, out, pad, pad
        ),
        "gconv._launch fprop (picked)": lambda: gconv._launch(
            xd, wd, None, out, pad, pad, fprop_cfg, False
        ),
        "gconv._launch dgrad (picked)": lambda: gconv._launch(
            g, wd, None, out, k - 1 - pad, k - 1 - pad, dgrad_cfg, True
        ),
        "gconv_wgrad._launch (picked)": lambda: gconv_wgrad._launch(
            g, xd, problem, wgrad_cfg, False, False
        ),
        "gconv_wgrad.wgrad (choice+launch)": lambda: gconv_wgrad.wgrad(
            g, xd, problem, False, False
        ),
        "  num_sms": lambda: num_sms(xd.device),
        "  timing_mode(l2_bytes)": lambda: timing_mode(problem, "fprop", l2_bytes(xd.device)),
        "  gconv_library.offered": lambda: gconv_library.offered(xd, False),
        "  gconv._cuda_level": lambda: gconv._cuda_level(xd, out),
        "  gconv_cuda.usable": lambda: gconv_cuda.usable(xd, out),
        "  gconv_cuda.tma_usable": lambda: gconv_cuda.tma_usable(xd),
        "  gconv_library.cache_tag": lambda: gconv_library.cache_tag(wd, True),
        "  alloc.empty (out)": lambda: alloc.empty(
            n, c, hw, hw, dtype=dtype, device=xd.device, memory_format=torch.channels_last
        ),
        "  torch.empty (out)": lambda: torch.empty(
            n, c, hw, hw, dtype=dtype, device=xd.device, memory_format=torch.channels_last
        ),
        "  GConvProblem.from_tensors": lambda: GConvProblem.from_tensors(xd, wd, None, pad, pad),
        "  gconv.validate": lambda: gconv.validate(xd, wd, None, pad, pad),
        "  torch.cuda.current_device": torch.cuda.current_device,
        "  raw current stream": lambda: torch._C._cuda_getCurrentRawStream(0),
    }
    if isinstance(fprop_cfg, gconv_cuda.CudaTile):
        tile = fprop_cfg
        kern = gconv_cuda._kernel(k, k, tile, dtype == torch.bfloat16, False, False, 0)
        sig = gconv_cuda._signature(tile)
        dep = tile.rowpair and gconv_cuda.dependent_launch(xd.device)
        launcher = cuda_launch.lean_launcher(kern, sig, dep)
        args = [xd, wd, wd, out]
        if gconv_cuda.dynamic_tiles(tile):  # its counters (left zero by the kernel)
            args.append(gconv_cuda.tile_counters(xd.device, c // tile.cb))
        args += [hw, hw, hw, hw, c, pad, pad, 1, 1, 1, *wd.stride()]
        if tile.tma:
            args.append(gconv_cuda._tensor_map(xd, tile.cb, tile.tw + k - 1, tile.th + k - 1))
            if tile.tma == 2:
                args.append(gconv_cuda._tensor_map(out, tile.cb, tile.tw, tile.th))
        smem = gconv_cuda.launch_smem(k, k, tile, dep)  # as bind_fprop asks (one wave)
        stream = torch._C._cuda_getCurrentRawStream(0)
        rows.update(
            {
                "  gconv_cuda._kernel (cached)": lambda: gconv_cuda._kernel(
                    k, k, tile, dtype == torch.bfloat16, False, False, 0
                ),
                "  gconv_cuda._tensor_map (cached)": lambda: gconv_cuda._tensor_map(
                    xd, tile.cb, tile.tw + k - 1, tile.th + k - 1
                ),
                "  dependent_launch": lambda: gconv_cuda.dependent_launch(xd.device),
                f"  Launcher() 1 CTA (dependent={dep})": lambda: launcher(
                    (1, 1, 1), (tile.warps * 32, 1, 1), args, smem, stream
                ),
            }
        )
        plain = cuda_launch.lean_launcher(kern, sig, False)
        rows["  Launcher() 1 CTA plain"] = lambda: plain(
            (1, 1, 1), (tile.warps * 32, 1, 1), args, smem, stream
        )
        for t in gconv_cuda.candidates(c, k, k, True, True):
            rows[f"  gconv_cuda.fprop {t.name}"] = lambda t=t: gconv_cuda.fprop(
                xd, wd, None, out, pad, pad, t
            )
    return rows


def device_us_per_call(fn, iters: int) -> float:
    """GPU time per call of ``fn`` in the same loop (events at both ends): close to the wall
    time per call only where the GPU, not the host, sets the pace."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def profile_calls(fn, iters: int, top: int) -> None:
    """cProfile of ``iters`` calls: own time first (C calls such as driver launches included)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        print(f"--- {iters} calls, by {key} ---")
        print("\n".join(buf.getvalue().splitlines()[6:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", action="append", help="N,C,HW,K (repeatable)")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--profile", type=int, default=0, help="cProfile's top N of fwd+bwd")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    dtype = getattr(torch, args.dtype)
    for shape in args.shape or ["1,64,16,3", "32,1024,16,3"]:
        n, c, hw, k = (int(v) for v in shape.split(","))
        print(f"== N={n} C={c} {hw}x{hw} {k}x{k} {args.dtype}")
        rows = rows_for(n, c, hw, k, dtype)
        for name, fn in rows.items():
            try:
                us = host_us_per_call(fn, iters=args.iters, warmup=20)
                print(f"{name:44s} {us:9.1f} us")
            except Exception as exc:  # a row that cannot run here says why, the rest go on
                print(f"{name:44s} failed: {type(exc).__name__}: {exc}"[:160])
        for name in ("cudnn fwd+bwd (autograd)", "tilewise fwd+bwd (autograd)"):
            gpu = device_us_per_call(rows[name], args.iters)
            print(f"{name + ' GPU time':44s} {gpu:9.1f} us")
        if args.profile:
            profile_calls(rows["tilewise fwd+bwd (autograd)"], 100, args.profile)


if __name__ == "__main__":
    main()
