"""``StrassenMLP``: an inference-only chain of Linear (+ ReLU) layers run through fused Strassen.

Weights are formatted once (``tilewise.ops.strassen.format_weights``) into non-persistent buffers,
so ``.to()`` / ``.half()`` move them with the module; call ``reformat()`` after editing weights.
``mode="auto"`` picks, per input shape, fused Strassen or the fused Linear chain
(``tilewise.functional.linear``, one GEMM + bias + activation kernel per layer): on CUDA it times
both on first use and caches the winner like any kernel config (``tilewise.runtime.autotune``,
keyed by batch, sizes, dtype and TF32); the rule ``strassen_wins(batch, hidden, dtype, device)``
(``hidden`` = the smallest feature size of the chain) is the untimed default, used on CPU, with
``TILEWISE_AUTOTUNE=0`` and during CUDA-graph capture. Only true fp32 is timed: in half precision
and TF32 Strassen's error exceeds the three-way rule, so there the rule alone decides.
Both paths follow PyTorch's TF32 switch (``torch.backends.cuda.matmul.allow_tf32``).

Non-finite inputs: Strassen mixes rows r and r + M/2 (and columns likewise), so a NaN or Inf in
one input row also reaches its partner row of the output, which plain PyTorch would not; use
``mode="linear"`` where inputs may hold NaN/Inf and that matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tilewise import functional as F
from tilewise.ops import strassen as ops
from tilewise.runtime import autotune

MODES = ("auto", "strassen", "linear")
_ACTIVATIONS = ("relu", "none")


def _flatten(modules: Iterable[nn.Module]) -> list[nn.Module]:
    out: list[nn.Module] = []
    for m in modules:
        if isinstance(m, nn.Sequential):
            out.extend(_flatten(m))
        elif isinstance(m, nn.Module):
            out.append(m)
        else:
            raise ValueError(f"tilewise.StrassenMLP: argument 'modules': {m!r} is not an nn.Module")
    return out


@dataclass(frozen=True)
class Path:
    """``strassen`` or ``linear``: the path a ``StrassenMLP`` call takes."""

    name: str


STRASSEN, LINEAR = Path("strassen"), Path("linear")
#: candidate orders, one tuple each (the autotuner's per-call memo is keyed by their identity)
_STRASSEN_FIRST, _LINEAR_FIRST = (STRASSEN, LINEAR), (LINEAR, STRASSEN)


def _reformat_after_load(module: StrassenMLP, _incompatible: object) -> None:
    if module.blocks0 is not None:
        module.reformat()


class StrassenMLP(nn.Module):
    """``act_N(... act_1(x @ W_1^T + b_1) ...)`` for a Linear chain, activations "relu" or "none".

    Shares the given ``nn.Linear`` modules (their parameters, no copy) as ``self.layers``; starts in
    eval mode. Inference only: under grad mode, a ``requires_grad`` input or training mode raises
    ``ValueError`` (no gradient would reach the weights).
    """

    def __init__(
        self, linears: Sequence[nn.Linear], activations: Sequence[str], mode: str = "auto"
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"tilewise.StrassenMLP: argument 'mode' must be one of {MODES}")
        if len(linears) == 0 or len(activations) != len(linears):
            raise ValueError(
                "tilewise.StrassenMLP: argument 'linears' must be non-empty and match "
                f"'activations' ({len(linears)} vs {len(activations)})"
            )
        for i, (lin, act) in enumerate(zip(linears, activations, strict=True)):
            if not isinstance(lin, nn.Linear):
                raise ValueError(
                    f"tilewise.StrassenMLP: layer {i} is {type(lin).__name__}, not Linear"
                )
            if act not in _ACTIVATIONS:
                raise ValueError(
                    f"tilewise.StrassenMLP: argument 'activations'[{i}] must be one of "
                    f"{_ACTIVATIONS}, got {act!r}"
                )
            if i and lin.in_features != linears[i - 1].out_features:
                raise ValueError(
                    f"tilewise.StrassenMLP: layer {i} has in_features={lin.in_features} but layer "
                    f"{i - 1} has out_features={linears[i - 1].out_features}"
                )
        self.layers = nn.ModuleList(linears)
        self.activations = tuple(activations)
        self.mode = mode
        for i in range(len(linears)):  # mode "linear" formats lazily, on a first Strassen call
            self.register_buffer(f"blocks{i}", None, persistent=False)
        if mode != "linear":
            self.reformat()
        # the formatted blocks are derived, not saved: rebuild them when weights are loaded
        self.register_load_state_dict_post_hook(_reformat_after_load)
        self.eval()

    @classmethod
    def from_modules(
        cls, *modules: nn.Module | Iterable[nn.Module], mode: str = "auto"
    ) -> StrassenMLP:
        """From ``Linear, ReLU, Linear, ReLU, ...`` (an ``nn.Sequential``, a list, or arguments).

        Each Linear may be followed by one ``nn.ReLU``; a ``tilewise.nn.Linear`` may carry its
        own "relu"/"none" activation; ``nn.Identity`` modules are skipped, so a Sequential that
        ``tilewise.transform`` already fused works too. Anything else raises ``ValueError``.
        """
        flat = _flatten(m for arg in modules for m in (arg if isinstance(arg, Iterable) else [arg]))
        linears: list[nn.Linear] = []
        acts: list[str] = []
        for m in flat:
            if isinstance(m, nn.Linear):
                act = getattr(m, "activation", "none")
                if act not in _ACTIVATIONS:
                    raise ValueError(
                        f"tilewise.StrassenMLP: a Linear with activation {act!r} is not supported"
                    )
                linears.append(m)
                acts.append(act)
            elif isinstance(m, nn.ReLU) and linears and acts[-1] == "none":
                acts[-1] = "relu"
            elif isinstance(m, nn.Identity):  # e.g. what ``transform`` leaves of a fused ReLU
                continue
            else:
                raise ValueError(
                    f"tilewise.StrassenMLP: argument 'modules': {type(m).__name__} at position "
                    f"{len(linears)} does not fit a Linear (+ ReLU) chain"
                )
        return cls(linears, acts, mode=mode)

    @torch.no_grad()
    def reformat(self) -> None:
        """(Re)build the formatted Strassen weights from the current Linear weights."""
        for i, lin in enumerate(self.layers):
            setattr(self, f"blocks{i}", ops.format_weights(lin.weight))

    @property
    def in_features(self) -> int:
        return self.layers[0].in_features

    @property
    def out_features(self) -> int:
        return self.layers[-1].out_features

    @property
    def sizes(self) -> list[int]:
        """Feature sizes along the chain: ``[in_features, out_1, ..., out_N]``."""
        return [self.in_features] + [lin.out_features for lin in self.layers]

    def uses_strassen(self, x: torch.Tensor) -> bool:
        """Whether ``forward(x)`` takes the fused Strassen path (timed on first use in "auto")."""
        if self.mode != "auto":
            return self.mode == "strassen"
        hidden = min(min(lin.in_features, lin.out_features) for lin in self.layers)
        batch = x.numel() // max(1, x.shape[-1]) if x.ndim else 0
        rule = STRASSEN if ops.strassen_wins(batch, hidden, x.dtype, x.device) else LINEAR
        if x.dtype != torch.float32 or ops.tf32_enabled():
            # half precision / TF32: Strassen's sums cost ~3.5x PyTorch's rounding error, more
            # than the three-way rule allows, so it is never chosen by timing there
            return rule == STRASSEN
        problem = ops.chain_problem(batch, self.sizes, x.dtype)
        path = autotune.choose_config(
            "strassen_mlp.path",
            problem,
            _STRASSEN_FIRST if rule == STRASSEN else _LINEAR_FIRST,
            lambda p: self._run(x, p == STRASSEN),
            device=x.device,
        )
        return path == STRASSEN

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.training):
            raise ValueError(
                "tilewise.StrassenMLP is inference-only: argument 'x' requires grad or the module "
                "is in training mode; call .eval() and run under torch.no_grad()/inference_mode()"
            )
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"tilewise.StrassenMLP: argument 'x' has shape {tuple(x.shape)}; its last dim "
                f"must be in_features={self.in_features}"
            )
        return self._run(x, self.uses_strassen(x))

    def _run(self, x: torch.Tensor, strassen: bool) -> torch.Tensor:
        biases = [None if lin.bias is None else lin.bias.detach() for lin in self.layers]
        if strassen:
            if self.blocks0 is None:
                self.reformat()
            blocks = [getattr(self, f"blocks{i}") for i in range(len(self.layers))]
            return ops.forward(x, blocks, biases, self.activations, self.sizes)
        tf32 = ops.tf32_enabled()
        with torch.no_grad():  # like the Strassen path: no graph to the weights
            for lin, b, act in zip(self.layers, biases, self.activations, strict=True):
                x = F.linear(x, lin.weight, b, act, allow_tf32=tf32)
        return x

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, activations={list(self.activations)}, mode={self.mode!r}"
