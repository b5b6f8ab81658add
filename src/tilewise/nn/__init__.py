"""``nn.Module`` drop-ins that subclass the torch.nn class they replace."""

from tilewise.nn.modules import BiasAct, LayerNorm

__all__ = ["BiasAct", "LayerNorm"]
