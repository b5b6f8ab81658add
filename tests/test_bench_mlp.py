"""CPU tests of the MLP study's wiring (tilewise through the Triton interpreter), and one GPU run.

Nothing here asserts on a timing: benchmarks are never timed tests.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

from tilewise import cli
from tilewise.bench import grid, mlp
from tilewise.bench.ceilings import Ceilings
from tilewise.bench.results import load_results, save_results

TINY = mlp.MLPConfig(
    layers=(1, 2),
    batches=(4,),
    hiddens=(32, 64),
    dtypes=("fp32",),
    impls=("eager", "graph", "tilewise", "strassen"),
    strassen_min_hidden=64,
    warmup=1,
    reps=2,
    min_samples=2,
    tiny_reps=2,
    train_shape=(2, 32, 8),
)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def test_configs():
    q, f = mlp.MLPConfig.quick(), mlp.MLPConfig.full()
    assert (q.layers, q.batches, q.hiddens) == ((1, 8), (2, 64, 512), (256, 1024, 4096))
    assert f.layers == (1, 2, 4, 8) and f.batches[-2:] == (512, 4096) and f.hiddens[-1] == 8192
    assert len(f.cells()) == 4 * 9 * 7 * 3 and "compile" in f.impls
    with pytest.raises(ValueError, match="dtype"):
        mlp.MLPConfig(dtypes=("fp8",)).cells()


@no_cuda
def test_cpu_grid_checks_and_records(tmp_path):
    recs = mlp.run_mlp(TINY, None, "cpu", progress=False)
    cells = [r for r in recs if r.get("study") != "train"]
    assert len(cells) == 4 * len(TINY.impls)
    by = {(r["layers"], r["hidden"], r["impl"]): r for r in cells}
    for (_, hidden, impl), r in by.items():
        if impl == "graph":
            assert r["median_s"] is None and "skipped" in r["error"] and "CUDA" in r["error"]
        elif impl == "strassen" and hidden < 64:
            assert r["median_s"] is None and "strassen_min_hidden" in r["error"]
        else:  # checked against the fp64 reference, then timed
            assert r["checked"] and r["check_note"].startswith(("max abs err", "0/"))
            assert r["median_s"] > 0 and r["timer"] == "perf_counter" and not r["graph_replayed"]
    train = {r["impl"]: r for r in recs if r.get("study") == "train"}
    assert set(train) == {"eager", "tilewise"}
    assert all(r["error"] is None and r["median_s"] > 0 for r in train.values())
    rows = mlp.summarize(recs)
    assert len(rows) == 4 and all(r["x_eager"] and r["x_graph"] is None for r in rows)
    assert mlp.errors(recs) == []  # skips are not errors
    path = save_results("mlp", recs, None, tmp_path)
    png = mlp.plot_mlp(load_results(path), path.with_suffix(".png"))
    assert png.exists() and png.stat().st_size > 1000
    assert not png.with_name(png.stem + "-vs-graph.png").exists()  # no graph column on a CPU


def test_failed_check_is_recorded_not_timed(monkeypatch):
    from tilewise.nn import Linear

    real = Linear.forward
    monkeypatch.setattr(Linear, "forward", lambda self, x: real(self, x) + 1.0)
    cfg = replace(TINY, layers=(1,), hiddens=(32,), impls=("eager", "tilewise"), train=False)
    recs = mlp.run_mlp(cfg, None, "cpu", progress=False)
    tw = next(r for r in recs if r["impl"] == "tilewise")
    assert not tw["checked"] and tw["median_s"] is None
    assert tw["error"].startswith("correctness check failed")
    assert any("correctness" in e for e in mlp.errors(recs))


def test_plot_both_figures(tmp_path):
    def rec(impl, s, batch, hidden, dtype="fp16"):
        return dict(impl=impl, median_s=s, dtype=dtype, layers=8, batch=batch, hidden=hidden)

    recs = [
        rec(i, s, b, h, d)
        for d in ("fp32", "fp16")
        for b in (2, 64)
        for h in (256, 1024)
        for i, s in (("eager", 3e-4), ("graph", 1e-4), ("tilewise", 8e-5), ("strassen", 9e-5))
    ]
    rows = mlp.summarize(recs)
    assert all(r["best"] == "tilewise" and r["x_eager"] == pytest.approx(3.75) for r in rows)
    png = mlp.plot_mlp({"records": recs}, tmp_path / "m.png")
    assert png.exists() and (tmp_path / "m-vs-graph.png").exists()
    assert not (tmp_path / "m-vs-compile.png").exists()  # no compile column timed
    headers, cells = mlp.summary_table(recs)
    assert headers[-3:] == ["x eager", "x graph", "x compile"]
    assert cells[0][-3:] == ["3.75x", "1.25x", "-"]
    recs += [
        rec("compile", 2e-4, b, h, d)
        for d in ("fp32", "fp16")
        for b in (2, 64)
        for h in (256, 1024)
    ]
    assert all(r["x_compile"] == pytest.approx(2.5) for r in mlp.summarize(recs))
    mlp.plot_mlp({"records": recs}, tmp_path / "c.png")
    assert (tmp_path / "c-vs-compile.png").stat().st_size > 1000
    with pytest.raises(ValueError):
        mlp.plot_mlp({"records": [rec("eager", 1e-4, 2, 256)]}, tmp_path / "n.png")


def test_cli_options_and_alias():
    for argv in (["bench", "mlp"], ["mlp-bench"]):
        args = cli.build_parser().parse_args(
            [*argv, "--quick", "--dtypes", "fp16", "--no-compile", "--no-train", "--plot"]
        )
        assert args.func is cli.run_mlp_command
        cfg = cli.mlp_config(args)
        assert cfg.dtypes == ("fp16",) and "compile" not in cfg.impls and not cfg.train
        assert cfg.layers == (1, 8) and args.plot and args.study == "mlp"
    full = cli.mlp_config(cli.build_parser().parse_args(["mlp-bench", "--hiddens", "512"]))
    assert full.hiddens == (512,) and full.layers == (1, 2, 4, 8) and "compile" in full.impls


def test_warm_compile_builds_each_cell_once_and_reports_failures(monkeypatch):
    """The compile warm-up builds each cell's compiled model as the study does (in process here;
    the study's own ``torch.compile`` options), and a cell that fails is reported, not raised."""
    built = []

    def fake_compile(model, mode=None, dynamic=None):
        assert mode == "max-autotune" and dynamic is False

        def run(x):
            built.append((next(model.parameters()).dtype, len(model) // 2, *x.shape))
            if x.shape[1] == 48:
                raise RuntimeError("inductor said no")
            return model(x)

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = mlp.MLPConfig(dtypes=("fp32",), layers=(1, 2), batches=(4,), hiddens=(32, 48))
    out = mlp.warm_compile(cfg, jobs=0, device="cpu")
    assert [c for c, _ in out] == cfg.cells()
    assert sorted(built) == sorted((torch.float32, n, 4, h) for n in (1, 2) for h in (32, 48))
    for (_, _, _, hidden), res in out:
        assert isinstance(res, str) == (hidden == 48), res
    assert "inductor said no" in dict(out)[("fp32", 1, 4, 48)]
    assert mlp.warm_compile(replace(cfg, impls=("eager",)), jobs=0, device="cpu") == []


def test_warm_compile_in_worker_processes_fills_the_cache(tmp_path, monkeypatch):
    """Real torch.compile (default mode, on the CPU) in two spawned workers; the study's process
    then finds the cell built: its own compile of it takes well under the worker's time."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = mlp.MLPConfig(
        dtypes=("fp32",), layers=(2,), batches=(4,), hiddens=(24, 40), compile_mode="default"
    )
    out = mlp.warm_compile(cfg, jobs=2, device="cpu")
    assert [c for c, _ in out] == cfg.cells()
    assert all(isinstance(t, float) for _, t in out), out
    again = mlp._compile_worker(cfg, cfg.cells()[:1], "cpu")[0][1]
    assert isinstance(again, float) and again < out[0][1], (again, out)


def test_cli_compile_warm_jobs_option():
    args = cli.build_parser().parse_args(["bench", "mlp", "--compile-warm-jobs", "6"])
    assert args.compile_warm_jobs == 6
    assert cli.build_parser().parse_args(["mlp-bench"]).compile_warm_jobs == 0


@no_cuda
def test_cli_refuses_without_cuda(tmp_path, capsys):
    assert cli.main(["mlp-bench", "--quick", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@no_cuda
def test_cli_runs_study_end_to_end(tmp_path, monkeypatch, capsys):
    """The CUDA-only runner with its GPU checks faked: grid on the CPU, tables, JSON and PNG."""
    from tilewise.bench import ceilings as ceilings_mod

    fake = Ceilings(3e12, {"fp32": 5e13}, device="test", method="x")
    monkeypatch.setattr(cli, "_needs_cuda", lambda what: True)
    monkeypatch.setattr(ceilings_mod, "measure_ceilings", lambda *a, **k: fake)
    argv = ["bench", "mlp", "--dtypes", "fp32", "--layers", "1", "--batches", "4"]
    argv += ["--hiddens", "32", "--impls", "eager", "tilewise", "--reps", "2", "--warmup", "1"]
    argv += ["--no-train", "--plot", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "MLP grid" in out and "x eager" in out
    doc = json.loads(next(tmp_path.glob("mlp__*.json")).read_text())
    assert {r["impl"] for r in doc["records"]} == {"eager", "tilewise"}
    assert all(r["frac_matmul"] is not None for r in doc["records"])
    assert next(tmp_path.glob("mlp__*.png")).stat().st_size > 1000
    assert cli.main(["bench", "report", str(tmp_path)]) == 0


@pytest.mark.gpu
def test_quick_grid_on_gpu(tmp_path):
    cfg = mlp.MLPConfig.quick(dtypes=("fp16",), impls=("eager", "graph", "tilewise", "strassen"))
    recs = mlp.run_mlp(cfg, None, "cuda", progress=False)
    errs = mlp.errors(recs)
    assert errs == [], "\n".join(errs)
    timed = [r for r in recs if r["median_s"] is not None]
    fwd = [r for r in timed if r.get("study") != "train"]
    assert all(r["graph_replayed"] for r in fwd if r["impl"] in ("graph", "tilewise", "strassen"))
    assert {r["impl"] for r in recs if r.get("study") == "train"} == {"eager", "tilewise"}
    path = save_results("mlp", recs, None, tmp_path)
    assert mlp.plot_mlp(load_results(path), path.with_suffix(".png")).exists()
    assert (tmp_path / (path.stem + "-vs-graph.png")).exists()


def test_cli_no_isolate_option():
    assert cli.mlp_config(cli.build_parser().parse_args(["mlp-bench"])).isolate is None
    args = cli.build_parser().parse_args(["mlp-bench", "--no-isolate"])
    assert cli.mlp_config(args).isolate is False


def test_cleanup_fault_names_the_first_failing_step():
    ran = []

    def fail():
        ran.append("fail")
        raise RuntimeError("CUDA error: unspecified launch failure\nmore lines")

    steps = [("a", lambda: ran.append("a")), ("skipped", None), ("b", fail), ("c", ran.clear)]
    assert grid.cleanup_fault(steps) == "b: RuntimeError: CUDA error: unspecified launch failure"
    assert ran == ["a", "fail"]  # the step after the fault does not run
    assert grid.cleanup_fault([("a", lambda: None)]) is None


def test_a_fault_in_a_cells_cleanup_keeps_its_timings(monkeypatch):
    """The timings are done (and synchronized) before the cleanup: they stay, marked."""

    def broken(device):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(mlp, "free_memory", broken)
    cfg = replace(TINY, layers=(1,), hiddens=(32,), impls=("eager", "tilewise"), train=False)
    recs = mlp.measure_cell(cfg, "fp32", 1, 4, 32, torch.device("cpu"))
    assert all(r["median_s"] > 0 for r in recs)
    assert all(r["fault_after_timing"].startswith("free_memory: RuntimeError") for r in recs)


def _isolated_probe(mode: str, item: int) -> tuple[list[dict], str | None]:
    """A worker's measure: its pid in the record; item 2 faults, item 4 kills the worker."""
    if mode == "die" and item == 4:
        os._exit(3)
    if mode == "raise" and item == 1:
        raise ValueError("no model for this cell")
    if mode == "hang" and item == 1:
        import time

        time.sleep(600)
    fault = "cleanup: RuntimeError: boom" if item == 2 else None
    return [{"item": item, "pid": os.getpid()}], fault


def test_isolated_runner_starts_a_fresh_worker_after_a_fault():
    with grid.IsolatedRunner(_isolated_probe, "die") as run:
        recs = [r for item in range(1, 7) for r in run(item)]
    pid = {r["item"]: r["pid"] for r in recs}
    assert sorted(pid) == [1, 2, 3, 5, 6]  # the worker that died lost its item only
    assert pid[1] == pid[2] != pid[3]  # a fault's worker is not reused
    assert pid[3] != pid[5] == pid[6] and os.getpid() not in pid.values()
    assert run.faults == 2 and run.pool is None
    with grid.IsolatedRunner(_isolated_probe, "raise") as run:
        assert run(1) == [] and run.last_fault == "worker raised ValueError: no model for this cell"
        assert run(3)[0]["item"] == 3 and run.faults == 1  # a fresh worker went on


def test_isolated_runner_kills_a_hung_worker():
    import time

    with grid.IsolatedRunner(_isolated_probe, "hang", timeout_s=20) as run:
        start = time.perf_counter()
        assert run(1) == [] and run.last_fault == "worker timed out after 20 s"
        assert time.perf_counter() - start < 120  # not the 600 s the item would have slept
        run.timeout_s = None  # a slow machine's fresh worker may take a while to import
        assert run(2)[0]["item"] == 2 and run.faults == 2  # item 2's own fault, a fresh worker


class _FakeRunner:
    """An ``IsolatedRunner`` stand-in: canned records per group, no process; the compile
    group's worker is lost at batch 8."""

    def __init__(self, fn, cfg, device, timeout_s=None):
        self.impls, self.last_fault = cfg.impls, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def __call__(self, cell):
        if "compile" in self.impls and cell[2] == 8:
            self.last_fault = "worker died: boom"
            return []
        times = {"eager": 4e-4, "graph": 2e-4, "tilewise": 1e-4, "compile": 3e-4}
        dtype, layers, batch, hidden = cell
        base = dict(dtype=dtype, layers=layers, batch=batch, hidden=hidden, error=None)
        return [dict(base, impl=i, median_s=times[i]) for i in self.impls]


def test_isolated_cells_join_the_groups_records(monkeypatch):
    """compile's worker apart: one eager record per cell (the first group's), ratios over the
    joined records, a lost worker's impls as error records, and the impls in their order."""
    monkeypatch.setattr(mlp, "IsolatedRunner", _FakeRunner)
    impls = ("eager", "graph", "compile", "tilewise")
    cfg = replace(TINY, layers=(1,), batches=(4, 8), hiddens=(32,), impls=impls, train=False)
    recs = mlp.run_mlp(replace(cfg, isolate=True), None, "cpu", progress=False)
    four = [r for r in recs if r["batch"] == 4]
    assert [r["impl"] for r in four] == list(impls)
    by = {r["impl"]: r for r in four}
    assert by["compile"]["x_graph"] == pytest.approx(2 / 3) and by["tilewise"]["x_eager"] == 4
    lost = [r for r in recs if r["batch"] == 8 and r["impl"] == "compile"]
    assert len(lost) == 1 and lost[0]["error"] == "worker lost: worker died: boom"
    assert lost[0]["median_s"] is None and any("worker lost" in e for e in mlp.errors(recs))


def test_compile_gets_a_process_of_its_own_beside_graph_replays():
    groups = mlp.process_groups(("eager", "graph", "compile", "tilewise", "strassen"))
    assert groups == [("eager", "graph", "tilewise", "strassen"), ("eager", "compile")]
    assert mlp.process_groups(("eager", "compile")) == [("eager", "compile")]
    assert mlp.process_groups(("eager", "tilewise")) == [("eager", "tilewise")]
