"""MLP study (seed 001's grid): N x (Linear(h, h) + ReLU) inference, plus one training step.

Columns per cell (dtype, layers, batch, hidden): see ``HOW``. fp32 runs with TF32 off. Each impl
is first checked against an fp64 reference by the three-way rule of ``bench.checks.compare``; a
failure is recorded instead of a time. On a CPU the graph column is skipped (reason recorded) and
tilewise runs through the Triton interpreter, not graphed: only the wiring is exercised there.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tilewise.bench.ceilings import Ceilings, tf32_off
from tilewise.bench.checks import compare
from tilewise.bench.grid import (
    IsolatedRunner,
    cleanup_fault,
    first_line,
    free_memory,
    run_grid,
    study_device,
)
from tilewise.bench.timing import (
    EventTimer,
    GraphTimer,
    Timing,
    interleaved,
    l2_cache_bytes,
    rotation_count,
    time_events,
)
from tilewise.registry import DTYPES

log = logging.getLogger(__name__)

IMPLS = ("eager", "graph", "compile", "tilewise", "strassen")
GRAPHED = frozenset({"graph", "tilewise", "strassen"})
HOW = {
    "eager": "nn.Sequential(Linear, ReLU) eager; CUDA events per call, host overhead included",
    "graph": "the eager module captured in a CUDA graph; timed by replay",
    "compile": "torch.compile(mode='max-autotune') (inductor replays CUDA graphs itself)",
    "tilewise": "tilewise.nn.Linear(activation='relu'); graph-replayed (runtime captures)",
    "strassen": "tilewise StrassenMLP(mode='strassen'), CUDA-graph replayed",
}
ROTATE_MIN_BYTES = 1 << 20  # rotate input sets past L2 only for inputs at least this large


@dataclass(frozen=True)
class MLPConfig:
    """The grid, implementations, timing effort and training-step problem of one MLP study."""

    layers: tuple[int, ...] = (1, 2, 4, 8)
    batches: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 512, 4096)
    hiddens: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    impls: tuple[str, ...] = IMPLS
    strassen_min_hidden: int = 1024
    warmup: int = 10
    reps: int = 50
    cell_budget_s: float = 0.5  # fewer reps for cells whose calls are long (estimated from flops)
    tiny_reps: int = 200  # cells of a few microseconds: their replays jitter, so take more
    min_samples: int = 12  # long cells too: under the power cap their p20-p80 spans ~5%
    # cells whose call passes ~1 ms: at least this many samples in this many rotating turns
    # (session 25: 12 in 4 read tilewise's fp32 chain 0.987-0.996x graph at 512 x 8192 and
    # 4096 x 4096/8192 while it ran PyTorch's own kernels; the probe's 24 in 6 read 1.000-1.001x)
    long_min_samples: int = 24
    long_turns: int = 6
    tiny_s: float = 20e-6
    compile_mode: str = "max-autotune"
    train: bool = True
    train_shape: tuple[int, int, int] = (8, 1024, 64)  # layers, hidden, batch
    train_dtype: str = "fp32"
    #: each cell in a worker process (``grid.IsolatedRunner``), so a CUDA fault costs one cell;
    #: None: on CUDA where torch.compile is among the impls (session 22: such cells faulted)
    isolate: bool | None = None
    #: an isolated cell still running after this long (a hung kernel) loses its worker
    cell_timeout_s: float | None = 900.0

    @classmethod
    def full(cls, **overrides: Any) -> MLPConfig:
        return replace(cls(), **overrides)

    @classmethod
    def quick(cls, **overrides: Any) -> MLPConfig:
        """layers {1, 8} x batch {2, 64, 512} x hidden {256, 1024, 4096}, every dtype."""
        return replace(
            cls(layers=(1, 8), batches=(2, 64, 512), hiddens=(256, 1024, 4096)), **overrides
        )

    def cells(self) -> list[tuple[str, int, int, int]]:
        for d in self.dtypes:
            if d not in DTYPES:
                raise ValueError(f"unknown dtype {d!r}; known: {sorted(DTYPES)}")
        return list(itertools.product(self.dtypes, self.layers, self.batches, self.hiddens))


def _precision(dtype: torch.dtype):
    return tf32_off() if dtype == torch.float32 else contextlib.nullcontext()


def make_mlp(layers: int, hidden: int, device, dtype: torch.dtype) -> nn.Sequential:
    """Seed 001's model: ``layers`` x (Linear(hidden, hidden) + ReLU(inplace=True)), eval mode."""
    mods = [m for _ in range(layers) for m in (nn.Linear(hidden, hidden), nn.ReLU(inplace=True))]
    return nn.Sequential(*mods).to(device=device, dtype=dtype).eval()


