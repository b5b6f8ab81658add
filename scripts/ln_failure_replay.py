"""Replay session 23's one layer_norm GPU test failure (`test_launch_variants[bwd-prefetch-cuda-
bfloat16]`, seed 106009923: one dbias element of the (33, 256, 102) case off by 1.66 against a
bound of 0.46) and say where the difference comes from: the atomic sum (the same kernel in
PyTorch's deterministic mode sums fixed partial rows) or a ReLU mask that differs from the fp64
reference's (the rows near the kink of the failing column).

    usage: python scripts/ln_failure_replay.py [SEED]
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import test_layernorm as T  # noqa: E402

import tilewise  # noqa: E402
from tilewise.ops import _common  # noqa: E402
from tilewise.ops import layernorm as ops  # noqa: E402


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 106009923
    dtype = torch.bfloat16

    def override(m, n, elem):
        base = ops.TileConfig(1, ops.next_pow2(n), 4, progs_per_sm=2, prefetch=False)
        return replace(base, prefetch=True)

    _common.CONFIG_OVERRIDES["layer_norm_bwd"] = override
    torch.manual_seed(seed)
    for xshape, shape in T.GPU_CASES:
        x = torch.randn(xshape, device="cuda", dtype=torch.float32)
        try:
            T._run_case(x, shape, "wb", True, dtype, dtype, seed)
            print(f"case {xshape}: passed")
            continue
        except AssertionError as e:
            print(f"case {xshape}: {e}")
        break
    else:
        return
    # redo the failing case's draws exactly (generator state before its x)
    torch.manual_seed(seed)
    for xs, sh in T.GPU_CASES:
        x = torch.randn(xs, device="cuda", dtype=torch.float32)
        if xs == xshape:
            break
        # a passing case's draws (w0, b0, grad) as _run_case made them
        x0 = x.to(dtype).float()
        _ = 1.0 + 0.5 * torch.randn(sh, device="cuda")
        _ = 0.5 * torch.randn(sh, device="cuda")
        _ = torch.randn_like(x0, dtype=dtype)
    n = ops.row_size(shape)
    x0 = x.to(dtype).float()
    w0 = (1.0 + 0.5 * torch.randn(shape, device="cuda")).to(dtype).float()
    b0 = (0.5 * torch.randn(shape, device="cuda")).to(dtype).float()
    grad = torch.randn_like(x0, dtype=dtype)

    def tw_run(deterministic: bool):
        xl = x0.to(dtype).requires_grad_()
        wl = w0.to(dtype).requires_grad_()
        bl = b0.to(dtype).requires_grad_()
        torch.use_deterministic_algorithms(deterministic)
        try:
            y = tilewise.layer_norm(xl, shape, wl, bl, relu=True)
            y.backward(grad)
        finally:
            torch.use_deterministic_algorithms(False)
        return y, xl.grad, wl.grad, bl.grad

    y_a, dx_a, dw_a, db_a = tw_run(False)
    y_d, dx_d, dw_d, db_d = tw_run(True)
    _, dx_r, dw_r, db_r = T._relu_ref_at_kinks(x0, shape, w0, b0, grad, y_a, 1e-4)
    err = (db_a.double() - db_r).abs().reshape(-1)
    col = int(err.argmax())
    print(
        f"worst dbias column {col}: atomic {float(db_a.reshape(-1)[col]):.4f} deterministic "
        f"{float(db_d.reshape(-1)[col]):.4f} fp64 ref {float(db_r.reshape(-1)[col]):.4f}"
    )
    print(
        "atomic vs deterministic dbias max diff",
        float((db_a.float() - db_d.float()).abs().max()),
    )
    xr = x0.double().reshape(-1, n)
    mean = xr.mean(1, keepdim=True)
    rstd = torch.rsqrt(((xr - mean) ** 2).mean(1, keepdim=True) + 1e-5)
    z = (xr - mean) * rstd * w0.double().reshape(-1) + b0.double().reshape(-1)
    zc = z[:, col]
    order = zc.abs().argsort()[:4]
    g = grad.double().reshape(-1, n)[:, col]
    for r in order.tolist():
        print(
            f"  row {r}: z {float(zc[r]):.3e} y_tw {float(y_a.reshape(-1, n)[r, col]):.3e} "
            f"dy {float(g[r]):.3f} w {float(w0.reshape(-1)[col]):.3f} "
            f"dx tw {float(dx_a.reshape(-1, n)[r, col]):.4f}"
            f" ref {float(dx_r.reshape(-1, n)[r, col]):.4f}"
        )


if __name__ == "__main__":
    main()
