"""Every wgrad candidate on the shapes where the GPU test found wrong results (half precision,
bias gradient fused): bad-element counts of dw and db against fp64, per config and mode.

python scripts/wgrad_diag.py [--all] [--stages N]
  --all       every candidate of gconv_config.candidate_configs, the excluded ones included
  --stages N  launch each config with num_stages=N (a pipeliner-race hypothesis: PERF_NOTES)
"""

import argparse
from dataclasses import replace

import torch

from tilewise.ops import gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem, candidate_configs

parser = argparse.ArgumentParser()
parser.add_argument("--all", action="store_true")
parser.add_argument("--stages", type=int, default=None)
args = parser.parse_args()

for n, c, h, w, k, dtype in (
    (4, 64, 24, 20, 7, torch.float16),
    (4, 64, 24, 20, 7, torch.bfloat16),
    (4, 64, 64, 64, 5, torch.float16),
):
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    dy = dy.contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, 8, k, k, device="cuda", dtype=dtype)
    g, pad = c // 8, k // 2
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), padding=pad, groups=g)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, padding=pad, groups=g)
    bound = (
        2 * (same.double() - ref).abs()
        + {torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype] * (n * h * w) ** 0.5
    )
    db_ref = dy.double().sum((0, 2, 3))
    prob = GConvProblem.from_tensors(x, wt, torch.zeros(c, device="cuda"), pad, pad)
    print(f"n{n} c{c} {h}x{w} k{k} {dtype}")
    configs = (
        candidate_configs(prob, "wgrad", 132)
        if args.all
        else list(gconv_wgrad.wgrad_candidates(prob, 132))
    )
    if args.stages is not None:
        configs = [replace(c, num_stages=args.stages) for c in configs]
    for cfg in configs * 3:
        for det in (True, False):
            dw, db = gconv_wgrad.launch_wgrad(dy, x, prob, cfg, True, det)
            bad = ((dw.double() - ref).abs() > bound).sum().item()
            bad_db = ((db.double() - db_ref).abs() > 1e-3 + 1e-5 * db_ref.abs()).sum().item()
            flag = "  <-- WRONG" if bad or bad_db else ""
            print(f"  {cfg.name:22s} det={det!s:5s} bad dw {bad:6d} bad db {bad_db:4d}{flag}")
