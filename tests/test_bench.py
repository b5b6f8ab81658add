"""CPU tests of the benchmark harness: arithmetic, files, plots, summaries and the CLI.

Nothing here asserts on a timing: benchmarks are never timed tests.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest
import torch

from tilewise import cli
from tilewise.bench import metrics
from tilewise.bench.ceilings import Ceilings
from tilewise.bench.checks import compare
from tilewise.bench.pointwise import Case, PointwiseConfig, measure_case, summarize
from tilewise.bench.results import (
    device_slug,
    environment,
    format_table,
    load_results,
    save_results,
)
from tilewise.bench.timing import (
    TIMERS,
    Timing,
    profile_kernels,
    rotation_count,
    time_calls,
    time_events,
)
from tilewise.registry import OPS, OpSpec, RowsProblem, rows_for_bytes

MB = 1 << 20
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


# --- metrics and rotation -------------------------------------------------------------------------


def test_metrics_arithmetic():
    assert metrics.effective_bandwidth(3e9, 1e-3) == pytest.approx(3e12)
    assert metrics.achieved_flops(2 * 8192**3, 2.0) == pytest.approx(8192**3)
    assert metrics.fraction(2.5e12, 3e12) == pytest.approx(2.5 / 3)
    assert metrics.fraction_of_copy(3e9, 2e-3, 3e12) == pytest.approx(0.5)
    assert metrics.fraction_of_matmul(1e12, 2.0, 1e12) == pytest.approx(0.5)
    assert metrics.speedup(baseline_s=3e-3, candidate_s=1e-3) == pytest.approx(3.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            metrics.effective_bandwidth(1, bad)
    with pytest.raises(ValueError):
        metrics.fraction(1.0, 0.0)


@pytest.mark.parametrize("nbytes", [1, 8 * MB, 33 * MB, 50 * MB, 100 * MB, 101 * MB, 1 << 30])
def test_rotation_count_exceeds_twice_l2(nbytes):
    l2 = 50 * MB
    k = rotation_count(nbytes, l2)
    assert k >= 1
    assert k * nbytes > 2 * l2 or (k == 1 and nbytes > 2 * l2)
    if k > 1:
        assert (k - 1) * nbytes <= 2 * l2  # the smallest such count


def test_rotation_count_edges():
    assert rotation_count(8 * MB, 50 * MB) == 13
    assert rotation_count(4 * MB, 0) == 1
    with pytest.raises(ValueError):
        rotation_count(0, 50 * MB)


def test_time_events_cpu_fallback_rotates_arg_sets():
    seen = []
    sets = [(i, torch.zeros(1)) for i in range(3)]  # a CPU tensor: the perf_counter path
    t = time_events(lambda i, _: seen.append(i), sets, warmup=2, reps=7)
    assert isinstance(t, Timing) and t.reps == 7 and t.method == "perf_counter"
    assert t.p20_s <= t.median_s <= t.p80_s
    assert seen == [0, 1] + [i % 3 for i in range(7)]


@pytest.mark.parametrize("timer", TIMERS)
def test_time_calls_runs_each_timer_over_the_arg_sets(timer):
    """The probes' timer switch: both timers call ``fn`` over every arg set (on the CPU through
    the perf_counter fallback), and an unknown timer is refused by name."""
    seen = []
    sets = [(i, torch.zeros(1)) for i in range(3)]
    t = time_calls(lambda i, _: seen.append(i), sets, timer)
    assert isinstance(t, Timing) and t.method == "perf_counter" and t.reps > 0
    assert set(seen) == {0, 1, 2} and len(seen) > t.reps
    with pytest.raises(ValueError, match="timer"):
        time_calls(lambda i, _: None, sets, "wallclock")
    with pytest.raises(ZeroDivisionError):  # a failing call's error reaches the probe as is
        time_calls(lambda i, _: 1 / 0, sets, timer)


@no_cuda
def test_profile_kernels_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        profile_kernels(lambda: None)


# --- result files and plots ---------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    ceilings = Ceilings(2.98e12, {"fp16": 7.87e14, "bf16": 7.35e14}, device="test", method="x")
    records = [{"op": "bias_act", "median_s": 1e-3, "eff_bw": math.inf}]
    env = environment("cpu")
    assert "hostname" not in json.dumps(env).lower()
    path = save_results("pointwise", records, ceilings, tmp_path / "out", env=env)
    assert path.name == f"pointwise__{device_slug(env['device_name'])}.json"
    doc = load_results(path)
    assert set(doc) == {"study", "environment", "ceilings", "records", "created"}
    assert doc["study"] == "pointwise"
    assert doc["environment"]["torch"] == torch.__version__
    assert Ceilings.from_dict(doc["ceilings"]) == ceilings
    assert doc["records"] == [{"op": "bias_act", "median_s": 1e-3, "eff_bw": None}]
    assert dt.datetime.fromisoformat(doc["created"]).utcoffset() == dt.timedelta(0)


def test_load_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"records": []}')
    with pytest.raises(ValueError, match="missing keys"):
        load_results(p)


def test_device_slug():
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def _record(op, pass_, impl, size_mb, median_s, frac, dtype="fp16"):
    return {
        "op": op, "pass": pass_, "impl": impl, "dtype": dtype, "m": 1, "n": 1024,
        "activation": "relu", "size_mb": size_mb, "tensor_mb": size_mb, "median_s": median_s,
        "frac_copy": frac, "eff_bw": None if frac is None else frac * 3e12,
    }  # fmt: skip


def _synthetic():
    recs = []
    for size in (4, 64, 256):
        for pass_ in ("fwd", "bwd"):
            recs.append(_record("bias_act", pass_, "tilewise", size, 1.0, 0.9))
            recs.append(_record("bias_act", pass_, "eager", size, 2.0, 0.45))
            recs.append(_record("bias_act", pass_, "compile", size, 1.5, 0.6))
    return recs


def test_plot_writes_png(tmp_path):
    from tilewise.bench.plots import plot_fraction_of_copy

    results = {"records": _synthetic(), "ceilings": {"copy_bytes_per_s": 3e12}}
    out = plot_fraction_of_copy(results, tmp_path / "fig.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_summarize_flags_targets():
    recs = [
        # 64 MB, fast and near the copy ceiling: meets the target
        _record("bias_act", "fwd", "tilewise", 64, 1.0, 0.90),
        _record("bias_act", "fwd", "eager", 64, 2.0, 0.45),
        _record("bias_act", "fwd", "compile", 64, 1.2, 0.75),
        # 256 MB, fast but only 0.8 of copy: misses
        _record("bias_act", "bwd", "tilewise", 256, 1.0, 0.80),
        _record("bias_act", "bwd", "eager", 256, 2.0, 0.40),
        _record("bias_act", "bwd", "compile", 256, 1.1, 0.72),
        # 4 MB: bandwidth not required, but slower than compile: misses
        _record("layer_norm", "fwd", "tilewise", 4, 1.0, 0.30),
        _record("layer_norm", "fwd", "eager", 4, 2.0, 0.15),
        _record("layer_norm", "fwd", "compile", 4, 0.9, 0.33),
        # 4 MB, faster than both: meets
        _record("layer_norm", "bwd", "tilewise", 4, 1.0, 0.30),
        _record("layer_norm", "bwd", "eager", 4, 2.0, 0.15),
        # 64 MB without a ceiling: unknown
        _record("layer_norm", "fwd", "tilewise", 64, 1.0, None),
        _record("layer_norm", "fwd", "eager", 64, 2.0, None),
        # not timed (failed check): ignored
        {**_record("layer_norm", "bwd", "tilewise", 256, None, None), "error": "x"},
    ]
    rows = {(r.op, r.pass_, r.size_mb): r for r in summarize(recs)}
    assert len(rows) == 5
    ok = rows[("bias_act", "fwd", 64)]
    assert ok.meets_target is True
    assert ok.vs_eager == pytest.approx(2.0) and ok.vs_compile == pytest.approx(1.2)
    assert ok.frac == {"tilewise": 0.90, "eager": 0.45, "compile": 0.75}
    assert rows[("bias_act", "bwd", 256)].meets_target is False
    assert rows[("layer_norm", "fwd", 4)].meets_target is False
    assert rows[("layer_norm", "bwd", 4)].meets_target is True
    assert rows[("layer_norm", "bwd", 4)].vs_compile is None
    assert rows[("layer_norm", "fwd", 64)].meets_target is None


def test_format_table_aligns_columns():
    text = format_table(["name", "value"], [["a", "1.5"], ["longer", "10.25"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # numbers right-aligned to one width
    assert lines[2].startswith("a ") and lines[2].endswith("  1.5")


# --- the study on tiny CPU problems --------------------------------------------------------------


def test_quick_config_grid():
    cfg = PointwiseConfig.quick()
    cases = cfg.cases()
    assert {c.problem.dtype for c in cases} == {"fp16"}
    assert {c.size_mb for c in cases} == {4.0, 64.0}
    assert {c.op for c in cases} == set(OPS)
    for op in OPS:
        assert len({c.problem.n for c in cases if c.op == op}) == 1
    c = cases[0]
    assert c.problem.m == rows_for_bytes(c.problem.n, "fp16", int(c.size_mb * MB))


def test_measure_case_cpu_records():
    case = Case("bias_act", RowsProblem(16, 64, "fp32", "gelu"), 16 * 64 * 4 / MB)
    ceilings = Ceilings(1e10, {})
    recs = measure_case(case, ("tilewise", "eager"), ceilings=ceilings, device="cpu", warmup=1,
                        reps=2)  # fmt: skip
    assert {(r["pass"], r["impl"]) for r in recs} == {
        (p, i) for p in ("fwd", "bwd") for i in ("tilewise", "eager")
    }
    for r in recs:
        assert r["checked"] is True and r["error"] is None
        assert r["bytes"] == OPS["bias_act"].bytes(case.problem, r["pass"])
        assert r["eff_bw"] == pytest.approx(r["bytes"] / r["median_s"])
        assert r["frac_copy"] == pytest.approx(r["eff_bw"] / 1e10)


def test_measure_case_forward_only():
    case = Case("layer_norm", RowsProblem(8, 32, "fp32", "relu"), 0.0)
    recs = measure_case(case, ("eager",), passes=("fwd",), device="cpu", warmup=1, reps=2)
    assert [(r["pass"], r["impl"], r["checked"]) for r in recs] == [("fwd", "eager", True)]
    assert recs[0]["frac_copy"] is None  # no ceilings given


def test_failed_check_is_not_timed(monkeypatch):
    spec = OPS["bias_act"]
    broken = OpSpec(
        name="broken",
        make_inputs=spec.make_inputs,
        tilewise=lambda x, bias, activation="relu": 2 * spec.reference(x, bias, activation),
        reference=spec.reference,
        bytes=spec.bytes,
        flops=spec.flops,
        grad_inputs=spec.grad_inputs,
    )
    monkeypatch.setitem(OPS, "broken", broken)
    recs = measure_case(Case("broken", RowsProblem(8, 32, "fp32"), 0.0), ("tilewise", "eager"),
                        device="cpu", warmup=1, reps=2)  # fmt: skip
    assert recs and all(r["checked"] is False and r["median_s"] is None for r in recs)
    assert all("correctness check failed" in r["error"] for r in recs)


def test_failing_impl_is_an_error_record_and_holds_no_frames(monkeypatch):
    """An impl that raises while being built or timed answers with an error record; the others
    are still timed, and the stored exception carries no traceback (whose frames would keep the
    pass's timers and graphs alive until a garbage collection)."""
    from tilewise.bench import pointwise

    spec, p = OPS["bias_act"], RowsProblem(8, 32, "fp32")
    sets = [spec.make_inputs(p, torch.device("cpu"))]

    def boom():
        raise RuntimeError("no such impl here")

    makers = {
        "eager": lambda: pointwise.implementation(spec, "eager", "relu"),
        "broken": boom,
    }
    for pass_ in ("fwd", "bwd"):
        got = pointwise._time_impls(makers, spec, sets, pass_, warmup=1, reps=2)
        assert list(got) == ["eager", "broken"]
        assert got["eager"].median_s > 0
        assert isinstance(got["broken"], RuntimeError) and got["broken"].__traceback__ is None
    recs = measure_case(Case("bias_act", p, 0.0), ("tilewise", "nope"), device="cpu", warmup=1,
                        reps=2)  # fmt: skip
    assert {r["impl"]: r["error"] is None for r in recs} == {"tilewise": True, "nope": False}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compare_accepts_rounding_and_rejects_garbage(dtype):
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    ref = torch.randn(64, 128)
    assert compare(ref.to(dtype), ref.to(dtype), ref, name)[0]
    assert not compare((ref + 0.5).to(dtype), ref.to(dtype), ref, name)[0]
    nan = ref.to(dtype).clone()
    nan[3, 5] = float("nan")
    assert not compare(nan, ref.to(dtype), ref, name)[0]


# --- CLI -----------------------------------------------------------------------------------------


@no_cuda
def test_tour_on_cpu(capsys):
    assert cli.main(["tour"]) == 0
    out = capsys.readouterr().out
    assert cli.NO_GPU in out
    assert "bias_act" in out and "layer_norm" in out
    assert "NO" not in out.split("CPU checks", 1)[1]  # every tilewise result agreed
    steps = out.split("Training steps", 1)[1]  # the model-level rows ran and agreed
    assert "mlp" in steps and "convfirst" in steps and "grouped convs swapped" in steps


@no_cuda
def test_bench_pointwise_refuses_without_cuda(capsys, tmp_path):
    assert cli.main(["bench", "pointwise", "--quick", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_pointwise_options_override_quick():
    args = cli.build_parser().parse_args(
        ["bench", "pointwise", "--quick", "--dtypes", "bf16", "--sizes-mb", "1", "2"]
    )
    cfg = cli.pointwise_config(args)
    assert cfg.dtypes == ("bf16",) and cfg.sizes_mb == (1.0, 2.0) and cfg.max_n_per_op == 1


def test_study_runner_wiring(tmp_path, monkeypatch, capsys):
    """The CUDA-only path of every ``tilewise bench`` study: ceilings, run, report, JSON."""
    import argparse

    from tilewise.bench import ceilings as ceilings_mod

    fake = Ceilings(3e12, {"fp16": 7e14}, device="test", method="x")
    monkeypatch.setattr(cli, "_needs_cuda", lambda what: True)
    monkeypatch.setattr(ceilings_mod, "measure_ceilings", lambda *a, **k: fake)
    seen = {}

    def run(ceilings):
        seen["ceilings"] = ceilings
        return [{"op": "x", "median_s": 1e-3}]

    def report(records, title):
        seen["report"] = (records, title)

    args = argparse.Namespace(out=tmp_path, plot=False)
    assert cli._run_study(args, "demo", run, report, "demo study", "demo") == 0
    assert seen["ceilings"] is fake
    assert seen["report"][0] == [{"op": "x", "median_s": 1e-3}]
    assert seen["report"][1].startswith("demo study, ")
    saved = json.loads(next(tmp_path.glob("demo__*.json")).read_text())
    assert saved["records"] == [{"op": "x", "median_s": 1e-3}]
    assert "wrote" in capsys.readouterr().out


def test_a_study_cut_short_leaves_its_records_so_far(tmp_path, monkeypatch):
    """Each finished problem is checkpointed to ``<study>.partial__<device>.json``; a study
    stopped by a time limit (here: an exception in the third problem) leaves the first two;
    one that finishes removes the partial file."""
    import argparse

    from tilewise.bench import ceilings as ceilings_mod
    from tilewise.bench.grid import run_grid

    fake = Ceilings(3e12, {"fp16": 7e14}, device="test", method="x")
    monkeypatch.setattr(cli, "_needs_cuda", lambda what: True)
    monkeypatch.setattr(ceilings_mod, "measure_ceilings", lambda *a, **k: fake)

    def measure(i):
        if i == 3:
            raise KeyboardInterrupt  # a stop mid-grid (SIGTERM ends it after the same writes)
        return [{"problem": i, "median_s": 1e-3 * i}]

    def run(ceilings):
        return run_grid([1, 2, 3], measure, desc="demo", progress=False)

    args = argparse.Namespace(out=tmp_path, plot=False)
    with pytest.raises(KeyboardInterrupt):
        cli._run_study(args, "cut", run, lambda r, t: None, "cut study", "cut")
    (partial,) = tmp_path.glob("cut.partial__*.json")
    saved = json.loads(partial.read_text())
    assert [r["problem"] for r in saved["records"]] == [1, 2]
    assert not list(tmp_path.glob("cut__*.json"))
    # a whole run: the final file, and the partial one gone
    ok = lambda c: run_grid([1, 2], measure, desc="demo", progress=False)  # noqa: E731
    assert cli._run_study(args, "whole", ok, lambda r, t: None, "whole study", "whole") == 0
    assert len(list(tmp_path.glob("whole__*.json"))) == 1
    assert not list(tmp_path.glob("whole.partial__*.json"))


def test_checkpoint_failures_do_not_stop_the_grid(caplog):
    from tilewise.bench.grid import checkpointing, run_grid

    def full_disk(records):
        raise OSError("No space left on device")

    with checkpointing(full_disk), caplog.at_level("WARNING"):
        got = run_grid([1, 2], lambda i: [{"i": i}], desc="d", progress=False)
    assert got == [{"i": 1}, {"i": 2}]
    assert any("checkpoint not written" in r.message for r in caplog.records)
    # outside the context nothing is checkpointed
    seen = []
    with checkpointing(seen.append):
        pass
    run_grid([1], lambda i: [{"i": i}], desc="d", progress=False)
    assert seen == []


def test_host_us_per_call_counts_every_call():
    from tilewise.bench.timing import host_us_per_call

    calls = []
    us = host_us_per_call(lambda: calls.append(1), iters=30, warmup=5)
    assert len(calls) == 35 and 0 < us < 1e5


@pytest.mark.gpu
def test_time_graph_keeps_the_gpu_ahead_of_tiny_replays():
    """A graph of 5-us spin kernels reads ~5 us per call: the replays run back to back behind
    the lead spin, so the host's graph launches stay out of the timed windows."""
    from tilewise.bench.timing import _sleep_cycles_per_s, time_graph

    x = torch.zeros(1, device="cuda")
    cycles = int(5e-6 * _sleep_cycles_per_s(torch.cuda.current_device()))
    t = time_graph(lambda _x: torch.cuda._sleep(cycles), [(x,)], rounds=4, replays=40)
    assert t.method == "cuda-graph+lead" and t.reps == 40
    assert 4e-6 < t.median_s < 10e-6, t  # loose: clocks under load stretch the spin
    plain = time_graph(lambda _x: torch.cuda._sleep(cycles), [(x,)], 1, 4, 40, keep_ahead=False)
    assert plain.method == "cuda-graph"
    assert t.median_s <= 1.1 * plain.median_s, (t, plain)  # the lead adds nothing to a window


def test_interleaved_rotates_turns_and_takes_every_replay():
    """Timers sampled in turns whose order rotates; each gets exactly its count of samples."""
    from tilewise.bench.timing import interleaved

    order = []

    class Fake:
        method = "cuda-graph"

        def __init__(self, name, value):
            self.name, self.value = name, value

        def sample(self, n):
            order.append((self.name, n))
            return [self.value] * n

    got = interleaved({"a": Fake("a", 1.0), "b": Fake("b", 2.0), "c": Fake("c", 3.0)}, 7)
    assert [name for name, _ in order[:6]] == ["a", "b", "c", "b", "c", "a"]
    assert {k: (t.median_s, t.reps) for k, t in got.items()} == {
        "a": (1.0, 7),
        "b": (2.0, 7),
        "c": (3.0, 7),
    }
    assert sum(n for name, n in order if name == "a") == 7
    assert interleaved({}, 5) == {}
    order.clear()
    got = interleaved({"a": Fake("a", 1.0), "b": Fake("b", 2.0)}, {"a": 5, "b": 40})
    assert (got["a"].reps, got["b"].reps) == (5, 40)
    assert [n for name, n in order if name == "b"] == [10, 10, 10, 10]
    order.clear()  # a timer with 2 samples takes 2 turns; the others still rotate over 4
    got = interleaved({"a": Fake("a", 1.0), "b": Fake("b", 2.0)}, {"a": 2, "b": 8})
    assert [n for name, n in order if name == "a"] == [1, 1] and got["b"].reps == 8
    with pytest.raises(ValueError, match="counts"):
        interleaved({"a": Fake("a", 1.0)}, 0)


def test_interleaved_keeps_the_others_when_one_timer_fails():
    """An impl that raises while timed (out of memory, say) answers with its exception; the
    other timers keep their samples and finish their turns."""
    from tilewise.bench.timing import interleaved

    class Ok:
        method = "cuda-graph"

        def sample(self, n):
            return [1.0] * n

    class Boom(Ok):
        def sample(self, n):
            raise RuntimeError("out of memory")

    got = interleaved({"ok": Ok(), "boom": Boom(), "ok2": Ok()}, 8)
    assert isinstance(got["boom"], RuntimeError)
    assert got["ok"].reps == got["ok2"].reps == 8


def test_merge_joins_parts_of_one_device(tmp_path, capsys):
    """A study run in parts (one process per batch) becomes one file; parts of different
    devices are refused."""
    rec = {"record": "pass", "block": "mbconv", "impl": "tilewise", "pass": "fprop", "batch": 32}
    env = {"device_name": "GPU A"}
    a = save_results("gconv-insitu-a", [rec], {"copy_bytes_per_s": 3e12}, tmp_path, env)
    part_b = [{**rec, "batch": 64}]
    b = save_results("gconv-insitu-b", part_b, {"copy_bytes_per_s": 3.1e12}, tmp_path, env)
    out = tmp_path / "merged"
    assert cli.main(["bench", "merge", "gconv-insitu-ab", str(a), str(b), "--out", str(out)]) == 0
    merged = load_results(out / "gconv-insitu-ab__gpu-a.json")
    assert [r["batch"] for r in merged["records"]] == [32, 64]
    assert [c["copy_bytes_per_s"] for c in merged["ceilings"]["parts"]] == [3e12, 3.1e12]
    assert merged["ceilings"]["copy_bytes_per_s"] == 3.1e12  # the plots' line: the median
    with pytest.raises(ValueError, match="study"):  # never overwrite a part
        cli.main(["bench", "merge", "gconv-insitu-a", str(a), str(b), "--out", str(tmp_path)])
    c = save_results("gconv-insitu-c", [rec], {"copy": 3e12}, tmp_path, {"device_name": "GPU B"})
    with pytest.raises(ValueError, match="files"):
        cli.main(["bench", "merge", "x", str(a), str(c), "--out", str(out)])


def test_merge_unique_by_keeps_the_latest_part_of_a_cell(tmp_path, capsys):
    """A cell re-run in a later part replaces the earlier reading (``--unique-by``); without it
    both stay; a field the records lack is refused by name."""
    env = {"device_name": "GPU A"}
    base = {"dtype": "bf16", "layers": 8, "hidden": 256, "impl": "graph", "error": None}
    a = save_results("mlp-a", [{**base, "batch": 32, "median_s": 1.0}, {**base, "batch": 64,
                     "median_s": 2.0}], {}, tmp_path, env)  # fmt: skip
    part_b = [
        {**base, "batch": 64, "median_s": 3.0},
        {**base, "batch": 32, "median_s": None, "error": "boom"},
    ]
    b = save_results("mlp-b", part_b, {}, tmp_path, env)
    out = tmp_path / "merged"
    key = ["--unique-by", "dtype", "layers", "batch", "hidden", "impl"]
    assert cli.main(["bench", "merge", "mlp-ab", str(a), str(b), "--out", str(out), *key]) == 0
    got = load_results(out / "mlp-ab__gpu-a.json")["records"]
    # batch 64 re-read in part b wins; batch 32's failed re-run there does not replace part a's
    assert [(r["batch"], r["median_s"]) for r in got] == [(32, 1.0), (64, 3.0)]
    assert cli.main(["bench", "merge", "mlp-all", str(a), str(b), "--out", str(out)]) == 0
    assert len(load_results(out / "mlp-all__gpu-a.json")["records"]) == 4
    with pytest.raises(ValueError, match="unique_by.*no record has.*seed"):
        cli.main(
            ["bench", "merge", "mlp-x", str(a), str(b), "--out", str(out), "--unique-by", "seed"]
        )


def test_unique_records_keys_a_missing_field_as_none():
    """In-situ parts mix pass records and step records (no ``pass_``): both kinds dedupe."""
    from tilewise.bench.reports import unique_records

    step = {"record": "step", "impl": "eager", "batch": 32}
    fprop = {"record": "pass", "impl": "eager", "batch": 32, "pass_": "fprop"}
    recs = [step | {"ms": 1}, fprop | {"gbs": 1}, step | {"ms": 2}, fprop | {"gbs": 2}]
    got = unique_records(recs, ["record", "impl", "batch", "pass_"])
    assert got == [step | {"ms": 2}, fprop | {"gbs": 2}]
    assert unique_records(recs, []) == recs


def test_merge_prints_and_plots_mlp_parts(tmp_path, capsys):
    """MLP grids run in parts (one process per dtype or layer count) merge into one table and
    one heatmap pair, as a study run whole writes."""
    env = {"device_name": "GPU A"}

    def recs(layers):
        base = {"dtype": "fp32", "layers": layers, "batch": 2, "hidden": 256, "flops": 1}
        return [
            {**base, "impl": impl, "median_s": s, "error": None, "checked": True}
            for impl, s in (("eager", 6e-5), ("graph", 6e-6), ("tilewise", 5e-6))
        ]

    a = save_results("mlp-a", recs(1), {"copy_bytes_per_s": 3e12}, tmp_path, env)
    b = save_results("mlp-b", recs(8), {"copy_bytes_per_s": 3e12}, tmp_path, env)
    out = tmp_path / "merged"
    assert cli.main(["bench", "merge", "mlp-ab", str(a), str(b), "--out", str(out), "--plot"]) == 0
    text = capsys.readouterr().out
    assert "1.20x" in text  # graph 6 us / tilewise 5 us, in the merged table
    assert (out / "mlp-ab__gpu-a.png").exists() and (out / "mlp-ab__gpu-a-vs-graph.png").exists()
