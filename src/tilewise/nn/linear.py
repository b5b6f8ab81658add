"""``Linear``: an ``nn.Linear`` whose forward is one fused GEMM + bias + activation kernel."""

from __future__ import annotations

import torch
from torch import nn

from tilewise import functional as F
from tilewise.nn.modules import adopt
from tilewise.ops._common import activation_code


class Linear(nn.Linear):
    """Drop-in ``nn.Linear`` (same arguments, parameters, init and state dict) computing
    ``act(x @ W^T + b)``; ``activation`` is one of "none", "relu", "gelu", "silu".

    ``allow_tf32`` lets fp32 products use TF32 tensor cores (default: true fp32).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation: str = "none",
        allow_tf32: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        activation_code(activation)
        self.activation, self.allow_tf32 = activation, allow_tf32

    @classmethod
    def from_linear(
        cls, module: nn.Linear, activation: str = "none", allow_tf32: bool = False
    ) -> Linear:
        """A tilewise Linear sharing ``module``'s Parameter objects (no copy)."""
        activation_code(activation)
        new = adopt(cls, module)
        new.activation, new.allow_tf32 = activation, allow_tf32
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias, self.activation, self.allow_tf32)

    def extra_repr(self) -> str:
        extra = f", allow_tf32={self.allow_tf32}" if self.allow_tf32 else ""
        return super().extra_repr() + f", activation={self.activation!r}" + extra
