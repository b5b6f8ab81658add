"""Pointwise study: every op in ``tilewise.registry.OPS`` vs eager PyTorch vs ``torch.compile``.

For each problem (op, dtype, n, tensor size, activation) the tilewise output and gradients are
first checked against eager PyTorch and an fp32 reference; a problem that fails is not timed.
Then each implementation and pass is timed with CUDA events over a rotation of input sets that
exceeds 2x L2, and quoted as compulsory bytes / time, as a fraction of the copy ceiling.
"MB" here means 2**20 bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from tilewise.bench.ceilings import Ceilings
from tilewise.bench.checks import bind_activation, check_problem
from tilewise.bench.grid import free_memory, run_grid, study_device
from tilewise.bench.metrics import achieved_flops, effective_bandwidth, fraction, speedup
from tilewise.bench.timing import (
    EventTimer,
    Timing,
    detached,
    interleaved,
    l2_cache_bytes,
    rotation_count,
    time_events,
)
from tilewise.registry import OPS, OpSpec, RowsProblem, rows_for_bytes

MB = 1 << 20
IMPLS = ("tilewise", "eager", "compile")
PASSES = ("fwd", "bwd")
DEFAULT_N: dict[str, tuple[int, ...]] = {"bias_act": (4096, 64), "layer_norm": (1024, 4096)}
BASE_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "bias_act": ("relu",),
    "layer_norm": ("none", "relu"),
}
FULL_ACTIVATIONS: dict[str, tuple[str, ...]] = {"bias_act": ("relu", "gelu", "silu")}
TARGET_FRACTION = 0.85
#: untimed calls after each turn's L2 read-out (``EventTimer(settle=)``)
SETTLE_CALLS = 3
TARGET_MIN_MB = 64.0


@dataclass(frozen=True)
class Case:
    """One problem of the grid: an op on one [m, n] shape, plus the nominal size it came from."""

    op: str
    problem: RowsProblem
    size_mb: float


@dataclass(frozen=True)
class PointwiseConfig:
    """The problem grid and timing effort of one pointwise study."""

    ops: tuple[str, ...] = tuple(OPS)
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    sizes_mb: tuple[float, ...] = (4, 16, 64, 256)
    passes: tuple[str, ...] = PASSES
    impls: tuple[str, ...] = IMPLS
    n_values: tuple[int, ...] | None = None  # same n for every op; None: DEFAULT_N per op
    max_n_per_op: int | None = None
    full_activation_dtype: str = "fp16"  # every activation at the largest size in this dtype
    warmup: int = 10
    reps: int = 50

    @classmethod
    def quick(cls, **overrides: Any) -> PointwiseConfig:
        """One n per op, 4 and 64 MB, fp16 only."""
        return replace(cls(dtypes=("fp16",), sizes_mb=(4, 64), max_n_per_op=1), **overrides)

    @classmethod
    def tour(cls, **overrides: Any) -> PointwiseConfig:
        """fp16 and bf16 at 64 and 256 MB, one n per op, both passes, all implementations."""
        base = cls(dtypes=("fp16", "bf16"), sizes_mb=(64, 256), max_n_per_op=1)
        return replace(base, **overrides)

    def ns(self, op: str) -> tuple[int, ...]:
        ns = self.n_values or DEFAULT_N.get(op, (1024,))
        return ns[: self.max_n_per_op] if self.max_n_per_op else ns

    def activations(self, op: str, dtype: str, size_mb: float) -> tuple[str, ...]:
        base = BASE_ACTIVATIONS.get(op, (RowsProblem(1, 1).activation,))
        if dtype == self.full_activation_dtype and size_mb == max(self.sizes_mb):
            return FULL_ACTIVATIONS.get(op, base)
        return base

    def cases(self) -> list[Case]:
        out = []
        for op in self.ops:
            if op not in OPS:
                raise ValueError(f"unknown op {op!r}; known: {sorted(OPS)}")
            for dtype in self.dtypes:
                for n in self.ns(op):
                    for size in self.sizes_mb:
                        m = rows_for_bytes(n, dtype, int(size * MB))
                        for act in self.activations(op, dtype, size):
                            out.append(Case(op, RowsProblem(m, n, dtype, act), float(size)))
        return out


@dataclass(frozen=True)
class Record:
    """One timed (problem, pass, implementation); timings are None when it was not timed."""

    op: str
    pass_: str
    impl: str
    dtype: str
    m: int
    n: int
    activation: str
    size_mb: float
    tensor_mb: float
    bytes: int
    flops: int
    checked: bool
    median_s: float | None = None
    p20_s: float | None = None
    p80_s: float | None = None
    eff_bw: float | None = None
    frac_copy: float | None = None
    flops_per_s: float | None = None
    timer: str | None = None
    error: str | None = None
    check_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d


# --- implementations -----------------------------------------------------------------------------


def configure_compile(limit: int = 512) -> None:
    """Settings for timing ``torch.compile`` baselines over many shapes and repeated backwards.

    Raises the recompile limits so one compiled callable holds a graph per shape/dtype without
    falling back to eager, and turns off AOTAutograd's donated buffers, which would refuse the
    ``retain_graph=True`` backward the timer repeats (it changes memory reuse, not kernels).
    """
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), limit))
            break
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), 4 * limit))
            break
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False


@functools.cache
def _compiled(op: str, activation: str) -> Callable[..., torch.Tensor]:
    configure_compile()
    return torch.compile(bind_activation(OPS[op].reference, activation), dynamic=False)


def implementation(spec: OpSpec, impl: str, activation: str) -> Callable[..., torch.Tensor]:
    """Callable taking the op's inputs as keywords: tilewise, eager reference or compiled."""
    if impl == "tilewise":
        return bind_activation(spec.tilewise, activation)
    if impl == "eager":
        return bind_activation(spec.reference, activation)
    if impl == "compile":
        return _compiled(spec.name, activation)
    raise ValueError(f"unknown impl {impl!r}; known: {IMPLS}")


