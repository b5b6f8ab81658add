"""Issue 3's bars read off study records (``bench.gconv_bars``) and its CLI command."""

from __future__ import annotations

import pytest

from tilewise import cli
from tilewise.bench.gconv_bars import DRAM_BAR_BYTES, activation_bytes, bar_counts, bar_rows
from tilewise.bench.results import save_results

ENV = {"device_name": "NVIDIA H100 80GB HBM3", "l2_bytes": 50 << 20}


def _rec(impl, pass_, n, graph_s, frac=None, c=64, hw=64, k=3, dtype="fp16", **extra):
    r = {"impl": impl, "pass": pass_, "n": n, "c": c, "h": hw, "w": hw, "k": k, "dtype": dtype}
    r |= {"graph_s": graph_s, "median_s": graph_s and graph_s * 1.1, "graph_frac_copy": frac}
    r |= {"frac_copy": None if frac is None else frac * 0.9, "error": None}
    return r | extra


def test_activation_bytes_and_the_64_mb_line():
    # C=64 64x64 fp16: 0.52 MB a sample, so N = 128 is the first issue batch at >= 64 MB
    assert activation_bytes(_rec("tilewise", "fprop", 128, 1.0)) == 128 * 64 * 64 * 64 * 2
    assert activation_bytes(_rec("tilewise", "fprop", 64, 1.0)) < DRAM_BAR_BYTES
    assert activation_bytes(_rec("tilewise", "fprop", 128, 1.0)) >= DRAM_BAR_BYTES
    assert activation_bytes(_rec("tilewise", "fprop", 1, 1.0, dtype="fp32")) == 64 * 64 * 64 * 4


def test_bars_per_pass_and_regime():
    recs = [
        _rec("tilewise", "fprop", 128, 1.0, 0.851),
        _rec("cudnn", "fprop", 128, 2.5),
        _rec("tilewise", "dgrad", 128, 1.0, 0.849),
        _rec("cudnn", "dgrad", 128, 0.9),  # cuDNN faster: the third bar fails
        _rec("tilewise", "wgrad", 128, 1.0, 0.751),
        _rec("tilewise", "fprop", 8, 1.0, 0.30, l2_frac_copy=1.2),  # fits in L2, no DRAM bar
        _rec("tilewise", "dgrad", 8, 1.0, 0.30, l2_frac_copy=0.6),
    ]
    rows = bar_rows(recs)
    got = {(r.pass_, r.n): r for r in rows}
    assert got["fprop", 128].bar == 0.85 and got["fprop", 128].dram_met is True
    assert got["dgrad", 128].dram_met is False
    assert got["wgrad", 128].bar == 0.75 and got["wgrad", 128].dram_met is True
    assert got["fprop", 128].x_cudnn == pytest.approx(2.5) and got["fprop", 128].cudnn_met
    assert got["dgrad", 128].cudnn_met is False
    assert got["wgrad", 128].x_cudnn is None  # no cuDNN reading: not judged
    assert got["fprop", 8].bar is None and got["fprop", 8].dram_met is None
    assert got["fprop", 8].l2_met is True and got["dgrad", 8].l2_met is False
    assert bar_counts(rows) == {"dram": (2, 3), "l2": (1, 2), "cudnn": (1, 2)}


def test_events_column_when_no_graph_and_errors_left_out():
    tw = _rec("tilewise", "fprop", 256, None, None, frac_copy=0.9, median_s=1.0)
    cu = _rec("cudnn", "fprop", 256, None, None, median_s=3.0)
    bad = _rec("tilewise", "dgrad", 256, 1.0, 0.9, error="out of memory")
    rows = bar_rows([tw, cu, bad])
    assert len(rows) == 1
    assert rows[0].frac == 0.9 and rows[0].x_cudnn == pytest.approx(3.0)


def test_every_reading_is_a_row():
    recs = [
        _rec("tilewise", "fprop", 128, 1.0, 0.84),
        _rec("cudnn", "fprop", 128, 2.0),
        _rec("tilewise", "fprop", 128, 1.0, 0.86),
        _rec("cudnn", "fprop", 128, 3.0),
    ]
    rows = bar_rows(recs)
    assert [r.dram_met for r in rows] == [False, True]
    assert [round(r.x_cudnn, 3) for r in rows] == [2.0, 3.0]


def test_cli_prints_the_table_and_counts(tmp_path, capsys):
    recs = [_rec("tilewise", "fprop", 128, 1.0, 0.9), _rec("cudnn", "fprop", 128, 3.0)]
    path = save_results("gconv-test", recs, {"copy_bytes_per_s": 3e12}, tmp_path, env=ENV)
    assert cli.main(["bench", "gconv-bars", str(path)]) == 0
    out = capsys.readouterr().out
    assert "C=64 64x64 3x3" in out and "0.900" in out and "3.00x" in out
    assert "at >= 64 MB of activations: 1 of 1 readings" in out
    assert "not slower than cuDNN: 1 of 1 readings" in out


def test_cli_with_no_records_says_so(tmp_path, capsys):
    path = save_results("gconv-empty", [], None, tmp_path, env=ENV)
    assert cli.main(["bench", "gconv-bars", str(path)]) == 1
    assert "no timed tilewise" in capsys.readouterr().out


def test_cli_skips_in_situ_files(tmp_path, capsys):
    recs = [_rec("tilewise", "fprop", 128, 1.0, 0.9)]
    path = save_results("gconv-insitu-test", recs, None, tmp_path, env=ENV)
    assert cli.main(["bench", "gconv-bars", str(path)]) == 1
    assert "an in-situ study" in capsys.readouterr().out


def test_a_failed_reading_does_not_shift_the_pairs():
    recs = [
        _rec("tilewise", "fprop", 128, 1.0, 0.9),
        _rec("cudnn", "fprop", 128, 9.0, error="capture failed"),
        _rec("tilewise", "fprop", 128, 2.0, 0.9),
        _rec("cudnn", "fprop", 128, 4.0),
        _rec("tilewise", "fprop", 128, 1.0, 0.9, error="check failed"),
        _rec("cudnn", "fprop", 128, 5.0),
    ]
    rows = bar_rows(recs)
    assert [r.x_cudnn for r in rows] == [None, pytest.approx(2.0)]


def test_ratio_falls_back_to_events_when_cudnn_has_no_graph_time():
    tw = _rec("tilewise", "wgrad", 128, 1.0, 0.8)  # median_s 1.1
    cu = _rec("cudnn", "wgrad", 128, None, median_s=2.2)
    (row,) = bar_rows([tw, cu])
    assert row.frac == 0.8 and row.x_cudnn == pytest.approx(2.0)
