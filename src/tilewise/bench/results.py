"""Result files: one JSON per (study, device) with the environment and the ceilings of the run.

A file holds ``study``, ``environment``, ``ceilings``, ``records`` and ``created`` (UTC ISO 8601),
so every figure can be traced to the machine, the software versions and the roofs it was quoted
against. No hostname or user name is recorded.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import tilewise
from tilewise.bench.ceilings import Ceilings


def _triton_version() -> str | None:
    try:
        import triton
    except Exception:  # pragma: no cover - depends on the machine
        return None
    return str(triton.__version__)


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """Device and software facts for a result file (no hostname)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    env: dict[str, Any] = {
        "device_type": dev.type,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tilewise": tilewise.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            l2_bytes=int(props.L2_cache_size),
            memory_bytes=int(props.total_memory),
        )
    else:
        env.update(
            device_name="cpu",
            capability=None,
            sm_count=None,
            l2_bytes=None,
            cpu_count=os.cpu_count(),
            cpu_model=platform.processor() or None,
        )
    return env


def device_slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown"


def _plain(obj: Any) -> Any:
    """JSON-safe copy: dataclasses to dicts, non-finite floats to None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    return obj


def result_path(study: str, out_dir: str | os.PathLike[str], env: Mapping[str, Any]) -> Path:
    """``<out_dir>/<study>__<device-slug>.json``: where ``save_results`` writes a study."""
    return Path(out_dir) / f"{study}__{device_slug(str(env.get('device_name', 'unknown')))}.json"


def save_results(
    study: str,
    records: Iterable[Any],
    ceilings: Ceilings | Mapping[str, Any] | None,
    out_dir: str | os.PathLike[str],
    env: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<out_dir>/<study>__<device-slug>.json`` and return its path."""
    env = dict(env) if env is not None else environment()
    doc = {
        "study": study,
        "environment": _plain(env),
        "ceilings": _plain(ceilings),
        "records": _plain(list(records)),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    path = result_path(study, out_dir, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return path


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a result file written by ``save_results`` (ceilings stay a plain dict)."""
    doc = json.loads(Path(path).read_text())
    missing = {"study", "environment", "ceilings", "records", "created"} - set(doc)
    if missing:
        raise ValueError(f"{path}: not a tilewise result file, missing keys {sorted(missing)}")
    return doc


_NUMBER = re.compile(r"^[-+]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?[x%]?$")


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Plain-text table, columns aligned: numeric columns to the right, text to the left."""
    cells = [[str(h) for h in headers]]
    cells += [["" if v is None else str(v) for v in row] for row in rows]
    ncol = len(headers)
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]
    numeric = [
        all(_NUMBER.match(r[i]) or r[i] in ("", "-") for r in cells[1:]) for i in range(ncol)
    ]

    def fmt(row: list[str]) -> str:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)
