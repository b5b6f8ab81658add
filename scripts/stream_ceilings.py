"""Read-only, write-only and copy bandwidth of this GPU (``tilewise.bench.streams``), printed in
TB/s and optionally written as JSON: the ceilings a kernel's load and store streams are judged by
(session 41: the grouped conv's 3x3 loads and stores, each alone, against these).

    python scripts/stream_ceilings.py [--gib 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

from tilewise.bench.results import environment
from tilewise.bench.streams import measure_stream_bandwidth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="bytes each stream moves, in GiB")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bw = measure_stream_bandwidth(nbytes=int(args.gib * (1 << 30)))
    print("  ".join(f"{k.removesuffix('_bytes_per_s')} {v / 1e12:.3f} TB/s" for k, v in bw.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), **bw}, f, indent=1)


if __name__ == "__main__":
    main()
