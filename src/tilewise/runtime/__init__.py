"""Dispatch between kernels and references; (later) CUDA-graph capture and config caches."""