# --- timing --------------------------------------------------------------------------------------


def _arg_sets(spec: OpSpec, problem: RowsProblem, device: torch.device) -> list[dict]:
    l2 = l2_cache_bytes(device)
    count = rotation_count(spec.bytes(problem, "fwd"), l2) if l2 else 1
    return [spec.make_inputs(problem, device) for _ in range(count)]


def _pass_call(
    fn: Callable[..., torch.Tensor], spec: OpSpec, sets: list[dict], pass_: str
) -> tuple[Callable[..., Any], list[tuple]]:
    """The timed callable of one pass and its argument sets: the forward under ``no_grad``, or
    ``autograd.grad`` over a graph built once per input set (``retain_graph``)."""
    if pass_ == "fwd":

        def fwd(inputs: dict) -> torch.Tensor:
            with torch.no_grad():
                return fn(**inputs)

        return fwd, [(s,) for s in sets]
    args = []
    with torch.enable_grad():
        for s in sets:
            out = fn(**s)
            args.append((out, tuple(s[k] for k in spec.grad_inputs), torch.randn_like(out)))

    def bwd(out: torch.Tensor, ins: tuple[torch.Tensor, ...], dy: torch.Tensor):
        return torch.autograd.grad(out, ins, dy, retain_graph=True)

    return bwd, args


def _time_impls(
    makers: Mapping[str, Callable[[], Callable[..., torch.Tensor]]],
    spec: OpSpec,
    sets: list[dict],
    pass_: str,
    warmup: int,
    reps: int,
) -> dict[str, Timing | Exception]:
    """Every impl's timing of one pass (``makers`` build each impl's callable; one that raises
    answers with its exception, as does one whose timing fails). On a GPU the impls are sampled
    in rotating turns (``interleaved``), so none is always timed first, right after the
    correctness check, or last (session 17: the study, timing tilewise then eager then compile,
    read tilewise's LayerNorm forward with streaming stores 1.4 points of copy below compile).
    Each turn starts with L2 read out and a few untimed calls (``EventTimer(settle=)``): turns
    without them let evict-first loads hit on input lines the previous impl had left in L2."""
    # exceptions are kept without their tracebacks (``detached``): a traceback's frames would
    # hold this frame's timers, graphs and outputs until a garbage collection
    out: dict[str, Timing | Exception] = {}
    calls: dict[str, Any] = {}
    for impl, make in makers.items():
        try:
            calls[impl] = _pass_call(make(), spec, sets, pass_)
        except Exception as exc:
            out[impl] = detached(exc)
    if sets and not any(isinstance(v, torch.Tensor) and v.is_cuda for v in sets[0].values()):
        for impl, c in calls.items():
            try:
                out[impl] = time_events(*c, warmup, reps)
            except Exception as exc:
                out[impl] = detached(exc)
        return {impl: out[impl] for impl in makers}
    timers: dict[str, EventTimer] = {}
    for impl, c in calls.items():
        try:
            timers[impl] = EventTimer(c[0], c[1], warmup, settle=SETTLE_CALLS)
        except Exception as exc:
            out[impl] = detached(exc)
    out.update(interleaved(timers, reps, chunks=4))
    return {impl: out[impl] for impl in makers}  # outputs die with this frame


