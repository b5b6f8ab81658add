"""NVRTC kernels whose binaries are kept on disk, so a new process loads a kernel instead of
compiling it again.

``torch.cuda._compile_kernel`` compiles every kernel variant in every process: the grouped conv's
autotuner compiles each candidate tile per kernel size, dtype and pass, and a program whose
choices are all in the autotune cache still compiled the chosen kernels on each start (~19 ms
per variant by session 3's measure, more for the warpgroup-MMA kernels). Here the NVRTC output
(a cubin) is written under ``$TILEWISE_CACHE_DIR/nvrtc/``, named by a digest of everything that
shapes it: the source, the entry point, the target (the GPU's compute capability, or the
architecture a kernel asks for, e.g. "90a"), and the torch, CUDA and file-format versions. On by
default; ``TILEWISE_NVRTC_CACHE=0`` turns it off. Anything unexpected (a torch without the
private helpers used here, an unreadable or corrupt file) falls back to compiling, as before: the
cache can cost a compile, never a wrong kernel, since a file is only ever found under the digest
of the source it was built from.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from tilewise.runtime.autotune import cache_dir

log = logging.getLogger(__name__)

ENV_NVRTC_CACHE = "TILEWISE_NVRTC_CACHE"
#: bumped when the file layout changes (files of another format are then never looked up)
FORMAT = 1
#: the binaries kept at most (``TILEWISE_NVRTC_CACHE_MB`` overrides): past it, a store removes
#: the least recently used ones (a load marks its file used) down to three quarters of it. Every
#: source edit, tile or torch version adds files that nothing reads again; a model's grouped convs
#: autotuned once write ~140 binaries (session 35: ``benchmarks/second_run.py``)
MAX_MB = 512
ENV_MAX_MB = "TILEWISE_NVRTC_CACHE_MB"


#: set when PyTorch's private helpers turned out to take other arguments: compile as before
_broken = False


def enabled() -> bool:
    """Whether binaries are kept on disk (unless ``TILEWISE_NVRTC_CACHE=0``; the helpers work)."""
    return os.environ.get(ENV_NVRTC_CACHE, "1") != "0" and not _broken


def _helpers() -> tuple[Any, Any] | None:
    """PyTorch's NVRTC compile and module-load helpers (private API: None where absent)."""
    utils = getattr(torch.cuda, "_utils", None)
    compile_fn = getattr(utils, "_nvrtc_compile", None)
    load_fn = getattr(utils, "_cuda_load_module", None)
    return (compile_fn, load_fn) if compile_fn and load_fn else None


def binaries_dir() -> Path:
    """Where the binaries are kept: ``$TILEWISE_CACHE_DIR/nvrtc``."""
    return cache_dir() / "nvrtc"


def binaries() -> list[Path]:
    """The binaries on disk now (none if the directory is missing)."""
    try:
        return sorted(binaries_dir().glob("*.bin"))
    except OSError:
        return []


def _sized() -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of each binary on disk (one removed meanwhile is skipped)."""
    entries = []
    for path in binaries():
        try:
            st = path.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    return entries


def total_bytes() -> int:
    """The binaries' total size on disk."""
    return sum(size for _, size, _ in _sized())


def clear() -> int:
    """Remove every binary (later compiles write them again); returns how many were removed."""
    removed = 0
    for path in binaries():
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def max_bytes() -> int:
    """The cap on the binaries' total size (``TILEWISE_NVRTC_CACHE_MB``, else ``MAX_MB``)."""
    try:
        mb = float(os.environ.get(ENV_MAX_MB, MAX_MB))
    except ValueError:
        mb = MAX_MB
    return int(max(mb, 0) * (1 << 20))


def trim(limit: int | None = None) -> int:
    """Remove the least recently used binaries while their total exceeds ``limit`` (default
    ``max_bytes()``), down to three quarters of it; returns how many were removed."""
    limit = max_bytes() if limit is None else limit
    sized = _sized()
    total = sum(size for _, size, _ in sized)
    if total <= limit:
        return 0
    removed = 0
    for _, size, path in sorted(sized, key=lambda entry: entry[0]):
        if total <= limit * 3 // 4:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def binary_path(
    source: str, entry: str, capability: tuple[int, int], target: str | None = None
) -> Path:
    """Where the binary of ``entry`` in ``source`` for a GPU of ``capability`` is kept
    (``target``: the architecture compiled for, where not the GPU's own)."""
    fields = [FORMAT, source, entry, list(capability), torch.__version__, torch.version.cuda]
    if target is not None:  # appended: the keys (and files) of own-architecture kernels stay
        fields.append(target)
    digest = hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:40]
    return binaries_dir() / f"{entry}-{digest}.bin"


def compile_kernel(source: str, entry: str, compute_capability: str | None = None) -> Any:
    """``torch.cuda._compile_kernel(source, entry)`` on the current device, its binary read
    from or written to the disk cache. ``compute_capability`` (e.g. "90a" for Hopper's
    architecture-specific instructions): the target, where not the device's own. Compile errors
    raise as from PyTorch."""
    target = {} if compute_capability is None else {"compute_capability": compute_capability}
    helpers = _helpers() if enabled() else None
    if helpers is None:
        return torch.cuda._compile_kernel(source, entry, **target)
    compile_fn, load_fn = helpers
    try:
        capability = torch.cuda.get_device_capability(torch.cuda.current_device())
        path = binary_path(source, entry, capability, compute_capability)
    except (RuntimeError, OSError) as exc:  # e.g. no home directory for the default cache dir
        _log_once(f"tilewise nvrtc cache: no cache directory ({exc}); compiling")
        return torch.cuda._compile_kernel(source, entry, **target)
    kernel = _load(path, load_fn)
    if kernel is not None:
        return kernel
    try:
        binary, name = compile_fn(source, entry, **target)
    except RuntimeError:  # the kernel's own compile errors, as PyTorch raises them
        raise
    except Exception as exc:  # a private helper of another signature: PyTorch's public path
        return _give_up(exc, source, entry, target)
    try:
        kernel = load_fn(binary, [name])[name]
    except (TypeError, KeyError, IndexError) as exc:  # likewise (a CUDA error would raise)
        return _give_up(exc, source, entry, target)
    _store(path, name, binary)
    return kernel


def _give_up(exc: Exception, source: str, entry: str, target: dict[str, str]) -> Any:
    """Turn the cache off for this process (the helpers take other arguments) and compile."""
    global _broken
    _broken = True
    _log_once(f"tilewise nvrtc cache: off ({type(exc).__name__}: {exc})")
    return torch.cuda._compile_kernel(source, entry, **target)


def _load(path: Path, load_fn) -> Any | None:
    """The kernel in ``path`` (its first line the mangled name, then the binary), or None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    name, sep, binary = data.partition(b"\n")
    try:
        if not sep or not binary:
            raise ValueError("truncated file")
        text = name.decode()
        kernel = load_fn(binary, [text])[text]
    except Exception as exc:  # a damaged file: compile again (and overwrite it)
        _log_once(f"tilewise nvrtc cache: {path.name} unusable ({type(exc).__name__}); compiling")
        return None
    try:  # used now: the last to go when the directory is trimmed
        os.utime(path)
    except OSError:
        pass
    return kernel


def _store(path: Path, name: str, binary: bytes) -> None:
    """Write atomically (a reader sees the old file or the whole new one); failures only log."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(name.encode() + b"\n" + bytes(binary))
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of the dir
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        _log_once(f"tilewise nvrtc cache: not written under {path.parent} ({exc})")
        return
    trim()


@functools.cache
def _log_once(message: str) -> None:
    log.warning(message)
