"""Persistent grids with every CTA resident at once (session 51): each NVRTC candidate whose
grid ``gconv_cuda.resident_grid_x`` changes, timed with the old grid and the new one.

Why: ``min_ctas`` x SMs rounded up to whole channel blocks asked for more CTAs than the GPU
holds where C has many channel blocks (C=1024) or a tile's registers or shared memory hold fewer
than ``min_ctas`` an SM; the CTAs without room ran as a second round. Per cell (C, image side,
kernel, N, pass): every candidate once with the new rule, those whose grid changed also with the
old one (``gconv_cuda.RESIDENT_GRID`` set between binds), by graph replay over three input sets,
with each new grid's result against PyTorch in fp32. The last lines per cell: the best tile by
either rule, as the autotuner would see them.

    python scripts/resident_grid_probe.py --shapes 1024:16 256:16 --kernels 3 5 7 --n 64 256 \
        --passes fprop wgrad --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import re

import torch
import torch.nn.functional as F

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.results import environment
from tilewise.bench.timing import time_calls
from tilewise.ops import gconv_cuda
from tilewise.ops.gconv_config import channels_last_copy

PASSES = ("fprop", "dgrad", "wgrad")


def _cl(n: int, c: int, hw: int) -> torch.Tensor:
    return channels_last_copy(torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float16))


def _cell_fns(c: int, hw: int, k: int, n: int, pass_: str, dw_cl: bool):
    """(input sets, call(tile) -> fn over a set, bind(tile) -> grid, error(tile) -> relative)."""
    pad = k // 2
    if pass_ == "wgrad":
        sets = [(_cl(n, c, hw), _cl(n, c, hw)) for _ in range(3)]

        def call(tile):
            return lambda dy, x: gconv_cuda.wgrad(dy, x, k, k, pad, pad, False, tile, dw_cl=dw_cl)

        def grid(tile):
            dy, x = sets[0]
            return gconv_cuda.bind_wgrad(dy, x, k, k, pad, pad, False, tile, dw_cl=dw_cl).grid

        def error(tile):
            dy, x = sets[0]
            got = call(tile)(dy, x)[0].float()
            ref = torch.nn.grad.conv2d_weight(
                x.float(), (c, 8, k, k), dy.float(), padding=pad, groups=c // 8
            )
            return float((got - ref).norm() / ref.norm())

        return sets, call, grid, error
    dgrad = pass_ == "dgrad"
    w = torch.randn(c, 8, k, k, device="cuda", dtype=torch.float16) / (8 * k)
    sets = [(_cl(n, c, hw), torch.empty_like(_cl(n, c, hw))) for _ in range(3)]

    def call(tile):
        return lambda x, out: gconv_cuda.fprop(x, w, None, out, pad, pad, tile, dgrad)

    def grid(tile):
        x, out = sets[0]
        return gconv_cuda.bind_fprop(x, w, None, out, pad, pad, tile, dgrad).grid

    def error(tile):
        x, out = sets[0]
        call(tile)(x, out)
        conv = F.conv_transpose2d if dgrad else F.conv2d  # dgrad: the input gradient of conv2d
        ref = conv(x.float(), w.float(), padding=pad, groups=c // 8)
        return float((out.float() - ref).norm() / ref.norm())

    return sets, call, grid, error


def _candidates(c: int, k: int, pass_: str) -> tuple:
    if pass_ == "wgrad":
        return gconv_cuda.wgrad_candidates(c, k, k, small=False, tma=True, wgmma=True)
    return gconv_cuda.candidates(c, k, k, tma=True, wgmma=True)


_ASKED: list = []  # what the driver said at each bind (the probe's wrapper records it)
_resident_per_sm = gconv_cuda._resident_per_sm


def _recording_resident_per_sm(*args):
    _ASKED.append(_resident_per_sm(*args))
    return _ASKED[-1]


gconv_cuda._resident_per_sm = _recording_resident_per_sm


def _bound_grid(grid_of, tile, resident: bool):
    """The launch's grid under either rule, and the driver's CTAs an SM that the bind used
    (None under the old rule)."""
    before, gconv_cuda.RESIDENT_GRID = gconv_cuda.RESIDENT_GRID, resident
    _ASKED.clear()
    try:
        grid = tuple(grid_of(tile))
    finally:
        gconv_cuda.RESIDENT_GRID = before
    return grid, (_ASKED[-1] if _ASKED else None)


def _time(fn, sets, tile, resident: bool) -> float:
    before, gconv_cuda.RESIDENT_GRID = gconv_cuda.RESIDENT_GRID, resident
    try:
        return time_calls(fn, sets).median_s * 1e6
    finally:
        gconv_cuda.RESIDENT_GRID = before


def probe_cell(c, hw, k, n, pass_, copy_bw, dw_cl, only_changed, only=None) -> list[dict]:
    sets, call, grid_of, error = _cell_fns(c, hw, k, n, pass_, dw_cl)
    nbytes = 2 * sets[0][0].nbytes
    rows = []
    for tile in _candidates(c, k, pass_):
        try:
            old, _ = _bound_grid(grid_of, tile, False)
            new, per_sm = _bound_grid(grid_of, tile, True)
        except ValueError as exc:  # a tile this GPU or launcher cannot run here
            print(f"  skip {tile.name}: {exc}")
            continue
        changed = old != new
        if (only_changed and not changed) or (only and not re.search(only, tile.name)):
            continue
        row = {"c": c, "hw": hw, "k": k, "n": n, "pass": pass_, "tile": tile.name,
               "grid_old": old, "grid_new": new, "changed": changed, "per_sm": per_sm}  # fmt: skip
        row["us_new"] = _time(call(tile), sets, tile, True)
        row["us_old"] = _time(call(tile), sets, tile, False) if changed else row["us_new"]
        row["err_new"] = error(tile)
        for key in ("new", "old"):
            row[f"frac_{key}"] = nbytes / (row[f"us_{key}"] * 1e-6) / copy_bw
        rows.append(row)
        mark = "*" if changed else " "
        print(
            f"{mark} C={c} {hw}x{hw} {k}x{k} N={n} {pass_} {tile.name:40s} "
            f"grid {old} -> {new} ({per_sm} an SM): "
            f"{row['us_old']:8.1f} -> {row['us_new']:8.1f} us "
            f"({row['frac_old']:.3f} -> {row['frac_new']:.3f} of copy) err {row['err_new']:.1e}"
        )
    if rows:
        best_old = min(rows, key=lambda r: r["us_old"])
        best_new = min(rows, key=lambda r: r["us_new"])
        print(
            f"best C={c} {k}x{k} N={n} {pass_}: old {best_old['tile']} {best_old['us_old']:.1f} us"
            f" ({best_old['frac_old']:.3f}); new {best_new['tile']} {best_new['us_new']:.1f} us"
            f" ({best_new['frac_new']:.3f})"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1024:16", "256:16"], help="C:side")
    ap.add_argument("--kernels", type=int, nargs="+", default=[3])
    ap.add_argument("--n", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--passes", nargs="+", default=["fprop", "wgrad"], choices=PASSES)
    ap.add_argument("--dw-contiguous", action="store_true", help="dw contiguous (default: cl)")
    ap.add_argument("--only-changed", action="store_true", help="time only the changed tiles")
    ap.add_argument("--only", default=None, help="time only tiles whose name matches")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    copy_bw = measure_copy_bandwidth()
    print(f"copy {copy_bw / 1e12:.3f} TB/s")
    rows = []
    cells = itertools.product(args.shapes, args.kernels, args.n, args.passes)
    for spec, k, n, pass_ in cells:  # the cell order: shape, kernel, batch, pass
        c, hw = (int(v) for v in spec.split(":"))
        dw_cl = not args.dw_contiguous
        rows += probe_cell(c, hw, k, n, pass_, copy_bw, dw_cl, args.only_changed, args.only)
        if args.json:  # written as it goes: a call cut at its limit keeps the rest
            with open(args.json, "w") as f:
                json.dump({"env": environment(), "copy_bw": copy_bw, "rows": rows}, f)


if __name__ == "__main__":
    main()
