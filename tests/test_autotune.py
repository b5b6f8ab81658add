"""Autotune: choice, memory and disk cache, keys, env switches, export/import, concurrent writers.

No real timing: the timer and the CUDA checks are replaced, so these run on any CPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from checks import fake_gpu_autotuner

import tilewise
from tilewise.ops import gconv_cuda
from tilewise.runtime import autotune, dispatch


@dataclass(frozen=True)
class Prob:
    n: int
    dtype: str = "fp16"


@dataclass(frozen=True)
class Cfg:
    block: int
    warps: int = 4


CANDS = [Cfg(16), Cfg(32), Cfg(64)]
TIMES = {Cfg(16): 3.0, Cfg(32): 1.0, Cfg(64): 2.0}
DEV = torch.device("cuda")  # never touched: the device checks are replaced


def run(cfg: Cfg) -> Cfg:
    return cfg


@pytest.fixture
def tuner(monkeypatch, tmp_path):
    """A fake CUDA machine: ``_bench`` runs fn once and returns the config's made-up time."""
    calls: list = []

    def fake_bench(fn):
        cfg = fn()
        calls.append(cfg)
        return TIMES.get(cfg, 5.0) if isinstance(cfg, Cfg) else 1.0 + len(calls) % 7

    fake_gpu_autotuner(monkeypatch, tmp_path, fake_bench)
    yield SimpleNamespace(calls=calls, path=tmp_path / autotune.CACHE_FILE)
    autotune.clear_memory_cache()


def _no_timing(fn):
    raise AssertionError("timed although the choice was cached")


def test_picks_fastest_and_caches_in_memory_and_on_disk(tuner, monkeypatch):
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(32)
    assert tuner.calls == CANDS
    monkeypatch.setattr(autotune, "_bench", _no_timing)
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(32)
    data = json.loads(tuner.path.read_text())
    (entry,) = data["entries"].values()
    assert entry["config"] == {"block": 32, "warps": 4} and entry["ms"] == 1.0
    key = json.loads(next(iter(data["entries"])))
    assert key["device"] == "Fake GPU" and key["op"] == "op" and key["dtype"] == "fp16"
    assert key["problem"] == {"n": 1, "dtype": "fp16"} and key["tilewise"] == tilewise.__version__


def test_cold_l2_choice_uses_its_timer_and_its_own_key(tuner, monkeypatch):
    """Large problems are timed with L2 flushed (another timer, other winners): the cold and the
    warm choice of one problem are cached apart."""
    cold_times = {Cfg(16): 1.0, Cfg(32): 4.0, Cfg(64): 2.0}
    monkeypatch.setattr(autotune, "_bench_cold", lambda fn, device: cold_times[fn()])
    assert autotune.choose_config("op", Prob(3), CANDS, run, device=DEV, cold_l2=True) == Cfg(16)
    assert autotune.choose_config("op", Prob(3), CANDS, run, device=DEV) == Cfg(32)
    autotune.clear_memory_cache()
    monkeypatch.setattr(autotune, "_bench", _no_timing)
    monkeypatch.setattr(autotune, "_bench_cold", lambda fn, device: _no_timing(fn))
    assert autotune.choose_config("op", Prob(3), CANDS, run, device=DEV, cold_l2=True) == Cfg(16)
    assert autotune.choose_config("op", Prob(3), CANDS, run, device=DEV) == Cfg(32)
    ops = sorted(json.loads(k)["op"] for k in json.loads(tuner.path.read_text())["entries"])
    assert ops == ["op", "op.cold"]


