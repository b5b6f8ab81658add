"""Issue 4's targets, read off MLP study records (seed 001's grid and the training step).

The targets (H100, the same run):

* ``eager 3x``: at 8 layers, hidden <= 1024 and batch <= 64, the best tilewise impl (the faster
  of the fused chain and Strassen) >= 3x PyTorch eager;
* ``graph 1x``: the best tilewise impl >= 1.0x PyTorch + CUDA graph in every cell;
* ``strassen 1.10x``: fp32 (TF32 off), hidden >= 4096 and batch >= 512: Strassen >= 1.10x PyTorch
  + CUDA graph, having passed the three-way check against fp64 (a timed record did: the study
  times only what passed);
* ``train 5x`` and ``train > compile``: the tilewise training step >= 5x eager and faster than
  torch.compile.

Each file is judged on its own, so a ratio is always of two readings of one run (a merged file's
cell, of one part); where several files judge a cell, the latest file's row counts
(``latest_rows``). Within a file, where a cell and impl has several records, the latest counts,
unless it failed where an earlier one did not (as ``bench merge --unique-by``). A cell counts
for a target only where both of the compared impls were timed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilewise.bench.mlp import summarize
from tilewise.bench.reports import unique_records

#: each target: (its bar, what the cell's value is)
TARGETS = {
    "eager 3x": (3.0, "best tilewise x eager"),
    "graph 1x": (1.0, "best tilewise x graph"),
    "strassen 1.10x": (1.10, "Strassen x graph"),
    "train 5x": (5.0, "tilewise step x eager"),
    "train > compile": (1.0, "tilewise step x compile"),
}
_CELL = ("study", "dtype", "layers", "batch", "hidden", "impl")


@dataclass(frozen=True)
class TargetRow:
    """One cell judged against one target."""

    target: str
    dtype: str
    layers: int
    batch: int
    hidden: int
    value: float  # the ratio the target bars (TARGETS[target][1])

    @property
    def bar(self) -> float:
        return TARGETS[self.target][0]

    @property
    def met(self) -> bool:
        if self.target == "train > compile":
            return self.value > self.bar
        return self.value >= self.bar

    @property
    def cell(self) -> str:
        return f"{self.dtype} L{self.layers} b{self.batch} h{self.hidden}"


def _ratio(num: Any, den: Any) -> float | None:
    return num / den if num and den else None


def target_rows(records: Iterable[Mapping[str, Any]]) -> list[TargetRow]:
    """A row per (target, cell) where the target applies and both sides were timed."""
    recs = [{"study": "grid", **r} for r in records]
    recs = unique_records(recs, _CELL) if recs else []
    grid = [r for r in recs if r.get("study") != "train"]
    rows = []

    def add(target: str, cell: Mapping[str, Any], value: float | None) -> None:
        if value is not None:
            keys = ("dtype", "layers", "batch", "hidden")
            rows.append(TargetRow(target, *(cell[k] for k in keys), value))

    for s in summarize(grid):
        if s["layers"] == 8 and s["hidden"] <= 1024 and s["batch"] <= 64:
            add("eager 3x", s, s["x_eager"])
        add("graph 1x", s, s["x_graph"])
    by = _by_cell_impl(grid)
    strassen = {k[:4]: r for k, r in by.items() if k[4] == "strassen"}
    graph = {k[:4]: r for k, r in by.items() if k[4] == "graph"}
    for key, rec in strassen.items():
        dtype, layers, batch, hidden = key
        if dtype == "fp32" and hidden >= 4096 and batch >= 512 and rec.get("checked"):
            cell = dict(dtype=dtype, layers=layers, batch=batch, hidden=hidden)
            add("strassen 1.10x", cell, _ratio(graph.get(key, {}).get("median_s"), rec["median_s"]))
    train = _by_cell_impl([r for r in recs if r.get("study") == "train"])
    for key, rec in train.items():
        if key[4] != "tilewise":
            continue
        cell = dict(zip(("dtype", "layers", "batch", "hidden"), key[:4], strict=True))
        for impl, target in (("eager", "train 5x"), ("compile", "train > compile")):
            other = train.get((*key[:4], impl), {})
            add(target, cell, _ratio(other.get("median_s"), rec.get("median_s")))
    return rows


def latest_rows(runs: Sequence[Iterable[Mapping[str, Any]]]) -> list[TargetRow]:
    """``target_rows`` of each run (a file's records), oldest first; where several runs judge a
    target's cell, the latest run's row replaces the others."""
    kept: dict[tuple, TargetRow] = {}
    for records in runs:
        for row in target_rows(records):
            key = (row.target, row.dtype, row.layers, row.batch, row.hidden)
            kept.pop(key, None)
            kept[key] = row
    return list(kept.values())


def strassen_shares(runs: Sequence[Iterable[Mapping[str, Any]]]) -> dict[tuple, float]:
    """Strassen's own share at the Strassen target's cells: the fused chain's time over
    Strassen's, ``{(dtype, layers, batch, hidden): ratio}``, from cells where both were timed
    (Strassen checked against fp64), each file alone and a cell's latest file counting. Not a
    target: it says whether "Strassen >= 1.10x graph" comes from Strassen's saved eighth of the
    flops or from the GEMMs both paths share (session 27: 3xTF32 on tensor cores)."""
    kept: dict[tuple, float] = {}
    for records in runs:
        recs = unique_records([{"study": "grid", **r} for r in records], _CELL)
        by = _by_cell_impl(r for r in recs if r.get("study") != "train")
        for key, rec in by.items():
            dtype, layers, batch, hidden, impl = key
            if impl != "strassen" or not rec.get("checked"):
                continue
            if dtype != "fp32" or hidden < 4096 or batch < 512:
                continue
            share = _ratio(by.get((*key[:4], "tilewise"), {}).get("median_s"), rec["median_s"])
            if share is not None:
                kept.pop(key[:4], None)
                kept[key[:4]] = share
    return kept


def _by_cell_impl(records: Iterable[Mapping[str, Any]]) -> dict[tuple, Mapping[str, Any]]:
    return {(r["dtype"], r["layers"], r["batch"], r["hidden"], r["impl"]): r for r in records}


def target_counts(rows: Sequence[TargetRow]) -> dict[str, tuple[int, int]]:
    """``{target: (met, judged)}``, every target listed (0 judged where none applied)."""
    out = {t: (0, 0) for t in TARGETS}
    for r in rows:
        met, judged = out[r.target]
        out[r.target] = (met + r.met, judged + 1)
    return out


def target_table(rows: Sequence[TargetRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells for ``results.format_table``."""
    headers = ["target", "cell", "value", "bar", "met"]
    cells = [
        [r.target, r.cell, f"{r.value:.3f}x", f"{r.bar:.2f}x", "yes" if r.met else "NO"]
        for r in rows
    ]
    return headers, cells
