"""Registers and spills of the grouped conv's NVRTC kernels, compiled offline with nvcc (no GPU):
every fprop/dgrad candidate for the given kernel sizes, with the wide-kernel
row-pair tiles (``WIDE_KERNEL_TILES``), and the cap their CTAs per SM leave.

    python scripts/gconv_cuda_regs.py [--kernels 7x7 6x6 5x7] [--c 64] [--arch sm_90]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from tilewise.ops import gconv_cuda


def ptxas(src: str, arch: str) -> tuple[int, int]:
    """(registers, spill bytes) of the kernel in ``src``."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cu"
        path.write_text(src)
        cmd = ["nvcc", f"-arch={arch}", "-cubin", "-o", str(Path(d) / "k.cubin"), "-Xptxas", "-v"]
        res = subprocess.run([*cmd, str(path)], capture_output=True, text=True, check=True)
    log = res.stdout + res.stderr
    regs = max(int(m) for m in re.findall(r"Used (\d+) registers", log))
    pairs = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return regs, sum(int(a) + int(b) for a, b in pairs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", nargs="+", default=["7x7", "6x6", "5x7", "7x5", "5x5", "3x3"])
    p.add_argument("--c", type=int, default=64)
    p.add_argument("--arch", default="sm_90")
    args = p.parse_args()
    print(f"{'kernel':7} {'tile':32} {'cap':>4} {'fp16 fprop+bias':>16} {'bf16 dgrad':>11}")
    for k in args.kernels:
        r, s = (int(v) for v in k.split("x"))
        tiles = [t for t in gconv_cuda.candidates(args.c, r, s, True, True) if t.rowpair]
        tiles += [gconv_cuda.non_tma_twin(t, args.c, r, s) for t in tiles if t.tma]
        for t in dict.fromkeys(tiles):
            cap = gconv_cuda.register_cap(t)
            cells = []
            for bf16, bias, dgrad in ((False, True, False), (True, False, True)):
                src, _ = gconv_cuda.source(r, s, t, bf16, bias, dgrad, "tw_gconv_fprop")
                regs, spills = ptxas(src, args.arch)
                cells.append(f"{regs}{f' spill {spills}' if spills else ''}")
            print(f"{k:7} {t.name:32} {cap:4} {cells[0]:>16} {cells[1]:>11}")


if __name__ == "__main__":
    main()
