"""Pointwise study (bias_act, layer_norm, ... : every op in tilewise.registry.OPS).

Same options as ``tilewise bench pointwise``; e.g. ``python benchmarks/bench_pointwise.py --quick``.
Needs a CUDA GPU; writes ``<out>/pointwise__<device>.json`` (and a PNG with ``--plot``).
"""

from __future__ import annotations

import argparse
import sys

from tilewise.cli import add_pointwise_args, run_pointwise_command


def main(argv: list[str] | None = None) -> int:
    parser = add_pointwise_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run_pointwise_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
