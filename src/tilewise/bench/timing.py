"""Timers: CUDA events per call, CUDA-graph replay, and in-situ kernel times from the profiler.

Callers pass ``arg_sets``, a list of argument tuples that calls rotate through, so that inputs
are not served from L2 (size the list with ``rotation_count``). The device is that of the first
tensor in the arguments (CUDA if there is none and a GPU exists). On a CPU every timer falls back
to ``time.perf_counter`` (labelled ``method="perf_counter"``), only good for smoke runs.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tilewise.ops._common import l2_bytes as _device_l2_bytes
from tilewise.runtime.graph_state import repair_after_failed_capture

ArgSets = Sequence[tuple[Any, ...]]


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and 20th/80th percentiles over ``reps`` samples."""

    median_s: float
    p20_s: float
    p80_s: float
    reps: int
    method: str = "cuda-events"


@dataclass(frozen=True)
class KernelStat:
    """Device time of all launches of one kernel name inside a profiled window."""

    name: str
    count: int
    total_s: float
    avg_s: float


@dataclass(frozen=True)
class KernelProfile:
    """Per-kernel device times and their sum per call of the profiled function."""

    kernels: tuple[KernelStat, ...]
    per_call_s: float
    calls: int


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            t = _first_tensor(item)
            if t is not None:
                return t
    return None


def _device_of(arg_sets: ArgSets) -> torch.device:
    """The device of the first tensor in ``arg_sets``; with none, CUDA when there is a GPU."""
    t = _first_tensor(list(arg_sets))
    if t is not None:
        return t.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _timing(samples: Sequence[float], method: str) -> Timing:
    a = np.asarray(samples, dtype=np.float64)
    p20, med, p80 = np.percentile(a, [20, 50, 80])
    return Timing(float(med), float(p20), float(p80), len(a), method)


def _call(fn: Callable[..., Any], arg_sets: ArgSets, i: int) -> Any:
    return fn(*arg_sets[i % len(arg_sets)])


def _time_cpu(fn: Callable[..., Any], arg_sets: ArgSets, warmup: int, reps: int) -> Timing:
    for i in range(warmup):
        _call(fn, arg_sets, i)
    samples = []
    for i in range(reps):
        t0 = time.perf_counter()
        _call(fn, arg_sets, i)
        samples.append(time.perf_counter() - t0)
    return _timing(samples, "perf_counter")


@functools.cache
def _sleep_cycles_per_s(index: int) -> float:
    """Calibrate ``torch.cuda._sleep`` (a spin kernel) against CUDA events on one device."""
    with torch.cuda.device(index):
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e-3)