def tilewise_mlp(eager: nn.Sequential) -> nn.Sequential:
    """``tilewise.nn.Linear(activation="relu")`` layers sharing ``eager``'s parameters."""
    from tilewise.nn import Linear

    lins = [m for m in eager if isinstance(m, nn.Linear)]
    return nn.Sequential(*(Linear.from_linear(m, activation="relu") for m in lins)).eval()


def reference64(eager: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    y = x.double()
    for m in eager:
        if isinstance(m, nn.Linear):
            y = torch.relu(nn.functional.linear(y, m.weight.double(), m.bias.double()))
    return y


def _capture(fn: Callable, *args: Any, warm: int = 2) -> Callable[[], Any]:
    """``fn(*args)`` warmed up on a side stream, captured in a CUDA graph: a replay callable."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)

    def replay() -> Any:
        graph.replay()
        return out

    return replay


def _fns(cfg: MLPConfig, eager: nn.Sequential, hidden: int) -> dict[str, Callable | str]:
    """impl -> callable, or the reason it is skipped."""
    from tilewise.bench.pointwise import configure_compile
    from tilewise.nn.strassen import StrassenMLP

    if set(cfg.impls) - set(IMPLS):
        raise ValueError(f"unknown impls in {cfg.impls}; known: {IMPLS}")
    cuda, small = next(eager.parameters()).is_cuda, hidden < cfg.strassen_min_hidden
    makers: dict[str, Callable[[], Callable | str]] = {
        "eager": lambda: eager,
        "graph": lambda: eager if cuda else "CUDA graphs need a CUDA device",
        "compile": lambda: (
            configure_compile() or torch.compile(eager, mode=cfg.compile_mode, dynamic=False)
        ),
        "tilewise": lambda: tilewise_mlp(eager),
        "strassen": lambda: (
            f"hidden < strassen_min_hidden={cfg.strassen_min_hidden}"
            if small
            else StrassenMLP.from_modules(eager, mode="strassen")
        ),
    }
    return {impl: makers[impl]() for impl in IMPLS if impl in cfg.impls}


def measure_cell(
    cfg: MLPConfig, dtype: str, layers: int, batch: int, hidden: int, device: torch.device
) -> list[dict[str, Any]]:
    """Check, then time every impl on one cell; one record per impl (eager first)."""
    dt = DTYPES[dtype]
    flops = 2 * batch * hidden * hidden * layers
    base = dict(dtype=dtype, layers=layers, batch=batch, hidden=hidden, flops=flops)
    torch.manual_seed(layers * 1_000_003 + batch * 1009 + hidden)
    recs: list[dict[str, Any]] = []
    with torch.no_grad(), _precision(dt):
        eager = make_mlp(layers, hidden, device, dt)
        nbytes = batch * hidden * dt.itemsize
        l2 = l2_cache_bytes(device)
        count = rotation_count(nbytes, l2) if l2 and nbytes >= ROTATE_MIN_BYTES else 1
        sets = [torch.randn(batch, hidden, device=device, dtype=dt) for _ in range(count)]
        ref = reference64(eager, sets[0])
        out_e = eager(sets[0]).clone()
        est_s = flops / (5e13 if device.type == "cuda" else 5e10)
        tiny = device.type == "cuda" and est_s < cfg.tiny_s  # the jitter is a GPU replay effect
        most = cfg.tiny_reps if tiny else cfg.reps
        reps = max(cfg.min_samples, min(most, int(cfg.cell_budget_s / max(est_s, 1e-9))))
        # a graph replay runs rounds x len(sets) calls: one round once a call passes ~1 ms, so
        # min_samples replays of long cells do not multiply their cost by 4
        long = est_s > 1e-3
        rounds = 1 if long else max(1, 4 // len(sets))
        args = [(x,) for x in sets]
        least = cfg.long_min_samples if long else cfg.min_samples
        replays = max(least, reps // (rounds * len(sets)))
        timers: dict[str, GraphTimer | EventTimer] = {}
        counts: dict[str, int] = {}
        recs_by: dict[str, dict[str, Any]] = {}
        for impl, fn in _fns(cfg, eager, hidden).items():
            rec = dict(base, impl=impl, how=HOW[impl], rotation=count, checked=False)
            rec.update(median_s=None, graph_replayed=False, check_note=None, error=None)
            recs.append(rec)
            recs_by[impl] = rec
            if isinstance(fn, str):
                rec["error"] = f"skipped: {fn}"
                continue
            graphed = impl in GRAPHED and device.type == "cuda"
            try:
                out = (_capture(fn, sets[0]) if graphed else partial(fn, sets[0]))().clone()
                ok, note = compare(out, out_e, ref, dtype)
            except Exception as exc:  # a crash is a failed check, reported as such
                ok, note = False, f"raised {first_line(exc)}"
            rec.update(checked=ok, check_note=note)
            if not ok:
                rec["error"] = f"correctness check failed: {note}"
                continue
            try:  # timed below, every impl in turns with the others
                if graphed:
                    timers[impl], counts[impl] = GraphTimer(fn, args, 1, rounds), replays
                elif device.type == "cuda":  # host overhead included, as eager code pays it
                    timers[impl] = EventTimer(fn, args, cfg.warmup, keep_ahead=False)
                    counts[impl] = max(reps, least)
                else:
                    _record_timing(rec, time_events(fn, args, cfg.warmup, reps), flops)
            except Exception as exc:
                rec["error"] = first_line(exc)
        try:  # one impl that fails while timed loses only its own record
            turns = cfg.long_turns if long else 4
            for impl, t in interleaved(timers, counts, chunks=turns).items():
                if isinstance(t, Exception):
                    recs_by[impl]["error"] = first_line(t)
                else:
                    _record_timing(recs_by[impl], t, flops)
        finally:
            for timer in timers.values():
                timer.close()
        _ratios(recs)
    del eager, sets
    fault = cleanup_fault(
        (
            ("after the timings", lambda: None),
            ("torch._dynamo.reset", torch._dynamo.reset if "compile" in cfg.impls else None),
            ("free_memory", lambda: free_memory(device)),
        )
    )
    _mark_fault(recs, fault)  # the checks and timings above, each synchronized, came through
    return recs


def _mark_fault(recs: list[dict[str, Any]], fault: str | None) -> None:
    """A CUDA fault that surfaced after the records' timings, on each of them."""
    for r in recs if fault is not None else []:
        r["fault_after_timing"] = fault


def _ratios(recs: list[dict[str, Any]]) -> None:
    """Each record's ``x_eager`` and ``x_graph`` (eager's, graph's time over its own)."""
    by = {r["impl"]: r["median_s"] for r in recs}
    for r in recs:
        for key, other in (("x_eager", by.get("eager")), ("x_graph", by.get("graph"))):
            ok = r["median_s"] and other
            r[key] = other / r["median_s"] if ok else None


def process_groups(impls: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The impls each worker process times: compile apart from the ``GRAPHED`` ones, whose CUDA
    graphs beside its cudagraph trees in one process faulted (session 22: an unspecified launch
    failure or illegal address in ~1 cell of 3 with eager + graph + compile, and with tilewise
    too; none in 21 cells of eager + compile alone). Eager goes with compile too, timed and
    then dropped where the first group has it."""
    if "compile" not in impls or not any(i in impls for i in GRAPHED):
        return [impls]
    return [tuple(i for i in impls if i != "compile"), ("eager", "compile")]  # eager: the check


def _measure_isolated(
    cfg: MLPConfig, device: str, cell: tuple[str, int, int, int]
) -> tuple[list[dict[str, Any]], str | None]:
    """``measure_cell`` in an ``IsolatedRunner`` worker: (records, the fault if any)."""
    try:
        recs = measure_cell(cfg, *cell, torch.device(device))
    except Exception as exc:  # e.g. a model that cannot be built: that cell's records say so
        why = first_line(exc)
        return lost_cell(cfg.impls, cell, f"raised {why}"), why
    return recs, next((r["fault_after_timing"] for r in recs if "fault_after_timing" in r), None)


def lost_cell(impls: Sequence[str], cell: tuple[str, int, int, int], why: str) -> list[dict]:
    """One error record per impl of a cell that gave none (its worker died or raised)."""
    dtype, layers, batch, hidden = cell
    flops = 2 * batch * hidden * hidden * layers
    base = dict(dtype=dtype, layers=layers, batch=batch, hidden=hidden, flops=flops)
    return [dict(base, impl=i, how=HOW[i], checked=False, median_s=None, error=why) for i in impls]


def _record_timing(rec: dict[str, Any], t: Timing, flops: float) -> None:
    rec.update(median_s=t.median_s, p20_s=t.p20_s, p80_s=t.p80_s, timer=t.method)
    rec.update(reps=t.reps, graph_replayed=t.method.startswith("cuda-graph"))
    rec["tflops"] = flops / t.median_s / 1e12


# --- training step -------------------------------------------------------------------------------


def _make_step(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> Callable:
    def step() -> torch.Tensor:
        opt.zero_grad()  # set_to_none: FusedAdamW then takes dW/db straight from the backward
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def measure_train(cfg: MLPConfig, device: torch.device) -> list[dict[str, Any]]:
    """One AdamW training step of ``cfg.train_shape``: eager, compiled, tilewise (graphed).

    Each impl trains its own copy of one model; the check is that the losses of the first 3
    steps (the warm-up; tilewise's on a side stream, before capture) match eager's to 1e-3."""
    from tilewise.optim import FusedAdamW

    layers, hidden, batch = cfg.train_shape
    dt = DTYPES[cfg.train_dtype]
    base = dict(study="train", dtype=cfg.train_dtype, layers=layers, batch=batch, hidden=hidden)
    torch.manual_seed(7)
    recs: list[dict[str, Any]] = []
    with _precision(dt):
        model = make_mlp(layers, hidden, device, dt).train()
        x, y = (torch.randn(batch, hidden, device=device, dtype=dt) for _ in range(2))
        m_e, m_c, m_t = (copy.deepcopy(model) for _ in range(3))
        m_t = tilewise_mlp(m_t).train()
        steps: dict[str, tuple[Callable, str]] = {
            "eager": (_make_step(m_e, torch.optim.AdamW(m_e.parameters()), x, y), "eager AdamW")
        }
        if "compile" in cfg.impls:
            from tilewise.bench.pointwise import configure_compile

            configure_compile()  # as the grid's cells do (in this process or a worker)
            fn = _make_step(m_c, torch.optim.AdamW(m_c.parameters()), x, y)
            steps["compile"] = (torch.compile(fn, mode=cfg.compile_mode), cfg.compile_mode)
        if "tilewise" in cfg.impls:
            how = "tilewise Linear + FusedAdamW" + (", step graphed" if x.is_cuda else "")
            steps["tilewise"] = (_make_step(m_t, FusedAdamW(m_t.parameters()), x, y), how)
        ref: list[float] = []
        for impl, (step, how) in steps.items():
            rec = dict(base, impl=impl, how=how, median_s=None, error=None)
            recs.append(rec)
            side = torch.cuda.Stream() if impl == "tilewise" and x.is_cuda else None
            try:  # tilewise: the warm-up before capture runs on a side stream
                if side is not None:
                    side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side) if side else contextlib.nullcontext():
                    losses = [float(step()) for _ in range(3)]
                ref = ref or losses
                rec["check_note"] = f"first losses {losses} vs eager {ref}"
                if any(not abs(a - b) <= 1e-3 * abs(b) for a, b in zip(losses, ref, strict=True)):
                    rec["error"] = f"correctness check failed: {rec['check_note']}"
                    continue
                if side is not None:  # capture forward + loss + backward + optimizer step
                    step = _capture(step, warm=0)
                t = time_events(lambda _x, s=step: s(), [(x,)], cfg.warmup, cfg.reps, False)
            except Exception as exc:
                rec["error"] = first_line(exc)
                continue
            rec.update(median_s=t.median_s, p20_s=t.p20_s, p80_s=t.p80_s, timer=t.method)
        eager_s = recs[0]["median_s"]
        for r in recs:
            r["x_eager"] = eager_s / r["median_s"] if eager_s and r["median_s"] else None
    del steps, m_e, m_c, m_t, model
    _mark_fault(recs, cleanup_fault((("free_memory", lambda: free_memory(device)),)))
    return recs


def _compile_cell(cfg: MLPConfig, cell: tuple[str, int, int, int], device: str) -> float:
    """Build and run the compile impl of one cell as ``measure_cell`` does (same module, dtype,
    precision and options), so its inductor artifacts land in the on-disk caches; seconds."""
    dtype, layers, batch, hidden = cell
    dt = DTYPES[dtype]
    dev = torch.device(device)
    t0 = time.perf_counter()
    with torch.no_grad(), _precision(dt):
        eager = make_mlp(layers, hidden, dev, dt)
        fn = _fns(replace(cfg, impls=("compile",)), eager, hidden)["compile"]
        fn(torch.randn(batch, hidden, device=dev, dtype=dt))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    torch._dynamo.reset()
    del eager
    free_memory(dev)
    return time.perf_counter() - t0


def _compile_worker(cfg: MLPConfig, cells: list, device: str) -> list[tuple[tuple, float | str]]:
    out: list[tuple[tuple, float | str]] = []
    for cell in cells:
        try:
            out.append((tuple(cell), _compile_cell(cfg, cell, device)))
        except Exception as exc:  # reported; the study then compiles (or fails) that cell itself
            out.append((tuple(cell), first_line(exc)))
    return out


def warm_compile(
    cfg: MLPConfig, jobs: int, device: str = "cuda"
) -> list[tuple[tuple, float | str]]:
    """Compile every cell's ``torch.compile(mode=cfg.compile_mode)`` model once, in ``jobs``
    processes (0: in this one), before the study times them.

    max-autotune spent ~30 s per shape in session 14, ~6 h for the whole grid in one process;
    inductor keeps what it builds on disk (``TORCHINDUCTOR_CACHE_DIR``: compiled graphs, GEMM
    autotuning results, Triton binaries), so a study that follows finds each cell built. The
    workers share the GPU, so their autotuning runs beside each other's and can pick a slower
    GEMM than a lone run would: a cost to the compile column, never to tilewise's. Returns
    (cell, seconds or error) per cell, in the cells' order.
    """
    cells = [c for c in cfg.cells() if "compile" in cfg.impls]
    if not cells:
        return []
    if jobs <= 0:
        return _compile_worker(cfg, cells, device)
    import concurrent.futures
    import multiprocessing

    chunks = [c for c in (cells[i::jobs] for i in range(jobs)) if c]
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    done: dict[tuple, float | str] = {}
    with concurrent.futures.ProcessPoolExecutor(len(chunks), mp_context=ctx) as pool:
        futures = {pool.submit(_compile_worker, cfg, c, device): c for c in chunks}
        for fut in concurrent.futures.as_completed(futures):
            try:
                done.update(fut.result())
            except Exception as exc:  # a worker that died: its cells are built by the study
                for cell in futures[fut]:
                    done.setdefault(tuple(cell), f"worker failed: {first_line(exc)}")
    return [(tuple(c), done.get(tuple(c), "not built")) for c in cells]


def run_mlp(
    cfg: MLPConfig,
    ceilings: Ceilings | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """The grid (and the training step unless ``cfg.train`` is false); record dicts."""
    dev = study_device(device)
    auto = "compile" in cfg.impls and dev.type == "cuda"
    isolate = cfg.isolate if cfg.isolate is not None else auto
    groups = process_groups(cfg.impls)
    with contextlib.ExitStack() as stack:  # one worker per group, each alive for the study
        runners = [
            stack.enter_context(
                IsolatedRunner(
                    _measure_isolated,
                    replace(cfg, impls=g),
                    str(dev),
                    timeout_s=cfg.cell_timeout_s,
                )
            )
            for g in groups
        ]

        def isolated(cell: tuple[str, int, int, int]) -> list[dict[str, Any]]:
            """The cell timed by each group's worker in turn; eager's record from the first
            group that has one; a group that gave nothing gets an error record per impl."""
            recs: list[dict[str, Any]] = []
            for runner, group in zip(runners, groups, strict=True):
                got = runner(cell) or lost_cell(group, cell, f"worker lost: {runner.last_fault}")
                have = {r["impl"] for r in recs}
                recs += [r for r in got if r["impl"] not in have]
            _ratios(recs)
            order = {impl: k for k, impl in enumerate(IMPLS)}
            return sorted(recs, key=lambda r: order.get(r["impl"], len(order)))

        recs = run_grid(
            cfg.cells(),
            isolated if isolate else lambda c: measure_cell(cfg, *c, dev),
            desc="mlp",
            label=lambda c: f"{c[0]} L{c[1]} B{c[2]} H{c[3]}",
            progress=progress,
        )
    for r in recs if ceilings is not None else []:  # fraction of the matmul ceiling
        rate = ceilings.matmul_flops_per_s.get(r["dtype"])
        r["frac_matmul"] = r["tflops"] * 1e12 / rate if rate and r.get("tflops") else None
    if not cfg.train:
        return recs
    try:  # in this process: a fault here must not cost the grid's records
        return recs + measure_train(cfg, dev)
    except Exception as exc:
        log.warning("tilewise bench mlp: the training step failed (%s)", first_line(exc))
        layers, hidden, batch = cfg.train_shape
        cell = (cfg.train_dtype, layers, batch, hidden)
        lost = lost_cell(("eager",), cell, f"raised {first_line(exc)}")
        return recs + [dict(r, study="train") for r in lost]


# --- summary and plots ---------------------------------------------------------------------------


def summarize(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per cell: us per call of each impl; best tilewise (fused or Strassen) x eager, x graph."""
    cells: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for r in records:
        if r.get("study") != "train":
            cells.setdefault((r["dtype"], r["layers"], r["batch"], r["hidden"]), {})[r["impl"]] = r
    rows = []
    for (dtype, layers, batch, hidden), by in cells.items():
        timed = [(by[i]["median_s"], i) for i in ("tilewise", "strassen") if i in by]
        best_s, best = min((t for t in timed if t[0]), default=(None, None))
        eager_s, graph_s, compile_s = (
            by.get(i, {}).get("median_s") for i in ("eager", "graph", "compile")
        )
        row = dict(dtype=dtype, layers=layers, batch=batch, hidden=hidden, best=best)
        row.update({f"{i}_us": by[i]["median_s"] * 1e6 for i in by if by[i]["median_s"]})
        row["x_eager"] = eager_s / best_s if best_s and eager_s else None
        row["x_graph"] = graph_s / best_s if best_s and graph_s else None
        row["x_compile"] = compile_s / best_s if best_s and compile_s else None
        rows.append(row)
    return rows


def summary_table(records: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    def f(x: float | None, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    headers = ["dtype", "L", "batch", "hidden", *(f"{i} us" for i in IMPLS), "best"]
    cells = []
    for r in summarize(records):
        keys = ("x_eager", "x_graph", "x_compile")
        ups = [f(r[k], ".2f") + ("x" if r[k] else "") for k in keys]
        us = [f(r.get(f"{i}_us")) for i in IMPLS]
        cells.append([r["dtype"], *(str(r[k]) for k in ("layers", "batch", "hidden"))])
        cells[-1] += [*us, r["best"] or "-", *ups]
    return [*headers, "x eager", "x graph", "x compile"], cells


def train_table(records: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    rows = [
        [r["impl"], f"{r['layers']}x{r['hidden']} b{r['batch']} {r['dtype']}",
         "-" if r["median_s"] is None else f"{r['median_s'] * 1e6:.1f}",
         "-" if not r.get("x_eager") else f"{r['x_eager']:.2f}x", r["how"]]
        for r in records if r.get("study") == "train" and "how" in r
    ]  # fmt: skip
    return ["train step", "problem", "us", "x eager", "how"], rows


def errors(records: Iterable[Mapping[str, Any]]) -> list[str]:
    return [
        f"{r.get('study', 'fwd')} {r['impl']} L{r['layers']} B{r['batch']} H{r['hidden']} "
        f"{r['dtype']}: {r['error']}"
        for r in records
        if r.get("error") and not str(r["error"]).startswith("skipped")
    ]


def plot_mlp(results: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Heatmaps of the best tilewise speedup, one panel per (dtype, layers): ``path`` vs eager,
    ``<path>-vs-graph.png`` vs the CUDA-graphed module and ``<path>-vs-compile.png`` vs
    torch.compile (each when that column was timed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    recs = results["records"] if isinstance(results, Mapping) else results
    rows = summarize(recs)
    if not any(r["x_eager"] for r in rows):
        raise ValueError("no cell with both eager and tilewise timed to plot")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    graph_png = out.with_name(out.stem + "-vs-graph.png")
    compile_png = out.with_name(out.stem + "-vs-compile.png")
    figures = {
        "x_eager": (out, "eager PyTorch"),
        "x_graph": (graph_png, "PyTorch + CUDA graph"),
        "x_compile": (compile_png, "torch.compile"),
    }
    for key, (target, base) in figures.items():
        if not any(r[key] for r in rows):
            continue
        dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
        layers = sorted({r["layers"] for r in rows})
        # at least ~5.6 inches wide: one panel would clip the title
        fig = Figure(figsize=(max(5.6, 3.6 * len(layers)), 3.2 * len(dtypes)), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(dtypes), len(layers), squeeze=False)
        vals = [r[key] for r in rows if r[key]]
        norm = TwoSlopeNorm(vcenter=1.0, vmin=min(min(vals), 0.99), vmax=max(max(vals), 1.01))
        for i, dtype in enumerate(dtypes):
            for j, n in enumerate(layers):
                ax = axes[i][j]
                sub = [r for r in rows if r["dtype"] == dtype and r["layers"] == n]
                bs, hs = sorted({r["batch"] for r in sub}), sorted({r["hidden"] for r in sub})
                grid = np.full((len(bs), len(hs)), np.nan)
                for r in sub:
                    grid[bs.index(r["batch"]), hs.index(r["hidden"])] = r[key] or np.nan
                im = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto", origin="lower")
                for (a, b), v in np.ndenumerate(grid):
                    if not math.isnan(v):
                        ax.text(b, a, f"{v:.2f}", ha="center", va="center", fontsize=6)
                ax.set_xticks(range(len(hs)), [str(h) for h in hs], fontsize=7)
                ax.set_yticks(range(len(bs)), [str(b) for b in bs], fontsize=7)
                ax.set_title(f"{dtype}, {n} layer{'s' * (n > 1)}", fontsize=9)
                ax.set(xlabel="hidden", ylabel="batch")
        fig.colorbar(im, ax=axes, shrink=0.6, label="speedup")
        fig.suptitle(f"MLP forward: best tilewise (fused or Strassen) vs {base}", fontsize=10)
        fig.savefig(target, dpi=110)
        written.append(target)
    return written[0]
