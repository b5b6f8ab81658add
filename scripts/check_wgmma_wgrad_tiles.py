"""The GPU tests of the wgmma wgrad tiles (odd shapes, several units a CTA) on only the tiles
whose names contain one of the given strings: a new experimental tile checked in seconds of
device time instead of the whole list's ~300 s. The tests themselves are
``tests/test_gconv_cuda.py``'s; this runs them with the tile lists narrowed.

    python scripts/check_wgmma_wgrad_tiles.py _tma3 [--dtypes fp16 bf16]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import test_gconv_cuda as suite  # noqa: E402

from tilewise.ops import gconv_cuda  # noqa: E402
from tilewise.runtime import alloc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", help="substrings of the tile names to test")
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    args = ap.parse_args()
    every = gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES
    tiles = tuple(t for t in every if any(n in t.name for n in args.names))
    if not tiles:
        raise SystemExit(f"no wgmma wgrad tile matches {args.names}")
    print("tiles:", " ".join(t.name for t in tiles))
    seed = int.from_bytes(os.urandom(4), "little")
    dts = {"fp16": torch.float16, "bf16": torch.bfloat16}
    with alloc.poison_outputs():  # as the tests' autouse fixture: outputs start as NaN
        for name in args.dtypes:
            torch.manual_seed(seed)
            ran = suite._check_wgrad_tiles(
                dts[name],
                seed,
                lambda c, r, s: [t for t in tiles if gconv_cuda.wgrad_tile_ok(c, r, s, t)],
            )
            assert ran > 0, "no odd shape took these tiles"
            print(f"odd shapes {name}: {ran} (shape, tile) pairs passed, seed {seed}")
            ran = suite.check_wgmma_wgrad_many_units(dts[name], seed, tiles)
            assert ran > 0, "no many-unit shape took these tiles"
            print(f"several units a CTA {name}: {ran} (shape, tile) pairs passed")


if __name__ == "__main__":
    main()