def test_warm_and_cold_choice_takes_the_smallest_worst_case_loss(tuner, monkeypatch):
    """With ``warm_too`` each candidate is timed warm and cold; the winner is the one whose worse
    ratio to the fastest is smallest (not the fastest cold one, not the fastest warm one), cached
    under its own key; a candidate that fails either way is out."""
    warm = {Cfg(16): 1.0, Cfg(32): 3.0, Cfg(64): 1.2}
    cold = {Cfg(16): 3.0, Cfg(32): 1.0, Cfg(64): 1.1}
    monkeypatch.setattr(autotune, "_bench", lambda fn: warm[fn()])
    monkeypatch.setattr(autotune, "_bench_cold", lambda fn, device: cold[fn()])
    pick = autotune.choose_config(
        "op", Prob(4), CANDS, run, device=DEV, cold_l2=True, warm_too=True
    )
    assert pick == Cfg(64)  # 1.2x warm, 1.1x cold; the others lose 3x one way
    assert autotune.choose_config("op", Prob(4), CANDS, run, device=DEV, cold_l2=True) == Cfg(32)
    (stored,) = [
        v for k, v in json.loads(tuner.path.read_text())["entries"].items()
        if json.loads(k)["op"] == "op.warmcold"
    ]  # fmt: skip
    assert stored["config"] == {"block": 64, "warps": 4} and stored["ms"] == 1.1  # the cold time
    # its readings: the chosen one first though not the fastest cold (each timer's time, no
    # screen on three candidates), then by the cold time
    chosen, *rest = stored["readings"]
    # (cold, Cfg(32) at 1.0 and Cfg(64) at 1.1 are near-ties of a long problem: their rounds)
    assert chosen == {"cand": "Cfg(block=64,warps=4)", "screen": None, "timed": [1.1, 1.2],
                      "chosen": True, "rounds": [[1.1] * 5, None]}  # fmt: skip
    assert [r["cand"] for r in rest] == ["Cfg(block=32,warps=4)", "Cfg(block=16,warps=4)"]

    def warm_fails(fn):
        cfg = fn()
        if cfg == Cfg(64):
            raise RuntimeError("out of resources")
        return warm[cfg]

    monkeypatch.setattr(autotune, "_bench", warm_fails)
    pick = autotune.choose_config(
        "op", Prob(5), CANDS, run, device=DEV, cold_l2=True, warm_too=True
    )
    assert pick in (Cfg(16), Cfg(32))  # both lose 3x one way; Cfg(64) failed warm
    assert autotune._least_worst_loss([[2.0, 1.0], [1.0, 3.0]]) == 0
    inf, nan = math.inf, math.nan
    assert autotune._least_worst_loss([[inf, 1.0, 2.0], [1.0, inf, 2.0]]) == 2  # failed once: out
    assert autotune._least_worst_loss([[nan, 1.0, 2.0], [1.0, 1.0, 1.0]]) == 1  # NaN: no time
    assert autotune._least_worst_loss([[0.0, 1.0], [1.0, 1.0]]) == 1  # zero: no time either
    assert autotune._least_worst_loss([[inf, 1.0], [1.0, inf]]) is None  # nothing valid


def test_a_new_process_reads_the_disk_cache(tuner, tmp_path):
    autotune.choose_config("op", Prob(7), CANDS, run, device=DEV)
    code = textwrap.dedent(
        """
        import dataclasses, torch
        from tilewise.runtime import autotune
        P = dataclasses.make_dataclass("Prob", [("n", int), ("dtype", str)], frozen=True)
        C = dataclasses.make_dataclass("Cfg", [("block", int), ("warps", int)], frozen=True)
        autotune._tunable = lambda d: True
        autotune._device_name = lambda d: "Fake GPU"
        def boom(fn):
            raise SystemExit("timed in the second process")
        autotune._bench = boom
        cands = [C(16, 4), C(32, 4), C(64, 4)]
        print(autotune.choose_config("op", P(7, "fp16"), cands, lambda c: c,
                                     device=torch.device("cuda")).block)
        """
    )
    env = dict(os.environ, TILEWISE_CACHE_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "32"


def test_key_covers_device_versions_op_problem_and_dtype(tuner, monkeypatch):
    autotune.choose_config("op", Prob(1), CANDS, run, device=DEV)
    searches = [len(tuner.calls)]
    for change in ("op", "problem", "dtype", "device", "version"):
        if change == "device":
            monkeypatch.setattr(autotune, "_device_name", lambda d: "Other GPU")
        if change == "version":
            monkeypatch.setattr(autotune, "_versions", lambda: ("99.0", "9.9"))
        if change in ("device", "version"):  # another process, in effect: forget this one's
            autotune._resolved.clear()
        op = "op2" if change == "op" else "op"
        prob = Prob(2) if change == "problem" else Prob(1, "bf16" if change == "dtype" else "fp16")
        autotune.choose_config(op, prob, CANDS, run, device=DEV)
        searches.append(len(tuner.calls))
    assert searches == [3, 6, 9, 12, 15, 18]  # every change is a miss that times all three
    assert len(json.loads(tuner.path.read_text())["entries"]) == 6


def test_env_disables_search_and_cache(tuner, monkeypatch):
    autotune.choose_config("op", Prob(1), CANDS, run, device=DEV)
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")
    monkeypatch.setattr(autotune, "_bench", _no_timing)
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(16)
    got = autotune.choose_config("op", Prob(3), CANDS, run, device=DEV, default=Cfg(64))
    assert got == Cfg(64)


def test_cpu_and_no_device_take_the_heuristic(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_bench", _no_timing)
    cpu = torch.device("cpu")
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=cpu, default=Cfg(64)) == Cfg(64)
    assert autotune.choose_config("op", Prob(1), CANDS, run) == Cfg(16)
    assert not (tmp_path / autotune.CACHE_FILE).exists()
    with pytest.raises(ValueError, match="'candidates'"):
        autotune.choose_config("op", Prob(1), [], run)


def test_graph_capture_takes_the_heuristic_without_storing(tuner, monkeypatch):
    monkeypatch.setattr(autotune, "_capturing", lambda d: True)
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(16)
    assert tuner.calls == [] and not tuner.path.exists()


def test_failing_candidates_are_skipped(tuner):
    def flaky(cfg):
        if cfg == Cfg(32):
            raise RuntimeError("out of shared memory")
        return cfg

    assert autotune.choose_config("op", Prob(1), CANDS, flaky, device=DEV) == Cfg(64)

    def broken(cfg):
        raise RuntimeError("no")

    assert autotune.choose_config("op", Prob(2), CANDS, broken, device=DEV) == Cfg(16)
    assert len(json.loads(tuner.path.read_text())["entries"]) == 1  # the failure stored nothing


def test_a_stale_entry_is_searched_again(tuner):
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(32)
    legal_now = [Cfg(16), Cfg(64)]
    assert autotune.choose_config("op", Prob(1), legal_now, run, device=DEV) == Cfg(64)


@dataclass(frozen=True)
class OtherCfg:  # same fields as Cfg: a different kernel family sharing a candidate tuple
    block: int
    warps: int = 4


def test_a_cached_choice_matches_only_its_own_config_type(tuner, monkeypatch):
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(32)
    autotune.clear_memory_cache()
    others = [OtherCfg(16), OtherCfg(32)]
    got = autotune.choose_config("op", Prob(1), others, run, device=DEV)
    assert isinstance(got, OtherCfg)  # searched again, not matched by field values
    assert tuner.calls[-2:] == others


def test_export_import_roundtrip(tuner, monkeypatch, tmp_path_factory):
    autotune.choose_config("op", Prob(1), CANDS, run, device=DEV)
    autotune.choose_config("op", Prob(2), CANDS, run, device=DEV)
    shipped = tmp_path_factory.mktemp("ship") / "cache.json"
    assert autotune.export_cache(shipped) == 2
    elsewhere = tmp_path_factory.mktemp("other")
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(elsewhere))
    autotune.clear_memory_cache()
    assert autotune.import_cache(shipped) == 2
    monkeypatch.setattr(autotune, "_bench", _no_timing)
    assert autotune.choose_config("op", Prob(2), CANDS, run, device=DEV) == Cfg(32)
    assert len(json.loads((elsewhere / autotune.CACHE_FILE).read_text())["entries"]) == 2
    with pytest.raises(ValueError, match="'path'"):
        autotune.import_cache(elsewhere / "missing.json")