def measure_case(
    case: Case,
    impls: Sequence[str] = IMPLS,
    passes: Sequence[str] = PASSES,
    ceilings: Ceilings | None = None,
    device: torch.device | str = "cuda",
    warmup: int = 10,
    reps: int = 50,
) -> list[dict[str, Any]]:
    """Check, then time one problem under every (pass, impl); one record dict per pair."""
    spec, p, dev = OPS[case.op], case.problem, torch.device(device)
    base = {"op": case.op, "dtype": p.dtype, "m": p.m, "n": p.n, "activation": p.activation}
    base.update(size_mb=case.size_mb, tensor_mb=p.tensor_bytes / MB)
    passes = [q for q in passes if q in spec.passes]
    sets = _arg_sets(spec, p, dev)
    try:
        ok, note = check_problem(spec, p, sets[0], with_grads="bwd" in passes)
    except Exception as exc:  # a crash in the kernel is a failed check, reported as such
        ok, note = False, f"check raised {type(exc).__name__}: {exc}"
    records = []
    for pass_ in passes:
        nbytes, flops = spec.bytes(p, pass_), spec.flops(p, pass_)
        recs = {
            impl: Record(
                pass_=pass_,
                impl=impl,
                bytes=nbytes,
                flops=flops,
                checked=ok,
                check_note=note if impl == "tilewise" else None,
                **base,
            )
            for impl in impls
        }
        if not ok:
            records += [
                replace(r, error=f"correctness check failed: {note}").to_dict()
                for r in recs.values()
            ]
            continue
        timings = _time_impls(
            {impl: functools.partial(implementation, spec, impl, p.activation) for impl in impls},
            spec,
            sets,
            pass_,
            warmup,
            reps,
        )
        for impl, rec in recs.items():
            t = timings[impl]
            if isinstance(t, Exception):
                records.append(replace(rec, error=f"{type(t).__name__}: {t}").to_dict())
                continue
            bw = effective_bandwidth(nbytes, t.median_s)
            frac = fraction(bw, ceilings.copy_bytes_per_s) if ceilings else None
            records.append(
                replace(
                    rec,
                    median_s=t.median_s,
                    p20_s=t.p20_s,
                    p80_s=t.p80_s,
                    eff_bw=bw,
                    frac_copy=frac,
                    flops_per_s=achieved_flops(flops, t.median_s),
                    timer=t.method,
                ).to_dict()
            )
    del sets
    free_memory(dev)
    return records


def run_pointwise(
    config: PointwiseConfig,
    ceilings: Ceilings | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run the whole grid of ``config``; returns record dicts (see ``Record.to_dict``)."""
    dev = study_device(device)
    return run_grid(
        config.cases(),
        lambda case: measure_case(
            case, config.impls, config.passes, ceilings, dev, config.warmup, config.reps
        ),
        desc="pointwise",
        label=lambda case: f"{case.op} {case.problem.label()}",
        progress=progress,
    )


# --- summary -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryRow:
    """Tilewise vs the baselines on one problem and pass."""

    op: str
    pass_: str
    dtype: str
    n: int
    activation: str
    size_mb: float
    frac: dict[str, float | None] = field(default_factory=dict)  # impl -> fraction of copy
    tw_eff_bw: float | None = None  # tilewise effective bandwidth, B/s
    vs_eager: float | None = None
    vs_compile: float | None = None
    meets_target: bool | None = None


def summarize(records: Iterable[Mapping[str, Any]]) -> list[SummaryRow]:
    """Per problem and pass: fractions of copy, tilewise speedups, and the target check.

    Target: faster than every baseline that was timed and, for tensors >= 64 MB, at least 0.85
    of the copy ceiling (None when that fraction is unknown).
    """
    groups: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for r in records:
        if r.get("median_s") is None:
            continue
        key = (r["op"], r["pass"], r["dtype"], r["n"], r["activation"], r["size_mb"])
        groups.setdefault(key, {})[r["impl"]] = r
    rows = []
    for (op, pass_, dtype, n, act, size), by_impl in groups.items():
        tw = by_impl.get("tilewise")
        if tw is None:
            continue
        ups = {
            impl: speedup(by_impl[impl]["median_s"], tw["median_s"])
            for impl in ("eager", "compile")
            if impl in by_impl
        }
        faster = all(s > 1.0 for s in ups.values())
        if size >= TARGET_MIN_MB:
            meets = (
                None
                if tw.get("frac_copy") is None
                else (faster and tw["frac_copy"] >= TARGET_FRACTION)
            )
        else:
            meets = faster
        rows.append(
            SummaryRow(
                op,
                pass_,
                dtype,
                n,
                act,
                size,
                frac={impl: r.get("frac_copy") for impl, r in by_impl.items()},
                tw_eff_bw=tw.get("eff_bw"),
                vs_eager=ups.get("eager"),
                vs_compile=ups.get("compile"),
                meets_target=meets,
            )
        )
    return rows


def summary_table(rows: Sequence[SummaryRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells for ``results.format_table``."""

    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    headers = ["op", "pass", "dtype", "n", "act", "MB", "tw GB/s", *IMPLS]
    headers += ["x eager", "x compile", "target"]
    cells = []
    for r in rows:
        target = {True: "yes", False: "NO", None: "-"}[r.meets_target]
        cells.append(
            [
                r.op,
                r.pass_,
                r.dtype,
                str(r.n),
                r.activation,
                f"{r.size_mb:g}",
                f(r.tw_eff_bw / 1e9 if r.tw_eff_bw else None, ".0f"),
                *(f(r.frac.get(i), ".3f") for i in IMPLS),
                f(r.vs_eager, ".2f") + ("x" if r.vs_eager else ""),
                f(r.vs_compile, ".2f") + ("x" if r.vs_compile else ""),
                target,
            ]
        )
    return headers, cells


def errors(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per record that was not timed, with its reason."""
    return [
        f"{r['op']} {r['pass']} {r['impl']} {r['m']}x{r['n']} {r['dtype']} {r['activation']}: "
        f"{r['error']}"
        for r in records
        if r.get("error")
    ]
