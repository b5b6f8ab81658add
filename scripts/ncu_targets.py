"""Launch one kernel a few times at a study size, for Nsight Compute to read its counters.

    ncu --clock-control none -k regex:tw_gconv_fprop --launch-skip 2 -c 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        python scripts/ncu_targets.py gconv-fprop

Targets (fp16): ``gconv-fprop`` and ``gconv-wgrad`` (NVRTC kernels, C=64 64x64 N=128 3x3; fprop
takes the tap kernel's default tile or ``--tile i`` of ``gconv_cuda.TILES``, where 0 is the
row-pair 16x16 tile, kernel ``tw_gconv_fprop_rp``; or any ``CudaTile`` by ``--tile-spec
"16,16,32,4,2,2,rowpair=True,tma=2"``; ``--k`` the kernel size), ``ln-bwd`` (LayerNorm backward,
64 MB, n=1024, the default config), ``bias-act-bwd`` and ``bias-act-fwd`` (64 MB, n=4096,
``--act``).
"""

from __future__ import annotations

import argparse

import torch

from tilewise.ops import bias_act, gconv_cuda, layernorm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    targets = ["gconv-fprop", "gconv-wgrad", "ln-bwd", "bias-act-bwd", "bias-act-fwd"]
    ap.add_argument("target", choices=targets)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--hw", type=int, default=64)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument(
        "--tile", type=int, default=-1, help="gconv-fprop: index into gconv_cuda.TILES (-1: tap)"
    )
    ap.add_argument(
        "--tma-tile", type=int, default=-1, help="gconv-fprop: index into gconv_cuda.TMA_TILES"
    )
    ap.add_argument("--k", type=int, default=3, help="gconv targets: kernel size R = S")
    ap.add_argument(
        "--tile-spec", default="", help='gconv targets: CudaTile arguments ("8,16,32,4,3,2")'
    )
    ap.add_argument("--act", default="relu", help="bias-act targets: relu, gelu, silu")
    args = ap.parse_args()
    dt = torch.float16
    if args.target.startswith("gconv"):
        cl = torch.channels_last
        shape = (args.n, args.c, args.hw, args.hw)
        x = torch.randn(shape, device="cuda", dtype=dt).contiguous(memory_format=cl)
        k = args.k
        w = (torch.randn(args.c, 8, k, k, device="cuda") * 0.1).to(dt)
        out = torch.empty_like(x)
        if args.target == "gconv-fprop":
            tile = gconv_cuda.CudaTile() if args.tile < 0 else gconv_cuda.TILES[args.tile]
            if args.tma_tile >= 0:
                tile = gconv_cuda.TMA_TILES[args.tma_tile]
            if args.tile_spec:
                tile = eval(f"gconv_cuda.CudaTile({args.tile_spec})")  # a developer's argument
            fn = lambda: gconv_cuda.fprop(x, w, None, out, k // 2, k // 2, tile)  # noqa: E731
        else:
            tile = gconv_cuda.WGRAD_TILES[0]
            if args.tile_spec:
                tile = eval(f"gconv_cuda.CudaTile({args.tile_spec})")  # a developer's argument
            dy = torch.randn_like(x)  # (session 43 read the kernel on an uninitialized dy)
            fn = lambda: gconv_cuda.wgrad(dy, x, k, k, k // 2, k // 2, True, tile)  # noqa: E731
    else:
        n = 1024 if args.target == "ln-bwd" else 4096
        m = 64 * 2**20 // (n * 2)
        x = torch.randn(m, n, device="cuda", dtype=dt)
        dy = torch.randn_like(x)
        b = torch.randn(n, device="cuda", dtype=dt)
        if args.target == "ln-bwd":
            w = torch.randn(n, device="cuda", dtype=dt)
            _, mean, rstd = layernorm.forward(x, (n,), w, b)
            fn = lambda: layernorm.backward(dy, x, (n,), w, b, mean, rstd)  # noqa: E731
        elif args.target == "bias-act-fwd":
            fn = lambda: bias_act.forward(x, b, args.act)  # noqa: E731
        else:
            fn = lambda: bias_act.backward(dy, x, b, args.act)  # noqa: E731
    for _ in range(args.reps):
        fn()
    torch.cuda.synchronize()
    print(f"{args.target}: {args.reps} launches done")


if __name__ == "__main__":
    main()
