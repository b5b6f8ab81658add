"""Attribution of profiled kernels to the grouped convs of a stack (in-situ study).

fprop: kernels launched under a ``record_function`` range tagged around each grouped conv (casts
under ``aten::_to_copy`` booked apart); backward: kernels under an autograd node whose sequence
number was created inside a tagged range; dgrad vs wgrad split by the kernel-name signatures of
each pass measured alone, or by a "dgrad"/"wgrad" in the name of a kernel those did not see.
See ``tilewise.bench.gconv_insitu`` for how the window is profiled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tilewise.bench.timing import _device_us, _is_device_event

TAG = "tilewise.bench::grouped_conv"
BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION
CAST_OP, CAST_NODE = "aten::_to_copy", "ToCopyBackward"


@dataclass(frozen=True)
class Attribution:
    """Kernel seconds and launches per bucket (fprop, dgrad, wgrad, cast, unmatched) over a
    profiled window, with the per-name breakdown and every kernel's total (``window_s``)."""

    seconds: dict[str, float]
    launches: dict[str, float]
    kernels: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    window_s: float = 0.0
    unmatched_fprop: tuple[str, ...] = ()


def _ancestors(evt: Any) -> Iterator[Any]:
    p = getattr(evt, "cpu_parent", None)
    while p is not None:
        yield p
        p = getattr(p, "cpu_parent", None)


def _is_kernel(evt: Any) -> bool:
    return _is_device_event(evt) and evt.name != TAG and not getattr(evt, "is_user_annotation", 0)


def device_kernels(evt: Any) -> list[tuple[str, float]]:
    """(name, seconds) of the device kernels the profiler linked to CPU op ``evt``."""
    return [
        (k.name, float(k.duration) * 1e-6)
        for k in getattr(evt, "kernels", ())
        if k.name not in (evt.name, TAG)  # legacy self-timing and GPU-side user annotations
    ]


def _bucket(evt: Any, tagged: set[int], seqs: set[int]) -> str | None:
    chain = [evt, *_ancestors(evt)]
    for i, a in enumerate(chain):
        if id(a) in tagged:
            return "cast" if any(b.name == CAST_OP for b in chain[:i]) else "fprop"
    for a in chain:
        if getattr(a, "scope", 0) == BACKWARD_SCOPE and getattr(a, "sequence_nr", -1) >= 0:
            if a.sequence_nr not in seqs:
                return None
            return "cast" if a.name.startswith(CAST_NODE) else "bwd"
    return None


def pass_by_name(name: str) -> str | None:
    """The backward pass a kernel that the isolated signatures do not know serves, where its
    name says so (cuDNN's "dgrad"/"wgrad" kernels); None otherwise. With cudnn.benchmark on, the
    stack's algorithm can differ from the one the pass picked when run alone."""
    low = name.lower()
    hits = [p for p in ("dgrad", "wgrad") if p in low]
    return hits[0] if len(hits) == 1 else None


def attribute(
    events: Iterable[Any],
    signatures: Mapping[str, Mapping[str, float]],
    kernels_of: Callable[[Any], list[tuple[str, float]]] = device_kernels,
) -> Attribution:
    """Attribute the kernels of a profiled window to the grouped convs' passes (module doc).

    ``signatures[pass][name]``: launches per call of each kernel name when the pass runs alone.
    """
    events = list(events)
    cpu = [e for e in events if not _is_device_event(e)]
    tagged = {id(e) for e in cpu if e.name == TAG}
    seqs = {
        e.sequence_nr
        for e in cpu
        if getattr(e, "sequence_nr", -1) >= 0 and any(id(a) in tagged for a in _ancestors(e))
    }
    acc: dict[str, dict[str, list[float]]] = {}
    sd, sw = signatures.get("dgrad", {}), signatures.get("wgrad", {})

    def add(bucket: str, name: str, n: float, s: float) -> None:
        row = acc.setdefault(bucket, {}).setdefault(name, [0.0, 0.0])
        row[0] += n
        row[1] += s

    for e in cpu:
        ks = kernels_of(e)
        bucket = _bucket(e, tagged, seqs) if ks else None
        for name, s in ks if bucket else ():
            if bucket != "bwd":
                add(bucket, name, 1.0, s)
            elif sd.get(name, 0) + sw.get(name, 0) == 0:
                add(pass_by_name(name) or "unmatched", name, 1.0, s)
            else:
                share = sd.get(name, 0) / (sd.get(name, 0) + sw.get(name, 0))
                for pass_, f in (("dgrad", share), ("wgrad", 1.0 - share)):
                    if f > 0:
                        add(pass_, name, f, f * s)
    buckets = ("fprop", "dgrad", "wgrad", "cast", "unmatched")
    fprop_sig = signatures.get("fprop")
    return Attribution(
        seconds={b: sum(r[1] for r in acc.get(b, {}).values()) for b in buckets},
        launches={b: sum(r[0] for r in acc.get(b, {}).values()) for b in buckets},
        kernels={b: {n: (r[0], r[1]) for n, r in rows.items()} for b, rows in acc.items()},
        window_s=sum(_device_us(e) for e in events if _is_kernel(e)) * 1e-6,
        unmatched_fprop=tuple(n for n in acc.get("fprop", {}) if fprop_sig and n not in fprop_sig),
    )


def name_split(events: Iterable[Any], depth: int, dgrad_layers: int, iters: int) -> dict | None:
    """Tilewise only: seconds of the Triton "gconv" kernels per pass, from names and launch
    order (per iteration, the first ``depth`` fprop-kernel launches are the forward's).
    None when the launch count does not fit the stack."""
    ks = sorted(
        (e for e in events if _is_kernel(e) and "gconv" in e.name), key=lambda e: e.time_range.start
    )
    fwd = [_device_us(e) * 1e-6 for e in ks if "wgrad" not in e.name]
    per = depth + dgrad_layers
    if not fwd or len(fwd) != per * iters:
        return None
    fprop = sum(s for i, s in enumerate(fwd) if i % per < depth)
    wgrad = sum(_device_us(e) * 1e-6 for e in ks if "wgrad" in e.name)
    return {"fprop": fprop, "dgrad": sum(fwd) - fprop, "wgrad": wgrad}
