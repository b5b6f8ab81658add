"""The rolling-row kernel's algorithm (``ops.gconv_roll_src``, session 36), modelled in fp64 on
the CPU and compared with PyTorch: its weight staging (each weight into kernel-row blocks R - 1 - r
and 2R - 1 - r, dgrad's flip and transpose), the window of B each phase reads, the accumulator
blocks bound to output rows mod R, the finished row taken out before each row's MMAs, bands of TH
rows with their halo rows, 64-pixel tiles, padding, input rows outside the image skipped and the
odd column paired with zeros. It checks the algorithm, not the CUDA transcription: the GPU tests
(``test_gconv_cuda.py::test_roll_tiles``) run the kernel itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

TW = 64  # the kernel's pixels a tile (M)


def _stage_b(w: torch.Tensor, g: int, dgrad: bool) -> torch.Tensor:
    """The kernel's B for group ``g``: [2R - 1 blocks][KP columns][8 out][8 in], filled in the
    weight's own order as the kernel's prologue does (padding columns left zero)."""
    r_n, s_n = w.shape[2], w.shape[3]
    kp = 2 * ((s_n + 1) // 2)
    b = torch.zeros(2 * r_n - 1, kp, 8, 8, dtype=w.dtype)
    for a in range(8):
        for bb in range(8):
            for rr in range(r_n):
                for ss in range(s_n):
                    v = w[g * 8 + a, bb, rr, ss]
                    if dgrad:  # the weight's [c][o][R - 1 - r][S - 1 - s]
                        co, ci, r, s = bb, a, r_n - 1 - rr, s_n - 1 - ss
                    else:
                        co, ci, r, s = a, bb, rr, ss
                    b[r_n - 1 - r, s, co, ci] = v
                    if r > 0:
                        b[2 * r_n - 1 - r, s, co, ci] = v
    return b


def roll_conv(
    x: torch.Tensor,
    w: torch.Tensor,
    pad_h: int,
    pad_w: int,
    th: int,
    dgrad: bool = False,
    stage=_stage_b,
) -> torch.Tensor:
    """The grouped conv (group width 8, stride 1) as the rolling-row kernel computes it
    (``stage``: B's staging, replaceable to show the comparison notices a wrong one)."""
    n, c, hi, wi = x.shape
    r_n, s_n = w.shape[2], w.shape[3]
    ho, wo = hi + 2 * pad_h - r_n + 1, wi + 2 * pad_w - s_n + 1
    kp = 2 * ((s_n + 1) // 2)
    out = torch.full((n, c, ho, wo), float("nan"), dtype=x.dtype)
    rows_in = th + r_n - 1
    for g in range(c // 8):
        bmat = stage(w, g, dgrad)
        xg = x[:, g * 8 : g * 8 + 8]
        for img in range(n):
            for y0 in range(0, ho, th):
                for x0 in range(0, wo, TW):
                    acc = torch.zeros(r_n, TW, 8, dtype=x.dtype)  # block b: [pixel][out]
                    for i in range(rows_in + 1):
                        # row i - 1 finished output row i - R, in block i mod R: out, zeroed
                        blk, o = i % r_n, i - r_n
                        if 0 <= o < th and y0 + o < ho:
                            cols = min(TW, wo - x0)
                            out[img, g * 8 : g * 8 + 8, y0 + o, x0 : x0 + cols] = acc[blk, :cols].T
                        acc[blk] = 0
                        yi = y0 - pad_h + i
                        if i == rows_in or not 0 <= yi < hi:  # outside the image: skipped
                            continue
                        a = torch.zeros(TW, kp, 8, dtype=x.dtype)  # [pixel][column][in]
                        for s in range(s_n):  # column S (odd S) stays zero, as in A
                            xs = torch.arange(TW) + x0 + s - pad_w
                            ok = (xs >= 0) & (xs < wi)
                            a[ok, s] = xg[img, :, yi, xs[ok]].T
                        ph = i % r_n
                        window = bmat[r_n - 1 - ph : 2 * r_n - 1 - ph]  # [R][KP][out][in]
                        acc += torch.einsum("msc,bsoc->bmo", a, window)
    return out


CASES = [  # N, C, H, W, R, S, pad_h, pad_w, TH
    (2, 16, 9, 11, 3, 3, 1, 1, 4),
    (1, 16, 13, 70, 5, 5, 2, 2, 8),
    (1, 8, 7, 5, 7, 7, 3, 3, 32),
    (2, 8, 6, 9, 6, 4, 0, 1, 4),
    (1, 16, 5, 3, 3, 1, 1, 0, 2),
    (1, 8, 4, 66, 7, 5, 4, 1, 3),
    (1, 8, 1, 1, 3, 3, 1, 1, 16),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rolling_rows_match_pytorch(case):
    n, c, h, w_, r, s, pad_h, pad_w, th = case
    g = torch.Generator().manual_seed(hash(case) % (2**31))
    x = torch.randn(n, c, h, w_, dtype=torch.float64, generator=g)
    wt = torch.randn(c, 8, r, s, dtype=torch.float64, generator=g)
    want = F.conv2d(x, wt, padding=(pad_h, pad_w), groups=c // 8)
    got = roll_conv(x, wt, pad_h, pad_w, th)
    assert not got.isnan().any()  # every output written once a band
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES[:4], ids=str)
def test_rolling_rows_dgrad_match_pytorch(case):
    """dgrad: the same kernel over dy with the flipped, transposed weights and padding
    R - 1 - p (as ``gconv_cuda.fprop(..., dgrad=True)`` is called)."""
    n, c, h, w_, r, s, pad_h, pad_w, th = case
    g = torch.Generator().manual_seed(hash(case) % (2**31) + 1)
    x = torch.randn(n, c, h, w_, dtype=torch.float64, generator=g)
    wt = torch.randn(c, 8, r, s, dtype=torch.float64, generator=g)
    shape = F.conv2d(x, wt, padding=(pad_h, pad_w), groups=c // 8).shape
    dy = torch.randn(shape, dtype=x.dtype, generator=g)
    want = torch.nn.grad.conv2d_input(x.shape, wt, dy, padding=(pad_h, pad_w), groups=c // 8)
    got = roll_conv(dy, wt, r - 1 - pad_h, s - 1 - pad_w, th, dgrad=True)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_model_catches_a_wrong_window():
    """The comparison has teeth: B's window one block off gives a different answer."""
    n, c, h, w_, r, s, pad_h, pad_w, th = CASES[0]
    g = torch.Generator().manual_seed(36)
    x = torch.randn(n, c, h, w_, dtype=torch.float64, generator=g)
    wt = torch.randn(c, 8, r, s, dtype=torch.float64, generator=g)
    good = roll_conv(x, wt, pad_h, pad_w, th)

    def shifted(w, g, dgrad):
        return torch.roll(_stage_b(w, g, dgrad), 1, dims=0)

    bad = roll_conv(x, wt, pad_h, pad_w, th, stage=shifted)
    assert not torch.allclose(good, bad)