def test_cache_cli_ships_choices(tuner, monkeypatch, tmp_path_factory, capsys):
    """``tilewise cache export`` / ``import``: the same round trip from the command line."""
    from tilewise import cli

    autotune.choose_config("op", Prob(3), CANDS, run, device=DEV)
    shipped = tmp_path_factory.mktemp("ship") / "cache.json"
    assert cli.main(["cache", "export", str(shipped)]) == 0
    assert "exported 1 choices" in capsys.readouterr().out
    elsewhere = tmp_path_factory.mktemp("other")
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(elsewhere))
    autotune.clear_memory_cache()
    assert cli.main(["cache", "import", str(shipped)]) == 0
    monkeypatch.setattr(autotune, "_bench", _no_timing)  # a re-timing would fail the test
    assert autotune.choose_config("op", Prob(3), CANDS, run, device=DEV) == Cfg(32)
    with pytest.raises(ValueError, match="'path'"):
        cli.main(["cache", "import", str(elsewhere / "missing.json")])


def test_cache_cli_info_and_clear_binaries(tuner, tmp_path, capsys):
    """``tilewise cache info`` counts the choices and the NVRTC binaries; ``clear-binaries``
    removes the binaries only; export and import still need a path."""
    from tilewise import cli
    from tilewise.runtime import nvrtc_cache

    autotune.choose_config("op", Prob(3), CANDS, run, device=DEV)
    (tmp_path / "nvrtc").mkdir(exist_ok=True)
    for name in ("a", "b"):
        (tmp_path / "nvrtc" / f"k-{name}.bin").write_bytes(b"k\n" + b"x" * 1000)
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "autotune choices: 1" in out and "NVRTC binaries: 2" in out
    assert cli.main(["cache", "clear-binaries"]) == 0
    assert "removed 2 NVRTC binaries" in capsys.readouterr().out
    assert nvrtc_cache.binaries() == [] and autotune.cache_path().exists()
    with pytest.raises(SystemExit, match="needs a PATH"):
        cli.main(["cache", "export"])


