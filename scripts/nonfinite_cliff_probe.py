"""How much slower the grouped conv's NVRTC fprop tiles run when inputs hold Inf (device probe).

A tile whose outputs are not all finite is recomputed exactly (the MMAs' zero weights would
turn 0 * Inf into NaN where PyTorch has none): output by output until session 35, by per-tap
MMAs since. Mixed-precision
training meets this on purpose: ``GradScaler`` starts at a scale that overflows, so the first
backward passes see dy full of Inf. Times every candidate tile (and cuDNN) on finite inputs, one
Inf, 1% Inf and all Inf, CUDA events, median.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tilewise.bench.timing import time_events
from tilewise.ops import gconv_cuda


def kernel_rows(k: int, cases: dict[str, torch.Tensor], max_tiles: int) -> None:
    """One line per candidate tile of a k x k kernel (and cuDNN): each case's time."""
    base = cases["finite"]
    c = base.shape[1]
    w = torch.randn(c, 8, k, k, device="cuda", dtype=torch.float16) / (8 * k * k) ** 0.5
    pad = k // 2
    tma = gconv_cuda._tma.supported(torch.cuda.current_device())
    tiles = gconv_cuda.candidates(c, k, k, tma, wgmma=gconv_cuda.wgmma_usable(base))
    tiles = tiles[:max_tiles] if max_tiles else tiles
    out = torch.empty_like(base)
    runs = {"cudnn": lambda x: F.conv2d(x, w, None, padding=pad, groups=c // 8)}
    for tile in tiles:
        runs[tile.name] = lambda x, t=tile: gconv_cuda.fprop(x, w, None, out, pad, pad, t)
    for name, fn in runs.items():
        times = [time_events(fn, [(x,)], warmup=2, reps=10).median_s for x in cases.values()]
        cells = " ".join(
            f"{case} {t * 1e3:8.3f} ({t / times[0]:6.1f}x)"
            for case, t in zip(cases, times, strict=True)
        )
        print(f"{k}x{k} {name:40} {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--c", type=int, default=64)
    parser.add_argument("--hw", type=int, default=64)
    parser.add_argument("--kernels", type=int, nargs="+", default=[3, 5, 7])
    parser.add_argument("--tiles", type=int, default=0, help="first N candidates only (0: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    n, c, hw = args.n, args.c, args.hw
    base = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float16)
    base = base.contiguous(memory_format=torch.channels_last)
    cases = {"finite": base.clone(), "one inf": base.clone(), "1% inf": base.clone()}
    cases["one inf"][n // 2, 5, hw // 2, hw // 3] = float("inf")
    cases["1% inf"][torch.rand(base.shape, device="cuda") < 0.01] = float("inf")
    cases["all inf"] = torch.full_like(base, float("inf"))
    print(f"N={n} C={c} {hw}x{hw} fp16, ms (x finite)", flush=True)
    for k in args.kernels:
        kernel_rows(k, cases, args.tiles)


if __name__ == "__main__":
    main()
