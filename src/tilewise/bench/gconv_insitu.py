"""In-situ grouped-conv study, Spio's methodology: the conv inside a stack of real blocks.

Stacks: ``block_stack`` of ConvFirst (C=64, 64x64, 3x3, expansion 6) or MBConv blocks (C=256,
16x16, expansion 4; the grouped conv runs on 1024 channels), depth 4 plus 2 extra MLP blocks,
channels_last, autocast fp16, 4 rotating inputs, ``cudnn.benchmark`` on, batch 32..256 step 32.
PyTorch ("eager") gets the model Spio profiles (``model.to(memory_format=channels_last)``, so
its grouped-conv weights are channels_last, cuDNN's preferred layout); tilewise gets a copy
rewritten by ``tilewise.transform`` (the ops take weights of any layout: they are tiny, and made
dense per call).

Per-pass time of the grouped convs (tilewise and eager): ``torch.profiler`` (CPU + CUDA
activity) over ``iters`` forward + backward iterations. Kernels are attributed to a grouped conv
through the profiler's CPU-op tree, not by guessing kernel names:

- fprop: every kernel launched inside a ``record_function`` range wrapped around each grouped
  conv module's call, except those under ``aten::_to_copy``: autocast's casts of the weight and
  of an fp32 input (the residual stream stays fp32 after the fp32 network input), as "cast".
- backward: autograd runs a conv's backward under a node event (scope BACKWARD_FUNCTION) whose
  ``sequence_nr`` is that of the forward op which created the node; kernels under a node whose
  number was created inside a tagged range belong to that conv ("ToCopyBackward" nodes: "cast").
- dgrad vs wgrad (one node launches both): each kernel name is matched against the kernels the
  same pass launches when run alone on the same problem in the same process (same cuDNN
  benchmark cache, same tilewise autotune choice): ``profile_kernels`` of ``bench.gconv.pass_fn``.
  A name both passes launch (a generic copy) is split by their launch counts; a name neither
  launches goes to the pass its name says ("dgrad"/"wgrad": cuDNN can pick another algorithm
  for the stack's layouts, noted in the record) or is reported as "unmatched" and left out.

Launch counts per iteration are compared with depth x the isolated launches (``expected``). For
tilewise a name-only cross-check is recorded too (``name_s``): the Triton kernels whose names
contain "gconv", the first ``depth`` ``_gconv_fwd_kernel`` launches of an iteration being fprop.
Training-step time (forward, backward, SGD step; CUDA events over the rotating inputs; wall
time with the host in the loop, and device time with the host kept ahead) compares tilewise,
eager and ``torch.compile`` (default mode). Effective bandwidth uses ``GConvProblem.bytes``.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tilewise.bench.ceilings import Ceilings
from tilewise.bench.gconv import (
    IMPL_STYLE,
    copy_ceiling_line,
    cudnn_benchmark,
    fmt,
    make_activations,
    make_weight,
    new_figure,
    pass_fn,
    ratio_of,
    records_of,
)
from tilewise.bench.gconv_attribution import (  # noqa: F401 (re-exported for tests)
    BACKWARD_SCOPE,
    TAG,
    Attribution,
    attribute,
    device_kernels,
    name_split,
    pass_by_name,
)
from tilewise.bench.grid import free_memory, run_grid, study_device
from tilewise.bench.metrics import effective_bandwidth, fraction
from tilewise.bench.timing import profile_kernels, time_events
from tilewise.models.convnets import block_stack, grouped_channels, grouped_convs
from tilewise.nn.transform import transform
from tilewise.ops.gconv_config import PASSES, GConvProblem

IMPLS = ("tilewise", "eager", "compile", "tilewise-compile")
#: impls timed only as a whole training step (torch.compile's kernels are not attributed per pass)
STEP_ONLY = ("compile", "tilewise-compile")
CHECK_RTOL = 2e-2


@dataclass(frozen=True)
class BlockSpec:
    """One block kind of the study and the grouped conv it contains."""

    kind: str
    c: int
    hw: int
    kernel: int = 3
    expansion: int = 4

    def problem(self, batch: int) -> GConvProblem:
        gc_ = grouped_channels(self.kind, self.c, self.expansion)
        k = self.kernel
        return GConvProblem(batch, gc_, self.hw, self.hw, k, k, k // 2, k // 2, "fp16")


BLOCKS = {
    "convfirst": BlockSpec("convfirst", 64, 64, 3, 6),
    "mbconv": BlockSpec("mbconv", 256, 16, 3, 4),
}


@dataclass(frozen=True)
class InSituConfig:
    """Blocks, batches and effort of the in-situ study."""

    blocks: tuple[str, ...] = tuple(BLOCKS)
    batches: tuple[int, ...] = tuple(range(32, 257, 32))
    depth: int = 4
    extra: int = 2
    impls: tuple[str, ...] = IMPLS
    rotating: int = 4
    warmup: int = 5
    iters: int = 10
    signature_iters: int = 3
    step_warmup: int = 10
    step_reps: int = 30
    lr: float = 1e-3

    @classmethod
    def quick(cls, **overrides: Any) -> InSituConfig:
        """Both blocks at batch 32 and 64, fewer iterations."""
        return replace(cls(batches=(32, 64), iters=5, step_reps=10), **overrides)

    def dgrad_layers(self, kind: str) -> int:
        """Grouped convs whose input needs a gradient (all, unless a ConvFirst stack starts
        with its grouped conv on the raw input)."""
        return self.depth if self.extra > 0 or kind != "convfirst" else self.depth - 1


@dataclass(frozen=True)
class PassRecord:
    """One (block, batch, impl, pass): grouped-conv kernel time per layer, in situ."""

    block: str
    impl: str
    batch: int
    c: int
    h: int
    w: int
    k: int
    depth: int
    pass_: str
    bytes: int  # compulsory bytes of one layer's pass
    layers: int
    layer_s: float | None = None
    eff_bw: float | None = None
    frac_copy: float | None = None
    launches: float | None = None  # per iteration, all layers
    expected_launches: float | None = None
    isolated_s: float | None = None  # the same pass alone, profiled in the same process
    name_s: float | None = None  # tilewise: Triton "gconv" kernels only, per layer
    cast_s: float | None = None  # autocast weight casts of the grouped convs, per iteration
    unmatched_s: float | None = None
    window_s: float | None = None  # every kernel of one forward + backward
    kernels: tuple[tuple[str, float, float], ...] = ()  # (name, launches, s) per iteration
    note: str | None = None
    error: str | None = None
    record: str = "pass"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        d["kernels"] = [list(k) for k in self.kernels]
        return d


@dataclass(frozen=True)
class StepRecord:
    """One (block, batch, impl): training-step time (forward, backward, SGD step)."""

    block: str
    impl: str
    batch: int
    depth: int
    extra: int
    step_s: float | None = None  # CUDA events, host in the loop
    p20_s: float | None = None
    p80_s: float | None = None
    device_s: float | None = None  # CUDA events, host kept ahead (device time)
    timer: str | None = None
    error: str | None = None
    record: str = "step"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- running the stack ---------------------------------------------------------------------------


@contextlib.contextmanager
def tagged(modules: Sequence[nn.Module], tag: str = TAG) -> Iterator[None]:
    """Wrap each module's call in ``record_function(tag)`` inside the block (instance attribute
    ``forward``, removed after)."""
    from torch.profiler import record_function

    patched = []
    try:
        for m in modules:

            def fwd(*args, _orig=m.forward, **kwargs):
                with record_function(tag):
                    return _orig(*args, **kwargs)

            m.forward = fwd
            patched.append(m)
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)


def fwd_bwd_step(
    model: nn.Module,
    opt: torch.optim.Optimizer | None = None,
    amp: torch.dtype | None = torch.float16,
) -> Callable:
    """One iteration: forward under ``amp`` autocast (None: off), mean-square loss, backward
    (and ``opt.step`` when given: a training step)."""

    def step(x: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=amp or torch.float16, enabled=amp is not None):
            out = model(x)
        out.float().square().mean().backward()
        if opt is not None:
            opt.step()

    return step


def profile_window(
    step: Callable, arg_sets: Sequence[tuple], modules: Sequence[nn.Module], iters: int, warmup: int
) -> list[Any]:
    """Profiler events (CPU tree + device kernels) of ``iters`` calls of ``step`` with the grouped
    conv modules tagged; CPU activity only on a CPU (for tests)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = any(a.is_cuda for args in arg_sets for a in args if isinstance(a, torch.Tensor))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for i in range(warmup):
        step(*arg_sets[i % len(arg_sets)])
    with tagged(modules), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            for i in range(iters):
                step(*arg_sets[i % len(arg_sets)])
            if cuda:
                torch.cuda.synchronize()
        return list(prof.events())


