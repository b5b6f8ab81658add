"""Every wgrad candidate config on the GPU shapes where the full-size test failed (5x5, 7x7 in
half precision): max error against an fp64 reference, per config and reduction mode.

python scripts/wgrad_diag.py
"""

import torch

from tilewise.ops import gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem, candidate_configs

for n, c, h, w, k, dtype in (
    (4, 64, 64, 64, 5, torch.float16),
    (4, 128, 32, 32, 7, torch.float16),
    (8, 64, 64, 64, 3, torch.float16),
    (4, 64, 64, 64, 5, torch.float32),
):
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    dy = torch.randn(n, c, h, w, device="cuda", dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    wt = torch.randn(c, 8, k, k, device="cuda", dtype=dtype)
    ref = torch.nn.grad.conv2d_weight(
        x.double(), wt.shape, dy.double(), padding=k // 2, groups=c // 8
    )
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, padding=k // 2, groups=c // 8)
    bound = 2 * (same.double() - ref).abs() + 1e-3 * (n * h * w) ** 0.5
    prob = GConvProblem.from_tensors(x, wt, None, k // 2, k // 2)
    print(f"n{n} c{c} {h}x{w} k{k} {dtype}: torch err {(same.double() - ref).abs().max():.3g}")
    for cfg in candidate_configs(prob, "wgrad", 132):
        for det in (True, False):
            dw32, _ = gconv_wgrad.launch_wgrad(dy, x, prob, cfg, False, det)
            dw = dw32.permute(2, 3, 0, 1).double()
            err = (dw - ref).abs()
            bad = int((err > bound).sum())
            # which taps hold the bad elements
            taps = sorted(
                {
                    int(t)
                    for t in (err > bound)
                    .nonzero()[:, 2:]
                    .mul(torch.tensor([k, 1], device="cuda"))
                    .sum(1)
                    .unique()
                    .tolist()
                }
            )
            print(
                f"  {cfg.name:22s} det={det!s:5s} max err {err.max():9.3g} bad {bad:6d}"
                f" taps {taps[:12]}{'...' if len(taps) > 12 else ''}"
            )