def test_a_corrupt_or_unwritable_cache_is_tolerated(tuner, monkeypatch, tmp_path):
    tuner.path.write_text("{not json")
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(32)
    assert len(json.loads(tuner.path.read_text())["entries"]) == 1  # rewritten whole
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(blocker / "cache"))
    assert autotune.choose_config("op", Prob(5), CANDS, run, device=DEV) == Cfg(32)
    monkeypatch.setattr(autotune, "_bench", _no_timing)  # kept in memory all the same
    assert autotune.choose_config("op", Prob(5), CANDS, run, device=DEV) == Cfg(32)


def test_concurrent_processes_lose_no_entries(tmp_path):
    code = textwrap.dedent(
        """
        import dataclasses, sys, torch
        from tilewise.runtime import autotune
        P = dataclasses.make_dataclass("Prob", [("n", int), ("worker", int)], frozen=True)
        C = dataclasses.make_dataclass("Cfg", [("block", int)], frozen=True)
        autotune._tunable = lambda d: True
        autotune._device_name = lambda d: "Fake GPU"
        autotune._capturing = lambda d: False
        autotune._bench = lambda fn: float(fn().block)
        w = int(sys.argv[1])
        for i in range(15):
            autotune.choose_config("op", P(i, w), [C(3), C(1), C(2)], lambda c: c,
                                   device=torch.device("cuda"))
        """
    )
    env = dict(os.environ, TILEWISE_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(w)], env=env, stderr=subprocess.PIPE)
        for w in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    entries = json.loads((tmp_path / autotune.CACHE_FILE).read_text())["entries"]
    assert len(entries) == 60
    assert all(e["config"] == {"block": 1} for e in entries.values())
    assert not list(tmp_path.glob("*.tmp")), "a temporary file was left behind"


@pytest.mark.skipif(not dispatch.INTERPRET, reason="CPU kernels need the Triton interpreter")
def test_gconv_searches_its_candidates_on_a_fake_gpu(tuner, rng_seed):
    """The real run_fn closures of fprop, dgrad and wgrad run each candidate (interpreter)."""
    x = torch.randn(1, 16, 4, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    w = (torch.randn(16, 8, 3, 3) / 8).requires_grad_()
    b = torch.randn(16, requires_grad=True)
    y = tilewise.grouped_conv2d(x, w, b, padding=1, deterministic=False)
    y.backward(torch.ones_like(y))
    keys = [json.loads(k)["op"] for k in json.loads(tuner.path.read_text())["entries"]]
    digest = gconv_cuda.SOURCE_DIGEST  # a choice made with other NVRTC sources is not reused
    assert sorted(keys) == [
        f"grouped_conv2d.dgrad@{digest}",
        f"grouped_conv2d.fprop@{digest}",
        f"grouped_conv2d_backward.wgrad.one-launch@{digest}",
    ]
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xr, wr, br, padding=1, groups=2)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    for got, exp in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        torch.testing.assert_close(got.double(), exp, rtol=1e-5, atol=1e-4)


def test_identity_memo_follows_the_candidates_and_the_environment(tuner, monkeypatch, tmp_path):
    """The per-call memo keyed by the candidate tuple's identity must never hand back a choice made
    for other candidates, another default, or another cache/autotune setting."""
    cands = tuple(CANDS)
    assert autotune.choose_config("op", Prob(1), cands, run, device=DEV) == Cfg(32)
    n = len(tuner.calls)
    assert autotune.choose_config("op", Prob(1), cands, run, device=DEV) == Cfg(32)
    assert len(tuner.calls) == n  # memo hit, no timing
    # an equal but distinct tuple, and a different candidate set: the choice follows the contents
    assert autotune.choose_config("op", Prob(1), tuple(CANDS), run, device=DEV) == Cfg(32)
    only = (Cfg(16), Cfg(64))
    assert autotune.choose_config("op", Prob(1), only, run, device=DEV) == Cfg(64)
    # TILEWISE_AUTOTUNE=0: the default, without timing, even though a timed answer is memoised
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")
    monkeypatch.setattr(autotune, "_bench", _no_timing)
    got = autotune.choose_config("op", Prob(1), cands, run, device=DEV, default=Cfg(64))
    assert got == Cfg(64)
    assert autotune.choose_config("op", Prob(1), cands, run, device=DEV) == Cfg(16)
    # back on, with another cache directory: nothing there, so it times again
    monkeypatch.delenv("TILEWISE_AUTOTUNE")
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "other"))
    timed = []
    monkeypatch.setattr(autotune, "_bench", lambda fn: timed.append(fn()) or TIMES[timed[-1]])
    assert autotune.choose_config("op", Prob(1), cands, run, device=DEV) == Cfg(32)
    assert len(timed) == 3


