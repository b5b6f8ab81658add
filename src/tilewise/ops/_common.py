"""Helpers shared by the op families: activation codes, device facts, block-size arithmetic."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

#: Activation name -> code baked into kernels as a constexpr.
ACTIVATIONS: dict[str, int] = {"none": 0, "relu": 1, "gelu": 2, "silu": 3}


def activation_code(activation: str) -> int:
    """Map an activation name to its kernel code, or raise ``ValueError`` naming the argument."""
    try:
        return ACTIVATIONS[activation]
    except KeyError:
        raise ValueError(
            f"argument 'activation' must be one of {sorted(ACTIVATIONS)}, got {activation!r}"
        ) from None


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on ``device`` (a small stand-in on the CPU interpreter)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 2


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code: ``triton.cdiv`` is a constexpr function object whose call
    costs microseconds, several times per launch."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class TileConfig:
    """A 2-D tile over a [rows, cols] view, the launch shape of the pointwise-style kernels.

    ``progs_per_sm`` sizes the persistent grid of the backward kernels that reduce over rows.
    """

    block_m: int
    block_n: int
    num_warps: int = 4
    progs_per_sm: int = 8


#: Config overrides by kernel name ("bias_act_fwd", ...): a hook for tuning sweeps.
CONFIG_OVERRIDES: dict[str, Callable[[int, int, int], TileConfig | None]] = {}


def pick_config(kernel: str, m: int, n: int, elem_bytes: int, default: TileConfig) -> TileConfig:
    """``default`` unless a tuning sweep installed an override for ``kernel``."""
    override = CONFIG_OVERRIDES.get(kernel)
    cfg = override(m, n, elem_bytes) if override is not None else None
    return cfg or default


@triton.jit
def act_fwd(z, ACT: tl.constexpr):
    """Activation of an fp32 tile; NaN propagates like PyTorch's."""
    if ACT == 1:
        y = tl.where(z < 0.0, 0.0, z)
    elif ACT == 2:
        y = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif ACT == 3:
        y = z * tl.sigmoid(z)
    else:
        y = z
    return y


@triton.jit
def act_bwd(dy, z, ACT: tl.constexpr):
    """dL/dz given dL/dy and the pre-activation z (fp32 tiles)."""
    if ACT == 1:
        dz = tl.where(z <= 0.0, 0.0, dy)
    elif ACT == 2:
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327
        dz = dy * (cdf + z * pdf)
    elif ACT == 3:
        s = tl.sigmoid(z)
        dz = dy * (s * (1.0 + z * (1.0 - s)))
    else:
        dz = dy
    return dz


def act_reference(z: torch.Tensor, activation: str) -> torch.Tensor:
    """PyTorch activation, the reference for ``act_fwd``."""
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return torch.nn.functional.gelu(z)
    if activation == "silu":
        return torch.nn.functional.silu(z)
    return z


def act_grad_reference(dy: torch.Tensor, z: torch.Tensor, activation: str) -> torch.Tensor:
    """dL/dz from dL/dy and z in PyTorch ops, the reference for ``act_bwd``."""
    if activation == "relu":
        return torch.where(z <= 0, torch.zeros_like(dy), dy)
    if activation == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(z * 0.7071067811865476))
        pdf = torch.exp(-0.5 * z * z) * 0.3989422804014327
        return dy * (cdf + z * pdf)
    if activation == "silu":
        s = torch.sigmoid(z)
        return dy * (s * (1.0 + z * (1.0 - s)))
    return dy