def pass_signatures(impl: str, problem: GConvProblem, device: torch.device, iters: int = 3):
    """({pass: {kernel name: launches per call}}, {pass: seconds per call}) of each pass run
    alone with the layouts the stack uses (channels_last weight for cuDNN)."""
    gen = torch.Generator(device=device).manual_seed(0)
    x, dy = make_activations(problem, device, gen)
    w = make_weight(problem, device, gen)
    if impl != "tilewise":
        w = w.contiguous(memory_format=torch.channels_last)
    sigs, secs = {}, {}
    for pass_ in PASSES:
        fn = pass_fn(impl, pass_, problem)
        prof = profile_kernels(fn, [(x, w, dy)], iters=iters, warmup=2)
        sigs[pass_] = {k.name: k.count / prof.calls for k in prof.kernels}
        secs[pass_] = prof.per_call_s
    return sigs, secs


def prepare(base: nn.Module, impl: str) -> nn.Module:
    """A copy of ``base`` for ``impl``: as is (eager), transformed (tilewise), compiled, or
    transformed and then compiled (tilewise's grouped convs inside torch.compile's graph, which
    fuses the pointwise ops around them)."""
    model = copy.deepcopy(base)
    if impl not in IMPLS:
        raise ValueError(f"argument 'impl' must be one of {IMPLS}, got {impl!r}")
    if impl.startswith("tilewise"):
        transform(model)
    if impl.endswith("compile"):
        torch.compiler.reset()
        model = torch.compile(model)
    return model


