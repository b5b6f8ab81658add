"""tilewise: Triton kernels and a low-overhead runtime for PyTorch convnets and MLPs."""

from tilewise import functional, nn
from tilewise.functional import bias_act, grouped_conv2d, layer_norm, linear
from tilewise.nn import transform
from tilewise.runtime import CaptureError, capture_inference, capture_train_step

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "__version__",
    "bias_act",
    "capture_inference",
    "capture_train_step",
    "functional",
    "grouped_conv2d",
    "layer_norm",
    "linear",
    "nn",
    "transform",
]
