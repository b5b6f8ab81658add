"""The NVRTC binary cache (``tilewise.runtime.nvrtc_cache``) with PyTorch's compile and load
helpers replaced by fakes: a binary compiled once is loaded by later "processes", a changed
source or GPU compiles afresh, damaged files are rebuilt, and the switch turns it off."""

from __future__ import annotations

import pytest
import torch

from tilewise.runtime import nvrtc_cache


class _Kernel:
    def __init__(self, binary: bytes) -> None:
        self.binary = binary


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    """(compiles, loads) lists; the cache under a fresh directory; compute capability 9.0."""
    compiles, loads = [], []

    def compile_fn(source, entry):
        compiles.append((source, entry))
        return b"CUBIN\n\x00" + source.encode(), entry  # a newline and a NUL inside, as cubins

    def load_fn(binary, names):
        loads.append(binary)
        if not binary.startswith(b"CUBIN"):
            raise RuntimeError("CUDA error: device kernel image is invalid")
        return {names[0]: _Kernel(binary)}

    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "1")
    monkeypatch.setattr(nvrtc_cache, "_broken", False)
    monkeypatch.setattr(nvrtc_cache, "_helpers", lambda: (compile_fn, load_fn))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability[0])
    return compiles, loads, capability


def test_a_compiled_binary_is_loaded_next_time(fakes, tmp_path):
    compiles, loads, _ = fakes
    first = nvrtc_cache.compile_kernel("src A", "k")
    second = nvrtc_cache.compile_kernel("src A", "k")  # as a new process would: from disk
    assert len(compiles) == 1 and len(loads) == 2
    assert first.binary == second.binary == b"CUBIN\n\x00src A"
    assert len(list((tmp_path / "nvrtc").glob("k-*.bin"))) == 1


def test_source_entry_and_gpu_each_change_the_file(fakes):
    compiles, _, capability = fakes
    nvrtc_cache.compile_kernel("src A", "k")
    nvrtc_cache.compile_kernel("src B", "k")
    nvrtc_cache.compile_kernel("src A", "k2")
    capability[0] = (8, 0)
    kernel = nvrtc_cache.compile_kernel("src A", "k")
    assert len(compiles) == 4 and kernel.binary.endswith(b"src A")
    assert nvrtc_cache.binary_path("s", "k", (9, 0)) != nvrtc_cache.binary_path("s", "k", (9, 1))


@pytest.mark.parametrize("damage", [b"", b"k", b"k\n", b"k\nGARBAGE"])
def test_a_damaged_file_is_compiled_again_and_rewritten(fakes, damage):
    compiles, _, _ = fakes
    nvrtc_cache.compile_kernel("src A", "k")
    path = nvrtc_cache.binary_path("src A", "k", (9, 0))
    path.write_bytes(damage)
    kernel = nvrtc_cache.compile_kernel("src A", "k")
    assert len(compiles) == 2 and kernel.binary == b"CUBIN\n\x00src A"
    assert path.read_bytes() == b"k\nCUBIN\n\x00src A"  # whole again


def test_switched_off_it_compiles_through_pytorch(fakes, monkeypatch):
    compiles, _, _ = fakes
    through = []
    monkeypatch.setattr(
        torch.cuda, "_compile_kernel", lambda s, e: through.append(e) or "k", raising=False
    )
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "0")
    assert nvrtc_cache.compile_kernel("src A", "k") == "k"
    assert through == ["k"] and not compiles


def test_compile_errors_still_raise(fakes, monkeypatch):
    def failing(source, entry):
        raise RuntimeError("Kernel compilation failed:\nerror: ...")

    monkeypatch.setattr(nvrtc_cache, "_helpers", lambda: (failing, None))
    with pytest.raises(RuntimeError, match="compilation failed"):
        nvrtc_cache.compile_kernel("bad", "k")
    assert not list(nvrtc_cache.cache_dir().glob("nvrtc/*"))  # nothing stored


def test_an_unwritable_cache_dir_only_logs(fakes, monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(blocker))
    nvrtc_cache._log_once.cache_clear()
    with caplog.at_level("WARNING", logger=nvrtc_cache.log.name):
        kernel = nvrtc_cache.compile_kernel("src A", "k")
    assert kernel.binary.endswith(b"src A")
    assert any("not written" in r.message for r in caplog.records)


def test_helpers_of_another_signature_fall_back_to_pytorch(fakes, monkeypatch):
    """The helpers are private PyTorch API: if they change, kernels still compile (uncached)."""
    through = []
    monkeypatch.setattr(
        torch.cuda, "_compile_kernel", lambda s, e: through.append(e) or "k", raising=False
    )
    monkeypatch.setattr(nvrtc_cache, "_helpers", lambda: (lambda source: b"", None))
    assert nvrtc_cache.compile_kernel("src A", "k") == "k"
    monkeypatch.setattr(nvrtc_cache, "_broken", False)
    monkeypatch.setattr(
        nvrtc_cache, "_helpers", lambda: (lambda s, e: (b"CUBIN", e), lambda binary: None)
    )
    assert nvrtc_cache.compile_kernel("src A", "k") == "k"
    assert through == ["k", "k"]
    assert not nvrtc_cache.enabled()  # off for the rest of the process: no double compiles


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("TILEWISE_NVRTC_CACHE", raising=False)
    assert not nvrtc_cache.enabled()


_ADD_ONE = r"""
extern "C" __global__ void tw_add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""


@pytest.mark.gpu
def test_a_real_kernel_is_loaded_from_disk_and_runs(monkeypatch, tmp_path):
    """On the GPU, through PyTorch's real helpers: the first call compiles and writes the
    binary; the second, with compiling made impossible, loads it, and both kernels run."""
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "1")
    monkeypatch.setattr(nvrtc_cache, "_broken", False)
    assert nvrtc_cache._helpers() is not None, "PyTorch's NVRTC helpers are gone"
    first = nvrtc_cache.compile_kernel(_ADD_ONE, "tw_add_one")
    capability = torch.cuda.get_device_capability(torch.cuda.current_device())
    path = nvrtc_cache.binary_path(_ADD_ONE, "tw_add_one", capability)
    assert path.is_file() and path.stat().st_size > 100
    assert nvrtc_cache.enabled()  # the helpers took the expected arguments

    real_load = nvrtc_cache._helpers()[1]

    def no_compile(source, entry):
        raise AssertionError("compiled although the binary is on disk")

    monkeypatch.setattr(nvrtc_cache, "_helpers", lambda: (no_compile, real_load))
    # compile_kernel falls back to PyTorch's compile on unexpected errors: close that door too
    monkeypatch.setattr(torch.cuda, "_compile_kernel", no_compile)
    second = nvrtc_cache.compile_kernel(_ADD_ONE, "tw_add_one")
    assert nvrtc_cache.enabled()  # no fallback switched the cache off on the way
    x = torch.full((1000,), float("nan"), device="cuda")
    x.copy_(torch.arange(1000, dtype=torch.float32))
    for kernel in (first, second):
        kernel(grid=(4, 1, 1), block=(256, 1, 1), args=[x, 1000])
    torch.cuda.synchronize()
    torch.testing.assert_close(x.cpu(), torch.arange(1000, dtype=torch.float32) + 2)