def forward_check(base: nn.Module, x: torch.Tensor) -> tuple[bool, str]:
    """Tilewise stack vs eager stack, one autocast forward from the same weights."""
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.float16):
        a = prepare(base, "tilewise")(x).float()
        b = prepare(base, "eager")(x).float()
    rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
    ok = bool(torch.isfinite(a).all()) and rel <= CHECK_RTOL
    return ok, f"stack output rel L2 err vs eager {rel:.2e}"


def pass_seconds(
    booked: Mapping[str, tuple[float, float]],
    expected: Mapping[str, float],
    names_s: float | None,
    tree_found: bool,
) -> tuple[float, str | None]:
    """One pass's kernel seconds per iteration, and a note where the CPU-tree attribution's figure
    was not taken as it is. ``booked``: kernel name -> (launches, seconds) an iteration the tree
    gave the pass; ``expected``: kernel name -> launches an iteration the stack makes (its layers
    x the pass's signature); ``names_s``: tilewise's kernels counted by name and launch order (a
    count that fitted the stack), or None.

    The tree can book more launches than the stack makes (session 45, H200, ConvFirst batch
    128-256: 4.8-5.1 tilewise fprop launches an iteration against 4; eager 4.4 against 4 and
    8.6-9.4 against 8, its extra launches as long as the rest). Tilewise then takes the names'
    figure; others each over-booked kernel's seconds scaled to the launches the stack makes
    (that kernel's booked mean). A kernel booked fewer times than the stack makes is noted (the time
    may be short), and tilewise takes the names' figure there too."""
    tree_s = sum(s for _, s in booked.values())
    if names_s is not None and not tree_found:
        return names_s, "Triton kernels not linked to CPU ops: time from names and order only"
    off = sorted(
        k for k, e in expected.items() if abs(booked.get(k, (0.0, 0.0))[0] - e) > 1e-6 and e > 0
    )
    if not off:
        return tree_s, None
    counts = ", ".join(
        f"{k[:48]} {booked.get(k, (0.0, 0.0))[0]:g} against {expected[k]:g}" for k in off
    )
    note = f"CPU-tree attribution booked launches an iteration: {counts}"
    if names_s is not None:
        return names_s, note + "; time from names and order"
    over = {k: booked[k] for k in off if k in booked and booked[k][0] > expected[k]}
    scaled = tree_s - sum(s * (1.0 - expected[k] / n) for k, (n, s) in over.items())
    if over:
        note += "; over-booked kernels scaled to the stack's launches"
    return scaled, note


