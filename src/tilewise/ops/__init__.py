"""Kernels and host launch code, one module per op family."""
