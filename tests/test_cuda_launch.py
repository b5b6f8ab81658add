"""The lean NVRTC launcher: the driver call and its argument buffer, checked on the CPU through a
fake driver library that reads the argument values back the way cuLaunchKernel does."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tilewise.runtime.cuda_launch import Launcher, PlannedLaunch, _LaunchAttribute, _LaunchConfig


class FakeDriver:
    """Records each cuLaunchKernel call, dereferencing kernelParams by the signature."""

    def __init__(self, signature: str, result: int = 0) -> None:
        self.signature, self.result, self.calls = signature, result, []

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: N802
        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        values = []
        for i, kind in enumerate(self.signature):
            if kind == "t":  # a by-value struct: its first 16 bytes, from the host address given
                values.append(ctypes.string_at(ptrs[i], 16))
                continue
            ctype = ctypes.c_void_p if kind == "p" else ctypes.c_int
            values.append(ctype.from_address(ptrs[i]).value)
        self.calls.append(
            dict(func=func.value, grid=(gx, gy, gz), block=(bx, by, bz), smem=smem,
                 stream=stream.value, values=values, extra=extra)
        )  # fmt: skip
        return self.result


class Kernel:
    func = ctypes.c_void_p(0xF00D)


def test_arguments_reach_the_driver_as_pytorch_passes_them():
    """Tensors as their data pointers, ints as 32-bit ints (negative paddings too), grid, block,
    shared memory, the raw stream; the reused buffer holds each call's own values."""
    sig = "ppii"
    drv = FakeDriver(sig)
    launch = Launcher(Kernel(), sig, lib=drv)
    a, b = torch.zeros(4), torch.ones(8)
    launch((3, 2, 1), (128, 1, 1), [a, b, -1, 7], 4096, 0x1234)
    launch((5, 1, 1), (64, 1, 1), [b, a, 2**31 - 1, 0], 0, 0x99)
    first, second = drv.calls
    values = [a.data_ptr(), b.data_ptr(), -1, 7]
    assert first == dict(func=0xF00D, grid=(3, 2, 1), block=(128, 1, 1), smem=4096,
                         stream=0x1234, values=values, extra=None)  # fmt: skip
    assert second["values"] == [b.data_ptr(), a.data_ptr(), 2**31 - 1, 0]
    assert second["grid"] == (5, 1, 1) and second["stream"] == 0x99


def test_struct_arguments_pass_their_host_bytes():
    """A ``t`` argument (a tensor map) reaches the driver as a pointer to its own bytes, per
    call, between ordinary arguments."""

    class Struct:
        def __init__(self, fill: bytes) -> None:
            self.raw = ctypes.create_string_buffer(fill * 16)
            self.address = ctypes.addressof(self.raw)

    sig = "pti"
    drv = FakeDriver(sig)
    launch = Launcher(Kernel(), sig, lib=drv)
    a = torch.zeros(2)
    one, two = Struct(b"\x01"), Struct(b"\x02")
    launch((1, 1, 1), (32, 1, 1), [a, one, 5], 0, 0)
    launch((1, 1, 1), (32, 1, 1), [a, two, 6], 0, 0)
    assert drv.calls[0]["values"] == [a.data_ptr(), b"\x01" * 16, 5]
    assert drv.calls[1]["values"] == [a.data_ptr(), b"\x02" * 16, 6]