def _pass_records(model, impl, case: dict, config: InSituConfig, ceilings, note) -> list[dict]:
    spec, batch, args = case["spec"], case["batch"], case["args"]
    problem, it = spec.problem(batch), config.iters
    sigs, iso = pass_signatures(impl, problem, args[0][0].device, config.signature_iters)
    mods = [m for _, m in grouped_convs(model)]
    events = profile_window(fwd_bwd_step(model), args, mods, it, config.warmup)
    att, dgrad_layers = attribute(events, sigs), config.dgrad_layers(spec.kind)
    names = name_split(events, config.depth, dgrad_layers, it) if impl == "tilewise" else None
    out = []
    for pass_ in PASSES:
        layers = dgrad_layers if pass_ == "dgrad" else config.depth
        notes = [note] if note else []
        if pass_ == "fprop" and att.unmatched_fprop:
            notes.append(f"fprop kernels not seen in isolation: {list(att.unmatched_fprop)}")
        by_name = [
            n for n in att.kernels.get(pass_, {}) if pass_ != "fprop" and n not in sigs[pass_]
        ]
        if by_name:
            notes.append(f"attributed by name, not seen in isolation: {by_name}")
        if impl == "tilewise" and names is None:
            notes.append("name cross-check: gconv launch count does not fit the stack")
        tree_found = any("gconv" in n for n in att.kernels.get(pass_, {}))
        per_kernel = {k: layers * v for k, v in sigs[pass_].items()}
        # the name split counts the "gconv" kernels only: a stand-in where the pass is only those
        names_fit = impl == "tilewise" and names and all("gconv" in k for k in sigs[pass_])
        s, why = pass_seconds(
            {n: (c / it, t / it) for n, (c, t) in att.kernels.get(pass_, {}).items()},
            per_kernel,
            names[pass_] / it if names_fit else None,
            tree_found,
        )
        notes += [why] if why else []
        rows = sorted(att.kernels.get(pass_, {}).items(), key=lambda kv: -kv[1][1])
        rec = PassRecord(
            **case["ident"],
            impl=impl,
            pass_=pass_,
            bytes=problem.bytes(pass_),
            layers=layers,
            launches=att.launches[pass_] / it,
            expected_launches=sum(per_kernel.values()),
            isolated_s=iso[pass_],
            name_s=names[pass_] / it / layers if names else None,
            cast_s=att.seconds["cast"] / it,
            unmatched_s=att.seconds["unmatched"] / it,
            window_s=att.window_s / it,
            kernels=tuple((n, c / it, t / it) for n, (c, t) in rows),
            note="; ".join(notes) or None,
        )
        if s <= 0:
            left = sorted(att.kernels.get("unmatched", {})) if pass_ != "fprop" else []
            why = f" (unmatched backward kernels: {left})" if left else ""
            rec = replace(rec, error=f"no kernels attributed to the grouped convs{why}")
        elif impl == "tilewise" and not (tree_found or names):
            rec = replace(rec, error="no tilewise kernels: did the layers fall back to PyTorch?")
        else:
            bw = effective_bandwidth(rec.bytes, s / layers)
            frac = fraction(bw, ceilings.copy_bytes_per_s) if ceilings else None
            rec = replace(rec, layer_s=s / layers, eff_bw=bw, frac_copy=frac)
        out.append(rec.to_dict())
    return out


def _step_record(model, impl: str, case: dict, config: InSituConfig) -> dict:
    step = fwd_bwd_step(model, torch.optim.SGD(model.parameters(), lr=config.lr))
    args = case["args"]
    wall = time_events(step, args, config.step_warmup, config.step_reps, keep_ahead=False)
    dev = time_events(step, args, 2, config.step_reps, keep_ahead=True)
    times = dict(step_s=wall.median_s, p20_s=wall.p20_s, p80_s=wall.p80_s, device_s=dev.median_s)
    return StepRecord(**case["step_ident"], impl=impl, **times, timer=wall.method).to_dict()


