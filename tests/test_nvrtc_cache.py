"""The NVRTC binary cache (``tilewise.runtime.nvrtc_cache``) with PyTorch's compile and load
helpers replaced by fakes: a binary compiled once is loaded by later "processes", a changed
source or GPU compiles afresh, damaged files are rebuilt, and the switch turns it off."""

from __future__ import annotations

import os

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

    def compile_fn(source, entry, compute_capability=None):
        compiles.append((source, entry))
        arch = (compute_capability or "own").encode()
        return b"CUBIN\n\x00" + arch + source.encode(), entry  # a newline and a NUL, as cubins

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
    assert first.binary == second.binary == b"CUBIN\n\x00ownsrc A"
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
    assert len(compiles) == 2 and kernel.binary == b"CUBIN\n\x00ownsrc A"
    assert path.read_bytes() == b"k\nCUBIN\n\x00ownsrc A"  # whole again


def test_a_named_target_is_cached_under_its_own_key(fakes):
    """Kernels compiled for an architecture other than the device's own (``sm_90a`` for the
    warpgroup MMAs) are cached too, apart from the same source built for the device."""
    compiles, _, _ = fakes
    own = nvrtc_cache.compile_kernel("src A", "k")
    first = nvrtc_cache.compile_kernel("src A", "k", compute_capability="90a")
    second = nvrtc_cache.compile_kernel("src A", "k", compute_capability="90a")
    assert len(compiles) == 2
    assert own.binary.endswith(b"ownsrc A") and first.binary == second.binary
    assert second.binary.endswith(b"90asrc A")
    plain = nvrtc_cache.binary_path("src A", "k", (9, 0))
    assert nvrtc_cache.binary_path("src A", "k", (9, 0), "90a") != plain
    assert nvrtc_cache.binary_path("src A", "k", (9, 0), None) == plain


def test_switched_off_it_compiles_through_pytorch(fakes, monkeypatch):
    compiles, _, _ = fakes
    through = []

    def pytorch_compile(source, entry, compute_capability=None):
        through.append((entry, compute_capability))
        return "k"

    monkeypatch.setattr(torch.cuda, "_compile_kernel", pytorch_compile, raising=False)
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "0")
    assert nvrtc_cache.compile_kernel("src A", "k") == "k"
    assert nvrtc_cache.compile_kernel("src A", "k", compute_capability="90a") == "k"
    assert through == [("k", None), ("k", "90a")] and not compiles


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


def test_helpers_rejecting_a_target_fall_back_to_pytorch_with_it(fakes, monkeypatch):
    """A private compile helper that takes no target: PyTorch's public path compiles for the
    named target, and the cache is off for the rest of the process."""
    through = []

    def pytorch_compile(source, entry, compute_capability=None):
        through.append((entry, compute_capability))
        return "k"

    monkeypatch.setattr(torch.cuda, "_compile_kernel", pytorch_compile, raising=False)
    monkeypatch.setattr(
        nvrtc_cache, "_helpers", lambda: (lambda s, e: (b"CUBIN", e), lambda b, n: {n[0]: "x"})
    )
    assert nvrtc_cache.compile_kernel("src A", "k", compute_capability="90a") == "k"
    assert through == [("k", "90a")] and not nvrtc_cache.enabled()


def _binary(tmp_path, name: str, size: int, age: float):
    path = tmp_path / "nvrtc" / f"{name}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = 1_000_000 - age
    os.utime(path, (stamp, stamp))
    return path


def test_trim_removes_the_least_recently_used_down_to_three_quarters(fakes, tmp_path):
    old, mid, new = (_binary(tmp_path, n, 100, a) for n, a in (("a", 30), ("b", 20), ("c", 10)))
    assert nvrtc_cache.total_bytes() == 300
    assert nvrtc_cache.trim(300) == 0  # at the cap: nothing goes
    assert nvrtc_cache.trim(250) == 2  # down to 187 bytes: the two oldest go
    assert not old.exists() and not mid.exists() and new.exists()


