"""Diagnose the intermittent fp32 LayerNorm + ReLU dx failure of
``tests/test_layernorm.py::test_launch_variants[bwd-prefetch-cuda-float32]`` on a GPU.

For several fresh draws of the test's largest case (4099 x 4096, fp32, weight and bias), runs
tilewise's forward and backward (the prefetch backward config the test uses, and the default) and
compares dx with three fp64 references that differ only in the ReLU mask: the exact one, the
test's (tilewise's mask where the exact pre-activation is within 1e-4 of 0), and tilewise's mask
everywhere. It prints the worst error against each, how many elements break the three-way bound,
and, for the worst row, how many mask disagreements it has and how close to 0 they are.

    python scripts/ln_relu_diag.py [--draws 4] [--seed S]

``--seed S`` redraws the test's first GPU case exactly as ``rng_seed`` = S drew it (the test
prints its seed on failure), and for the elements that break the bound, tries flipping each
near-kink mask element of their row in the reference to find the mask the kernel used.
"""

from __future__ import annotations

import argparse
import os

import torch

import tilewise
from tilewise.ops import _common
from tilewise.ops import layernorm as ln


def _ref_dx(x, w, b, grad, mask_fn, eps=1e-5):
    mean = x.mean(1, keepdim=True)
    rstd = torch.rsqrt(((x - mean) ** 2).mean(1, keepdim=True) + eps)
    xhat = (x - mean) * rstd
    z = xhat * w + b
    g = grad * mask_fn(z) * w
    return (g - xhat * (g * xhat).mean(1, keepdim=True) - g.mean(1, keepdim=True)) * rstd, z


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--seed", type=int, help="the failing test's seed (prefetch config only)")
    ap.add_argument("--seeds", type=int, help="replay this many fresh seeds, one attempt each")
    args = ap.parse_args()
    if args.seed is not None:
        _replay(args.seed)
        return
    if args.seeds:
        seeds = [int.from_bytes(os.urandom(4), "little") for _ in range(args.seeds)]
        broken = sum(_replay(seed, attempts=1) for seed in seeds)
        print(f"{broken} of {len(seeds)} seeds broke the bound")
        return
    m, n = 4099, 4096
    configs = {
        "prefetch": _common.TileConfig(1, 4096, 4, progs_per_sm=2, prefetch=True),
        "default": None,
    }
    for name, cfg in configs.items():
        if cfg is None:
            _common.CONFIG_OVERRIDES.pop("layer_norm_bwd", None)
        else:
            _common.CONFIG_OVERRIDES["layer_norm_bwd"] = lambda *_, c=cfg: c
        for draw in range(args.draws):
            x = torch.randn(m, n, device="cuda")
            w = 1.0 + 0.5 * torch.randn(n, device="cuda")
            b = 0.5 * torch.randn(n, device="cuda")
            grad = torch.randn(m, n, device="cuda")
            y, mean, rstd = ln.forward(x, (n,), w, b, 1e-5, True)
            dx, _, _ = ln.backward(grad, x, (n,), w, b, mean, rstd, True)
            xt = x.clone().requires_grad_()
            yt = torch.relu(torch.nn.functional.layer_norm(xt, (n,), w, b))
            (dxt,) = torch.autograd.grad(yt, xt, grad)
            x64, w64, b64, g64 = x.double(), w.double(), b.double(), grad.double()
            tw_pos = y > 0
            exact, z = _ref_dx(x64, w64, b64, g64, lambda z: z > 0)
            test, _ = _ref_dx(
                x64, w64, b64, g64, lambda z, t=tw_pos: torch.where(z.abs() <= 1e-4, t, z > 0)
            )
            full_tw, _ = _ref_dx(x64, w64, b64, g64, lambda z, t=tw_pos: t)
            err_test = (dx.double() - test).abs()
            bound = 2 * (dxt.double() - test).abs() + 4e-5
            bad = err_test > bound
            row = int(err_test.max(1).values.argmax())
            flips = (tw_pos[row] != (z[row] > 0)).nonzero().flatten()
            print(
                f"{name} draw {draw}: bound broken at {int(bad.sum())} elements; max err vs "
                f"exact {(dx.double() - exact).abs().max():.2e}, vs test ref "
                f"{err_test.max():.2e}, vs tilewise-mask ref "
                f"{(dx.double() - full_tw).abs().max():.2e}; torch vs test ref "
                f"{(dxt.double() - test).abs().max():.2e}"
            )
            print(
                f"   worst row {row}: rstd {float(rstd[row]):.4f}, mask flips vs exact "
                f"{flips.numel()} at |z| = {[f'{float(z[row, i]):.2e}' for i in flips[:4]]}, "
                f"torch/tilewise mask flips {int(((yt[row] > 0) != tw_pos[row]).sum())}"
            )
    _common.CONFIG_OVERRIDES.pop("layer_norm_bwd", None)


