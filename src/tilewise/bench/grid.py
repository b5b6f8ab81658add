"""The loop every study shares: measure each problem of a grid, with a progress bar."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from tqdm import tqdm

T = TypeVar("T")


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
    return records


def free_memory(device: torch.device) -> None:
    """Drop collected tensors and return cached blocks, between problems of different sizes."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
