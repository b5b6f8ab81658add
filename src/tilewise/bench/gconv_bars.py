"""Issue 3's performance bars, read off isolated grouped-conv study records.

The bars (H100, tilewise against cuDNN in the same run):

* activations of >= 64 MB: effective bandwidth >= 0.85 of copy for fprop and dgrad, >= 0.75 for
  wgrad;
* activations that fit in L2: above the copy bandwidth (the study's L2 column, one input set
  replayed, is timed exactly for these problems);
* every problem: never slower than cuDNN.

Each bar is judged on the CUDA-graph replay column where the study has it (the figure the
README quotes), else on the CUDA-event column. A problem with several readings (files merged
from several runs) gets one row per reading, so run-to-run spread stays visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilewise.bench.gconv import shape_label
from tilewise.bench.metrics import speedup
from tilewise.registry import DTYPES

#: activations (one input tensor) from this size on are held to the DRAM bars
DRAM_BAR_BYTES = 64 * 10**6
#: fraction of the copy ceiling each pass must reach at >= ``DRAM_BAR_BYTES``
DRAM_BARS = {"fprop": 0.85, "dgrad": 0.85, "wgrad": 0.75}


@dataclass(frozen=True)
class BarRow:
    """One reading of one problem and pass against the bars that apply to it."""

    shape: str
    dtype: str
    n: int
    pass_: str
    activation_mb: float
    frac: float | None  # tilewise, of copy (graph replay, else events)
    bar: float | None  # the DRAM bar, when the activations are >= 64 MB
    l2_frac: float | None  # tilewise, L2 column (problems that fit in L2)
    x_cudnn: float | None  # cuDNN's time over tilewise's (graph replay where both have it)

    @property
    def dram_met(self) -> bool | None:
        if self.bar is None or self.frac is None:
            return None
        return self.frac >= self.bar

    @property
    def l2_met(self) -> bool | None:
        return None if self.l2_frac is None else self.l2_frac > 1.0

    @property
    def cudnn_met(self) -> bool | None:
        return None if self.x_cudnn is None else self.x_cudnn >= 1.0


def activation_bytes(record: Mapping[str, Any]) -> int:
    """One activation tensor of the problem: N x H x W x C elements."""
    elem = DTYPES[record["dtype"]].itemsize
    return record["n"] * record["h"] * record["w"] * record["c"] * elem


def _frac_key(tw: Mapping[str, Any]) -> str:
    """Tilewise's fraction of copy: graph replay when it has it, else events."""
    return "graph_frac_copy" if tw.get("graph_s") else "frac_copy"


def _x_cudnn(tw: Mapping[str, Any], cu: Mapping[str, Any] | None) -> float | None:
    """cuDNN's time over tilewise's in a column both have (graph replay, else events); None
    when cuDNN has no reading (failed, or not run)."""
    if cu is None or cu.get("error"):
        return None
    for key in ("graph_s", "median_s"):
        if tw.get(key) and cu.get(key):
            return speedup(cu[key], tw[key])
    return None


def bar_rows(records: Iterable[Mapping[str, Any]]) -> list[BarRow]:
    """A row per (problem, pass, reading) with a timed tilewise record. Readings of a problem
    pair in order: the i-th tilewise record (failed ones included) with the i-th cuDNN record,
    so a failed reading of either side does not shift the later pairs."""
    pending: dict[tuple, dict[str, list[Mapping[str, Any]]]] = {}
    for r in records:
        if r.get("impl") not in ("tilewise", "cudnn"):
            continue
        key = (r["c"], r["h"], r["w"], r["k"], r["dtype"], r["n"], r["pass"])
        pending.setdefault(key, {"tilewise": [], "cudnn": []})[r["impl"]].append(r)
    rows = []
    for (c, h, w, k, dtype, n, pass_), by in pending.items():
        cus = by["cudnn"]
        for i, tw in enumerate(by["tilewise"]):
            if tw.get("error"):
                continue
            act = activation_bytes(tw)
            rows.append(
                BarRow(
                    shape=shape_label(c, h, w, k),
                    dtype=dtype,
                    n=n,
                    pass_=pass_,
                    activation_mb=act / 1e6,
                    frac=tw.get(_frac_key(tw)),
                    bar=DRAM_BARS.get(pass_) if act >= DRAM_BAR_BYTES else None,
                    l2_frac=tw.get("l2_frac_copy"),
                    x_cudnn=_x_cudnn(tw, cus[i] if i < len(cus) else None),
                )
            )
    return rows


def _mark(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


def bar_table(rows: Sequence[BarRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells for ``results.format_table``."""
    headers = ["shape", "dtype", "N", "pass", "act MB", "tw frac", "bar", "met"]
    headers += ["tw L2 frac", "> copy", "x cudnn", ">= cudnn"]
    cells = []
    for r in rows:
        cells.append(
            [
                r.shape,
                r.dtype,
                str(r.n),
                r.pass_,
                f"{r.activation_mb:.1f}",
                "-" if r.frac is None else f"{r.frac:.3f}",
                "-" if r.bar is None else f"{r.bar:.2f}",
                _mark(r.dram_met),
                "-" if r.l2_frac is None else f"{r.l2_frac:.3f}",
                _mark(r.l2_met),
                "-" if r.x_cudnn is None else f"{r.x_cudnn:.2f}x",
                _mark(r.cudnn_met),
            ]
        )
    return headers, cells


def bar_counts(rows: Sequence[BarRow]) -> dict[str, tuple[int, int]]:
    """``{bar: (met, judged)}`` over the rows each bar applies to."""
    out = {}
    for name, attr in (("dram", "dram_met"), ("l2", "l2_met"), ("cudnn", "cudnn_met")):
        judged = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
        out[name] = (sum(judged), len(judged))
    return out
