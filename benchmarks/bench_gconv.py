"""Grouped conv (group width 8), isolated kernels: tilewise vs PyTorch/cuDNN per pass.

Same options as ``tilewise bench gconv``; e.g. ``python benchmarks/bench_gconv.py --quick --plot``.
Needs a CUDA GPU; writes ``<out>/gconv__<device>.json`` (and a PNG with ``--plot``).
"""

from __future__ import annotations

import argparse
import sys

from tilewise.cli import add_gconv_args, run_gconv_command


def main(argv: list[str] | None = None) -> int:
    parser = add_gconv_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run_gconv_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
