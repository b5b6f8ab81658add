"""Keeping PyTorch's CUDA state usable after a CUDA-graph capture fails (shared by the capture
API and the autotuner, which times candidates by graph replay)."""

from __future__ import annotations

import contextlib

import torch


def repair_after_failed_capture(device: torch.device | None = None) -> None:
    """A capture that fails inside CUDA leaves PyTorch's CUDA generator in capture mode (the next
    ``torch.randn`` raises "Offset increment outside graph capture"); one clean capture resets
    it. Safe to call when nothing is wrong."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    with contextlib.suppress(RuntimeError), torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            torch.empty(1, device=device).zero_()
        finally:
            graph.capture_end()
