"""Two fprop tiles of the 3x3 C=64 64x64 N=128 fp16 cell, timed in turns by CUDA-graph replay
over rotating inputs (device probe: whether a tile's time moved between sessions)."""

from __future__ import annotations

import sys

import torch

from tilewise.bench.timing import time_graph
from tilewise.ops import gconv_cuda


def main(names: list[str]) -> None:
    n, c, hw, k = 128, 64, 64, 3
    cl = torch.channels_last
    sets = []
    for _ in range(3):  # 3 x 2 x 67 MB: more than the L2
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float16).contiguous(
            memory_format=cl
        )
        sets.append((x, torch.empty_like(x)))
    w = torch.randn(c, 8, k, k, device="cuda", dtype=torch.float16) / 9
    tiles = {t.name: t for t in gconv_cuda.candidates(c, k, k, True, True, True)}
    nbytes = 2 * sets[0][0].numel() * 2
    for rnd in range(3):
        for name in names:
            tile = tiles[name]
            t = time_graph(lambda x, y, t=tile: gconv_cuda.fprop(x, w, None, y, 1, 1, t), sets)
            rate = nbytes / t.median_s / 1e12
            print(f"round {rnd} {name:34} {t.median_s * 1e6:7.2f} us  {rate:.3f} TB/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["cudarp_t8x32c64w16m1s2_tma2", "cudawg_t8x64c32w16m1s2_tma2"])
