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
