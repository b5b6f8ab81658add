"""``nn.Module`` drop-ins that subclass the torch.nn class they replace."""

from tilewise.nn.gconv import GroupedConv2d
from tilewise.nn.linear import Linear
from tilewise.nn.modules import BiasAct, LayerNorm
from tilewise.nn.strassen import StrassenMLP
from tilewise.nn.transform import TransformReport, transform

__all__ = [
    "BiasAct",
    "GroupedConv2d",
    "LayerNorm",
    "Linear",
    "StrassenMLP",
    "TransformReport",
    "transform",
]