def test_a_store_trims_and_a_load_keeps_its_file(fakes, tmp_path, monkeypatch):
    """Past ``TILEWISE_NVRTC_CACHE_MB`` a store removes the least recently used binaries; a load
    marks its file used, so a kernel still in use outlives one that is not."""
    compiles, _, _ = fakes
    nvrtc_cache.compile_kernel("src A", "k")
    nvrtc_cache.compile_kernel("src B", "k")
    path_a = nvrtc_cache.binary_path("src A", "k", (9, 0))
    path_b = nvrtc_cache.binary_path("src B", "k", (9, 0))
    for path in (path_a, path_b):
        os.utime(path, (1000, 1000))
    nvrtc_cache.compile_kernel("src A", "k")  # loaded: A is the most recently used now
    assert len(compiles) == 2 and path_a.stat().st_mtime > 1000
    size = path_a.stat().st_size
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE_MB", str(2.9 * size / 2**20))
    nvrtc_cache.compile_kernel("src C", "k")  # 3 files over a cap of 2.9: down to <= 2.175
    path_c = nvrtc_cache.binary_path("src C", "k", (9, 0))
    assert path_a.exists() and not path_b.exists() and path_c.exists()
    assert nvrtc_cache.binaries() == sorted([path_a, path_c])


def test_clear_removes_every_binary(fakes):
    nvrtc_cache.compile_kernel("src A", "k")
    nvrtc_cache.compile_kernel("src B", "k")
    assert nvrtc_cache.clear() == 2 and nvrtc_cache.binaries() == []


def test_on_by_default_and_off_with_zero(monkeypatch):
    monkeypatch.setattr(nvrtc_cache, "_broken", False)
    monkeypatch.delenv("TILEWISE_NVRTC_CACHE", raising=False)
    assert nvrtc_cache.enabled()
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "0")
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


@pytest.mark.gpu
def test_grouped_conv_kernels_run_from_disk(monkeypatch, tmp_path):
    """The grouped conv's NVRTC kernels (the warpgroup-MMA ones, built for sm_90a, included where
    the GPU takes them): compiled once into the cache, then, with the in-process kernels
    forgotten and compiling made impossible, loaded from disk; both runs give the same answers,
    and those match PyTorch's."""
    from tilewise.ops import gconv_cuda

    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWISE_NVRTC_CACHE", "1")
    monkeypatch.setattr(nvrtc_cache, "_broken", False)
    x = torch.randn(3, 64, 19, 23, device="cuda", dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 8, 7, 7, device="cuda", dtype=torch.float16) / 20
    ref = torch.nn.functional.conv2d(x, w, padding=3, groups=8)
    tiles = gconv_cuda.candidates(64, 7, 7, tma=True, wgmma=gconv_cuda.wgmma_usable(x))
    wg_tiles = gconv_cuda.wgrad_candidates(64, 7, 7)
    wg_tiles = [t for t in wg_tiles if t.wgmma][:1] + [gconv_cuda.WGRAD_TILES[0]]
    assert tiles

    def run() -> list[torch.Tensor]:
        outs = []
        for tile in tiles:
            out = torch.full_like(x, float("nan"))
            outs.append(gconv_cuda.fprop(x, w, None, out, 3, 3, tile))
        for tile in wg_tiles:
            outs.append(gconv_cuda.wgrad(x, x, 7, 7, 3, 3, False, tile)[0])
        torch.cuda.synchronize()
        return outs

    gconv_cuda._kernel.cache_clear()
    try:
        first = run()
        assert list((tmp_path / "nvrtc").glob("*.bin")), "nothing written to the cache"

        def no_compile(*args, **kwargs):
            raise AssertionError("compiled although the binary is on disk")

        real_load = nvrtc_cache._helpers()[1]
        monkeypatch.setattr(nvrtc_cache, "_helpers", lambda: (no_compile, real_load))
        monkeypatch.setattr(torch.cuda, "_compile_kernel", no_compile)
        gconv_cuda._kernel.cache_clear()
        second = run()
        assert nvrtc_cache.enabled()
    finally:
        gconv_cuda._kernel.cache_clear()
    names = [t.name for t in tiles] + [f"wgrad {t.name}" for t in wg_tiles]
    if gconv_cuda.wgmma_usable(x):
        assert any(t.wgmma for t in tiles), "no warpgroup-MMA tile among the candidates"
    for name, a, b in zip(names, first, second, strict=True):
        if name.startswith("wgrad"):  # fp32 atomics: the order of the sums may differ
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2, msg=name)
        else:
            assert torch.equal(a, b), name
            torch.testing.assert_close(a, ref, atol=2e-2, rtol=2e-2, msg=name)
