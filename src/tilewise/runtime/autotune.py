"""Kernel config choice per problem: timed once per machine on CUDA, cached in memory and on disk.

``choose_config(op, problem, candidates, run_fn)`` returns the heuristic default (the first
candidate unless ``default`` is given) on CPU / the interpreter, when ``TILEWISE_AUTOTUNE=0``, and
while a CUDA graph is being captured. Otherwise it looks the problem up, and on a miss times every
candidate (median device time of CUDA-graph replays, warm or with L2 flushed), keeps the fastest
in memory and in ``$TILEWISE_CACHE_DIR/autotune.json`` (default ``~/.cache/tilewise/``), so a
second process pays nothing. Keys hold the device name, the tilewise and Triton versions, the op
and every field of the problem (dtype included). Writes take a file lock, merge with what is on
disk, write a temporary file and ``os.replace`` it: concurrent processes never see a torn file
and do not lose each other's entries. ``export_cache`` / ``import_cache`` ship a cache between
machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger("tilewise")

ENV_AUTOTUNE = "TILEWISE_AUTOTUNE"
ENV_CACHE_DIR = "TILEWISE_CACHE_DIR"
#: "0" turns ``choose_config``'s screening off (every candidate timed in full)
ENV_SCREEN = "TILEWISE_AUTOTUNE_SCREEN"
CACHE_FILE = "autotune.json"
FORMAT = 1

C = TypeVar("C")

_lock = threading.Lock()
_memory: dict[str, dict[str, Any]] = {}
_loaded_path: Path | None = None
#: this process's answers, so a launch pays one dict lookup; cleared by ``clear_memory_cache``
_resolved: dict[tuple, Any] = {}
_generation = 0


def cache_dir() -> Path:
    """Where the cache lives: ``$TILEWISE_CACHE_DIR`` or ``~/.cache/tilewise``."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tilewise"


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def search_enabled() -> bool:
    """False when ``TILEWISE_AUTOTUNE=0``: heuristic configs only, no timing, no cache."""
    return os.environ.get(ENV_AUTOTUNE, "1") != "0"


def generation() -> int:
    """A count that moves whenever answers already given may change (the memory cache cleared or
    entries imported): per-problem launch plans built on an answer are kept only while it holds
    (``runtime.plans``)."""
    return _generation


def _forget_answers() -> None:
    """Drop the per-problem answers (under ``_lock``) and move ``generation``."""
    global _generation
    _resolved.clear()
    _generation += 1


def clear_memory_cache() -> None:
    """Forget what this process has loaded or found (the disk cache stays)."""
    global _loaded_path
    with _lock:
        _memory.clear()
        _forget_answers()
        _loaded_path = None


# --- seams the tests replace --------------------------------------------------------------------


def _tunable(device: torch.device | None) -> bool:
    """Only CUDA devices are timed; the interpreter and CPU take the heuristic."""
    return device is not None and device.type == "cuda"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _bench(fn: Callable[[], object]) -> float:
    """Median device milliseconds of ``fn`` over ~20 ms of graph replays (``_graph_median``)."""
    return _graph_median(fn, 20)


def _bench_screen(fn: Callable[[], object]) -> float:
    """A first, brief reading of ``fn`` (``SCREEN_REP_MS`` of graph replays) for screening."""
    return _graph_median(fn, SCREEN_REP_MS)


