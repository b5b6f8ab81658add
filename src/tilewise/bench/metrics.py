"""Pure arithmetic that turns (bytes, flops, seconds) into rates and fractions of ceilings.

Every kernel result is quoted against a ceiling measured in the same run (see ``ceilings``).
"""

from __future__ import annotations

import math


def _check_seconds(seconds: float) -> None:
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be positive and finite, got {seconds}")


def effective_bandwidth(nbytes: float, seconds: float) -> float:
    """Compulsory bytes moved per second (B/s)."""
    _check_seconds(seconds)
    return float(nbytes) / seconds


def achieved_flops(flops: float, seconds: float) -> float:
    """Floating-point operations per second."""
    _check_seconds(seconds)
    return float(flops) / seconds


def fraction(value: float, ceiling: float) -> float:
    """``value / ceiling``; a ceiling that is not positive is an error, not a silent inf."""
    if not ceiling > 0:
        raise ValueError(f"ceiling must be positive, got {ceiling}")
    return float(value) / float(ceiling)


def fraction_of_copy(nbytes: float, seconds: float, copy_bytes_per_s: float) -> float:
    """Effective bandwidth as a fraction of the device-to-device copy ceiling."""
    return fraction(effective_bandwidth(nbytes, seconds), copy_bytes_per_s)


def fraction_of_matmul(flops: float, seconds: float, matmul_flops_per_s: float) -> float:
    """Achieved FLOP/s as a fraction of the matmul ceiling of the same dtype."""
    return fraction(achieved_flops(flops, seconds), matmul_flops_per_s)


def speedup(baseline_s: float, candidate_s: float) -> float:
    """How many times faster ``candidate`` is than ``baseline`` (>1 means faster)."""
    _check_seconds(baseline_s)
    _check_seconds(candidate_s)
    return baseline_s / candidate_s
