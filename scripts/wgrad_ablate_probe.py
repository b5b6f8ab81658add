"""The tap wgrad's time with parts of it switched off, to find where its ~11.5 us a launch goes
(session 45, H200: the 3x3 pick takes 13.5 us at C=64 N=8, one tile a CTA, against 6.1 for the
fprop). One process per setting: ``TILEWISE_GCONV_WGRAD_ABLATE`` (bits: 1 no atomics, 2 no
finish, 4 no MMAs, 8 no loads: TMA tiles only; session 46, inside the finish: 16 the count
alone, 32 no fence before the count; 64 the pass's loads alone; 128 plain stores in place of the
dw reductions) is read once, at import. Ablated results are
wrong, so only setting 0 is checked (against PyTorch's, a relative error); bit 2 or 16 without bit 1
leaves the stream's workspace unclean for any later wgrad in the process (timing only). Timed by
graph replay as the study: each captured wgrad gets its own zeroed workspace (a fill before it).

    TILEWISE_GCONV_WGRAD_ABLATE=4 python scripts/wgrad_ablate_probe.py [--n 8 32 128]
        [--channels 64] [--kernel 3] [--tile cuda_t16x16c64w8m1s2_tma1 ...] [--dw-cl]
        [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.gconv import SHAPES
from tilewise.bench.results import environment
from tilewise.bench.timing import profile_kernels, time_calls
from tilewise.ops import gconv_cuda
from tilewise.ops.gconv_config import channels_last_copy

SIDES = {c: h for c, h, _ in SHAPES}  # the shapes: channels -> image side
DEFAULT_TILE = "cuda_t16x16c64w8m1s2_tma1"  # the 3x3 wgrad pick in every cell since session 41


def _tile(name: str) -> gconv_cuda.CudaTile:
    tiles = {t.name: t for t in gconv_cuda.wgrad_candidates(64, 3, 3, tma=True, wgmma=False)}
    tiles |= {t.name: t for t in gconv_cuda.WGRAD_TILES + gconv_cuda.TMA_WGRAD_TILES}
    tiles |= {t.name: t for t in gconv_cuda.EXPERIMENTAL_WGRAD_TILES + gconv_cuda.SUMK_WGRAD_TILES}
    for c in SIDES:  # the slot forms (session 49) as fitted to each of the C
        tiles |= {t.name: t for t in gconv_cuda.slot_wgrad_candidates(c, 3, 3, tma=True)}
    # the warpgroup wgrad (5x5, 7x7) and its slot forms (session 50)
    wg = gconv_cuda.WGMMA_WGRAD_TILES
    tiles |= {t.name: t for t in wg + tuple(dataclasses.replace(t, slots=True) for t in wg)}
    if name not in tiles:
        raise ValueError(f"argument '--tile': {name!r} is none of {sorted(tiles)}")
    return tiles[name]


def input_sets(n: int, c: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three (dy, x) sets of the issue's shape for C, fp16 channels_last, rotated by the timer:
    at N = 128 each set is 134 MB, past the L2."""
    hw = SIDES[c]
    return [
        tuple(
            channels_last_copy(torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float16))
            for _ in range(2)
        )
        for _ in range(3)
    ]


def relative_error(fn, dy: torch.Tensor, x: torch.Tensor, k: int) -> float:
    """``fn(dy, x)``'s weight gradient against PyTorch's in fp32, as a relative norm."""
    c = x.shape[1]
    ref = torch.nn.grad.conv2d_weight(
        x.float(), (c, 8, k, k), dy.float(), padding=k // 2, groups=c // 8
    )
    return float((fn(dy, x).float() - ref).norm() / ref.norm())


def _row(
    n: int, c: int, k: int, tile, copy_bw: float, dw_cl: bool = False, profile: bool = False
) -> dict:
    pad = k // 2
    sets = input_sets(n, c)

    def fn(dy, x):
        return gconv_cuda.wgrad(dy, x, k, k, pad, pad, False, tile, dw_cl=dw_cl)[0]

    err = None if gconv_cuda.WGRAD_ABLATE else relative_error(fn, *sets[0], k)
    dy, x = sets[0]  # the launch's grid (a sumk tile's: whole clusters, all resident)
    grid = gconv_cuda.bind_wgrad(dy, x, k, k, pad, pad, False, tile, dw_cl=dw_cl).grid
    s = time_calls(fn, sets).median_s
    nbytes = 2 * sets[0][0].nbytes + c * 8 * k * k * 2
    # torch.profiler's device time per launch of each kernel (a dependent kernel's span includes
    # its wait for the kernel before it; session 49)
    kernels = {}
    if profile:
        for stat in profile_kernels(fn, sets, iters=20).kernels:
            kernels[stat.name] = stat.avg_s * 1e6
    return {
        "kernels_us": kernels,
        "n": n,
        "c": c,
        "k": k,
        "tile": tile.name,
        "grid": list(grid),
        "ablate": gconv_cuda.WGRAD_ABLATE,
        "dw_cl": dw_cl,
        "finish_order": gconv_cuda.WGRAD_FINISH_ORDER,
        "copies": gconv_cuda.wgrad_copies(k, k, tile),
        "us": s * 1e6,
        "frac_copy": nbytes / s / copy_bw,
        "rel_err": err,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--channels", type=int, default=64, choices=sorted(SIDES))
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--tile", nargs="+", default=[DEFAULT_TILE], help="one row per tile and N")
    ap.add_argument("--dw-cl", action="store_true", help="dw in a channels_last weight's layout")
    ap.add_argument("--profile", action="store_true", help="also the profiler's kernel times")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tiles = [_tile(name) for name in args.tile]
    for tile in tiles:
        if gconv_cuda.WGRAD_ABLATE & 8 and not tile.tma:
            raise ValueError(
                f"argument '--tile': {tile.name} has no tensor copies to leave out (bit 8)"
            )
    copy_bw = measure_copy_bandwidth()
    print(
        f"copy {copy_bw / 1e12:.3f} TB/s; ablate {gconv_cuda.WGRAD_ABLATE}; "
        f"finish order: {gconv_cuda.WGRAD_FINISH_ORDER}"
    )
    rows = []
    for n in args.n:
        for tile in tiles:
            row = _row(n, args.channels, args.kernel, tile, copy_bw, args.dw_cl, args.profile)
            rows.append(row)
            err = "-" if row["rel_err"] is None else f"{row['rel_err']:.1e}"
            layout = " cl" if args.dw_cl else ""
            print(
                f"ablate {row['ablate']:2d}{layout} C={row['c']} {row['k']}x{row['k']} "
                f"N={n:4d} {row['tile']}: {row['us']:7.1f} us  {row['frac_copy']:.3f} of copy  "
                f"err {err}  grid {row['grid']}  copies {row['copies']}"
            )
            for name, us in row["kernels_us"].items():
                print(f"  profiler {name[:40]}: {us:.1f} us a launch")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": environment(), "copy_bw": copy_bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
