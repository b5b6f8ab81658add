"""``transform(model)``: swap every eligible ``nn.Conv2d`` for a parameter-sharing tilewise module.

Works on any module tree (timm models included): candidates come from ``named_modules``, swaps
are ``setattr`` on every parent that holds the module (shared modules stay shared). Only exact
``nn.Conv2d`` instances are swapped: subclasses (e.g. timm's ``Conv2dSame``, ``StdConv2d``) have
their own forward, so they are reported and left alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from torch import nn

from tilewise.nn.gconv import GroupedConv2d, conv_unsupported_reason


@dataclass
class TransformReport:
    """What ``transform`` did: (name, what) per swapped module, (name, reason) per conv left."""

    model: nn.Module
    swapped: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"tilewise.nn.transform: {len(self.swapped)} swapped, {len(self.left)} left"]
        lines += [f"  swapped {name or '<root>'}: {what}" for name, what in self.swapped]
        lines += [f"  left    {name or '<root>'}: {why}" for name, why in self.left]
        return "\n".join(lines)


def _describe(conv: nn.Conv2d) -> str:
    r, s = conv.kernel_size
    return (
        f"Conv2d({conv.in_channels}, {conv.out_channels}, {r}x{s}, groups={conv.groups}, "
        f"padding={conv.padding}) -> GroupedConv2d"
    )


def transform(
    model: nn.Module, *, inplace: bool = True, deterministic: bool | None = None
) -> TransformReport:
    """Replace each eligible ``nn.Conv2d`` in ``model`` by ``GroupedConv2d.from_conv``.

    Eligible: C_in == C_out, groups == C / 8, stride 1, dilation 1, zero padding (symmetric),
    kernel up to 7x7. ``inplace=False`` transforms a deep copy. The transformed model is
    ``report.model`` (the same object as ``model`` when in place, unless ``model`` itself is an
    eligible conv, which cannot be replaced in its caller).
    """
    if not inplace:
        model = copy.deepcopy(model)
    report = TransformReport(model=model)
    replacements: dict[int, GroupedConv2d] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Conv2d) or isinstance(module, GroupedConv2d):
            continue
        if type(module) is not nn.Conv2d:
            report.left.append((name, f"{type(module).__name__} subclasses nn.Conv2d"))
            continue
        reason = conv_unsupported_reason(module)
        if reason is not None:
            report.left.append((name, reason))
            continue
        replacements[id(module)] = GroupedConv2d.from_conv(module, deterministic=deterministic)
        report.swapped.append((name, _describe(module)))
    if id(model) in replacements:
        report.model = replacements[id(model)]
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if id(child) in replacements:
                setattr(parent, child_name, replacements[id(child)])
    return report