def _graph_median(fn: Callable[[], object], rep_ms: float) -> float:
    """Median device milliseconds of ``fn``: replays of a CUDA graph of it (``rep_ms`` each).

    Event timing of single launches (``do_bench``) charges the host's launch cost to every
    candidate; on the H100 host a Triton launch costs 15-50 us against a few us of kernel, so
    small problems were decided by host time (``scripts/linear_backend_probe.py``: fp32
    64x256x256 chose the Triton GEMM at 25 us of device time over cuBLAS's 9 us). Graph replay
    measures what a captured step (``tilewise.capture_*``) pays. Candidates that cannot be
    captured are timed with ``do_bench`` instead.
    """
    import triton.testing

    from tilewise.runtime.graph_state import repair_after_failed_capture

    # do_bench_cudagraph runs fn on a stream of its own that does not wait for the current one:
    # without this sync, fn could read inputs not yet written, or write an output whose memory
    # queued kernels still read.
    torch.cuda.synchronize()
    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    except RuntimeError as exc:
        log.debug("tilewise.autotune: graph timing failed (%s); timing launches instead", exc)
        repair_after_failed_capture()
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def _bench_cold(
    fn: Callable[[], object], device: torch.device, reps: int = 8, flush_by: str = "read"
) -> float:
    """Median device milliseconds of ``fn`` with L2 flushed before each run.

    ``_bench`` replays ``fn`` on the same inputs, so operands stay in L2; a tile that wins warm
    can lose where its weights come from DRAM, as in a model whose layers together exceed L2
    (bf16 512x4096x4096: the Triton tile chosen warm ran at 0.77x cuBLAS in the MLP study, whose
    inputs rotate past L2). One graph replays (flush, fn) ``reps`` times, another only the
    flushes; the median over paired replays of the difference is ``fn``'s cold time. Where
    capture fails, or noise leaves no positive difference, ``triton.testing.do_bench`` (which
    also clears L2 before every run, but pays host launch time) measures it instead.

    ``flush_by="read"`` (the default since session 15) evicts L2 by summing the buffer, so no
    dirty lines are written back while ``fn`` runs; ``"zero"`` (sessions 6-14) zeroes it.
    ``scripts/cold_timing_probe.py`` on an H100 (session 15, call 1): read-flushed times sit
    within 0.5 us (up to 1.5 us at 4 MB) of the same kernel with its weights really in DRAM,
    zero-flushed ones 1-10 us above it (bf16 16 x 4096 x 4096: 20.5-38.4 us against 17.3-32.1).
    """
    if flush_by not in ("zero", "read"):
        raise ValueError(f"argument 'flush_by' must be 'zero' or 'read', got {flush_by!r}")
    import triton.testing

    from tilewise.runtime.graph_state import repair_after_failed_capture

    def timed_launches() -> float:
        torch.cuda.synchronize(device)
        return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))

    with torch.cuda.device(device):
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        flush = torch.empty(max(2 * l2, 1 << 26), dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        graphs = []
        try:
            fn()  # compile and warm up outside capture
            for with_fn in (False, True):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(reps):
                        if flush_by == "zero":
                            flush.zero_()
                        else:
                            flush.sum(dtype=torch.int32)
                        if with_fn:
                            fn()
                graphs.append(g)
        except RuntimeError as exc:
            log.debug("tilewise.autotune: cold graph timing failed (%s); timing launches", exc)
            repair_after_failed_capture()
            return timed_launches()
        diffs = []
        for _ in range(7):
            pair = []
            for g in graphs:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                pair.append(start.elapsed_time(end))
            diffs.append((pair[1] - pair[0]) / reps)
        del graphs
    cold = sorted(diffs)[len(diffs) // 2]
    return cold if cold > 0 else timed_launches()


# --- keys and the disk file ---------------------------------------------------------------------


def _versions() -> tuple[str, str]:
    import triton

    import tilewise

    return getattr(tilewise, "__version__", "unknown"), triton.__version__


def make_key(op: str, problem: Any, device_name: str) -> str:
    """The cache key: device name, tilewise/Triton versions, op, problem fields and dtype."""
    fields = dataclasses.asdict(problem)
    tw, tr = _versions()
    return json.dumps(
        {
            "device": device_name,
            "tilewise": tw,
            "triton": tr,
            "op": op,
            "problem": fields,
            "dtype": str(fields.get("dtype", "")),
        },
        sort_keys=True,
    )


@functools.cache
def _warn_once(msg: str) -> None:
    log.warning("tilewise.autotune: %s", msg)


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """Entries of a cache file; a missing, torn or foreign file reads as empty."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        _warn_once(f"ignoring unreadable cache {path}: {exc}")
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or data.get("format") != FORMAT:
        _warn_once(f"ignoring cache {path} of another format")
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, dict) and "config" in v}


def _write_atomic(path: Path, entries: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock beside ``path`` (none where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _merge_into(path: Path, updates: dict[str, dict[str, Any]]) -> None:
    with _file_lock(path):
        entries = _read(path)
        entries.update(updates)
        _write_atomic(path, entries)


def _ensure_loaded() -> None:
    global _loaded_path
    path = cache_path()
    if _loaded_path != path:
        _memory.clear()
        _memory.update(_read(path))
        _loaded_path = path


def _lookup(key: str, candidates: Sequence[C]) -> C | None:
    with _lock:
        _ensure_loaded()
        entry = _memory.get(key)
    if entry is None:
        return None
    kind = entry.get("type")
    for cand in candidates:  # only a config that is still legal counts, of the same kind
        if dataclasses.asdict(cand) == entry["config"] and kind in (None, type(cand).__name__):
            return cand
    return None


#: the most candidates whose readings a stored choice keeps (``readings``: the chosen one first)
READINGS_KEEP = 8


def _label(cand: Any) -> str:
    """A short name of a candidate for the stored readings (its ``name`` where it has one)."""
    name = getattr(cand, "name", None)
    if isinstance(name, str):
        return name
    if dataclasses.is_dataclass(cand):
        fields = ",".join(f"{k}={v}" for k, v in dataclasses.asdict(cand).items())
        return f"{type(cand).__name__}({fields})"
    return repr(cand)


def _readings(
    candidates: Sequence[Any],
    table: list[list[float]],
    quick: list[float] | None,
    best: int,
    rounds: list[dict[int, list[float]]] | None = None,
) -> list[dict[str, Any]]:
    """What the choice saw, for the cache file: per candidate (the chosen one, ``chosen``, then
    the fastest by the first timer, then by the screen: ``READINGS_KEEP`` in all) its screening
    reading and each timer's, in ms (None: not timed or failed). Session 45: two fresh machines
    picked different tiles for one problem (16% apart in the in-situ stack), and the stored
    choice kept no trace of why. A near-tie timed again in rounds (``rounds``, per timer:
    candidate -> its readings) also keeps those readings, first one first, and its ``timed`` is
    their median (session 46)."""

    def ms(t: float) -> float | None:
        return round(t, 5) if math.isfinite(_valid(t)) else None

    def rank(i: int) -> tuple[float, float]:
        return _valid(table[0][i]), _valid(quick[i]) if quick else math.inf

    rest = sorted((i for i in range(len(candidates)) if i != best), key=rank)
    order = [best, *rest][:READINGS_KEEP]
    return [
        {
            "cand": _label(candidates[i]),
            "screen": ms(quick[i]) if quick else None,
            "timed": [ms(times[i]) for times in table],
            **({"chosen": True} if i == best else {}),
            **(
                {"rounds": [[ms(t) for t in r[i]] if i in r else None for r in rounds]}
                if rounds and any(i in r for r in rounds)
                else {}
            ),
        }
        for i in order
    ]


def _store(key: str, config: Any, ms: float, readings: list[dict[str, Any]] | None = None) -> None:
    entry = {"type": type(config).__name__, "config": dataclasses.asdict(config), "ms": ms}
    if readings:
        entry["readings"] = readings
    with _lock:
        _ensure_loaded()
        _memory[key] = entry
    try:
        _merge_into(cache_path(), {key: entry})
    except OSError as exc:
        _warn_once(f"cannot write {cache_path()} ({exc}); keeping choices in memory only")


# --- public API ---------------------------------------------------------------------------------


#: the list ``recording`` hands out, while one is open (None otherwise)
_picks: ContextVar[list[tuple[str, Any, Any]] | None] = ContextVar(
    "tilewise_autotune_picks", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, Any, Any]]]:
    """A list that collects ``(op, problem, config)`` for every ``choose_config`` answer inside
    the context (cached or timed), so a benchmark can say which config ran."""
    picks: list[tuple[str, Any, Any]] = []
    token = _picks.set(picks)
    try:
        yield picks
    finally:
        _picks.reset(token)


def recording_active() -> bool:
    """Whether a ``recording`` context is open here (per-problem plans then take the full path,
    so that every answer is recorded)."""
    return _picks.get() is not None


def choose_config(
    op: str,
    problem: Any,
    candidates: Sequence[C],
    run_fn: Callable[[C], object],
    *,
    device: torch.device | None = None,
    default: C | None = None,
    cold_l2: bool = False,
    warm_too: bool = False,
    screen: bool = False,
    prefer: C | None = None,
    prefer_within: float = 0.0,
) -> C:
    """The config to launch ``op`` on ``problem`` with (see the module docstring).

    ``problem`` is a dataclass; ``run_fn(config)`` runs the kernel once with that config on real
    tensors (only called when timing). A candidate that raises (e.g. out of shared memory) is
    skipped; if all do, the default is returned and nothing is stored. ``cold_l2`` times each
    candidate with L2 flushed first (for problems too large to stay in L2 inside a model); such
    choices are cached under their own key. ``screen`` (lists of at least ``SCREEN_MIN``): every
    candidate is first read briefly (``_bench_screen``, warm replays) and only the ``SCREEN_KEEP``
    fastest within ``SCREEN_RATIO`` of the fastest are timed in full (warm or cold); for long
    candidate lists such as the grouped conv's (28 for a 3x3 fprop: 12 Triton configs and 16 NVRTC
    tiles at ~200 ms of replays each, plus graph capture). ``warm_too`` (with ``cold_l2``) times
    each candidate both ways and keeps the one whose worse ratio to the fastest, warm or cold, is
    smallest: for layers whose weights stay in L2 in one model and stream from DRAM in another
    (session 15: a bf16 [8, 4096] x [4096, 4096] forward chose cold a Triton tile that ran 15.1 us
    where cuBLAS's 10.4 us path won with the weights in L2); cached under a third key. Every answer
    is also appended to the list of an open ``recording`` context. ``prefer`` (a candidate) is
    kept for long problems (the fastest at least ``PREFER_MIN_MS``) unless another candidate is
    faster by more than ``prefer_within`` in every way it was timed: for a baseline's own path,
    which a one-GEMM timing cannot beat by a margin the whole model keeps.
    """
    config = _choose_config(
        op,
        problem,
        candidates,
        run_fn,
        device,
        default,
        cold_l2,
        warm_too,
        screen,
        (prefer, prefer_within),
    )
    picks = _picks.get()
    if picks is not None:
        picks.append((op, problem, config))
    return config


def _choose_config(
    op: str,
    problem: Any,
    candidates: Sequence[C],
    run_fn: Callable[[C], object],
    device: torch.device | None,
    default: C | None,
    cold_l2: bool,
    warm_too: bool,
    screen: bool,
    preference: tuple[C | None, float] = (None, 0.0),
) -> C:
    """``choose_config`` without the recording."""
    # The per-call fast path: a launch must not pay for keys, JSON or config comparisons (those
    # cost ~0.3 ms, which dominated small layers' time). Problems are frozen dataclasses. Callers
    # that pass the same (cached) candidate tuple each time skip even hashing it: one entry per
    # (op, problem, device) remembers the last candidate and default objects (identity checks)
    # and the environment it answered for; anything else falls through to the full memo.
    env = (os.environ.get(ENV_AUTOTUNE), os.environ.get(ENV_CACHE_DIR))
    fast_key = ("fast", op, problem, device, cold_l2, warm_too)
    fast = _resolved.get(fast_key)
    if fast is not None and fast[0] is candidates and fast[1] is default and fast[2] == env:
        return fast[3]
    given = candidates
    candidates = tuple(candidates)
    if not candidates:
        raise ValueError("argument 'candidates' is empty")
    memo_key = (op, problem, device, candidates, default, env, cold_l2, warm_too, preference)
    memo = _resolved.get(memo_key)
    if memo is not None:
        if isinstance(given, tuple):
            _resolved[fast_key] = (given, default, env, memo)
        return memo
    fallback = candidates[0] if default is None else default
    if not search_enabled() or not _tunable(device):
        _resolved[memo_key] = fallback
        return fallback
    both = cold_l2 and warm_too
    suffix = ".warmcold" if both else ".cold" if cold_l2 else ""
    key = make_key(op + suffix, problem, _device_name(device))
    hit = _lookup(key, candidates)
    if hit is not None:
        _resolved[memo_key] = hit
        return hit
    if _capturing(device):
        return fallback
    timers = [functools.partial(_bench_cold, device=device) if cold_l2 else _bench]
    if both:
        timers.append(_bench)
    table = []  # per timer, per candidate
    rounds: list[dict[int, list[float]]] = []  # per timer: the near-ties' readings (_retime_close)
    # the brief screening readings are warm replays even for a cold choice: they only drop
    # candidates slower by more than SCREEN_RATIO, and the kept ones are timed with ``timers``
    close_min = SCREENED_CLOSE_MIN_MS if screen else CLOSE_MIN_MS  # asked for, switch or not
    screen = screen and os.environ.get(ENV_SCREEN, "1") != "0"
    kept, quick = _screen(op, candidates, run_fn) if screen else (None, None)
    for timer in timers:
        times = _time_each(op, timer, candidates, run_fn, kept)
        if kept is not None and not any(math.isfinite(_valid(t)) for t in times):
            times = _time_each(op, timer, candidates, run_fn, None)  # the kept all failed
            kept = None  # and the next timer (warm_too) times every candidate too
        rounds.append({})
        table.append(_retime_close(times, timer, candidates, run_fn, close_min, rounds[-1]))
    times = table[0]  # what is stored: the cold time when timed cold
    if both:
        best = _least_worst_loss(table)
    else:
        best = min(range(len(candidates)), key=lambda i: _valid(times[i]))
    best = _preferred(table, candidates, best, *preference)
    if best is None or not math.isfinite(_valid(times[best])):
        _warn_once(f"every candidate of {op} failed; using the heuristic config")
        _resolved[memo_key] = fallback
        return fallback
    readings = _readings(candidates, table, quick, best, rounds)
    _store(key, candidates[best], times[best], readings)
    _resolved[memo_key] = candidates[best]
    log.info("tilewise.autotune: %s %s -> %s (%.4f ms)", op, problem, candidates[best], times[best])
    return candidates[best]


def _time_each(
    op: str, timer: Callable, candidates: Sequence, run_fn: Callable, kept: set[int] | None
) -> list[float]:
    """``timer``'s reading of each candidate (of those in ``kept`` unless None; inf for the rest
    and for any that raises: a config the compiler or the device rejects)."""
    times = []
    for i, cand in enumerate(candidates):
        if kept is not None and i not in kept:  # screened out
            times.append(math.inf)
            continue
        try:
            times.append(timer(lambda cand=cand: run_fn(cand)))
        except Exception as exc:
            log.debug("tilewise.autotune: %s %s failed: %s", op, cand, exc)
            times.append(math.inf)
    return times


#: screening (``choose_config(screen=True)``): lists of at least ``SCREEN_MIN`` candidates are
#: read with ``SCREEN_REP_MS`` of replays each first (``do_bench_cudagraph`` replays that budget
#: 10 times: ~20 ms per candidate against the full timing's ~200 ms), and the ``SCREEN_KEEP``
#: fastest within ``SCREEN_RATIO`` of the fastest reading are timed in full (all of them if none
#: of those gives a time)
SCREEN_MIN = 8
SCREEN_REP_MS = 2
SCREEN_RATIO = 1.3
SCREEN_KEEP = 6


def _screen(
    op: str, candidates: Sequence, run_fn: Callable
) -> tuple[set[int] | None, list[float] | None]:
    """Indices of the candidates worth a full timing, or None (time every one) for a short list
    or where no candidate gave a brief reading; and the brief readings (None where none taken)."""
    if len(candidates) < SCREEN_MIN:
        return None, None
    quick = []
    for cand in candidates:
        try:
            quick.append(_valid(_bench_screen(lambda cand=cand: run_fn(cand))))
        except Exception as exc:  # rejected now: rejected in the full timing too
            log.debug("tilewise.autotune: %s %s failed: %s", op, cand, exc)
            quick.append(math.inf)
    best = min(quick)
    if not math.isfinite(best):
        return None, quick
    order = sorted(
        (i for i, t in enumerate(quick) if t <= SCREEN_RATIO * best), key=quick.__getitem__
    )
    kept = set(order[:SCREEN_KEEP])
    log.debug("tilewise.autotune: %s screened %d of %d candidates in", op, len(kept), len(quick))
    return kept, quick


#: candidates whose first timing is at least this long (ms) and within ``CLOSE_RATIO`` of the
#: fastest (the ``CLOSE_MAX`` fastest of them) are timed again in ``CLOSE_ROUNDS`` rotating
#: rounds: long, compute-bound kernels run at the clocks the power cap leaves them, which depend
#: on what ran just before, so one pass in a fixed order favours its first candidates (session
#: 16: an fp16 4096 x 8192 x 8192 forward read cuBLASLt's bias + ReLU 1.04x PyTorch + graph in one
#: run, and the cuBLAS + epilogue path it had chosen 0.96-1.00x). The window is wider than that
#: bias, so a candidate read too slow by it still gets its rounds.
CLOSE_MIN_MS = 0.2
#: the same for screened choices (the grouped conv's passes), from 0.05 ms (session 46): MBConv's
#: C=1024 16x16 N=256 fprop (~0.075 ms) chose the 8x16 32-channel tile (88.1 us) over the 8x8
#: 64-channel one in two fresh choices on one H200; the latter read 74.0-74.8 us by the screen but
#: 88.2-90.9 by its full timing, the last of the kept candidates; alone, three rounds in turn, it
#: read 76-79 us warm against the others' 86-92. With rounds, twelve of twelve choices took it.
#: Screened choices only: a round costs ~0.2 s a near-tie, and unscreened GEMMs of 0.05-0.2 ms
#: (linear's) would pay up to ~3 s a choice for a bias not seen there.
SCREENED_CLOSE_MIN_MS = 0.05
CLOSE_RATIO = 1.10
CLOSE_MAX = 4
CLOSE_ROUNDS = 4


def _retime_close(
    times: list[float],
    timer: Callable,
    candidates: Sequence,
    run_fn: Callable,
    min_ms: float = CLOSE_MIN_MS,
    samples_out: dict[int, list[float]] | None = None,
) -> list[float]:
    """``times`` with each near-tie of a problem of at least ``min_ms`` replaced by the median of
    its first timing and ``CLOSE_ROUNDS`` more, taken in turns whose order rotates; a near-tie
    that fails in a round is out (inf). ``samples_out`` gets each near-tie's readings in the
    order taken."""
    valid = [_valid(t) for t in times]
    best = min(valid)
    if not math.isfinite(best) or best < min_ms:
        return times
    close = sorted(
        (i for i, t in enumerate(valid) if t <= CLOSE_RATIO * best), key=valid.__getitem__
    )
    close = sorted(close[:CLOSE_MAX])  # rounds in the candidates' own order, rotated
    if len(close) < 2:
        return times
    log.debug("tilewise.autotune: near-ties %s timed again in %d rounds", close, CLOSE_ROUNDS)
    samples = {i: [valid[i]] for i in close}
    for r in range(CLOSE_ROUNDS):
        for i in close[r % len(close) :] + close[: r % len(close)]:
            try:
                samples[i].append(_valid(timer(lambda cand=candidates[i]: run_fn(cand))))
            except Exception:  # failed now after timing once: not a candidate to keep
                samples[i].append(math.inf)
    if samples_out is not None:
        samples_out.update({i: list(got) for i, got in samples.items()})
    out = list(times)
    for i, got in samples.items():
        got.sort()
        out[i] = got[len(got) // 2] if all(math.isfinite(t) for t in got) else math.inf
    return out


#: ``choose_config(prefer=...)`` applies to problems whose fastest timing is at least this long
#: (ms): long compute-bound kernels, whose clocks under the power cap differ between a one-GEMM
#: timing and a model that runs them back to back
PREFER_MIN_MS = 0.2


def _preferred(
    table: list[list[float]], candidates: Sequence, best: int | None, prefer: Any, within: float
) -> int | None:
    """``best``, or the index of ``prefer`` when the problem is long and ``prefer`` is within
    ``within`` of the fastest in every row of ``table`` (one row per way of timing)."""
    if best is None or prefer is None or prefer not in candidates:
        return best
    j = candidates.index(prefer)
    rows = [[_valid(t) for t in row] for row in table]
    fastest = [min(row) for row in rows]
    if not all(math.isfinite(f) for f in fastest) or fastest[0] < PREFER_MIN_MS:
        return best
    if all(row[j] <= (1.0 + within) * f for row, f in zip(rows, fastest, strict=True)):
        return j
    return best


def _valid(t: float) -> float:
    """A timing, or inf where it is not one (NaN, zero or negative: a failed or noise-lost run)."""
    return t if math.isfinite(t) and t > 0 else math.inf


def _least_worst_loss(table: list[list[float]]) -> int | None:
    """The candidate whose largest ratio to the fastest of a row (one row per way of timing) is
    smallest; ties go to the first row's faster. A candidate without a valid time in every row
    is out; None when no candidate is left."""
    rows = [[_valid(t) for t in row] for row in table]
    ok = [i for i in range(len(rows[0])) if all(math.isfinite(row[i]) for row in rows)]
    if not ok:
        return None
    fastest = [min(row[i] for i in ok) for row in rows]

    def loss(i: int) -> tuple[float, float]:
        return max(row[i] / f for row, f in zip(rows, fastest, strict=True)), rows[0][i]

    return min(ok, key=loss)


def export_cache(path: str | os.PathLike) -> int:
    """Write every known choice (disk cache and this process) to ``path``; returns the count."""
    with _lock:
        _ensure_loaded()
        entries = {**_read(cache_path()), **_memory}
    _write_atomic(Path(path), entries)
    return len(entries)


def import_cache(path: str | os.PathLike) -> int:
    """Merge a cache written by ``export_cache`` into this process and the disk cache."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"argument 'path': {path} does not exist")
    entries = _read(path)
    with _lock:
        _ensure_loaded()
        _memory.update(entries)
        _forget_answers()
    try:
        _merge_into(cache_path(), entries)
    except OSError as exc:
        _warn_once(f"cannot write {cache_path()} ({exc}); imported entries kept in memory only")
    return len(entries)