def test_fresh_candidate_tuples_do_not_grow_the_memo(tuner):
    """Callers that build their candidate tuple per call must not add a memo entry per call."""
    for _ in range(2):  # the timed answer, then its per-call entry
        autotune.choose_config("op", Prob(2), tuple(CANDS), run, device=DEV)
    size = len(autotune._resolved)
    for _ in range(50):
        assert autotune.choose_config("op", Prob(2), tuple(CANDS), run, device=DEV) == Cfg(32)
    assert len(autotune._resolved) == size


@pytest.mark.gpu
def test_cold_timing_sees_dram_where_warm_sees_l2():
    """An 8 MB copy stays in the H100's 50 MB L2 when replayed warm; with L2 flushed before each
    run it reads DRAM (and pays for the flush's dirty lines), so it must time clearly slower. The
    counter shows the captured function really ran in the timed replays."""
    src = torch.randn(2 << 20, device="cuda")
    dst = torch.empty_like(src)
    count = torch.zeros((), device="cuda", dtype=torch.int64)

    def fn():
        dst.copy_(src)
        count.add_(1)

    warm = autotune._bench(fn)
    before = int(count)
    cold = autotune._bench_cold(fn, torch.device("cuda"))
    torch.testing.assert_close(dst, src)
    assert int(count) - before >= 1 + 7 * 8  # the warm-up run and 7 paired replays of 8
    assert 0 < warm and math.isfinite(cold)
    # the least of three readings each, in turns: the GPU script runs test files side by side,
    # and another process's kernels once slowed a warm reading past a cold one (session 29)
    for _ in range(2):
        warm = min(warm, autotune._bench(fn))
        cold = min(cold, autotune._bench_cold(fn, torch.device("cuda")))
    assert cold >= 1.1 * warm, (cold, warm)


def test_cold_timing_flush_is_named():
    """``_bench_cold`` evicts L2 by zeroing or by reading a buffer; anything else is refused
    before anything runs."""
    with pytest.raises(ValueError, match="flush_by"):
        autotune._bench_cold(lambda: None, torch.device("cpu"), flush_by="sweep")


def test_near_ties_of_long_problems_are_timed_again_in_turns(tuner, monkeypatch):
    """A long candidate timed first (cool GPU) reads fast once; the near-ties are timed again in
    rotating rounds and the median decides. Short problems and clear winners are timed once."""
    true_ms = {Cfg(16): 1.00, Cfg(32): 0.98, Cfg(64): 2.0}
    calls: list = []

    def first_reads_fast(fn):
        cfg = fn()
        calls.append(cfg)
        return true_ms[cfg] * (0.94 if len(calls) == 1 else 1.0)

    monkeypatch.setattr(autotune, "_bench", first_reads_fast)
    assert autotune.choose_config("op", Prob(1), CANDS, run, device=DEV) == Cfg(32)
    rounds = autotune.CLOSE_ROUNDS
    assert calls[:3] == CANDS and len(calls) == 3 + 2 * rounds
    assert Cfg(64) not in calls[3:]  # not within CLOSE_RATIO of the fastest
    assert calls[3:5] == [Cfg(16), Cfg(32)] and calls[5:7] == [Cfg(32), Cfg(16)]  # rotating

    calls.clear()
    true_ms.update({Cfg(16): 0.100, Cfg(32): 0.098, Cfg(64): 0.2})  # short: timed once each
    assert autotune.choose_config("op", Prob(2), CANDS, run, device=DEV) == Cfg(16)
    assert calls == CANDS

    # a screened choice (the grouped conv's) gets rounds from SCREENED_CLOSE_MIN_MS (session 46:
    # MBConv's C=1024 N=256 fprop, ~0.075 ms), even where its list is too short to screen
    assert autotune.SCREENED_CLOSE_MIN_MS <= 0.075 < autotune.CLOSE_MIN_MS
    calls.clear()
    true_ms.update({Cfg(16): 0.075, Cfg(32): 0.0735, Cfg(64): 0.15})
    got = autotune.choose_config("op", Prob(3), CANDS, run, device=DEV, screen=True)
    assert got == Cfg(32) and len(calls) == 3 + 2 * rounds and Cfg(64) not in calls[3:]
    # the stored readings keep each near-tie's rounds, first reading first (session 46)
    entries = json.loads(tuner.path.read_text())["entries"].items()
    (stored,) = [e for k, e in entries if json.loads(k)["problem"]["n"] == 3]
    by_cand = {r["cand"]: r for r in stored["readings"]}
    (first16,) = by_cand["Cfg(block=16,warps=4)"]["rounds"]
    assert first16[0] == round(0.075 * 0.94, 5) and len(first16) == 1 + rounds
    assert by_cand["Cfg(block=16,warps=4)"]["timed"] == [0.075]  # the median
    assert len(by_cand["Cfg(block=32,warps=4)"]["rounds"][0]) == 1 + rounds
    assert "rounds" not in by_cand["Cfg(block=64,warps=4)"]
    calls.clear()  # under the screened threshold: once each
    true_ms.update({Cfg(16): 0.040, Cfg(32): 0.0392, Cfg(64): 0.08})
    assert autotune.choose_config("op", Prob(4), CANDS, run, device=DEV, screen=True) == Cfg(16)
    assert calls == CANDS


