"""The tour's model-level rows: whole training steps, tilewise against eager PyTorch.

- ``mlp``: 8 x (Linear + ReLU) trained with AdamW. Eager: ``nn.Linear`` + ``torch.optim.AdamW``.
  tilewise: ``transform`` (Linear + ReLU fused), ``FusedAdamW``, and the whole step captured in one
  CUDA graph by ``capture_train_step`` (on a CPU the capture API runs eagerly and says so).
- ``convfirst``: a ConvFirst stack (grouped 3x3 convs, group width 8), channels_last, SGD;
  tilewise: ``transform`` (grouped convs), ``FusedSGD``, the step captured likewise.

Both start from the same weights; "agrees" compares the losses of the first steps.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tilewise.models import block_stack
from tilewise.nn import transform
from tilewise.optim import FusedAdamW, FusedSGD
from tilewise.runtime.capture import capture_train_step

LOSS_RTOL = 2e-2  # losses of a few steps from the same weights (fp32 here; TF32 may be on)


@dataclass(frozen=True)
class TourModel:
    """One model-level row: the problem and its sizes on a GPU and on a CPU."""

    name: str
    gpu: dict[str, int]
    cpu: dict[str, int]


MODELS = (
    TourModel("mlp", dict(layers=8, hidden=1024, batch=64), dict(layers=4, hidden=64, batch=8)),
    TourModel(
        "convfirst",
        dict(c=64, hw=32, batch=32, depth=4),
        dict(c=16, hw=8, batch=2, depth=2),
    ),
)


def _time(step: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median seconds of ``step()`` (host time included, as a user sees it)."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def _mlp(sizes: dict[str, int], device: torch.device):
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(sizes["layers"]):
        layers += [nn.Linear(sizes["hidden"], sizes["hidden"]), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(sizes["batch"], sizes["hidden"], device=device)
    target = torch.randn_like(x)
    return model, x, target, nn.functional.mse_loss


def _convfirst(sizes: dict[str, int], device: torch.device):
    torch.manual_seed(0)
    model = block_stack("convfirst", sizes["c"], depth=sizes["depth"], expansion=2)
    model = model.to(device).to(memory_format=torch.channels_last)
    x = torch.randn(sizes["batch"], sizes["c"], sizes["hw"], sizes["hw"], device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    target = torch.randn(sizes["batch"], sizes["c"], device=device)
    return model, x, target, nn.functional.mse_loss


def _eager_step(model, opt, loss_fn, x, target) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()
        return loss

    return step


def run_model(spec: TourModel, device: torch.device, reps: int = 20) -> dict[str, Any]:
    """Train the eager and the tilewise copy a few steps from the same weights; time both."""
    sizes = spec.gpu if device.type == "cuda" else spec.cpu
    build = _mlp if spec.name == "mlp" else _convfirst
    base, x, target, loss_fn = build(sizes, device)
    eager = copy.deepcopy(base)
    tw = copy.deepcopy(base)
    report = transform(tw)
    if spec.name == "mlp":
        e_opt = torch.optim.AdamW(eager.parameters(), lr=1e-4)
        t_opt = FusedAdamW(tw.parameters(), lr=1e-4)
        how = "fused Linear+ReLU, FusedAdamW, "
    else:
        e_opt = torch.optim.SGD(eager.parameters(), lr=1e-3)
        t_opt = FusedSGD(tw.parameters(), lr=1e-3)
        how = f"{len(report.swapped)} grouped convs swapped, FusedSGD, "
    e_step = _eager_step(eager, e_opt, loss_fn, x, target)
    # the whole tilewise step in one CUDA graph: small steps are host-bound, and a Triton launch
    # costs several times a PyTorch op's host time (README, grouped conv in situ)
    captured = capture_train_step(tw, loss_fn, t_opt, x, target)
    t_step = lambda: captured(x, target)  # noqa: E731
    how += "whole step in one CUDA graph" if captured.captured else "eager (no CUDA)"
    losses = [(float(e_step().detach()), float(t_step().detach())) for _ in range(3)]
    agrees = all(abs(a - b) <= LOSS_RTOL * max(abs(a), 1e-12) for a, b in losses)
    return {
        "model": spec.name,
        "sizes": sizes,
        "eager_s": _time(e_step, device, reps),
        "tilewise_s": _time(t_step, device, reps),
        "agrees": agrees,
        "losses": losses,
        "how": how,
    }


def rows(device: torch.device) -> list[dict[str, Any]]:
    """Every model-level row on ``device``."""
    return [run_model(spec, device) for spec in MODELS]


def format_rows(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) for ``bench.results.format_table``."""
    headers = ["training step", "sizes", "eager ms", "tilewise ms", "x eager", "agrees", "tilewise"]
    out = []
    for r in records:
        sizes = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
        out.append(
            [
                r["model"],
                sizes,
                f"{r['eager_s'] * 1e3:.3f}",
                f"{r['tilewise_s'] * 1e3:.3f}",
                f"{r['eager_s'] / r['tilewise_s']:.2f}x",
                "yes" if r["agrees"] else "NO",
                r["how"],
            ]
        )
    return headers, out