def _graph_step_record(model, case: dict, config: InSituConfig) -> dict:
    """The tilewise stack's training step as tilewise's runtime runs it: the whole step (autocast
    forward, loss, backward, ``FusedSGD``) captured in one CUDA graph by ``capture_train_step``;
    recorded as impl ``tilewise-graph`` (eagerly, with a note, where there is no CUDA)."""
    from tilewise.optim import FusedSGD
    from tilewise.runtime.capture import capture_train_step

    args = case["args"]
    with torch.no_grad(), torch.autocast(args[0][0].device.type, dtype=torch.float16):
        zeros = torch.zeros_like(model(args[0][0]), dtype=torch.float32)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out.float() - target).square().mean()  # = fwd_bwd_step's loss (target zeros)

    opt = FusedSGD(model.parameters(), lr=config.lr)
    captured = capture_train_step(
        model, loss_fn, opt, args[0], (zeros,), autocast_dtype=torch.float16
    )

    def step(x: torch.Tensor) -> None:
        captured((x,), (zeros,))

    wall = time_events(step, args, config.step_warmup, config.step_reps, keep_ahead=False)
    dev = time_events(step, args, 2, config.step_reps, keep_ahead=True)
    times = dict(step_s=wall.median_s, p20_s=wall.p20_s, p80_s=wall.p80_s, device_s=dev.median_s)
    rec = StepRecord(**case["step_ident"], impl="tilewise-graph", **times, timer=wall.method)
    return rec.to_dict()


def measure_block(
    spec: BlockSpec,
    batch: int,
    config: InSituConfig,
    ceilings: Ceilings | None = None,
    device: torch.device | str = "cuda",
) -> list[dict[str, Any]]:
    """Every impl of one (block, batch): pass records (tilewise, eager) and step records."""
    dev = torch.device(device)
    torch.manual_seed(0)
    base = block_stack(spec.kind, spec.c, config.depth, spec.kernel, spec.expansion, config.extra)
    base = base.to(dev).to(memory_format=torch.channels_last)
    shape, fmt = (batch, spec.c, spec.hw, spec.hw), torch.channels_last
    n_inputs = max(1, config.rotating)
    args = [
        (torch.randn(shape, device=dev).contiguous(memory_format=fmt),) for _ in range(n_inputs)
    ]
    p = spec.problem(batch)
    case = {
        "spec": spec,
        "batch": batch,
        "args": args,
        "ident": dict(block=spec.kind, batch=batch, c=p.c, h=p.h, w=p.w, k=p.r, depth=config.depth),
        "step_ident": dict(block=spec.kind, batch=batch, depth=config.depth, extra=config.extra),
    }
    records: list[dict[str, Any]] = []
    with cudnn_benchmark(True):
        checked = any(i.startswith("tilewise") for i in config.impls)
        ok, note = forward_check(base, args[0][0]) if checked else (True, "")
        for impl in config.impls:

            def pass_error(msg: str, impl: str = impl) -> dict:
                """The record of a pass that was not timed, with why."""
                err = dict(pass_="fprop", bytes=p.bytes("fprop"), layers=config.depth)
                return PassRecord(**case["ident"], impl=impl, **err, error=msg).to_dict()

            if impl.startswith("tilewise") and not ok:  # a wrong model is not timed
                msg = f"check failed: {note}"
                if impl not in STEP_ONLY:
                    records.append(pass_error(msg))
                records.append(StepRecord(**case["step_ident"], impl=impl, error=msg).to_dict())
                continue
            model = None
            try:
                model = prepare(base, impl)
                try:
                    if impl not in STEP_ONLY:
                        tw_note = note if impl == "tilewise" else None
                        records += _pass_records(model, impl, case, config, ceilings, tw_note)
                except Exception as exc:
                    records.append(pass_error(f"{type(exc).__name__}: {exc}"))
                records.append(_step_record(model, impl, case, config))
                if impl == "tilewise":
                    try:
                        records.append(_graph_step_record(model, case, config))
                    except Exception as exc:  # recorded, the other impls still run
                        msg = f"{type(exc).__name__}: {exc}"
                        ident = case["step_ident"]
                        records.append(
                            StepRecord(**ident, impl="tilewise-graph", error=msg).to_dict()
                        )
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"
                records.append(StepRecord(**case["step_ident"], impl=impl, error=msg).to_dict())
            finally:
                del model
                if impl in STEP_ONLY:
                    torch.compiler.reset()
                free_memory(dev)
    return records


