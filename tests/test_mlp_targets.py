"""Issue 4's targets judged on MLP study records (``tilewise bench mlp-targets``)."""

from __future__ import annotations

import pytest

from tilewise import cli
from tilewise.bench.mlp_targets import (
    latest_rows,
    strassen_shares,
    target_counts,
    target_rows,
    target_table,
)
from tilewise.bench.results import save_results


def _cell(dtype, layers, batch, hidden, **us):
    """One record per impl of a grid cell; ``us`` maps impl to microseconds (None: failed)."""
    base = dict(dtype=dtype, layers=layers, batch=batch, hidden=hidden)
    out = []
    for impl, t in us.items():
        ok = t is not None
        err = None if ok else "correctness check failed"
        out.append({**base, "impl": impl, "median_s": t and t * 1e-6, "checked": ok, "error": err})
    return out


def _train(**us):
    base = dict(study="train", dtype="fp32", layers=8, batch=64, hidden=1024, error=None)
    return [{**base, "impl": i, "median_s": t * 1e-6} for i, t in us.items()]


def test_each_target_applies_to_its_cells_only():
    recs = _cell("fp16", 8, 64, 1024, eager=300.0, graph=40.0, tilewise=30.0)  # eager 10x
    recs += _cell("fp16", 8, 128, 1024, eager=300.0, graph=40.0, tilewise=30.0)  # batch > 64
    recs += _cell("fp16", 4, 2, 256, eager=50.0, graph=20.0, tilewise=21.0)  # 0.95x graph
    recs += _cell("fp32", 8, 512, 4096, graph=1000.0, tilewise=1000.0, strassen=950.0)
    recs += _cell("fp32", 8, 4096, 8192, graph=1000.0, tilewise=1000.0, strassen=880.0)
    recs += _cell("fp16", 8, 4096, 8192, graph=1000.0, tilewise=1000.0, strassen=800.0)  # not fp32
    recs += _train(eager=3000.0, compile=1600.0, tilewise=400.0)
    rows = target_rows(recs)
    counts = target_counts(rows)
    assert counts["eager 3x"] == (1, 1)  # only the 8-layer batch-64 hidden-1024 cell
    assert counts["graph 1x"] == (5, 6)  # every grid cell; the 0.95x one misses
    assert counts["strassen 1.10x"] == (1, 2)  # fp32 only: 1.053x misses, 1.136x meets
    assert counts["train 5x"] == (1, 1) and counts["train > compile"] == (1, 1)
    (miss,) = [r for r in rows if r.target == "graph 1x" and not r.met]
    assert miss.cell == "fp16 L4 b2 h256" and miss.value == pytest.approx(20 / 21)
    headers, cells = target_table(rows)
    assert headers[-1] == "met" and sum(c[-1] == "NO" for c in cells) == 2


def test_latest_reading_counts_and_unchecked_strassen_is_not_judged():
    """A later reading of a cell replaces an earlier one (a failed one does not); a Strassen
    record that failed its fp64 check is never judged as meeting anything."""
    old = _cell("fp32", 8, 512, 4096, graph=1000.0, tilewise=1000.0, strassen=960.0)
    new = _cell("fp32", 8, 512, 4096, graph=1000.0, strassen=900.0)
    failed = _cell("fp32", 8, 512, 4096, strassen=None)
    (row,) = [r for r in target_rows(old + new + failed) if r.target == "strassen 1.10x"]
    assert row.value == pytest.approx(1000 / 900) and row.met
    bad = _cell("fp32", 8, 4096, 4096, graph=1000.0, tilewise=990.0, strassen=None)
    assert not [r for r in target_rows(bad) if r.target == "strassen 1.10x"]
    tie = _train(eager=2000.0, compile=400.0, tilewise=400.0)  # "faster than compile": strict
    (row,) = [r for r in target_rows(tie) if r.target == "train > compile"]
    assert row.value == pytest.approx(1.0) and not row.met


def test_runs_are_judged_apart_and_the_latest_run_counts():
    """A ratio never mixes runs: a later run without eager does not pair its tilewise with an
    earlier run's eager; the later run's graph ratio replaces the earlier one."""
    early = _cell("fp16", 8, 64, 1024, eager=300.0, graph=40.0, tilewise=30.0)
    late = _cell("fp16", 8, 64, 1024, graph=40.0, tilewise=50.0)  # 0.8x graph, no eager
    rows = {r.target: r for r in latest_rows([early, late])}
    assert rows["eager 3x"].value == pytest.approx(10.0)  # early run's own pair
    assert rows["graph 1x"].value == pytest.approx(0.8) and not rows["graph 1x"].met
    assert len(latest_rows([early, late])) == 2


def test_strassen_share_is_fused_over_strassen_latest_run_counting():
    """Strassen's own share (informational): the fused chain's time over Strassen's, at the
    Strassen target's cells only, from one run at a time, the latest run replacing a cell."""
    early = _cell("fp32", 8, 512, 4096, graph=1000.0, tilewise=1000.0, strassen=800.0)
    late = _cell("fp32", 8, 512, 4096, graph=1000.0, tilewise=700.0, strassen=760.0)
    other = _cell("fp32", 8, 4096, 8192, graph=1000.0, tilewise=900.0, strassen=None)
    small = _cell("fp32", 8, 128, 4096, graph=1000.0, tilewise=900.0, strassen=800.0)
    shares = strassen_shares([early + other + small, late])
    assert shares == {("fp32", 8, 512, 4096): pytest.approx(700 / 760)}
    assert strassen_shares([early]) == {("fp32", 8, 512, 4096): pytest.approx(1.25)}


def test_cli_counts_misses_and_refuses_mixed_devices(tmp_path, capsys):
    recs = _cell("fp32", 8, 512, 4096, graph=1000.0, tilewise=1000.0, strassen=950.0)
    a = save_results("mlp-a", recs, {}, tmp_path, {"device_name": "GPU A"})
    assert cli.main(["bench", "mlp-targets", str(a)]) == 0
    out = capsys.readouterr().out
    assert "fp32 L8 b512 h4096" in out and "NO" in out
    assert "strassen 1.10x (Strassen x graph >= 1.10x): 0 of 1 cells" in out
    assert "Strassen's own share (fused chain time / Strassen's, not a target) at 1 cells" in out
    assert "1.053-1.053x" in out
    assert "graph 1x (best tilewise x graph >= 1.00x): 1 of 1 cells" in out
    b = save_results("mlp-b", recs, {}, tmp_path, {"device_name": "GPU B"})
    with pytest.raises(ValueError, match="files"):
        cli.main(["bench", "mlp-targets", str(a), str(b)])
    empty = save_results("mlp-c", [], {}, tmp_path, {"device_name": "GPU A"})
    assert cli.main(["bench", "mlp-targets", str(empty)]) == 1
