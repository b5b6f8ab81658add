"""What ptxas makes of the wgmma grouped-conv kernels, without a GPU: registers, spill bytes,
serialized wgmmas, and SASS instruction counts (all, ``R2UR``, uniform ``U*``, ``HGMMA``,
``LDSM``) of each offered wgmma tile, compiled with nvcc for sm_90a and read by cuobjdump.

    python scripts/sass_report.py [--pass fprop|wgrad] [--kernels 3 5 7] [--ablate 0 16 ...]
                                  [--jobs N]

``--ablate``: fprop, ``TILEWISE_WG_ABLATE`` settings; wgrad, ``WG_PROBE`` modes (session 40's
descriptor A/B: fprop 16 = the old opaque base, wgrad 1024 = the new uniform one). Needs nvcc
and cuobjdump (Triton's copy is used when none is on PATH)."""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import sys
import tempfile
from pathlib import Path

from tilewise.bench import sass
from tilewise.ops import gconv_cuda


def _tiles(pass_: str, k: int) -> list[gconv_cuda.CudaTile]:
    if pass_ == "wgrad":
        return [t for t in gconv_cuda.WGMMA_WGRAD_TILES if gconv_cuda.wgrad_tile_ok(64, k, k, t)]
    offered = [t for t in gconv_cuda.candidates(64, k, k, True, True, True) if t.wgmma]
    extra = [t for t in gconv_cuda.EXPERIMENTAL_WGMMA_TILES if gconv_cuda.tile_ok(64, k, k, t)]
    return offered + [t for t in extra if t not in offered]


def report(job: tuple) -> str:
    """One line for (pass, k, tile, bf16, ablate)."""
    pass_, k, tile, bf16, ablate = job
    if pass_ == "wgrad":
        original = gconv_cuda._SOURCE_WWG
        gconv_cuda._SOURCE_WWG = (f"#define WG_PROBE {ablate}\n" if ablate else "") + original
        src, _ = gconv_cuda.source(k, k, tile, bf16, 2 if bf16 else 1, False, "tw_gconv_wgrad")
        gconv_cuda._SOURCE_WWG = original
    else:
        gconv_cuda.WG_ABLATE = ablate
        src, _ = gconv_cuda.source(k, k, tile, bf16, not bf16, bf16, "tw_gconv_fprop")
    with tempfile.TemporaryDirectory() as d:
        try:
            cubin, log = sass.compile_cubin(src, Path(d))
        except RuntimeError as err:
            return f"{k}x{k} {tile.name} compile failed: {str(err)[-300:]}"
        ops = sass.opcodes(cubin)
    count = lambda prefix: sum(1 for op in ops if op.startswith(prefix))  # noqa: E731
    regs = max(int(m) for m in re.findall(r"Used (\d+) registers", log))
    spill = sum(int(m) for m in re.findall(r"(\d+) bytes spill stores", log))
    kind = ("bf16 " + ("wgrad" if pass_ == "wgrad" else "dgrad")) if bf16 else "fp16 " + pass_
    return (
        f"{k}x{k} {tile.name:36s} {kind:10s} ablate {ablate:<5d} regs {regs:3d} spill {spill:3d} "
        f"serialized {int('serialized' in log)} R2UR {count('R2UR'):4d} "
        f"U* {count('U'):4d} HGMMA {count('HGMMA'):4d} LDSM {count('LDSM'):3d} all {len(ops)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass", dest="pass_", choices=["fprop", "wgrad"], default="fprop")
    ap.add_argument("--kernels", type=int, nargs="+", default=[3, 5, 7])
    ap.add_argument("--ablate", type=int, nargs="+", default=[0])
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args()
    if sass.NVCC is None or sass.cuobjdump() is None:
        sys.exit("nvcc or cuobjdump is not installed")
    jobs = [
        (args.pass_, k, tile, bf16, ablate)
        for k in args.kernels
        for tile in _tiles(args.pass_, k)
        for bf16 in (False, True)
        for ablate in args.ablate
    ]
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for line in pool.map(report, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
