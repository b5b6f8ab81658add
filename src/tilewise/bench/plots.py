"""Figures for result files, drawn on matplotlib's Agg canvas directly.

No pyplot: nothing global is switched, so importing this never disturbs a caller's backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

TARGET_FRACTION = 0.85
IMPL_STYLE: dict[str, tuple[str, str]] = {  # impl -> (colour, marker)
    "tilewise": ("tab:blue", "o"),
    "eager": ("tab:orange", "s"),
    "compile": ("tab:green", "^"),
}
_LINESTYLES = ("-", "--", ":", "-.")


def _records(results: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    recs = results["records"] if isinstance(results, Mapping) else results
    return [dict(r) for r in recs if r.get("frac_copy") is not None]


def _ordered(values: Sequence[Any], order: Sequence[Any] = ()) -> list[Any]:
    seen = list(dict.fromkeys(values))
    return [v for v in order if v in seen] + [v for v in seen if v not in order]


def plot_series(
    ax: Any,
    points: Sequence[tuple[float, float]],
    style: tuple[str, str],
    linestyle: str,
    label: str,
) -> None:
    """One (x, y) line in an implementation's (colour, marker) ``style``."""
    colour, marker = style
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, color=colour, marker=marker, ms=4, linestyle=linestyle, label=label)


def plot_fraction_of_copy(
    results: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
) -> Path:
    """Effective bandwidth / measured copy ceiling vs tensor size, per (op, pass) and dtype.

    Columns are (op, pass), rows are dtypes; colour and marker mark the implementation, line
    style the (n, activation) variant. The dashed line is the 0.85 target.
    """
    recs = _records(results)
    if not recs:
        raise ValueError("no timed records (with frac_copy) to plot")
    cols = _ordered([(r["op"], r["pass"]) for r in recs])
    dtypes = _ordered([r["dtype"] for r in recs], ("fp32", "fp16", "bf16"))
    fig = Figure(figsize=(4.2 * len(cols), 3.2 * len(dtypes)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(dtypes), len(cols), squeeze=False, sharex=True, sharey=True)
    for i, dtype in enumerate(dtypes):
        for j, (op, pass_) in enumerate(cols):
            ax = axes[i][j]
            sub = [r for r in recs if r["dtype"] == dtype and (r["op"], r["pass"]) == (op, pass_)]
            variants = _ordered([(r["n"], r["activation"]) for r in sub])
            for impl in _ordered([r["impl"] for r in sub], tuple(IMPL_STYLE)):
                colour, marker = IMPL_STYLE.get(impl, ("tab:gray", "x"))
                for k, (n, act) in enumerate(variants):
                    pts = sorted(
                        (r["tensor_mb"], r["frac_copy"])
                        for r in sub
                        if r["impl"] == impl and (r["n"], r["activation"]) == (n, act)
                    )
                    if not pts:
                        continue
                    plot_series(
                        ax,
                        pts,
                        (colour, marker),
                        _LINESTYLES[k % len(_LINESTYLES)],
                        f"{impl} n={n} {act}",
                    )
            ax.axhline(TARGET_FRACTION, color="black", linestyle="--", linewidth=0.8)
            ax.annotate(
                f"target {TARGET_FRACTION}",
                xy=(0.01, TARGET_FRACTION),
                xycoords=("axes fraction", "data"),
                xytext=(0, 2),
                textcoords="offset points",
                fontsize=7,
            )
            ax.set_xscale("log")
            ax.set_xticks(sorted({r["tensor_mb"] for r in recs}))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(bottom=0.0, top=max(1.0, ax.get_ylim()[1]))
            ax.set_title(f"{op} {pass_} {dtype}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(dtypes) - 1:
                ax.set_xlabel("tensor size (MB)")
            if j == 0:
                ax.set_ylabel("fraction of copy bandwidth")
            if sub and i == 0:  # the variants repeat across dtype rows: one legend per column
                ax.legend(fontsize=6, loc="best")
    copy = None
    if isinstance(results, Mapping) and results.get("ceilings"):
        copy = results["ceilings"].get("copy_bytes_per_s")
    title = "Effective bandwidth / measured copy ceiling"
    if copy:
        title += f" ({copy / 1e12:.2f} TB/s)"
    fig.suptitle(title, fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
