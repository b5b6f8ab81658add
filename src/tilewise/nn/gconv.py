"""``GroupedConv2d``: an ``nn.Conv2d`` whose forward runs tilewise's group-width-8 kernels."""

from __future__ import annotations

import torch
from torch import nn

from tilewise import functional as F
from tilewise.nn.modules import adopt
from tilewise.ops import gconv_config
from tilewise.runtime import dispatch


def conv_unsupported_reason(conv: nn.Conv2d) -> str | None:
    """Why ``conv``'s hyper-parameters have no tilewise kernel, or None if they have one."""
    return gconv_config.unsupported_reason(
        conv.in_channels,
        conv.out_channels,
        tuple(conv.kernel_size),
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        conv.padding_mode,
    )


class GroupedConv2d(nn.Conv2d):
    """Drop-in ``nn.Conv2d`` (same arguments, parameters, init and state dict).

    Group-width-8 convs with stride 1, dilation 1, zero padding and kernels up to 7x7 on
    channels_last inputs run the tilewise kernels; any other use runs ``nn.Conv2d``'s forward and
    says why once. ``deterministic`` picks the weight-gradient reduction (see
    ``tilewise.functional.grouped_conv2d``); None follows
    ``torch.are_deterministic_algorithms_enabled()``.
    """

    def __init__(self, *args, deterministic: bool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deterministic = deterministic

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, *, deterministic: bool | None = None) -> GroupedConv2d:
        """A GroupedConv2d sharing ``conv``'s Parameter objects, buffers and settings (no copy)."""
        new = adopt(cls, conv)
        new.deterministic = deterministic
        return new

    def unsupported_reason(self) -> str | None:
        """Why this module's hyper-parameters have no kernel, or None (inputs are checked later)."""
        return conv_unsupported_reason(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding_mode != "zeros":
            if not torch.compiler.is_compiling():
                dispatch.fallback("grouped_conv2d", f"padding_mode={self.padding_mode!r}")
            return super().forward(x)
        # Falls back to F.conv2d (== nn.Conv2d.forward for zero padding) when ineligible.
        return F.grouped_conv2d(
            x,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            deterministic=self.deterministic,
        )

    def extra_repr(self) -> str:
        extra = "" if self.deterministic is None else f", deterministic={self.deterministic}"
        return super().extra_repr() + extra
