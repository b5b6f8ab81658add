"""MLP study (seed 001's grid: N x (Linear(h, h) + ReLU), plus an AdamW training step).

Same options as ``tilewise bench mlp``; e.g. ``python benchmarks/bench_mlp.py --quick --plot``.
Needs a CUDA GPU; writes ``<out>/mlp__<device>.json`` (and heatmap PNGs with ``--plot``).
"""

from __future__ import annotations

import argparse
import sys

from tilewise.cli import add_mlp_args, run_mlp_command


def main(argv: list[str] | None = None) -> int:
    parser = add_mlp_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run_mlp_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