def test_near_tie_failing_in_a_round_is_out(tuner, monkeypatch):
    """A near-tie that raises when timed again is not chosen, however fast its first reading."""
    calls: list = []

    def flaky(fn):
        cfg = fn()
        calls.append(cfg)
        if cfg == Cfg(32) and calls.count(Cfg(32)) == 3:
            raise RuntimeError("launch failed")
        return {Cfg(16): 1.00, Cfg(32): 0.95, Cfg(64): 1.02}[cfg]

    monkeypatch.setattr(autotune, "_bench", flaky)
    assert autotune.choose_config("op", Prob(3), CANDS, run, device=DEV) == Cfg(16)
    assert calls.count(Cfg(64)) == 1 + autotune.CLOSE_ROUNDS  # within CLOSE_RATIO: re-timed


def test_screening_times_in_full_only_the_briefly_fastest(tuner, monkeypatch):
    """``screen=True``: every candidate is read briefly; the ``SCREEN_KEEP`` fastest within
    ``SCREEN_RATIO`` of the fastest reading are timed in full, and the choice is the fastest full
    timing among them (a candidate screened out is never chosen)."""
    cands = tuple(Cfg(b) for b in range(1, 11))  # 10 >= SCREEN_MIN
    quick = {Cfg(b): 1.0 + 0.05 * b for b in range(1, 11)}  # 1.05 .. 1.5
    quick[Cfg(10)] = 9.0  # far behind in the brief reading
    full = {c: 2.0 for c in cands}
    full[Cfg(6)] = 1.0  # within the kept six: wins the full timing
    full[Cfg(10)] = 0.5  # screened out: never timed in full, never chosen
    screened, timed = [], []
    monkeypatch.setattr(
        autotune, "_bench_screen", lambda fn: screened.append(fn()) or quick[screened[-1]]
    )
    monkeypatch.setattr(autotune, "_bench", lambda fn: timed.append(fn()) or full[timed[-1]])
    assert autotune.choose_config("op", Prob(3), cands, run, device=DEV, screen=True) == Cfg(6)
    assert screened == list(cands)
    assert sorted(timed, key=lambda c: c.block) == [Cfg(b) for b in range(1, 7)]
    assert autotune.SCREEN_KEEP == 6 and len(timed) == autotune.SCREEN_KEEP


def test_stored_choice_keeps_the_readings_that_made_it(tuner, monkeypatch):
    """The cache entry keeps each candidate's screening and full readings (the fastest
    ``READINGS_KEEP``, fastest first; None where not timed), so a pick read on another machine
    can be explained from the file."""
    cands = tuple(Cfg(b) for b in range(1, 11))
    quick = {Cfg(b): 1.0 + 0.05 * b for b in range(1, 11)}
    quick[Cfg(10)] = 9.0  # screened out
    full = {c: 2.0 + 0.01 * c.block for c in cands}
    full[Cfg(6)] = 1.0
    monkeypatch.setattr(autotune, "_bench_screen", lambda fn: quick[fn()])
    monkeypatch.setattr(autotune, "_bench", lambda fn: full[fn()])
    assert autotune.choose_config("op", Prob(5), cands, run, device=DEV, screen=True) == Cfg(6)
    (entry,) = json.loads(tuner.path.read_text())["entries"].values()
    got = entry["readings"]
    assert len(got) == autotune.READINGS_KEEP == 8
    assert got[0] == {"cand": "Cfg(block=6,warps=4)", "screen": 1.3, "timed": [1.0], "chosen": True}
    assert [r["cand"] for r in got[1:6]] == [f"Cfg(block={b},warps=4)" for b in (1, 2, 3, 4, 5)]
    # past the six timed in full: screened out, their brief readings only, fastest first
    assert got[6] == {"cand": "Cfg(block=7,warps=4)", "screen": 1.35, "timed": [None]}
    assert got[7]["cand"] == "Cfg(block=8,warps=4)"
    assert not any(r.get("chosen") for r in got[1:])
    # a candidate with a name is stored by it
    assert autotune._label(SimpleNamespace(name="cudarp_t8x8c64w8m4s2_tma2")).startswith("cudarp")


