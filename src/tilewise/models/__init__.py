"""Reference models built from plain ``torch.nn`` modules (what ``tilewise.transform`` rewrites)."""

from tilewise.models.convnets import (
    BLOCK_KINDS,
    ConvFirstBlock,
    MBConvBlock,
    MLPBlock,
    block_stack,
    grouped_channels,
    grouped_conv,
    grouped_convs,
    is_grouped_conv,
    make_block,
)

__all__ = [
    "BLOCK_KINDS",
    "ConvFirstBlock",
    "MBConvBlock",
    "MLPBlock",
    "block_stack",
    "grouped_channels",
    "grouped_conv",
    "grouped_convs",
    "is_grouped_conv",
    "make_block",
]
