"""Offline compiles of the NVRTC kernels' CUDA sources by nvcc, and their SASS by cuobjdump: what
ptxas makes of a kernel without a GPU (the compile tests, ``scripts/sass_report.py``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

NVCC = shutil.which("nvcc")
#: a SASS line's opcode (after any predicate), as cuobjdump prints it
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def cuobjdump() -> str | None:
    """cuobjdump on PATH, else the copy Triton's NVIDIA backend ships, else None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    return str(path) if path.exists() else None


def compile_cubin(src: str, out_dir: Path, arch: str = "sm_90a") -> tuple[Path, str]:
    """``src`` compiled by nvcc into ``out_dir``/k.cubin: (the cubin, ptxas's ``-v`` log).
    Raises RuntimeError with the log's tail when nvcc fails."""
    out_dir = Path(out_dir)
    (out_dir / "k.cu").write_text(src)
    cubin = out_dir / "k.cubin"
    cmd = [NVCC, f"-arch={arch}", "-cubin", "-o", str(cubin), "-Xptxas", "-v"]
    res = subprocess.run([*cmd, str(out_dir / "k.cu")], capture_output=True, text=True, timeout=300)
    log = res.stdout + res.stderr
    if res.returncode:
        raise RuntimeError(f"nvcc failed: {log[-2000:]}")
    return cubin, log


def opcodes(cubin: Path, function: str | None = None) -> list[str]:
    """The SASS opcodes of every kernel in ``cubin`` (or of the one named ``function``), in
    order (``HGMMA.64x32x16.F32``, ...)."""
    only = ["-fun", function] if function else []
    sass = subprocess.run([cuobjdump(), "-sass", *only, str(cubin)], capture_output=True, text=True)
    return _OPCODE.findall(sass.stdout)
