"""A lean launcher for kernels compiled by ``torch.cuda._compile_kernel`` (NVRTC).

PyTorch's ``_CudaKernel.__call__`` builds a ctypes object per argument on every call and finds
the current stream through a Python ``Stream`` object. For the grouped conv's 18-argument
kernels that is most of the host time of a launch (fprop: 51.8 us of host per call on the H100
machine against cuDNN's 24.9 us, ``scripts/timing_check.py``, session 6). ``Launcher`` keeps one
argument buffer per kernel and signature, writes the values into it and calls ``cuLaunchKernel``
on the raw current stream: the same driver call with the same argument values.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

#: ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (cuda.h)
_PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: what ``cuLaunchKernelEx`` returns where the attribute is not supported: CUDA_ERROR_INVALID_VALUE
#: and CUDA_ERROR_NOT_SUPPORTED; the plain launch that follows raises if the cause was elsewhere
_REFUSED_ATTRIBUTE = (1, 801)


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (``cuLaunchKernelEx``)."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


def max_active_clusters(
    kernel: Any, grid: Sequence[int], block: Sequence[int], shared_mem: int, lib: Any = None
) -> int | None:
    """How many thread-block clusters of ``kernel`` (its compiled cluster shape) the GPU holds
    at once for this launch shape (``cuOccupancyMaxActiveClusters``), or None where the driver
    does not say."""
    lib = lib if lib is not None else torch.cuda._utils._get_gpu_runtime_library()
    cfg = _LaunchConfig(num_attrs=0)
    cfg.grid[:] = tuple(grid)[:3]
    cfg.block[:] = tuple(block)[:3]
    cfg.shared_mem = shared_mem
    most = ctypes.c_int()
    try:
        result = lib.cuOccupancyMaxActiveClusters(
            ctypes.byref(most), kernel.func, ctypes.byref(cfg)
        )
    except AttributeError:  # a driver without the call
        return None
    return most.value if result == 0 else None


def max_active_blocks(kernel: Any, threads: int, shared_mem: int, lib: Any = None) -> int | None:
    """How many CTAs of ``threads`` threads and ``shared_mem`` bytes of dynamic shared memory one
    SM holds at once for ``kernel`` (``cuOccupancyMaxActiveBlocksPerMultiprocessor``: its
    registers, shared memory and threads together), or None where the driver does not say."""
    lib = lib if lib is not None else torch.cuda._utils._get_gpu_runtime_library()
    most = ctypes.c_int()
    try:
        result = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(most), kernel.func, ctypes.c_int(threads), ctypes.c_size_t(shared_mem)
        )
    except AttributeError:  # a driver without the call
        return None
    return most.value if result == 0 else None


class Launcher:
    """``cuLaunchKernel`` for one compiled kernel with a fixed argument signature.

    ``signature`` has one letter per kernel argument: ``p`` for a tensor (its data pointer),
    ``i`` for a 32-bit int and ``t`` for a by-value struct given as an object with an ``address``
    of its host bytes (``runtime.tma.TensorMap``). ``lib`` is the CUDA driver library (default:
    PyTorch's handle). ``dependent=True`` launches with programmatic stream serialization
    (``cuLaunchKernelEx``): the kernel may start while the one before it on the stream drains, so
    it must call ``griddepcontrol.wait`` before touching global memory (the grouped conv's
    row-pair kernel does, ``grid_dependency_sync``).
    """

    def __init__(
        self, kernel: Any, signature: str, lib: Any = None, dependent: bool = False
    ) -> None:
        if not signature or set(signature) - {"p", "i", "t"}:
            raise ValueError(f"argument 'signature' must be letters p/i/t, got {signature!r}")
        self.func = kernel.func
        self.lib = lib if lib is not None else torch.cuda._utils._get_gpu_runtime_library()
        self.signature = signature
        self.dependent = dependent
        if dependent:
            self._attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
            self._attr.value[0] = 1  # programmaticStreamSerializationAllowed
            self._config = _LaunchConfig(attrs=ctypes.pointer(self._attr), num_attrs=1)
            self._launch_ex = self.lib.cuLaunchKernelEx  # AttributeError: no such driver call
        self._values = [ctypes.c_void_p() if k == "p" else ctypes.c_int() for k in signature]
        self._params = (ctypes.c_void_p * len(signature))(
            *[ctypes.addressof(v) for v in self._values]
        )
        self._lock = threading.Lock()  # the buffer is shared; the driver copies it per launch

    def __call__(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
        shared_mem: int,
        stream: int,
    ) -> None:
        if len(args) != len(self.signature):
            raise ValueError(
                f"argument 'args' has {len(args)} values, the signature {self.signature!r} "
                f"{len(self.signature)}"
            )
        with self._lock:
            for i, (value, kind, arg) in enumerate(
                zip(self._values, self.signature, args, strict=True)
            ):
                if kind == "t":  # the driver copies the struct from its host address
                    self._params[i] = arg.address
                else:
                    value.value = arg.data_ptr() if kind == "p" else int(arg)
            result = self._fire(grid, block, shared_mem, stream)
        if result != 0:
            torch.cuda._utils._check_cuda(result)  # raises with the driver's message

    def _fire(self, grid: Sequence[int], block: Sequence[int], shared_mem: int, stream: int) -> int:
        """The driver call with the argument buffer as written (under ``_lock``); its result."""
        result = None
        if self.dependent:
            cfg = self._config
            cfg.grid[:] = grid[:3]
            cfg.block[:] = block[:3]
            cfg.shared_mem = shared_mem
            cfg.stream = stream
            result = self._launch_ex(ctypes.byref(cfg), self.func, self._params, None)
            if result in _REFUSED_ATTRIBUTE:  # this driver or GPU refuses the attribute:
                self.dependent = False  # plain launches from now on (a kernel that waits
                log.info(  # with nothing to wait for runs as before)
                    "tilewise: programmatic dependent launch refused (CUDA error %d); "
                    "launching plainly",
                    result,
                )
        if not self.dependent:
            result = self.lib.cuLaunchKernel(
                self.func,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem,
                ctypes.c_void_p(stream),
                self._params,
                None,
            )
        return result


class PlannedLaunch(Launcher):
    """One launch of one problem, planned once: its grid, block, shared memory and scalar
    (``i``) arguments are written into this launcher's own buffer when it is made, so a call
    writes only the tensor pointers and tensor maps. For the per-problem plans of ops whose host
    time matters (the grouped conv uncaptured: ~20 arguments written per launch cost more host
    time than the driver call)."""

    def __init__(
        self,
        kernel: Any,
        signature: str,
        grid: Sequence[int],
        block: Sequence[int],
        shared_mem: int,
        scalars: Sequence[int],
        dependent: bool = False,
        lib: Any = None,
    ) -> None:
        super().__init__(kernel, signature, lib=lib, dependent=dependent)
        slots = [i for i, kind in enumerate(signature) if kind == "i"]
        if len(scalars) != len(slots):
            raise ValueError(
                f"argument 'scalars' has {len(scalars)} values, the signature {signature!r} "
                f"{len(slots)}"
            )
        for i, value in zip(slots, scalars, strict=True):
            self._values[i].value = int(value)
        self.grid, self.block, self.shared_mem = tuple(grid), tuple(block), int(shared_mem)
        self._live = tuple((i, kind) for i, kind in enumerate(signature) if kind != "i")

    def run(self, live: Sequence[Any], stream: int) -> None:
        """Launch on ``stream`` with ``live``: the tensors and tensor maps, in signature order."""
        if len(live) != len(self._live):
            raise ValueError(
                f"argument 'live' has {len(live)} values, the signature {self.signature!r} "
                f"{len(self._live)} pointers and maps"
            )
        with self._lock:
            for (i, kind), arg in zip(self._live, live, strict=True):
                if kind == "t":
                    self._params[i] = arg.address
                else:
                    self._values[i].value = arg.data_ptr()
            result = self._fire(self.grid, self.block, self.shared_mem, stream)
        if result != 0:
            torch.cuda._utils._check_cuda(result)


@functools.cache  # asked on every launch of an NVRTC kernel
def nvrtc_available() -> bool:
    """NVRTC compilation through PyTorch (``torch.cuda._compile_kernel``) and a CUDA device."""
    return torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")


@functools.cache  # one per compiled kernel, signature and launch kind
def lean_launcher(kernel: Any, signature: str, dependent: bool = False) -> Launcher | None:
    """The lean launcher for ``kernel``, or None where it cannot be built (then PyTorch's own
    launcher runs; said once). ``dependent``: a programmatic dependent launch where the driver
    has ``cuLaunchKernelEx``, else a plain one (said once)."""
    try:
        return Launcher(kernel, signature, dependent=dependent)
    except (AttributeError, OSError, TypeError) as exc:
        if dependent:
            log.info("tilewise: launches without programmatic dependence (%s)", exc)
            return lean_launcher(kernel, signature)
        log.info("tilewise: PyTorch's kernel launcher in use (%s)", exc)
        return None


def on_device(device: int) -> contextlib.AbstractContextManager:
    """``device`` made current where another one is (an NVRTC kernel launches in its context)."""
    if device != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def launch(
    kernel: Any,
    grid: Sequence[int],
    block: Sequence[int],
    args: Sequence[Any],
    shared_mem: int,
    device: int,
    launcher: Launcher | None,
) -> None:
    """Launch ``kernel`` on the current stream of ``device``: through ``launcher`` (a
    ``lean_launcher``, ~host time of one driver call), or PyTorch's ``_CudaKernel`` call where it
    is None. Runs under ``device`` when another device is current (the kernel's context)."""
    with on_device(device):
        if launcher is None:
            kernel(grid=grid, block=block, args=list(args), shared_mem=shared_mem)
        else:
            launcher(grid, block, args, shared_mem, torch._C._cuda_getCurrentRawStream(device))
