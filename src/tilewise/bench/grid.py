"""The loop every study shares: measure each problem of a grid, with a progress bar."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import torch
from tqdm import tqdm

T = TypeVar("T")
log = logging.getLogger(__name__)

#: called with the records so far after each problem of ``run_grid`` (``checkpointing``)
_checkpoint: ContextVar[Callable[[list[dict[str, Any]]], object] | None] = ContextVar(
    "tilewise_grid_checkpoint", default=None
)


@contextlib.contextmanager
def checkpointing(save: Callable[[list[dict[str, Any]]], object]) -> Iterator[None]:
    """Within this context ``run_grid`` hands its records to ``save`` after every problem, so a
    study stopped by a time limit leaves what it measured (session 19 lost two gconv studies
    that way)."""
    token = _checkpoint.set(save)
    try:
        yield
    finally:
        _checkpoint.reset(token)


def study_device(device: torch.device | str | None) -> torch.device:
    """``device``, or CUDA when there is a GPU, else the CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def run_grid(
    items: Iterable[T],
    measure: Callable[[T], list[dict[str, Any]]],
    *,
    desc: str,
    label: Callable[[T], str] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Concatenate ``measure(item)`` over ``items``; the bar shows ``label(item)``."""
    items = list(items)
    records: list[dict[str, Any]] = []
    bar = tqdm(items, desc=desc, unit="problem", disable=not progress, leave=False)
    for item in bar:
        if label is not None:
            bar.set_postfix_str(label(item))
        records += measure(item)
        save = _checkpoint.get()
        if save is not None:
            try:
                save(records)
            except OSError as exc:  # a full disk must not cost the study itself
                log.warning("tilewise bench: checkpoint not written (%s)", exc)
    return records


def free_memory(device: torch.device) -> None:
    """Drop collected tensors and return cached blocks, between problems of different sizes."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def cleanup_fault(steps: Iterable[tuple[str, Callable[[], object] | None]]) -> str | None:
    """Run each cleanup step, then synchronize the GPU; the first that raises (a CUDA fault
    that a kernel left behind surfaces at the next synchronization) stops the rest and is
    returned as ``"<step>: <first line of the error>"``; None when all went through."""
    for name, step in steps:
        if step is None:
            continue
        try:
            step()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception as exc:  # torch.AcceleratorError (a RuntimeError) on a CUDA fault
            return f"{name}: {first_line(exc)}"
    return None


def first_line(exc: BaseException) -> str:
    """``Type: message`` up to the message's first line (CUDA errors append four of advice)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class IsolatedRunner:
    """``measure(item)`` run in one spawned worker process at a time, so a CUDA fault (a
    context that is dead from then on) costs the worker, not the study: session 22's MLP
    studies with torch.compile faulted in a cell's cleanup, once per ~10 cells, with and
    without tilewise in the cell, and lost everything after it. ``fn(*fixed, item)`` must be a
    picklable module-level function returning ``(records, fault)``; a fault (or a worker
    that died) starts a fresh worker for the next item. Items run one after another: timing
    needs the GPU to itself. ``timeout_s``: an item that takes longer (a hung kernel) has its
    worker killed and counts as a fault."""

    def __init__(
        self,
        fn: Callable[..., tuple[list[dict[str, Any]], str | None]],
        *fixed: Any,
        timeout_s: float | None = None,
    ):
        self.fn, self.fixed, self.timeout_s = fn, fixed, timeout_s
        self.pool: Any = None
        self.faults = 0
        self.last_fault: str | None = None

    def __enter__(self) -> IsolatedRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self._drop()

    def _drop(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        if kill:  # a hung worker would never finish its item: end its process first
            for proc in list(getattr(self.pool, "_processes", {}).values()):
                proc.kill()
        self.pool.shutdown(wait=not kill, cancel_futures=True)
        self.pool = None

    def __call__(self, item: T) -> list[dict[str, Any]]:
        import concurrent.futures
        import multiprocessing

        if self.pool is None:
            ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
            self.pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
        hung = False
        try:
            future = self.pool.submit(self.fn, *self.fixed, item)
            records, fault = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            records, fault, hung = [], f"worker timed out after {self.timeout_s} s", True
        except concurrent.futures.BrokenExecutor as exc:  # the worker process died
            records, fault = [], f"worker died: {exc}"
        except Exception as exc:  # raised in the worker: its process may be unusable too
            records, fault = [], f"worker raised {first_line(exc)}"
        if fault is not None:
            self.faults += 1
            self.last_fault = fault
            log.warning("tilewise bench: %s faulted (%s); a fresh worker goes on", item, fault)
            self._drop(kill=hung)
        return records
