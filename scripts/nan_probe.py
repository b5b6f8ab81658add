"""Where a row-pair tile's NaN/Inf pattern differs from PyTorch's (device diagnostic)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tilewise.ops import gconv_cuda


def cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def main() -> None:
    torch.manual_seed(0)
    c = 64
    for r, s, ph, pw in ((3, 3, 1, 1), (5, 5, 2, 2), (7, 7, 3, 3), (6, 6, 2, 3)):
        for dtype in (torch.float16,):
            x = cl(torch.randn(24, c, 33, 35, device="cuda"))
            wt = torch.randn(c, 8, r, s, device="cuda") / (8 * r * s) ** 0.5
            g, pad = c // 8, (ph, pw)
            for case, pos in (
                ("nan", ((3, 5, 7, 9),)),
                ("inf-edge", ((20, 60, 32, 34),)),
                ("inf-mid", ((10, 12, 16, 17),)),
            ):
                bad = x.to(dtype).clone()
                for p in pos:
                    bad[p] = float("nan") if case == "nan" else float("inf")
                ref = F.conv2d(bad, wt.to(dtype), None, padding=pad, groups=g)
                ref64 = F.conv2d(bad.double(), wt.double(), None, padding=pad, groups=g)
                d16 = (ref.isnan() != ref64.isnan()).sum().item()
                tma = gconv_cuda._tma.supported(0)
                tiles = [t for t in gconv_cuda.candidates(c, r, s, tma, wide_tiles=True)]
                tiles += [gconv_cuda.non_tma_twin(t, c, r, s) for t in tiles if t.tma]
                for tile in dict.fromkeys(tiles):
                    out = cl(torch.zeros(ref.shape, device="cuda", dtype=dtype))
                    gconv_cuda.fprop(cl(bad), wt.to(dtype), None, out, ph, pw, tile)
                    torch.cuda.synchronize()
                    mn = out.isnan() != ref64.isnan()
                    mi = out.isinf() != ref64.isinf()
                    line = f"{r}x{s} {case:8} {tile.name:34} cudnn-vs-64 {d16}"
                    line += f" nan {mn.sum().item()} inf {mi.sum().item()}"
                    bad_at = (mn | mi).nonzero()
                    if len(bad_at):
                        i = tuple(bad_at[0].tolist())
                        line += f" first {i} out {out[i].item()} ref64 {ref64[i].item()}"
                        line += f" n-range {bad_at[:, 0].unique().tolist()[:6]}"
                        line += f" rows {bad_at[:, 2].unique().tolist()[:12]}"
                    print(line, flush=True)


if __name__ == "__main__":
    main()