def test_screening_keeps_only_near_ties_and_skips_short_lists(tuner, monkeypatch):
    cands = tuple(Cfg(b) for b in range(1, 9))
    quick = {c: 10.0 for c in cands}
    quick[Cfg(1)], quick[Cfg(2)] = 1.0, 1.2  # the rest are > SCREEN_RATIO x slower
    screened, timed = [], []
    monkeypatch.setattr(
        autotune, "_bench_screen", lambda fn: screened.append(fn()) or quick[screened[-1]]
    )
    monkeypatch.setattr(autotune, "_bench", lambda fn: timed.append(fn()) or 1.0)
    autotune.choose_config("op", Prob(4), cands, run, device=DEV, screen=True)
    assert set(timed) == {Cfg(1), Cfg(2)}  # (near-ties of >= 0.2 ms are timed in rounds too)
    # fewer than SCREEN_MIN candidates, or the switch at "0": no screening
    screened.clear()
    assert autotune.choose_config("op", Prob(5), tuple(CANDS), run, device=DEV, screen=True)
    assert not screened
    # a cold choice is screened by the same warm readings; only the kept are timed cold
    cold_timed = []
    monkeypatch.setattr(autotune, "_bench_cold", lambda fn, device: cold_timed.append(fn()) or 1.0)
    timed.clear()
    autotune.choose_config("op", Prob(8), cands, run, device=DEV, screen=True, cold_l2=True)
    assert screened == list(cands) and set(cold_timed) == {Cfg(1), Cfg(2)} and not timed
    screened.clear()
    monkeypatch.setenv("TILEWISE_AUTOTUNE_SCREEN", "0")
    timed.clear()
    autotune.choose_config("op", Prob(7), cands, run, device=DEV, screen=True)
    assert not screened and set(timed) == set(cands)


def test_screening_a_warm_and_cold_choice_times_the_kept_both_ways(tuner, monkeypatch):
    """``warm_too`` with ``screen``: the kept candidates are timed cold and warm (the small
    grouped-conv passes); when every kept one fails cold, every candidate is timed both ways."""
    cands = tuple(Cfg(b) for b in range(1, 9))
    quick = {c: (1.0 if c.block <= 2 else 5.0) for c in cands}
    monkeypatch.setattr(autotune, "_bench_screen", lambda fn: quick[fn()])
    cold, warm = [], []
    monkeypatch.setattr(
        autotune, "_bench_cold", lambda fn, device: cold.append(fn()) or float(cold[-1].block)
    )
    monkeypatch.setattr(autotune, "_bench", lambda fn: warm.append(fn()) or 1.0)
    got = autotune.choose_config(
        "op", Prob(11), cands, run, device=DEV, screen=True, cold_l2=True, warm_too=True
    )
    assert got == Cfg(1) and set(cold) == set(warm) == {Cfg(1), Cfg(2)}

    def cold_fails_for_the_kept(fn, device):
        cfg = fn()
        cold.append(cfg)
        if cfg.block <= 2:
            raise RuntimeError("rejected")
        return float(cfg.block)

    cold.clear(), warm.clear()
    monkeypatch.setattr(autotune, "_bench_cold", cold_fails_for_the_kept)
    got = autotune.choose_config(
        "op", Prob(12), cands, run, device=DEV, screen=True, cold_l2=True, warm_too=True
    )
    assert got == Cfg(3) and set(cold) == set(warm) == set(cands)


def test_screening_that_reads_nothing_times_every_candidate(tuner, monkeypatch):
    cands = tuple(Cfg(b) for b in range(1, 9))

    def broken(fn):
        raise RuntimeError("no brief reading")

    timed = []
    monkeypatch.setattr(autotune, "_bench_screen", broken)
    monkeypatch.setattr(autotune, "_bench", lambda fn: timed.append(fn()) or float(timed[-1].block))
    assert autotune.choose_config("op", Prob(6), cands, run, device=DEV, screen=True) == Cfg(1)
    assert len(timed) == len(cands)


def test_when_every_kept_candidate_fails_the_rest_are_timed(tuner, monkeypatch):
    """A screened-in candidate may fail its full timing (rejected by the device): if all do, the
    screened-out ones are timed instead of falling back to the heuristic default."""
    cands = tuple(Cfg(b) for b in range(1, 9))
    quick = {c: (1.0 if c.block <= 2 else 5.0) for c in cands}
    timed = []

    def full(fn):
        cfg = fn()
        timed.append(cfg)
        if cfg.block <= 2:
            raise RuntimeError("out of resources")
        return float(cfg.block)

    monkeypatch.setattr(autotune, "_bench_screen", lambda fn: quick[fn()])
    monkeypatch.setattr(autotune, "_bench", full)
    got = autotune.choose_config("op", Prob(9), cands, run, device=DEV, screen=True)
    assert got == Cfg(3) and set(timed) == set(cands)


