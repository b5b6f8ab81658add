"""Where the half-precision full-size wgrad test fails (5x5, 7x7): the kernel called directly with
and without the fused bias gradient, in both reduction modes, and the public autograd path.

python scripts/wgrad_diag.py
"""

import torch
import torch.nn.functional as F

import tilewise
from tilewise.ops import gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem, default_config

for n, c, h, w, k, dtype in (
    (4, 64, 64, 64, 5, torch.float16),
    (4, 128, 32, 32, 7, torch.float16),
    (8, 64, 64, 64, 3, torch.float16),
):
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    wt = torch.randn(c, 8, k, k, device="cuda", dtype=dtype) / (8 * k * k) ** 0.5
    g = c // 8
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), padding=k // 2, groups=g)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, padding=k // 2, groups=g)
    bound = 2 * (same.double() - ref).abs() + 2e-3 * (n * h * w) ** 0.5

    def report(tag, dw, ref=ref, bound=bound):
        bad = (dw.double() - ref).abs() > bound
        print(f"  {tag:40s} bad {int(bad.sum()):6d}/{bad.numel()}")

    prob = GConvProblem.from_tensors(x, wt, None, k // 2, k // 2)
    cfg = default_config(prob, "wgrad", 132)
    print(f"n{n} c{c} {h}x{w} k{k} {dtype} default {cfg.name}")
    dyc = dy.contiguous(memory_format=torch.channels_last)
    for det in (True, False):
        for need_db in (False, True):
            dw32, _ = gconv_wgrad.launch_wgrad(dyc, x, prob, cfg, need_db, det)
            report(f"kernel det={det} db={need_db}", dw32.permute(2, 3, 0, 1))
    for bias in (False, True):
        for det in (True, False):
            xl = x.detach().clone().requires_grad_()
            wl = wt.detach().clone().requires_grad_()
            b = torch.zeros(c, device="cuda", dtype=dtype, requires_grad=True) if bias else None
            y = tilewise.grouped_conv2d(xl, wl, b, padding=k // 2, deterministic=det)
            y.backward(dy)
            report(f"public bias={bias} det={det}", wl.grad)
            yr = F.conv2d(xl, wl, b, padding=k // 2, groups=g)
            assert torch.isfinite(yr).all()
