"""Isolated grouped-conv study: tilewise vs PyTorch/cuDNN per pass, side by side in one run.

Problems: fp16 and bf16; C=64 at 64x64, C=128 at 32x32, C=256 at 16x16 with 3x3 kernels, plus
5x5 and 7x7 at C=64 64x64; N in {1, 8, 32, 64, 128, 256}; group width 8, 'same' padding, no
bias, channels_last. Per pass:

- cuDNN (``torch.backends.cudnn.benchmark`` on): fprop ``F.conv2d``; dgrad and wgrad
  ``aten.convolution_backward`` with ``output_mask`` (True, False, False) / (False, True, False)
  on the real channels_last input and a channels_last weight, i.e. the call autograd makes
  (``torch.nn.grad.conv2d_input`` would pass a zero-stride fake input instead).
- tilewise: the host functions ``ops.gconv.forward`` and ``ops.gconv.backward`` with only the
  needed gradient (contiguous [C, 8, R, S] weight; wgrad with fp32 atomics unless
  ``deterministic``, as ``GroupedConv2d`` does by default).

Each problem is first checked: tilewise vs cuDNN in the same dtype vs an fp64 reference, per pass
(``bench.checks.compare``); a pass that fails is not timed for tilewise and says why. Timing is
``time_events`` (CUDA events, median) over input sets rotated past 2x L2, cross-checked with
``profile_kernels`` summing every kernel the pass launches (helpers such as the dgrad weight flip
or the wgrad zero fill included). Effective bandwidth = compulsory bytes
(``GConvProblem.bytes``) / time, quoted against the copy ceiling measured in the same run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tilewise.bench.ceilings import Ceilings
from tilewise.bench.checks import compare
from tilewise.bench.grid import free_memory, run_grid, study_device
from tilewise.bench.metrics import effective_bandwidth, fraction, speedup
from tilewise.bench.timing import (
    l2_cache_bytes,
    profile_kernels,
    rotation_count,
    time_events,
    time_graph,
)
from tilewise.ops import gconv as _gconv
from tilewise.ops.gconv_config import GROUP_WIDTH, PASSES, GConvProblem
from tilewise.registry import DTYPES
from tilewise.runtime import autotune

log = logging.getLogger(__name__)

SHAPES: tuple[tuple[int, int, int], ...] = ((64, 64, 64), (128, 32, 32), (256, 16, 16))
BATCHES: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
IMPLS = ("tilewise", "cudnn")
IMPL_STYLE: dict[str, tuple[str, str]] = {  # impl -> (colour, marker); shared with gconv_insitu
    "tilewise": ("tab:blue", "o"),
    "cudnn": ("tab:orange", "s"),
    "eager": ("tab:orange", "s"),
    "compile": ("tab:green", "^"),
    "tilewise-graph": ("tab:cyan", "v"),
    "tilewise-compile": ("tab:purple", "D"),
}
KernelRow = tuple[str, float, float]  # (kernel name, launches per call, seconds per call)


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool = True) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` set inside the block, restored after."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


@dataclass(frozen=True)
class GConvStudyConfig:
    """The problem grid and timing effort of the isolated study."""

    dtypes: tuple[str, ...] = ("fp16", "bf16")
    shapes: tuple[tuple[int, int, int], ...] = SHAPES  # (C, H, W)
    batches: tuple[int, ...] = BATCHES
    kernels: tuple[int, ...] = (3,)  # square kernel sizes at every shape
    extra_kernels: tuple[int, ...] = (5, 7)  # ... and these at ``extra_shape`` only
    extra_shape: tuple[int, int, int] = (64, 64, 64)
    passes: tuple[str, ...] = PASSES
    impls: tuple[str, ...] = IMPLS
    deterministic: bool = False
    warmup: int = 10
    reps: int = 50
    profile_iters: int = 20
    graph_replays: int = 20
    #: the weight layout tilewise is given: "channels_last", as in a model moved to channels_last
    #: and as cuDNN gets it (since session 21), or "contiguous" (sessions 1-20)
    tilewise_weight: str = "channels_last"

    @classmethod
    def quick(cls, **overrides: Any) -> GConvStudyConfig:
        """fp16, C=64 at 64x64, 3x3, N in {1, 32}: a smoke run of every code path."""
        base = cls(dtypes=("fp16",), shapes=(SHAPES[0],), batches=(1, 32), extra_kernels=())
        return replace(base, **overrides)

    def problems(self) -> list[GConvProblem]:
        """Every problem of the grid, in run order, without duplicates."""
        out = []
        for dtype in self.dtypes:
            grid = [(shape, k) for shape in self.shapes for k in self.kernels]
            grid += [(self.extra_shape, k) for k in self.extra_kernels]
            for (c, h, w), k in grid:
                for n in self.batches:
                    out.append(GConvProblem(n, c, h, w, k, k, k // 2, k // 2, dtype))
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Record:
    """One (problem, pass, implementation); timings are None when it was not timed."""

    pass_: str
    impl: str
    dtype: str
    n: int
    c: int
    h: int
    w: int
    k: int
    bytes: int
    flops: int
    checked: bool
    rotation: int = 1
    median_s: float | None = None
    p20_s: float | None = None
    p80_s: float | None = None
    eff_bw: float | None = None
    frac_copy: float | None = None
    timer: str | None = None
    prof_s: float | None = None
    prof_eff_bw: float | None = None
    prof_frac_copy: float | None = None
    graph_s: float | None = None  # per call, from CUDA-graph replays of GRAPH_CALLS calls
    graph_eff_bw: float | None = None
    graph_frac_copy: float | None = None
    l2_s: float | None = None  # the same with one input set replayed (it stays in L2), if it fits
    l2_eff_bw: float | None = None
    l2_frac_copy: float | None = None
    # torch's copy_ of the input's bytes into a buffer of that size, by graph replay over the same
    # rotated sets (a copy as large as the problem, not the 1 GiB ceiling), and the pass's graph
    # bandwidth as a fraction of that copy's
    same_copy_s: float | None = None
    graph_frac_same_copy: float | None = None
    kernels: tuple[KernelRow, ...] = ()
    configs: tuple[str, ...] = ()  # tilewise: the configs the autotuner answered with
    weight_layout: str | None = None  # the layout of the weight this impl was given
    error: str | None = None
    check_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        d["kernels"] = [list(k) for k in self.kernels]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["pass_"] = d["pass"]
        kw["kernels"] = tuple((str(n), float(c), float(s)) for n, c, s in d.get("kernels", ()))
        kw["configs"] = tuple(d.get("configs", ()))
        return cls(**kw)


#: the fewest calls per captured graph (whole rounds over the rotated input sets, so small
#: problems with many sets capture one round of them all): the graph column times
#: the kernels back to back as a captured step runs them, where the event column's window per
#: call also holds the launch (~3 us against a 52 us kernel: session 20, C=64 N=128 fprop).
GRAPH_CALLS = 8
#: problems whose input + output set takes at most this fraction of L2 also get the ``l2_*``
#: columns: one set replayed, so it stays in L2 (the output of one call is the next call's
#: output buffer again)
L2_RESIDENT_FRACTION = 0.5


def shape_label(c: int, h: int, w: int, k: int) -> str:
    return f"C={c} {h}x{w} {k}x{k}"


# --- tensors and the passes ------------------------------------------------------------------


def _normal(shape: Sequence[int], dtype: torch.dtype, device: torch.device, gen, cl: bool):
    fmt = torch.channels_last if cl else torch.contiguous_format
    t = torch.empty(tuple(shape), dtype=torch.float32, device=device, memory_format=fmt)
    return t.normal_(generator=gen).to(dtype)


def make_activations(
    problem: GConvProblem, device: torch.device, gen: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, dy): channels_last N(0, 1) input and output gradient of ``problem``."""
    dt = DTYPES[problem.dtype]
    x = _normal((problem.n, problem.c, problem.h, problem.w), dt, device, gen, True)
    dy = _normal((problem.n, problem.c, problem.p, problem.q), dt, device, gen, True)
    return x, dy


