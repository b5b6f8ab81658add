"""Shared judging helpers: the three-way tolerance rule and device/dtype parametrization."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

CPU_DTYPES = [torch.float32, torch.float16]  # the interpreter gets bf16 wrong

# (device, dtype) cases: tiny shapes through the interpreter on CPU; all dtypes on the GPU.
DEVICE_DTYPES = [pytest.param("cpu", dt, id=f"cpu-{str(dt)[6:]}") for dt in CPU_DTYPES] + [
    pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}", marks=pytest.mark.gpu)
    for dt in (torch.float32, torch.float16, torch.bfloat16)
]

ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def assert_three_way(
    out, out_torch, ref64, atol: float, what: str, seed: int | None = None, ulps: float = 0.0
):
    """``|out - ref| <= 2 |out_torch - ref| + atol`` elementwise, ``ref`` computed in fp64.

    ``ulps`` widens ``atol`` by that many units in the last place of ``out``'s dtype at ``|ref|``
    (``ulps * eps * |ref|``): a correctly rounded half-precision output can sit half an ulp from
    the exact value where PyTorch's happens to land closer, which an absolute ``atol`` does not
    cover for large outputs. NaN in ``ref`` must be NaN in ``out``; NaN anywhere else fails.
    """
    assert out.shape == ref64.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref64.shape)}"
    o, t, r = out.detach().double().cpu(), out_torch.detach().double().cpu(), ref64.double().cpu()
    ref_nan = torch.isnan(r)
    assert torch.equal(torch.isnan(o), ref_nan), f"{what}: NaN pattern differs (seed {seed})"
    finite = ~ref_nan
    err = (o - r).abs()[finite]
    bound = 2 * (t - r).abs() + atol
    if ulps:
        bound = bound + ulps * torch.finfo(out.dtype).eps * r.abs()
    bound = bound[finite]
    bad = ~(err <= bound)
    if bad.any():
        worst = (err - bound).argmax()
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements outside the three-way bound; "
            f"worst err {err[worst].item():.3e} > bound {bound[worst].item():.3e} (seed {seed})"
        )


def leaf(t: torch.Tensor, dtype=None) -> torch.Tensor:
    """A fresh leaf copy that requires grad (optionally cast)."""
    return t.detach().to(dtype or t.dtype).clone().requires_grad_(True)


@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """PyTorch's deterministic mode for the block (tilewise's reductions then avoid atomics)."""
    was, was_warn = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)


def fake_gpu_autotuner(monkeypatch, tmp_path, bench: Callable) -> None:
    """The autotuner as on a CUDA machine ("Fake GPU", its cache in ``tmp_path``, never capturing),
    timing with ``bench(fn)``; its in-memory cache cleared."""
    from tilewise.runtime import autotune

    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TILEWISE_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune, "_tunable", lambda d: True)
    monkeypatch.setattr(autotune, "_device_name", lambda d: "Fake GPU")
    monkeypatch.setattr(autotune, "_capturing", lambda d: False)
    monkeypatch.setattr(autotune, "_bench", bench)
    autotune.clear_memory_cache()


@contextlib.contextmanager
def allow_tf32(value: bool) -> Iterator[None]:
    """PyTorch's fp32-matmul TF32 switch set to ``value`` inside the block, restored after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = value
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def failed_import(module: str, **env: str) -> str:
    """The stderr of importing ``module`` in a fresh interpreter with ``env`` added to the
    environment, asserting the import failed (a switch read at import that rejects a value)."""
    out = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
    )
    assert out.returncode != 0, out.stdout[-500:]
    return out.stderr


def fake_nvrtc(monkeypatch) -> tuple[list, list]:
    """The grouped conv's NVRTC compiles and launches faked on the CPU, the disk cache off and
    the in-process kernels forgotten: returns (compiles as (entry, source, target), launches'
    keyword args)."""
    from tilewise.ops import gconv_cuda, gconv_slots

    compiles, launches = [], []

    class FakeKernel:
        func = None

        def set_shared_memory_config(self, nbytes):
            pass

        def __call__(self, **launch):
            launches.append(launch)

    def fake_compile(src, name, compute_capability=None):
        compiles.append((name, src, compute_capability))
        return FakeKernel()

    gconv_cuda._kernel.cache_clear()
    gconv_slots.kernel.cache_clear()
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "0")  # compiles are counted (no disk cache)
    monkeypatch.setattr(torch.cuda, "_compile_kernel", fake_compile, raising=False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gconv_cuda, "num_sms", lambda device: 132)
    return compiles, launches
