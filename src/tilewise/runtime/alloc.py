"""Output allocation for the ops, with an optional poison fill so tests catch unwritten elements."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_poison = False


@contextlib.contextmanager
def poison_outputs(enabled: bool = True) -> Iterator[None]:
    """Within this context every kernel output is pre-filled with NaN (a test aid; costs a pass)."""
    global _poison
    previous, _poison = _poison, enabled
    try:
        yield
    finally:
        _poison = previous


def _maybe_poison(t: torch.Tensor) -> torch.Tensor:
    if _poison and t.is_floating_point():
        t.fill_(float("nan"))
    return t


def empty_like(t: torch.Tensor, **kwargs) -> torch.Tensor:
    return _maybe_poison(torch.empty_like(t, **kwargs))


def empty(*shape: int, **kwargs) -> torch.Tensor:
    return _maybe_poison(torch.empty(*shape, **kwargs))
