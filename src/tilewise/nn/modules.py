"""Thin modules over ``tilewise.functional``; parameters and init come from the torch.nn parents."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from tilewise import functional as F
from tilewise.ops._common import activation_code


def adopt(cls: type[nn.Module], module: nn.Module) -> nn.Module:
    """A new ``cls`` instance sharing ``module``'s Parameter objects, buffers, submodules and
    settings (no copy). Its per-module containers (parameters, buffers, hooks, submodules, the
    non-persistent buffer set) are new: registering a hook or a buffer on one module leaves the
    other alone. The hooks present now are carried over (removing one through its handle on the
    original leaves the drop-in's copy). A parametrized module (``torch.nn.utils.parametrize``)
    is refused: its parameters live in a generated subclass the drop-in cannot be."""
    if parametrize.is_parametrized(module):
        raise ValueError(
            f"tilewise.nn: argument 'module' ({type(module).__name__}) is parametrized "
            "(weight_norm or register_parametrization); remove the parametrization first"
        )
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    for k, v in module.__dict__.items():
        new.__dict__[k] = type(v)(v) if isinstance(v, (dict, set)) else v
    return new


class BiasAct(nn.Module):
    """A learnable bias added along ``dim`` and an activation, fused: ``act(x + bias)``."""

    def __init__(
        self, num_features: int, activation: str = "relu", dim: int = -1, device=None, dtype=None
    ) -> None:
        super().__init__()
        activation_code(activation)
        self.activation, self.dim = activation, dim
        self.bias = nn.Parameter(torch.zeros(num_features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.bias_act(x, self.bias, self.activation, self.dim)

    def extra_repr(self) -> str:
        return f"{self.bias.shape[0]}, activation={self.activation!r}, dim={self.dim}"


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` with tilewise kernels and an optional fused ReLU after the affine."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        relu: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            normalized_shape,
            eps=eps,
            elementwise_affine=elementwise_affine,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        self.relu = relu

    @classmethod
    def from_torch(cls, module: nn.LayerNorm, relu: bool = False) -> LayerNorm:
        """A tilewise LayerNorm sharing ``module``'s parameters (no copy)."""
        new = adopt(cls, module)
        new.relu = relu
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self.relu)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", relu={self.relu}"
