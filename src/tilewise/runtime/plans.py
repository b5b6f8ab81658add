"""Per-problem launch plans: what an op worked out for one problem, kept for its next call.

An uncaptured call of a small op pays host time for every check, choice and argument it works
out again (session 28, H100 host: a grouped conv's forward + backward spent ~200 us of Python
around three launches of ~15 us each, against cuDNN's whole call of ~35 us a pass). An op keys a
plan by everything its work depends on: the tensors' shapes, strides, dtypes, devices and
alignment, its scalar arguments, and the switches it reads (environment variables, backend
flags, the autotuner's answers: ``switches``). A call whose key and switches match runs the
plan; any other call takes the op's full path, which builds the plan again.

Plans are not stored while a CUDA graph is being captured: the autotuner answers a capture that
finds no cached choice with its default without remembering it (``autotune.choose_config``), and
that default must not outlive the capture.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

import torch

from tilewise.runtime import autotune

#: every plan cache, so tests can start each case from none (``clear_all``)
_CACHES: list[PlanCache] = []
_CACHES_LOCK = threading.Lock()


def environment(names: tuple[str, ...]) -> tuple[str | None, ...]:
    """The values of the environment variables ``names`` (None where unset)."""
    get = os.environ.get
    return tuple(get(name) for name in names)


class PlanCache:
    """Plans by key, each valid while ``switches()`` returns what it returned when the plan was
    stored (``switches``: a cheap tuple of everything outside the key the plan depends on; the
    autotuner's ``generation`` is always part of it). At most ``size`` plans; past that the
    cache starts again empty (a model has a few dozen problems; a sweep that has thousands gains
    nothing from keeping them)."""

    def __init__(self, switches: Callable[[], tuple], size: int = 4096) -> None:
        self._switches = switches
        self.size = size
        self._plans: dict[Hashable, tuple[tuple, Any]] = {}
        with _CACHES_LOCK:
            _CACHES.append(self)

    def token(self) -> tuple:
        return (autotune.generation(), *self._switches())

    def get(self, key: Hashable) -> Any:
        """The plan stored under ``key`` if its switches still hold, else None (also inside
        ``autotune.recording``, which lists the configs that the full path chooses)."""
        entry = self._plans.get(key)
        if entry is None or entry[0] != self.token() or autotune.recording_active():
            return None
        return entry[1]

    def put(self, key: Hashable, plan: Any, token: tuple | None = None) -> None:
        """Store ``plan`` under ``key`` (not while a CUDA graph is being captured), valid while
        the switches read ``token`` (take it before the work the plan records: a switch that
        moves meanwhile then invalidates the plan; None: read it now)."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        if len(self._plans) >= self.size:
            self._plans.clear()
        self._plans[key] = (self.token() if token is None else token, plan)

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


def clear_all() -> None:
    """Forget every plan of every op (tests: a case that patches an op's internals starts clean)."""
    with _CACHES_LOCK:
        for cache in _CACHES:
            cache.clear()