def test_a_planned_launch_writes_its_scalars_once_and_its_pointers_per_call():
    """``PlannedLaunch``: the grid, block, shared memory and ints given when it is made reach the
    driver on every call, beside each call's own pointers and tensor maps; a wrong count of
    either raises ``ValueError`` naming the argument."""

    class Struct:
        def __init__(self, fill: bytes) -> None:
            self.raw = ctypes.create_string_buffer(fill * 16)
            self.address = ctypes.addressof(self.raw)

    sig = "pipit"
    drv = FakeDriver(sig)
    plan = PlannedLaunch(Kernel(), sig, (4, 2, 1), (96, 1, 1), 512, [-3, 11], lib=drv)
    a, b, c = torch.zeros(2), torch.zeros(3), torch.zeros(5)
    one, two = Struct(b"\x01"), Struct(b"\x02")
    plan.run([a, b, one], 0x10)
    plan.run([c, a, two], 0x20)
    first, second = drv.calls
    assert first["values"] == [a.data_ptr(), -3, b.data_ptr(), 11, b"\x01" * 16]
    assert second["values"] == [c.data_ptr(), -3, a.data_ptr(), 11, b"\x02" * 16]
    assert first["grid"] == second["grid"] == (4, 2, 1) and first["block"] == (96, 1, 1)
    assert (first["smem"], first["stream"], second["stream"]) == (512, 0x10, 0x20)
    with pytest.raises(ValueError, match="'live'"):
        plan.run([a, b], 0)
    with pytest.raises(ValueError, match="'scalars'"):
        PlannedLaunch(Kernel(), sig, (1, 1, 1), (32, 1, 1), 0, [1], lib=drv)


class FakeDriverEx(FakeDriver):
    """Also has cuLaunchKernelEx: records the launch config it is given and its attributes."""

    def cuLaunchKernelEx(self, config, func, params, extra):  # noqa: N802
        cfg = ctypes.cast(config, ctypes.POINTER(_LaunchConfig)).contents
        attrs = [(cfg.attrs[i].id, cfg.attrs[i].value[0]) for i in range(cfg.num_attrs)]
        self.calls.append(
            dict(grid=tuple(cfg.grid), block=tuple(cfg.block), smem=cfg.shared_mem,
                 stream=cfg.stream, attrs=attrs, values=ctypes.cast(params, ctypes.c_void_p).value)
        )  # fmt: skip
        self.params = params
        return self.result