def test_recording_collects_every_answer_inside_its_context(tuner):
    """``recording`` lists (op, problem, config) for each answer, timed or cached, and nothing
    outside it (a benchmark uses it to say which config ran)."""
    autotune.choose_config("op", Prob(10), tuple(CANDS), run, device=DEV)  # not recorded
    with autotune.recording() as picks:
        autotune.choose_config("op", Prob(11), tuple(CANDS), run, device=DEV)  # timed
        autotune.choose_config("op", Prob(10), tuple(CANDS), run, device=DEV)  # cached
        with autotune.recording() as inner:
            autotune.choose_config("op2", Prob(12), tuple(CANDS), run, device=DEV)
    assert picks == [("op", Prob(11), Cfg(32)), ("op", Prob(10), Cfg(32))]
    assert inner == [("op2", Prob(12), Cfg(32))]
    autotune.choose_config("op", Prob(13), tuple(CANDS), run, device=DEV)
    assert len(picks) == 2


def _timed(monkeypatch, ms):
    """``_bench`` reads ``ms[cfg]`` for every timing (first and near-tie rounds alike)."""
    monkeypatch.setattr(autotune, "_bench", lambda fn: ms[fn()])


def test_preferred_candidate_kept_for_long_problems_within_the_margin(tuner, monkeypatch):
    """``prefer``: a long problem keeps the preferred candidate unless another is faster by
    more than ``prefer_within``; a clear winner still wins, and short problems pick the fastest."""
    _timed(monkeypatch, {Cfg(16): 1.015, Cfg(32): 1.0, Cfg(64): 2.0})  # 1.5% behind
    pick = autotune.choose_config(
        "op", Prob(11), CANDS, run, device=DEV, prefer=Cfg(16), prefer_within=0.02
    )
    assert pick == Cfg(16)
    _timed(monkeypatch, {Cfg(16): 1.03, Cfg(32): 1.0, Cfg(64): 2.0})  # 3% behind: not kept
    pick = autotune.choose_config(
        "op", Prob(12), CANDS, run, device=DEV, prefer=Cfg(16), prefer_within=0.02
    )
    assert pick == Cfg(32)
    short = autotune.PREFER_MIN_MS / 2
    _timed(monkeypatch, {Cfg(16): 1.01 * short, Cfg(32): short, Cfg(64): 2 * short})
    pick = autotune.choose_config(
        "op", Prob(13), CANDS, run, device=DEV, prefer=Cfg(16), prefer_within=0.02
    )
    assert pick == Cfg(32)
    _timed(monkeypatch, {Cfg(16): 1.01, Cfg(32): 1.0, Cfg(64): 2.0})
    assert autotune.choose_config("op", Prob(14), CANDS, run, device=DEV) == Cfg(32)


def test_preferred_candidate_must_be_within_the_margin_both_ways(tuner, monkeypatch):
    """Timed warm and cold, the preferred candidate is kept only if it is within the margin of
    the fastest in both timings."""
    cold = {Cfg(16): 1.01, Cfg(32): 1.0, Cfg(64): 2.0}
    warm = {Cfg(16): 1.05, Cfg(32): 1.0, Cfg(64): 2.0}
    monkeypatch.setattr(autotune, "_bench_cold", lambda fn, device: cold[fn()])
    _timed(monkeypatch, warm)
    kw = {"device": DEV, "cold_l2": True, "warm_too": True, "prefer_within": 0.02}
    assert autotune.choose_config("op", Prob(15), CANDS, run, prefer=Cfg(16), **kw) == Cfg(32)
    warm[Cfg(16)] = 1.015
    assert autotune.choose_config("op", Prob(16), CANDS, run, prefer=Cfg(16), **kw) == Cfg(16)


def test_linear_prefers_pytorchs_path_only_for_true_fp32_none_or_relu_forwards():
    """``linear.preferred_backend``: ``CUBLAS`` (addmm + ReLU, PyTorch's path) for true-fp32
    forwards with no activation or ReLU where cuBLAS is legal, and for nothing else."""
    from tilewise.ops.linear import CUBLAS, preferred_backend

    assert preferred_backend(True, True, "relu+bias") == CUBLAS
    assert preferred_backend(True, True, "none") == CUBLAS
    assert preferred_backend(True, True, "gelu+bias") is None  # not PyTorch's path there
    assert preferred_backend(True, False, "relu+bias") is None  # TF32, half precision, no cuBLAS
    assert preferred_backend(False, True, "none") is None  # a backward GEMM
