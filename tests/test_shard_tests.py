"""``scripts/shard_tests.py``: how gpu_check.sh splits a slow test file into units."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "shard_tests.py"
_spec = importlib.util.spec_from_file_location("shard_tests", _PATH)
shard_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shard_tests)


def _ids(fn: str, params: list[str]) -> list[str]:
    return [f"tests/test_x.py::{fn}[{p}]" for p in params]


def test_heavy_cases_land_in_different_units():
    """Session 25's case: two long cases of one function went to one unit; with their times known
    they go to two, and the short cases fill the others."""
    heavy = _ids("test_every_tile", ["fp16", "bf16"])
    light = _ids("test_small", [str(i) for i in range(8)])
    known = {heavy[0]: 200.0, heavy[1]: 190.0} | {c: 5.0 for c in light}
    bins = shard_tests.plan(heavy + light, 3, known)
    assert sorted(c for b in bins for c in b) == sorted(heavy + light)
    assert [sum(c in heavy for c in b) for b in bins].count(1) == 2
    loads = [sum(known[c] for c in b) for b in bins]
    assert max(loads) == 200.0  # the longest case alone bounds the slowest unit


def test_unknown_cases_weigh_the_median_and_no_unit_is_empty():
    cases = _ids("test_a", ["1", "2", "3"])
    bins = shard_tests.plan(cases, 6, {})  # no durations: 1 s each, fewer cases than units
    assert sorted(len(b) for b in bins) == [1, 1, 1]
    b = _ids("test_b", ["1", "2", "3"])
    known = {b[0]: 10.0, b[1]: 2.0, b[2]: 4.0}
    bins = shard_tests.plan(cases + b, 2, known)
    # the unknown test_a cases weigh the median, 4 s: 10 + 4 against 3 x 4 + 2 (had they weighed
    # 1 s, test_b[3] would have joined test_b[2] and the three test_a cases instead)
    assert bins == [[b[0], b[2]], [*cases, b[1]]]
    with pytest.raises(ValueError, match="'units'"):
        shard_tests.plan(cases, 0, {})


def test_order_puts_the_longest_files_first():
    known = {"tests/a.py::t[1]": 5.0, "tests/a.py::t[2]": 5.0, "tests/b.py::t": 30.0}
    known["tests/c.py::t"] = 9.0
    files = ["tests/a.py", "tests/d.py", "tests/b.py", "tests/c.py"]
    assert shard_tests.order(files, known) == [
        "tests/b.py",
        "tests/a.py",
        "tests/c.py",
        "tests/d.py",
    ]
    assert shard_tests.order(["tests/x.py", "tests/y.py"], {}) == ["tests/x.py", "tests/y.py"]


def test_read_durations_skips_comments_and_bad_lines(tmp_path):
    path = tmp_path / "gpu_durations.txt"
    text = "# seconds node\n12.5 tests/a.py::t[1]\nbad\nx tests/a.py::t[2]\n"
    text += "3 tests/a.py::t[C(a=1, b=2)]\n"
    path.write_text(text)
    assert shard_tests.read_durations(path) == {
        "tests/a.py::t[1]": 12.5,
        "tests/a.py::t[C(a=1, b=2)]": 3.0,  # a node id with spaces
    }
    assert shard_tests.read_durations(tmp_path / "missing.txt") == {}


def test_gather_finished_and_cut_off_tests(tmp_path):
    """Finished tests count end - start; one whose unit was killed counts to the file's last
    write; both over the earlier file's times."""
    times = tmp_path / "gpu_tests__test_a@0.times"
    times.write_text(
        "start 100.0 tests/a.py::t[1]\nend 112.5 tests/a.py::t[1]\n"
        "start 113.0 tests/a.py::slow\ngarbage\n"
    )
    os.utime(times, (400.0, 400.0))  # the unit was killed at t = 400
    known = {"tests/a.py::t[1]": 99.0, "tests/a.py::old": 3.0}
    got = shard_tests.gather(tmp_path, known)
    assert got == {"tests/a.py::t[1]": 12.5, "tests/a.py::slow": 287.0, "tests/a.py::old": 3.0}


def test_conftest_writes_test_times(tmp_path):
    """Under TILEWISE_TEST_TIMES the test session writes a start and an end line per test."""
    out = tmp_path / "unit.times"
    node = "tests/test_shard_tests.py::test_read_durations_skips_comments_and_bad_lines"
    env = dict(os.environ, TILEWISE_TEST_TIMES=str(out))
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
        cwd=_PATH.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    events = [line.split()[0] + " " + line.split()[2] for line in out.read_text().splitlines()]
    assert events == [f"start {node}", f"end {node}"]
    assert shard_tests.gather(tmp_path, {})[node] >= 0.0


def test_remaining_lists_the_cases_that_never_ended(tmp_path):
    """A shard's cases without an ``end`` line (cut, or never started: no times file at all) are
    listed, in the shards' order; finished ones (passed or failed) are not."""
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "gpu_tests__test_a@0.ids").write_text("tests/a.py::t[1]\ntests/a.py::t[2]\n\n")
    (shards / "gpu_tests__test_a@1.ids").write_text("tests/a.py::u\n")
    (tmp_path / "gpu_tests__test_a@0.times").write_text(
        "start 1.0 tests/a.py::t[1]\nend 2.0 tests/a.py::t[1]\nstart 2.0 tests/a.py::t[2]\n"
    )
    assert shard_tests.remaining(tmp_path) == ["tests/a.py::t[2]", "tests/a.py::u"]
    assert shard_tests.remaining(tmp_path / "nothing") == []


def test_split_deals_an_id_file_into_units(tmp_path):
    """``--split IDS UNITS PREFIX`` writes each unit's ids and prints the unit count (0 for an
    empty file, which writes nothing)."""
    ids = tmp_path / "left.ids"
    ids.write_text("tests/a.py::x\n\ntests/b.py::y\ntests/b.py::z\n")
    prefix = tmp_path / "gpu_tests__rerun"
    run = [sys.executable, str(_PATH), "--split", str(ids), "2", str(prefix)]
    res = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "2", res.stderr
    units = [Path(f"{prefix}@{j}.ids").read_text().split() for j in range(2)]
    assert sorted(units[0] + units[1]) == ["tests/a.py::x", "tests/b.py::y", "tests/b.py::z"]
    ids.write_text("\n")
    res = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.stdout.strip() == "0"
