"""Grouped bars of ``scripts/gconv_cuda_probe.py`` results: per pass, shape, batch and dtype, the
fraction of the copy bandwidth (measured in the same run) that cuDNN, the best NVRTC tile of
each family and tilewise's autotuned choice reach, with the issue's target drawn across.

    python benchmarks/plot_gconv_probe.py PROBE.json [PROBE.json ...] --out FIGURE.png

Families: tiles without TMA, TMA tiles of <= 32 channels, TMA tiles of 64 or 128 channels (the
session-19 tiles). Several files may hold the same cell (e.g. fprop and wgrad probes, or N = 128
and 256): each cell is drawn from the last file that has it.
"""

from __future__ import annotations

import argparse
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: the issue's targets (fraction of copy at activations >= 64 MB)
TARGETS = {"fprop": 0.85, "dgrad": 0.85, "wgrad": 0.75}
FAMILIES = ("cudnn", "no TMA", "TMA, <= 32 ch", "TMA, 64-128 ch", "tilewise (autotuned)")


def family(impl: str) -> str | None:
    """Which bar an implementation's row belongs to (None: left out, e.g. cluster tiles)."""
    if impl == "cudnn":
        return "cudnn"
    if impl == "tilewise":
        return "tilewise (autotuned)"
    m = re.search(r"c(\d+)w\d+m\d+s\d+(k\d+)?(r\d+)?(_tma\d)?$", impl)
    if not m or m.group(2) or m.group(3):  # clusters and row splits: small-batch tiles
        return None
    if not m.group(4):
        return "no TMA"
    return "TMA, 64-128 ch" if int(m.group(1)) >= 64 else "TMA, <= 32 ch"


def cells(paths: list[str]) -> dict[tuple, dict[str, float]]:
    """{(pass, C, N, dtype): {family: best fraction of copy}}."""
    out: dict[tuple, dict[str, float]] = {}
    for path in paths:
        with open(path) as f:
            rows = json.load(f)["rows"]
        fresh: dict[tuple, dict[str, float]] = {}
        for row in rows:
            fam = family(row["impl"])
            if fam is None:
                continue
            key = (row.get("pass_", "fprop"), row["c"], row["n"], row["dtype"])
            best = fresh.setdefault(key, {})
            best[fam] = max(best.get(fam, 0.0), row["frac_copy"])
        out.update(fresh)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probes", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="grouped conv, group width 8, 3x3 (H100)")
    args = ap.parse_args()
    data = cells(args.probes)
    passes = sorted({k[0] for k in data}, key=list(TARGETS).index)
    fig, axes = plt.subplots(len(passes), 1, figsize=(13, 4.2 * len(passes)), squeeze=False)
    for ax, pass_ in zip(axes[:, 0], passes, strict=True):
        keys = sorted(k for k in data if k[0] == pass_)
        width = 0.8 / len(FAMILIES)
        for i, fam in enumerate(FAMILIES):
            xs = [j + (i - len(FAMILIES) / 2 + 0.5) * width for j in range(len(keys))]
            ys = [data[k].get(fam, 0.0) for k in keys]
            ax.bar(xs, ys, width, label=fam)
        ax.axhline(TARGETS[pass_], color="k", ls="--", lw=1)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"C={c}\nN={n} {d}" for _, c, n, d in keys], fontsize=8)
        ax.set_ylabel("fraction of copy bandwidth")
        ax.set_title(f"{pass_} ({args.title}); dashed: the issue's target at >= 64 MB")
        ax.set_ylim(0, 1.0)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(ncol=len(FAMILIES), fontsize=8, loc="upper center")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
