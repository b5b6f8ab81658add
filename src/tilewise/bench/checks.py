"""Correctness guard run before a problem is timed: tilewise vs eager vs an fp64 reference.

The rule is flash-attention's: tilewise must be as close to the fp64 reference as PyTorch in the
same dtype is (within 2x its error), plus a small dtype tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from tilewise.registry import OpSpec, RowsProblem

#: (atol, rtol) on top of 2x eager's own error vs the fp64 reference (flash-attention's rule).
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-4),
    "fp16": (1e-3, 1e-3),
    "bf16": (8e-3, 8e-3),
}


#: Odd grouped-conv problems for kernel checks on a GPU (tests and the NVRTC probe): tiny and odd
#: images, C from 8 to 128, kernels 1x1 to 7x7 and non-square, padding 0 to R.
#: (n, c, h, w, r, s, pad_h, pad_w, bias)
GCONV_ODD_SHAPES: tuple[tuple[int, int, int, int, int, int, int, int, bool], ...] = (
    (2, 64, 13, 17, 3, 3, 1, 1, True),
    (1, 16, 5, 7, 3, 3, 1, 1, False),
    (3, 128, 9, 9, 5, 5, 2, 2, True),
    (2, 64, 8, 8, 7, 7, 3, 3, False),
    (2, 64, 10, 10, 1, 1, 0, 0, True),
    (2, 32, 6, 6, 3, 3, 0, 0, True),
    (1, 8, 4, 4, 3, 3, 3, 3, False),
    (1, 64, 1, 1, 3, 3, 1, 1, True),
    (4, 64, 20, 19, 3, 5, 1, 2, True),
    (2, 24, 11, 3, 2, 4, 2, 1, True),
    (2, 32, 19, 21, 7, 7, 3, 2, True),
    (1, 16, 11, 13, 6, 7, 2, 3, False),
)


def bind_activation(
    fn: Callable[..., torch.Tensor], activation: str
) -> Callable[..., torch.Tensor]:
    """``fn`` with its ``activation`` keyword fixed; the inputs are passed as keywords."""

    def call(**inputs: torch.Tensor) -> torch.Tensor:
        return fn(**inputs, activation=activation)

    return call


def _outputs(
    fn: Callable[..., torch.Tensor],
    spec: OpSpec,
    inputs: Mapping[str, torch.Tensor],
    dy: torch.Tensor | None,
) -> list[torch.Tensor]:
    out = fn(**inputs)
    if dy is None:
        return [out.detach()]
    grads = torch.autograd.grad(out, [inputs[k] for k in spec.grad_inputs], dy.to(out.dtype))
    return [out.detach(), *grads]


def compare(
    out: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, dtype: str
) -> tuple[bool, str]:
    """Is ``out`` as close to the fp64 reference as eager PyTorch is? (ok, note)

    Elementwise: ``|out - ref| <= 2 |eager - ref| + atol + rtol |ref|``. A handful of violations
    is accepted when they are at most 1e-6 of the elements, or when the relative L2 error is within
    2x eager's plus ``rtol``: ops with a kink (a ReLU after a recomputed LayerNorm) can legitimately
    flip a few elements whose pre-activation is within rounding of zero.
    """
    if out.shape != ref64.shape:
        return False, f"shape {tuple(out.shape)} != {tuple(ref64.shape)}"
    atol, rtol = TOLERANCES.get(dtype, (1e-2, 1e-2))
    r, o = ref64.double(), out.double()
    nonfinite = int((~torch.isfinite(o) & torch.isfinite(r)).sum())
    if nonfinite:
        return False, f"{nonfinite} non-finite elements where the reference is finite"
    err = (o - r).abs()
    err_e = (eager.double() - r).abs()
    bad = int((~(err <= 2 * err_e + atol + rtol * r.abs())).sum())  # NaN counts as bad
    max_err = float(err.max()) if err.numel() else 0.0
    if bad == 0:
        return True, f"max abs err {max_err:.3g}"
    norm = float(r.norm()) or 1.0
    rel, rel_e = float(err.norm()) / norm, float(err_e.norm()) / norm
    if bad <= 1e-6 * err.numel() or rel <= 2 * rel_e + rtol:
        return True, f"{bad}/{err.numel()} outliers, rel L2 err {rel:.3g} (eager {rel_e:.3g})"
    return False, (
        f"{bad}/{err.numel()} elements beyond 2x eager error + tolerance, max abs err "
        f"{max_err:.3g}, rel L2 err {rel:.3g} (eager {rel_e:.3g})"
    )


def check_problem(
    spec: OpSpec, problem: RowsProblem, inputs: Mapping[str, torch.Tensor], with_grads: bool
) -> tuple[bool, str]:
    """Tilewise output (and gradients) vs eager, both vs an fp64 reference; (ok, note)."""
    act = problem.activation
    inputs64 = {k: v.detach().double().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    dy = torch.randn_like(inputs["x"]) if with_grads else None
    with torch.enable_grad():
        tw = _outputs(bind_activation(spec.tilewise, act), spec, inputs, dy)
        ea = _outputs(bind_activation(spec.reference, act), spec, inputs, dy)
        ref = _outputs(bind_activation(spec.reference, act), spec, inputs64, dy)
    names = ["out", *(f"d{k}" for k in spec.grad_inputs)][: len(tw)]
    notes = []
    for name, t, e, r in zip(names, tw, ea, ref, strict=True):
        ok, note = compare(t, e, r, problem.dtype)
        if not ok:
            return False, f"{name}: {note}"
        notes.append(f"{name}: {note}")
    return True, "; ".join(notes)