def run_insitu(
    config: InSituConfig,
    ceilings: Ceilings | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run every (block, batch) of ``config``; returns record dicts (pass and step records)."""
    dev = study_device(device)
    return run_grid(
        [(BLOCKS[b], n) for b in config.blocks for n in config.batches],
        lambda case: measure_block(case[0], case[1], config, ceilings, dev),
        desc="gconv-insitu",
        label=lambda case: f"{case[0].kind} N={case[1]}",
        progress=progress,
    )


# --- summary and plot ----------------------------------------------------------------------------


def summary_tables(records: Iterable[Mapping[str, Any]]) -> list[tuple[list[str], list[list]]]:
    """(headers, rows) of the pass table (GB/s per layer) and of the step table (ms)."""
    by: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for r in records:
        key = (r["record"], r["block"], r["batch"], r.get("pass", "step"))
        by.setdefault(key, {})[r["impl"]] = r
    passes, steps = [], []
    for (kind, block, batch, pass_), d in by.items():
        tw, ea, co, twc = (d.get(i) for i in IMPLS)
        if kind == "pass":
            bws = [fmt(r, "eff_bw", ".0f", 1e-9) for r in (tw, ea)]
            fracs = [fmt(r, "frac_copy", ".3f") for r in (tw, ea)]
            ratio, name_us = ratio_of(ea, tw, "layer_s"), fmt(tw, "name_s", ".1f", 1e6)
            passes.append([block, batch, pass_, *bws, *fracs, ratio, name_us])
        else:
            tg = d.get("tilewise-graph")
            ms = [fmt(r, "step_s", ".2f", 1e3) for r in (tw, tg, ea, co, twc)]
            ratios = [ratio_of(ea, tw, "step_s"), ratio_of(co, tw, "step_s")]
            ratios += [ratio_of(ea, tg, "step_s"), ratio_of(co, tg, "step_s")]
            ratios += [ratio_of(co, twc, "step_s")]
            steps.append([block, batch, *ms, *ratios])
    heads = ["block", "batch", "pass", "tw GB/s", "eager GB/s", "tw frac", "eager frac", "x eager"]
    step_heads = ["block", "batch", "tilewise ms", "tw graph ms", "eager ms", "compile ms"]
    step_heads += ["tw+compile ms", "x eager", "x compile", "graph x eager", "graph x compile"]
    step_heads += ["tw+compile x compile"]
    return [(heads + ["tw gconv us"], passes), (step_heads, steps)]


def errors(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per record with an error."""
    return [
        f"{r['block']} batch {r['batch']} {r['impl']} {r.get('pass', 'step')}: {r['error']}"
        for r in records
        if r.get("error")
    ]


def plot_insitu(results: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | Path):
    """Per block (rows): effective bandwidth (GB/s) vs batch for fprop, dgrad, wgrad (tilewise
    vs eager, copy ceiling dashed) and training-step time (ms) vs batch for every impl."""
    recs = [r for r in records_of(results) if r.get("eff_bw") or r.get("step_s")]
    if not recs:
        raise ValueError("no timed records to plot")
    blocks = list(dict.fromkeys(r["block"] for r in recs))
    fig, axes = new_figure(len(blocks), 4)
    for i, block in enumerate(blocks):
        for j, pass_ in enumerate((*PASSES, "step")):
            ax, key = axes[i][j], "step_s" if pass_ == "step" else "eff_bw"
            sub = [r for r in recs if r["block"] == block and r.get("pass", "step") == pass_]
            for impl in dict.fromkeys(r["impl"] for r in sub if r.get(key) is not None):
                pts = sorted((r["batch"], r[key]) for r in sub if r["impl"] == impl and r.get(key))
                xs, ys = zip(*pts, strict=True)
                scale = 1e3 if pass_ == "step" else 1e-9
                colour, marker = IMPL_STYLE.get(impl, ("tab:gray", "x"))
                ax.plot(xs, [y * scale for y in ys], color=colour, marker=marker, ms=4, label=impl)
            if pass_ != "step":
                copy_ceiling_line(ax, results)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{block} {pass_}", fontsize=9)
            ax.set_xlabel("batch size")
            ax.set_ylabel("step time (ms)" if pass_ == "step" else "effective bandwidth (GB/s)")
            ax.grid(True, alpha=0.3)
            if sub:
                ax.legend(fontsize=6, loc="best")
    fig.suptitle("Grouped conv in situ (autocast fp16, channels_last)", fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