def test_dependent_launches_go_through_launch_kernel_ex():
    """``dependent=True``: cuLaunchKernelEx with the grid, block, shared memory and stream of
    the call and one attribute, programmatic stream serialization (6) allowed (1); the same
    argument buffer as cuLaunchKernel's."""
    drv = FakeDriverEx("pi")
    launch = Launcher(Kernel(), "pi", lib=drv, dependent=True)
    a = torch.zeros(3)
    launch((7, 2, 1), (256, 1, 1), [a, 9], 1024, 0xABC)
    launch((1, 1, 1), (32, 1, 1), [a, 3], 0, 0x5)
    first, second = drv.calls
    assert first["grid"] == (7, 2, 1) and first["block"] == (256, 1, 1)
    assert first["smem"] == 1024 and first["stream"] == 0xABC and first["attrs"] == [(6, 1)]
    assert second["stream"] == 0x5 and second["grid"] == (1, 1, 1)
    ptrs = ctypes.cast(drv.params, ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.c_void_p.from_address(ptrs[0]).value == a.data_ptr()
    assert ctypes.c_int.from_address(ptrs[1]).value == 3
    # the layouts of cuda.h's CUlaunchAttribute and CUlaunchConfig on a 64-bit host
    assert ctypes.sizeof(_LaunchAttribute) == 72 and _LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(_LaunchConfig) == 56 and _LaunchConfig.shared_mem.offset == 24
    assert (_LaunchConfig.stream.offset, _LaunchConfig.attrs.offset) == (32, 40)
    assert _LaunchConfig.num_attrs.offset == 48


def test_a_refused_dependent_launch_is_made_plainly_from_then_on(monkeypatch):
    """A driver that refuses the attribute (CUDA_ERROR_NOT_SUPPORTED) gets the same launch
    through cuLaunchKernel, and every later one too; a refusal whose cause is elsewhere (the
    plain launch fails as well) still raises."""

    class Refusing(FakeDriverEx):
        def cuLaunchKernelEx(self, config, func, params, extra):  # noqa: N802
            self.refused = getattr(self, "refused", 0) + 1
            return 801

    drv = Refusing("pi")
    launch = Launcher(Kernel(), "pi", lib=drv, dependent=True)
    a = torch.zeros(2)
    launch((2, 1, 1), (64, 1, 1), [a, 4], 0, 0x7)
    launch((3, 1, 1), (64, 1, 1), [a, 5], 0, 0x7)
    assert drv.refused == 1 and not launch.dependent
    assert [c["values"] for c in drv.calls] == [[a.data_ptr(), 4], [a.data_ptr(), 5]]
    assert drv.calls[0]["grid"] == (2, 1, 1) and drv.calls[0]["stream"] == 0x7
    failing = Refusing("pi", result=700)  # the plain launch fails too: that error is raised
    seen = []
    monkeypatch.setattr(torch.cuda._utils, "_check_cuda", lambda r: seen.append(r) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        Launcher(Kernel(), "pi", lib=failing, dependent=True)((1, 1, 1), (32, 1, 1), [a, 1], 0, 0)
    assert seen == [700]


def test_a_driver_without_launch_kernel_ex_launches_plainly(monkeypatch):
    """``lean_launcher(..., dependent=True)`` falls back to a plain launcher where the driver
    has no cuLaunchKernelEx."""
    from tilewise.runtime import cuda_launch

    drv = FakeDriver("i")
    with pytest.raises(AttributeError):
        Launcher(Kernel(), "i", lib=drv, dependent=True)
    monkeypatch.setattr(torch.cuda._utils, "_get_gpu_runtime_library", lambda: drv, raising=False)
    cuda_launch.lean_launcher.cache_clear()
    try:
        launcher = cuda_launch.lean_launcher(Kernel(), "i", True)
        assert launcher is not None and not launcher.dependent
    finally:
        cuda_launch.lean_launcher.cache_clear()


def test_bad_signatures_and_argument_counts_are_refused():
    with pytest.raises(ValueError, match="'signature'"):
        Launcher(Kernel(), "pq", lib=FakeDriver("pq"))
    launch = Launcher(Kernel(), "pi", lib=FakeDriver("pi"))
    with pytest.raises(ValueError, match="'args'"):
        launch((1, 1, 1), (32, 1, 1), [torch.zeros(1)], 0, 0)


def test_a_driver_error_raises(monkeypatch):
    drv = FakeDriver("i", result=700)
    seen = []
    monkeypatch.setattr(torch.cuda._utils, "_check_cuda", lambda r: seen.append(r) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        Launcher(Kernel(), "i", lib=drv)((1, 1, 1), (32, 1, 1), [1], 0, 0)
    assert seen == [700]


class _CudaLooking(torch.Tensor):
    """A CPU tensor that passes PyTorch's launcher's device check (its pointer is only read)."""

    @property
    def is_cuda(self):
        return True


def test_same_driver_call_as_pytorchs_launcher(monkeypatch):
    """PyTorch's ``_CudaKernel.__call__`` and ``Launcher`` hand the driver the same function,
    grid, block, shared memory, stream and argument values (read back from kernelParams)."""
    cuda_kernel = pytest.importorskip("torch.cuda._utils")._CudaKernel
    sig = "pppiiii"
    drv = FakeDriver(sig)
    monkeypatch.setattr(torch.cuda._utils, "_get_gpu_runtime_library", lambda: drv)

    class Stream:
        _as_parameter_ = ctypes.c_void_p(0xBEEF)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: Stream())
    theirs = cuda_kernel(ctypes.c_void_p(0xF00D), ctypes.c_void_p(0))
    tensors = [torch.randn(3).as_subclass(_CudaLooking) for _ in range(3)]
    args = [*tensors, 5, -2, 0, 2**31 - 1]
    theirs(grid=(7, 3, 1), block=(256, 1, 1), args=args, shared_mem=1024)
    Launcher(theirs, sig, lib=drv)((7, 3, 1), (256, 1, 1), args, 1024, 0xBEEF)
    pytorch_call, lean_call = drv.calls
    assert lean_call == pytorch_call
