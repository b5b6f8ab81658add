"""Grouped conv in situ (Spio's methodology): ConvFirst and MBConv stacks, tilewise vs PyTorch.

Same options as ``tilewise bench gconv-insitu``; e.g.
``python benchmarks/bench_gconv_insitu.py --quick --plot``. Needs a CUDA GPU; writes
``<out>/gconv-insitu__<device>.json`` (and a PNG with ``--plot``).
"""

from __future__ import annotations

import argparse
import sys

from tilewise.cli import add_insitu_args, run_insitu_command


def main(argv: list[str] | None = None) -> int:
    parser = add_insitu_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run_insitu_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