class EventTimer:
    """Calls of ``fn`` rotating through ``arg_sets``, one CUDA event pair per call; ``sample(n)``
    times the next ``n`` calls (the counterpart of ``GraphTimer`` for code that is not graphed).

    With ``keep_ahead`` a spin kernel sized to twice the host time of one call is queued before
    each start event, so the GPU never waits for the host inside a timed window: the figure is the
    device time of the call's kernels (as in triton's ``do_bench``), not Python launch overhead.

    ``settle`` (for timers sampled in turns with others over the same inputs): each ``sample``
    batch first reads L2 out and makes ``settle`` untimed calls. Without it, a kernel with
    evict-first loads hit in L2 on input lines another impl had just read with normal priority
    (session 17: a LayerNorm forward read 0.957 of copy that way, against ~0.90).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        arg_sets: ArgSets,
        warmup: int = 10,
        keep_ahead: bool = True,
        settle: int = 0,
    ) -> None:
        self.fn, self.arg_sets = fn, list(arg_sets) or [()]
        self.settle = settle
        self.device = _device_of(self.arg_sets)
        if self.device.type != "cuda":
            raise ValueError(f"EventTimer needs CUDA arguments, got device {self.device}")
        with torch.cuda.device(self.device):
            self.index = torch.cuda.current_device()
            host = []
            for i in range(max(1, warmup)):
                t0 = time.perf_counter()
                _call(fn, self.arg_sets, i)
                host.append(time.perf_counter() - t0)
            torch.cuda.synchronize(self.device)
        self.calls = max(1, warmup)
        self.sleep_cycles = 0
        if keep_ahead and hasattr(torch.cuda, "_sleep"):
            lead_s = 2.0 * float(np.median(host[len(host) // 2 :])) + 20e-6
            self.sleep_cycles = int(min(lead_s, 0.05) * _sleep_cycles_per_s(self.index))

    @property
    def method(self) -> str:
        return "cuda-events+lead" if self.sleep_cycles else "cuda-events"

    def _settle(self) -> None:
        """Read L2 out (a normal-priority read of 2x L2, which evicts lines any other code left,
        including lines that evict-first loads would never displace), then ``settle`` untimed
        calls, so a batch starts from this code's own steady state."""
        _flush_buffer(self.device).sum(dtype=torch.int32)
        for _ in range(self.settle):
            _call(self.fn, self.arg_sets, self.calls)
            self.calls += 1

    def sample(self, reps: int) -> list[float]:
        """Seconds of each of the next ``reps`` calls (after ``settle`` untimed ones, if asked)."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        with torch.cuda.device(self.index):
            if self.settle:
                self._settle()
            for s, e in zip(starts, ends, strict=True):
                if self.sleep_cycles:
                    torch.cuda._sleep(self.sleep_cycles)
                s.record()
                _call(self.fn, self.arg_sets, self.calls)
                self.calls += 1
                e.record()
            torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends, strict=True)]

    def close(self) -> None:
        self.fn = None


_FLUSH_BUFFERS: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """One buffer of 2x L2 (>= 64 MB) per device, shared by every timer that reads L2 out."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buf = _FLUSH_BUFFERS.get(device)
    if buf is None:
        size = max(2 * l2_cache_bytes(device), 1 << 26)
        buf = _FLUSH_BUFFERS[device] = torch.empty(size, dtype=torch.uint8, device=device)
    return buf


def detached(exc: BaseException) -> BaseException:
    """``exc`` without its traceback and chained exceptions, whose frames would keep every
    timer, graph and buffer of the failed measurement alive until a garbage collection."""
    exc.__traceback__ = None
    exc.__context__ = exc.__cause__ = None
    return exc


def time_events(
    fn: Callable[..., Any],
    arg_sets: ArgSets,
    warmup: int = 10,
    reps: int = 50,
    keep_ahead: bool = True,
) -> Timing:
    """Median device time of ``fn(*arg_sets[i % len(arg_sets)])``, one CUDA event pair per call
    (``EventTimer``; ``keep_ahead`` keeps host launch time out of the windows)."""
    arg_sets = list(arg_sets) or [()]
    if _device_of(arg_sets).type != "cuda":
        return _time_cpu(fn, arg_sets, warmup, reps)
    timer = EventTimer(fn, arg_sets, warmup, keep_ahead)
    return _timing(timer.sample(reps), timer.method)


