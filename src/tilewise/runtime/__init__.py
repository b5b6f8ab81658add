"""Dispatch between kernels and references, config caches, and whole-step CUDA-graph capture."""

_CAPTURE = ("CaptureError", "CapturedInference", "CapturedTrainStep")
_CAPTURE += ("capture_inference", "capture_train_step")


def __getattr__(name: str):
    # Lazy, so importing tilewise.runtime.dispatch does not pull in tilewise.optim (import cycle).
    if name in _CAPTURE:
        from tilewise.runtime import capture

        return getattr(capture, name)
    raise AttributeError(f"module 'tilewise.runtime' has no attribute {name!r}")