def _mask_of(pos):
    """The test's mask: ``pos`` where the exact pre-activation is within 1e-4 of the kink."""
    return lambda zz: torch.where(zz.abs() <= 1e-4, pos, zz > 0)


def _replay(seed: int, attempts: int = 3) -> bool:
    """Whether any attempt broke the bound; also compares the direct launch with the autograd
    path the test takes (``tilewise.layer_norm``)."""
    broke = False
    m, n = 4099, 4096
    cfg = _common.TileConfig(1, 4096, 4, progs_per_sm=2, prefetch=True)
    _common.CONFIG_OVERRIDES["layer_norm_bwd"] = lambda *_: cfg
    torch.manual_seed(seed)  # the test's draw order: x, w, b, grad
    x = torch.randn(m, n, device="cuda")
    w = 1.0 + 0.5 * torch.randn(n, device="cuda")
    b = 0.5 * torch.randn(n, device="cuda")
    grad = torch.randn(m, n, device="cuda")
    for attempt in range(attempts):  # the same inputs again: is it deterministic?
        y, mean, rstd = ln.forward(x, (n,), w, b, 1e-5, True)
        dx, _, _ = ln.backward(grad, x, (n,), w, b, mean, rstd, True)
        xa = x.clone().requires_grad_()
        wa, ba = w.clone().requires_grad_(), b.clone().requires_grad_()
        ya = tilewise.layer_norm(xa, (n,), wa, ba, relu=True)
        ya.backward(grad)
        same = torch.equal(ya, y) and torch.equal(xa.grad, dx)
        xt = x.clone().requires_grad_()
        yt = torch.relu(torch.nn.functional.layer_norm(xt, (n,), w, b))
        (dxt,) = torch.autograd.grad(yt, xt, grad)
        x64, w64, b64, g64 = x.double(), w.double(), b.double(), grad.double()
        tw_pos = y > 0

        ref, z = _ref_dx(x64, w64, b64, g64, _mask_of(tw_pos))
        bound = 2 * (dxt.double() - ref).abs() + 4e-5
        err = (dx.double() - ref).abs()
        bad = (err > bound).nonzero()
        bad_a = int((((xa.grad.double() - ref).abs()) > bound).sum())
        print(
            f"seed {seed} attempt {attempt}: {bad.shape[0]} elements break the bound (autograd "
            f"path: {bad_a}; its y and dx bitwise equal to the direct launch's: {same})"
        )
        broke = broke or bad.shape[0] > 0 or bad_a > 0
        for row in sorted({int(r) for r in bad[:, 0]})[:4]:
            cols = bad[bad[:, 0] == row, 1]
            print(
                f"  row {row}: cols {cols[:8].tolist()}, err {err[row, cols[:4]].tolist()}, "
                f"bound {bound[row, cols[:4]].tolist()}"
            )
            band = (z[row].abs() <= 1e-4).nonzero().flatten()
            for j in band.tolist():
                flipped = tw_pos.clone()
                flipped[row, j] = ~flipped[row, j]
                alt, _ = _ref_dx(x64[row : row + 1], w64, b64, g64[row : row + 1],
                                 _mask_of(flipped[row : row + 1]))  # fmt: skip
                alt_err = (dx[row].double() - alt[0]).abs().max()
                print(
                    f"    near-kink col {j}: z {float(z[row, j]):.3e}, y_tw {float(y[row, j]):.3e},"
                    f" grad {float(grad[row, j]):.3f}; tilewise's max err in the row with this"
                    f" mask flipped {float(alt_err):.2e} (unflipped {float(err[row].max()):.2e})"
                )
    _common.CONFIG_OVERRIDES.pop("layer_norm_bwd", None)
    return broke


if __name__ == "__main__":
    main()