class GraphTimer:
    """``rounds`` x ``len(arg_sets)`` calls of ``fn`` captured once in a CUDA graph; ``sample``
    times replays of it. Several timers sampled in turn (``interleaved``) share the GPU's clock
    and power state, which drifts over a run of long compute-bound calls (session 16: the MLP
    grid's first-timed impl read up to 4% faster at hidden 8192).

    ``fn`` must launch its work on the current stream and be capturable (no host syncs, no
    allocation-dependent control flow).
    """

    def __init__(
        self, fn: Callable[..., Any], arg_sets: ArgSets, warmup: int = 3, rounds: int = 4
    ) -> None:
        arg_sets = list(arg_sets) or [()]
        self.device = _device_of(arg_sets)
        if self.device.type != "cuda":
            raise ValueError(f"GraphTimer needs CUDA arguments, got device {self.device}")
        with torch.cuda.device(self.device):  # capture where sample() times
            self._capture(fn, arg_sets, warmup, rounds)

    def _capture(self, fn: Callable[..., Any], arg_sets: ArgSets, warmup: int, rounds: int) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for i in range(warmup * len(arg_sets)):
                _call(fn, arg_sets, i)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        self.graph: Any = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _ in range(rounds):
                for args in arg_sets:
                    fn(*args)
        self.calls = rounds * len(arg_sets)
        self.graph.replay()  # the first replay uploads the graph
        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        self.graph.replay()
        end.record()
        self.host_s = time.perf_counter() - t0  # host cost of queueing one timed replay
        torch.cuda.synchronize(self.device)
        self.replay_s = start.elapsed_time(end) * 1e-3
        self.led = False  # whether the last sample ran behind a lead spin

    def sample(self, replays: int, keep_ahead: bool = True) -> list[float]:
        """Seconds per call of each of ``replays`` replays. With ``keep_ahead`` (and replays
        under a millisecond) one spin kernel, sized to the host time of queueing every replay,
        runs before the first start event: tiny replays then run back to back instead of each
        window also holding the host's graph launch (which made graphs of a few microseconds
        read several microseconds slow at random)."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        sleep_cycles = 0
        with torch.cuda.device(index):
            if keep_ahead and self.replay_s < 1e-3 and hasattr(torch.cuda, "_sleep"):
                lead_s = min(2.0 * self.host_s * replays + 50e-6, 0.1)
                sleep_cycles = int(lead_s * _sleep_cycles_per_s(index))
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            for s, e in zip(starts, ends, strict=True):
                s.record()
                self.graph.replay()
                e.record()
        torch.cuda.synchronize(self.device)
        self.led = bool(sleep_cycles)
        return [s.elapsed_time(e) * 1e-3 / self.calls for s, e in zip(starts, ends, strict=True)]

    @property
    def method(self) -> str:
        return "cuda-graph+lead" if self.led else "cuda-graph"

    def close(self) -> None:
        self.graph = None


def time_graph(
    fn: Callable[..., Any],
    arg_sets: ArgSets,
    warmup: int = 3,
    rounds: int = 4,
    replays: int = 20,
    keep_ahead: bool = True,
) -> Timing:
    """Seconds per call from CUDA-graph replays of ``rounds`` x ``len(arg_sets)`` captured calls
    (``GraphTimer``): no Python per call; with ``keep_ahead`` no host launch time in the windows
    either (without it, replays of a few microseconds include part of each graph launch). On a
    CPU: ``perf_counter`` per call."""
    arg_sets = list(arg_sets) or [()]
    if _device_of(arg_sets).type != "cuda":
        return _time_cpu(fn, arg_sets, warmup * len(arg_sets), replays * len(arg_sets))
    timer = GraphTimer(fn, arg_sets, warmup, rounds)
    try:
        samples = timer.sample(replays, keep_ahead)
    finally:
        timer.close()
    return _timing(samples, timer.method)


#: the probe scripts' timers: graph replay (the study's and the autotuner's figure) or one event
#: pair a call
TIMERS = ("graph", "events")


def time_calls(fn: Callable[..., Any], arg_sets: ArgSets, timer: str = "graph") -> Timing:
    """Median seconds a call of ``fn`` over ``arg_sets`` by ``timer`` (``TIMERS``), at the
    probe scripts' counts. Graph replay by default: session 42's wgrad probe read a kernel
    change as 11-17% faster by events where the study's graph replay, which the autotuner also
    uses, read the cells -0.4% to +2.6% apart. A captured call records what it allocates too
    (a wgrad's zeroed workspace: a memset the eager call does not make), as in the study and
    the autotuner. A capture that fails is repaired before the error propagates, so a probe
    can go on."""
    if timer == "graph":
        try:
            return time_graph(fn, arg_sets, warmup=3, rounds=4, replays=20)
        except Exception:
            device = _device_of(list(arg_sets) or [()])
            if device.type == "cuda":
                repair_after_failed_capture(device)
            raise
    if timer == "events":
        return time_events(fn, arg_sets, warmup=5, reps=30)
    raise ValueError(f"timer must be one of {TIMERS}, got {timer!r}")


def interleaved(
    timers: Mapping[str, GraphTimer | EventTimer],
    counts: Mapping[str, int] | int,
    chunks: int = 4,
) -> dict[str, Timing | Exception]:
    """``counts`` samples (one number, or one per timer) of every timer, taken in up to ``chunks``
    turns whose order rotates, so no timer is always sampled first or last. A timer that raises
    is left out of later turns and answers with its exception; the others go on."""
    names = list(timers)
    if not names:
        return {}
    want = {n: counts if isinstance(counts, int) else counts[n] for n in names}
    for name, n in want.items():
        if n < 1:
            raise ValueError(f"argument 'counts': timer {name!r} asks for {n} samples, needs >= 1")
    samples: dict[str, list[float]] = {n: [] for n in names}
    failed: dict[str, Exception] = {}
    for i in range(max(1, chunks)):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            turns = min(max(1, chunks), want[name])  # a timer with fewer samples takes fewer turns
            if name in failed or i >= turns:
                continue
            take = want[name] // turns + (1 if i < want[name] % turns else 0)
            try:
                samples[name] += timers[name].sample(take)
            except Exception as exc:  # e.g. out of memory in one impl: the others keep theirs
                failed[name] = detached(exc)
    return {n: failed[n] if n in failed else _timing(samples[n], timers[n].method) for n in names}


def host_us_per_call(fn: Callable[[], Any], iters: int = 2000, warmup: int = 50) -> float:
    """Wall microseconds per call of ``fn`` in a loop, synchronised at both ends: host launch
    cost when ``fn``'s kernels are too small to keep the GPU busy (``scripts/*_overhead.py``)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e6


def l2_cache_bytes(device: torch.device | str | None = None) -> int:
    """L2 size of a CUDA device in bytes (0 for a CPU)."""
    device = torch.device(device) if device is not None else None
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return _device_l2_bytes(device)


def rotation_count(bytes_per_set: int, l2_bytes: int) -> int:
    """Input sets needed so that one pass over the rotation touches more than 2x L2."""
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    return max(1, 2 * int(l2_bytes) // int(bytes_per_set) + 1)


def _device_us(evt: Any) -> float:
    """Device time of one profiler event in us (``device_time_total``, else ``cuda_time_total``)."""
    us = getattr(evt, "device_time_total", None)
    if us is None:  # torch before the device_* renames
        us = getattr(evt, "cuda_time_total", 0.0)
    us = float(us or 0.0)
    if us == 0.0 and hasattr(evt, "time_range"):
        us = float(evt.time_range.elapsed_us())
    return us


def _is_device_event(evt: Any) -> bool:
    kind = getattr(evt, "device_type", None)
    return kind is not None and getattr(kind, "name", str(kind)).upper().endswith("CUDA")


def profile_kernels(
    fn: Callable[..., Any],
    arg_sets: ArgSets | None = None,
    iters: int = 20,
    warmup: int = 3,
    name_filter: str | None = None,
) -> KernelProfile:
    """In-situ kernel times: run ``fn`` ``iters`` times under ``torch.profiler`` (CUDA activity).

    Returns per-kernel-name device time (total and per launch) and the summed device time of all
    kernels (optionally only names containing ``name_filter``) divided by the number of calls.
    """
    arg_sets = list(arg_sets) if arg_sets is not None else [()]
    if _device_of(arg_sets).type != "cuda":
        raise RuntimeError("profile_kernels needs a CUDA GPU: CPU runs have no device kernels")
    from torch.profiler import ProfilerActivity, profile

    for i in range(warmup):
        _call(fn, arg_sets, i)
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch 2.11 warns that events are cleared per cycle
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(iters):
                _call(fn, arg_sets, i)
            torch.cuda.synchronize()
        events = prof.events()
    totals: dict[str, list[float]] = {}
    for evt in events:
        if not _is_device_event(evt):
            continue
        if name_filter is not None and name_filter not in evt.name:
            continue
        acc = totals.setdefault(evt.name, [0, 0.0])
        acc[0] += 1
        acc[1] += _device_us(evt) * 1e-6
    stats = tuple(
        sorted(
            (KernelStat(name, int(c), t, t / c) for name, (c, t) in totals.items()),
            key=lambda k: -k.total_s,
        )
    )
    return KernelProfile(stats, sum(k.total_s for k in stats) / iters, iters)
