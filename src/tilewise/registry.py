"""The op registry: params, inputs, tilewise and reference callables, bytes and flops.

Tests and benchmarks iterate over ``OPS`` instead of knowing each op, so adding an op here makes it
measurable by ``tilewise bench`` and checkable by the generic tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tilewise import functional as F
from tilewise.ops import bias_act as _bias_act

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class RowsProblem:
    """An op over an [m, n] view (rows x the innermost dim) in one dtype."""

    m: int
    n: int
    dtype: str = "fp16"
    activation: str = "relu"  # bias_act: the activation; layer_norm: "relu" or "none"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def elem_bytes(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def tensor_bytes(self) -> int:
        """Bytes of one [m, n] activation tensor."""
        return self.m * self.n * self.elem_bytes

    def label(self) -> str:
        return f"{self.m}x{self.n} {self.dtype} {self.activation}"


@dataclass(frozen=True)
class OpSpec:
    """How to build, run, reference and count one op."""

    name: str
    make_inputs: Callable[[RowsProblem, torch.device], dict[str, torch.Tensor]]
    tilewise: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    bytes: Callable[[RowsProblem, str], int]
    flops: Callable[[RowsProblem, str], int]
    passes: tuple[str, ...] = ("fwd", "bwd")
    grad_inputs: tuple[str, ...] = field(default=("x",))


def _bias_act_inputs(p: RowsProblem, device: torch.device) -> dict[str, torch.Tensor]:
    dt = p.torch_dtype
    x = torch.randn(p.m, p.n, device=device, dtype=dt, requires_grad=True)
    b = torch.randn(p.n, device=device, dtype=dt, requires_grad=True)
    return {"x": x, "bias": b}


def _bias_act_bytes(p: RowsProblem, pass_: str) -> int:
    vec = p.n * p.elem_bytes
    if pass_ == "fwd":  # read x, bias; write y
        return 2 * p.tensor_bytes + vec
    return 3 * p.tensor_bytes + 2 * vec  # read dy, x, bias; write dx, dbias


def _layer_norm_inputs(p: RowsProblem, device: torch.device) -> dict[str, torch.Tensor]:
    dt = p.torch_dtype
    x = torch.randn(p.m, p.n, device=device, dtype=dt, requires_grad=True)
    w = (1.0 + 0.1 * torch.randn(p.n, device=device, dtype=dt)).requires_grad_()
    b = (0.1 * torch.randn(p.n, device=device, dtype=dt)).requires_grad_()
    return {"x": x, "weight": w, "bias": b}


def _layer_norm_bytes(p: RowsProblem, pass_: str) -> int:
    vec = p.n * p.elem_bytes
    if pass_ == "fwd":  # read x, w, b; write y
        return 2 * p.tensor_bytes + 2 * vec
    return 3 * p.tensor_bytes + 4 * vec  # read dy, x, w, b; write dx, dw, db


def _layer_norm_tw(x, weight, bias, activation="none"):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, relu=activation == "relu")


def _layer_norm_ref(x, weight, bias, activation="none"):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias)
    return torch.relu(y) if activation == "relu" else y


def _elementwise_flops(per_elem_fwd: int, per_elem_bwd: int):
    def flops(p: RowsProblem, pass_: str) -> int:
        return p.m * p.n * (per_elem_fwd if pass_ == "fwd" else per_elem_bwd)

    return flops


OPS: dict[str, OpSpec] = {
    "bias_act": OpSpec(
        name="bias_act",
        make_inputs=_bias_act_inputs,
        tilewise=lambda x, bias, activation="relu": F.bias_act(x, bias, activation),
        reference=lambda x, bias, activation="relu": _bias_act.reference(x, bias, activation),
        bytes=_bias_act_bytes,
        flops=_elementwise_flops(2, 4),
        grad_inputs=("x", "bias"),
    ),
    "layer_norm": OpSpec(
        name="layer_norm",
        make_inputs=_layer_norm_inputs,
        tilewise=_layer_norm_tw,
        reference=_layer_norm_ref,
        bytes=_layer_norm_bytes,
        flops=_elementwise_flops(8, 12),
        grad_inputs=("x", "weight", "bias"),
    ),
}


def rows_for_bytes(n: int, dtype: str, target_bytes: int) -> int:
    """Rows m so that one [m, n] tensor of ``dtype`` holds about ``target_bytes``."""
    elem = torch.empty((), dtype=DTYPES[dtype]).element_size()
    return max(1, math.ceil(target_bytes / (n * elem)))