def make_weight(
    problem: GConvProblem, device: torch.device, gen: torch.Generator | None = None
) -> torch.Tensor:
    """A contiguous [C, 8, R, S] weight scaled like kaiming, so outputs are O(1)."""
    scale = (GROUP_WIDTH * problem.r * problem.s) ** -0.5
    shape = (problem.c, GROUP_WIDTH, problem.r, problem.s)
    w = _normal(shape, torch.float32, device, gen, False) * scale
    return w.to(DTYPES[problem.dtype])


def pass_fn(
    impl: str, pass_: str, problem: GConvProblem, deterministic: bool = False
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(x, weight, dy)`` running one pass of ``problem`` with ``impl`` ("tilewise"/"cudnn").

    cuDNN wants a channels_last weight; tilewise reads any layout (``measure_problem`` gives it
    the same channels_last weight unless the study says ``tilewise_weight="contiguous"``).
    """
    if pass_ not in PASSES:
        raise ValueError(f"argument 'pass_' must be one of {PASSES}, got {pass_!r}")
    ph, pw = problem.pad_h, problem.pad_w
    idx = 0 if pass_ == "dgrad" else 1
    if impl == "tilewise":
        if pass_ == "fprop":
            return lambda x, w, dy: _gconv.forward(x, w, None, ph, pw)
        need = (pass_ == "dgrad", pass_ == "wgrad", False)
        return lambda x, w, dy: _gconv.backward(dy, x, w, None, ph, pw, need, deterministic)[idx]
    if impl in ("cudnn", "eager"):
        g = problem.groups
        if pass_ == "fprop":
            return lambda x, w, dy: F.conv2d(x, w, None, 1, (ph, pw), 1, g)
        mask = [pass_ == "dgrad", pass_ == "wgrad", False]
        conv_bwd = torch.ops.aten.convolution_backward
        return lambda x, w, dy: conv_bwd(
            dy, x, w, None, [1, 1], [ph, pw], [1, 1], False, [0, 0], g, mask
        )[idx]
    raise ValueError(f"argument 'impl' must be one of {IMPLS}, got {impl!r}")


def check_problem(
    problem: GConvProblem,
    x: torch.Tensor,
    w_tw: torch.Tensor,
    w_cu: torch.Tensor,
    dy: torch.Tensor,
    passes: Sequence[str] = PASSES,
    deterministic: bool = False,
) -> dict[str, tuple[bool, str]]:
    """Per pass: is tilewise as close to an fp64 reference as cuDNN in the same dtype is?"""
    out = {}
    for pass_ in passes:
        tw = pass_fn("tilewise", pass_, problem, deterministic)(x, w_tw, dy)
        cu = pass_fn("cudnn", pass_, problem)(x, w_cu, dy)
        ref = pass_fn("cudnn", pass_, problem)(x.double(), w_tw.double(), dy.double())
        out[pass_] = compare(tw, cu, ref, problem.dtype)
    return out


def _kernel_rows(prof) -> tuple[KernelRow, ...]:
    return tuple((k.name, k.count / prof.calls, k.total_s / prof.calls) for k in prof.kernels)


def measure_problem(
    problem: GConvProblem,
    config: GConvStudyConfig,
    ceilings: Ceilings | None = None,
    device: torch.device | str = "cuda",
) -> list[dict[str, Any]]:
    """Check, then time every (pass, impl) of one problem; one record dict each."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(problem.n * 7919 + problem.c)
    e = problem.elem_bytes
    set_bytes = problem.n * problem.c * (problem.h * problem.w + problem.p * problem.q) * e
    l2 = l2_cache_bytes(dev)
    rot = rotation_count(set_bytes, l2) if l2 else 1
    sets = [make_activations(problem, dev, gen) for _ in range(rot)]
    w_tw = make_weight(problem, dev, gen)
    w_cu = w_tw.contiguous(memory_format=torch.channels_last)
    if config.tilewise_weight == "channels_last":
        w_tw = w_cu
    with cudnn_benchmark(True):
        try:
            x0, dy0 = sets[0]
            checks = check_problem(
                problem, x0, w_tw, w_cu, dy0, config.passes, config.deterministic
            )
        except Exception as exc:  # a crash in a kernel is a failed check, reported as such
            checks = {p: (False, f"check raised {type(exc).__name__}: {exc}") for p in PASSES}
        resident = bool(l2) and set_bytes <= L2_RESIDENT_FRACTION * l2
        records = []
        for pass_ in config.passes:
            for impl in config.impls:
                args = (problem, pass_, impl, checks[pass_], sets, w_tw, w_cu, config, ceilings)
                rec = _measure(*args, rot)
                if resident and not rec["error"]:
                    w = w_tw if impl == "tilewise" else w_cu
                    rec.update(_l2_rates(problem, pass_, impl, sets[0], w, config, ceilings))
                records.append(rec)
    same = _same_size_copy(sets, config, problem)
    for rec in records:
        rec.update(_same_copy_fields(rec, same, 2 * sets[0][0].nbytes))
    del sets
    free_memory(dev)
    return records


def _measure(problem, pass_, impl, check, sets, w_tw, w_cu, config, ceilings, rot) -> dict:
    ok, note = check
    nbytes = problem.bytes(pass_)
    rec = Record(
        pass_=pass_,
        impl=impl,
        dtype=problem.dtype,
        n=problem.n,
        c=problem.c,
        h=problem.h,
        w=problem.w,
        k=problem.r,
        bytes=nbytes,
        flops=problem.flops(pass_),
        checked=ok,
        rotation=rot,
        check_note=note if impl == "tilewise" else None,
    )
    if impl == "tilewise" and not ok:
        return replace(rec, error=f"correctness check failed: {note}").to_dict()
    fn = pass_fn(impl, pass_, problem, config.deterministic)
    w = w_tw if impl == "tilewise" else w_cu
    cl = w.is_contiguous(memory_format=torch.channels_last)  # a 1x1 weight is both
    rec = replace(rec, weight_layout="channels_last" if cl else "contiguous")
    args = [(x, w, dy) for x, dy in sets]
    try:
        with autotune.recording() as picks:  # which config runs (chosen on this first call)
            fn(*args[0])
        rec = replace(rec, configs=tuple(dict.fromkeys(_config_name(c) for _, _, c in picks)))
        t = time_events(fn, args, warmup=config.warmup, reps=config.reps)
        prof = graph = None
        if args[0][0].device.type == "cuda":
            prof = profile_kernels(fn, args, iters=config.profile_iters, warmup=3)
    except Exception as exc:
        return replace(rec, error=f"{type(exc).__name__}: {exc}").to_dict()
    if args[0][0].device.type == "cuda":
        graph = _graph_timing(fn, args, config, problem)
    copy = ceilings.copy_bytes_per_s if ceilings else None
    bw = effective_bandwidth(nbytes, t.median_s)
    rec = replace(
        rec,
        median_s=t.median_s,
        p20_s=t.p20_s,
        p80_s=t.p80_s,
        eff_bw=bw,
        frac_copy=fraction(bw, copy) if copy else None,
        timer=t.method,
    )
    if graph is not None:
        rec = replace(rec, **_rates("graph", graph.median_s, nbytes, copy))
    if prof is not None and prof.per_call_s > 0:
        rates = _rates("prof", prof.per_call_s, nbytes, copy)
        rec = replace(rec, kernels=_kernel_rows(prof), **rates)
    return rec.to_dict()


def _graph_timing(fn, args, config: GConvStudyConfig, problem: GConvProblem):
    """``time_graph`` over whole rounds of ``args`` (at least ``GRAPH_CALLS`` calls), or None
    where capture fails (the other timings stand; said in a log line)."""
    rounds = -(-GRAPH_CALLS // len(args))
    try:
        return time_graph(fn, args, warmup=2, rounds=rounds, replays=config.graph_replays)
    except Exception as exc:
        log.warning("gconv study: no graph timing for %s (%s)", problem.label(), exc)
        return None


def _same_size_copy(sets, config: GConvStudyConfig, problem: GConvProblem) -> float | None:
    """Seconds of ``dst.copy_(x)`` per call by graph replay over the rotated inputs, each into
    its own buffer (session 43: at 64 MiB a copy reads only 0.88 of the 1 GiB ceiling, so this
    says how much of a bar is the problem's size); None off CUDA or where capture fails."""
    if sets[0][0].device.type != "cuda":
        return None
    args = [(x, torch.empty_like(x)) for x, _ in sets]
    t = _graph_timing(lambda x, dst: dst.copy_(x), args, config, problem)
    return None if t is None else t.median_s


def _same_copy_fields(rec: Mapping[str, Any], same_s: float | None, copy_bytes: int) -> dict:
    """``same_copy_s`` and ``graph_frac_same_copy`` of a record (empty without both timings)."""
    if not (same_s and rec.get("graph_s")):
        return {}
    frac = (rec["bytes"] / rec["graph_s"]) / (copy_bytes / same_s)
    return {"same_copy_s": same_s, "graph_frac_same_copy": frac}


def _l2_rates(problem, pass_, impl, act_set, weight, config, ceilings) -> dict[str, Any]:
    """``l2_*`` fields: graph replay of one input set over and over, so a problem whose
    activations fit in L2 runs from L2 (the issue asks for more than the copy bandwidth there;
    the rotated columns read every input from DRAM). Empty where that cannot be timed."""
    if act_set[0].device.type != "cuda":
        return {}
    fn = pass_fn(impl, pass_, problem, config.deterministic)
    x, dy = act_set
    t = _graph_timing(fn, [(x, weight, dy)], config, problem)
    if t is None:
        return {}
    copy = ceilings.copy_bytes_per_s if ceilings else None
    return _rates("l2", t.median_s, problem.bytes(pass_), copy)


def _rates(prefix: str, seconds: float, nbytes: int, copy: float | None) -> dict[str, Any]:
    """``<prefix>_s``, ``<prefix>_eff_bw`` and ``<prefix>_frac_copy`` of one timing."""
    bw = effective_bandwidth(nbytes, seconds)
    frac = fraction(bw, copy) if copy else None
    return {f"{prefix}_s": seconds, f"{prefix}_eff_bw": bw, f"{prefix}_frac_copy": frac}


def _config_name(config: Any) -> str:
    """A config's short name (NVRTC tiles and Triton configs have one), else its repr."""
    name = getattr(config, "name", None)
    return name if isinstance(name, str) else repr(config)


def run_gconv(
    config: GConvStudyConfig,
    ceilings: Ceilings | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run the whole grid of ``config``; returns record dicts (see ``Record.to_dict``)."""
    dev = study_device(device)
    return run_grid(
        config.problems(),
        lambda problem: measure_problem(problem, config, ceilings, dev),
        desc="gconv",
        label=lambda problem: problem.label(),
        progress=progress,
    )


# --- summary and plot ------------------------------------------------------------------------


def fmt(r: Mapping[str, Any] | None, key: str, spec: str, scale: float = 1.0) -> str:
    """``r[key] * scale`` formatted with ``spec``, "-" when missing."""
    v = None if r is None else r.get(key)
    return "-" if v is None else format(v * scale, spec)


def ratio_of(base: Mapping[str, Any] | None, cand: Mapping[str, Any] | None, key: str) -> str:
    """How many times faster ``cand`` is than ``base`` on time ``key``, "-" when unknown."""
    if not (base and cand and base.get(key) and cand.get(key)):
        return "-"
    return f"{speedup(base[key], cand[key]):.2f}x"


def summary_table(records: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: per problem and pass, GB/s and fraction of copy from CUDA events per
    call, the same fraction from graph replays and from the profiler's kernel sum, and tilewise's
    speedup over cuDNN (events; graphs); for problems that fit in L2, the fraction with one input
    set replayed from L2; and tilewise's graph bandwidth as a fraction of a same-size copy's
    (``same_copy_s``)."""
    groups: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for r in records:
        key = (r["c"], r["h"], r["w"], r["k"], r["dtype"], r["n"], r["pass"])
        groups.setdefault(key, {})[r["impl"]] = r
    headers = ["shape", "dtype", "N", "pass", "tw GB/s", "cudnn GB/s", "tw frac", "cudnn frac"]
    headers += ["x cudnn", "tw graph frac", "cudnn graph frac", "x cudnn graph"]
    headers += ["tw prof frac", "cudnn prof frac", "tw L2 frac", "cudnn L2 frac"]
    headers += ["tw graph / same-size copy"]
    rows = []
    for (c, h, w, k, dtype, n, pass_), by in groups.items():
        tw, cu = by.get("tilewise"), by.get("cudnn")
        cells = [fmt(r, "eff_bw", ".0f", 1e-9) for r in (tw, cu)]
        cells += [fmt(r, "frac_copy", ".3f") for r in (tw, cu)]
        cells += [ratio_of(cu, tw, "median_s")]
        cells += [fmt(r, "graph_frac_copy", ".3f") for r in (tw, cu)]
        cells += [ratio_of(cu, tw, "graph_s")]
        cells += [fmt(r, "prof_frac_copy", ".3f") for r in (tw, cu)]
        cells += [fmt(r, "l2_frac_copy", ".3f") for r in (tw, cu)]
        cells += [fmt(tw, "graph_frac_same_copy", ".3f")]
        rows.append([shape_label(c, h, w, k), dtype, str(n), pass_, *cells])
    return headers, rows


def errors(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per record that was not timed, with its reason."""
    return [
        f"{shape_label(r['c'], r['h'], r['w'], r['k'])} N={r['n']} {r['dtype']} {r['pass']} "
        f"{r['impl']}: {r['error']}"
        for r in records
        if r.get("error")
    ]


def copy_ceiling_line(ax, results: Mapping[str, Any] | Sequence[Any]) -> None:
    """The copy ceiling of the run (GB/s) as a horizontal line, when the results carry it."""
    ceil = results.get("ceilings") if isinstance(results, Mapping) else None
    copy = (ceil or {}).get("copy_bytes_per_s")
    if copy:
        ax.axhline(copy / 1e9, color="black", linestyle="--", linewidth=0.8, label="copy ceiling")


def new_figure(rows: int, cols: int, width: float = 4.0, height: float = 3.0):
    """A matplotlib Figure on an Agg canvas (no pyplot) and its [rows][cols] axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def records_of(results: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records of a result file (or a plain list of records), as dicts."""
    recs = results["records"] if isinstance(results, Mapping) else results
    return [dict(r) for r in recs]


def plot_gconv(results: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Effective bandwidth (GB/s) vs N: a row per shape, a column per pass; tilewise vs cuDNN
    (colour), fp16 solid / bf16 dashed, the run's copy ceiling as a black dashed line."""
    from tilewise.bench.plots import plot_series

    recs = [r for r in records_of(results) if r.get("eff_bw") is not None]
    if not recs:
        raise ValueError("no timed records (with eff_bw) to plot")
    shapes = list(dict.fromkeys((r["c"], r["h"], r["w"], r["k"]) for r in recs))
    passes = [p for p in PASSES if any(r["pass"] == p for r in recs)]
    fig, axes = new_figure(len(shapes), len(passes))
    styles = {"fp16": "-", "bf16": "--", "fp32": ":"}
    for i, shape in enumerate(shapes):
        for j, pass_ in enumerate(passes):
            ax = axes[i][j]
            sub = [r for r in recs if (r["c"], r["h"], r["w"], r["k"]) == shape]
            sub = [r for r in sub if r["pass"] == pass_]
            for impl in dict.fromkeys(r["impl"] for r in sub):
                colour, marker = IMPL_STYLE.get(impl, ("tab:gray", "x"))
                for dtype in dict.fromkeys(r["dtype"] for r in sub):
                    pts = sorted(
                        (r["n"], r["eff_bw"] / 1e9)
                        for r in sub
                        if r["impl"] == impl and r["dtype"] == dtype
                    )
                    plot_series(
                        ax, pts, (colour, marker), styles.get(dtype, "-."), f"{impl} {dtype}"
                    )
            copy_ceiling_line(ax, results)
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{shape_label(*shape)} {pass_}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("batch N")
            if j == 0:
                ax.set_ylabel("effective bandwidth (GB/s)")
            if i == 0 and j == 0:
                ax.legend(fontsize=6, loc="best")
    fig.suptitle("Grouped conv (group width 8), isolated: compulsory bytes / time", fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
