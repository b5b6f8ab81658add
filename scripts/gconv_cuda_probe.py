"""The NVRTC grouped-conv kernel (``tilewise.ops.gconv_cuda``) on a GPU: correctness of fprop and
dgrad against fp64 on odd shapes (three-way rule), then timing beside cuDNN and the Triton kernel
on the issue's shapes, as effective bandwidth (compulsory bytes / time) and fraction of copy.

    python scripts/gconv_cuda_probe.py [--tiles] [--n 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

import torch
import torch.nn.functional as F

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.checks import GCONV_ODD_SHAPES
from tilewise.bench.results import environment
from tilewise.bench.timing import time_events
from tilewise.ops import gconv, gconv_cuda, gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem
from tilewise.ops.gconv_cuda import CudaTile
from tilewise.runtime import alloc

ATOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _tile_for(c: int, tile: CudaTile) -> CudaTile:
    if tile.tma:  # TMA boxes take power-of-two channel blocks: the candidates' own fitting
        return gconv_cuda._fitted(tile, c)
    cb = min(tile.cb, c)
    while c % cb:
        cb //= 2
    return dataclasses.replace(tile, cb=cb)


def _judge(out, same, ref, atol, what) -> str:
    o, t = out.double(), same.double()
    # plus one unit in the last place at |ref|: a correctly rounded half output may sit half an
    # ulp off where PyTorch's happens to land closer (as tests/checks.py allows)
    ulp = torch.finfo(out.dtype).eps * ref.abs()
    err, bound = (o - ref).abs(), 2 * (t - ref).abs() + atol + ulp
    bad = int((~(err <= bound)).sum())
    return f"{what}: {'ok' if bad == 0 else f'{bad} BAD'} (max err {err.max().item():.2e})"


def _agreement(impls: dict, make_args) -> dict[str, float]:
    """Each implementation's largest difference from cuDNN's output on ``make_args()`` (fresh
    per call: outputs poisoned each time), relative to
    cuDNN's largest magnitude: a quick check of tiles ``check`` does not cover (the timing loops
    poison nothing, so a wrong tile would otherwise time as well as a right one)."""
    if "cudnn" not in impls:
        return {}
    out = {}
    with torch.no_grad(), alloc.poison_outputs():  # outputs NaN until written
        ref = impls["cudnn"](*make_args())
        ref = (ref[0] if isinstance(ref, tuple) else ref).float()
        for name, fn in impls.items():
            try:
                got = fn(*make_args())
                got = (got[0] if isinstance(got, tuple) else got).float()
                out[name] = ((got - ref).abs().max() / ref.abs().max()).item()
            except Exception:  # reported by the timing loop
                pass
    return out


def check(tile: CudaTile) -> bool:
    ok = True
    cases = GCONV_ODD_SHAPES
    for dname, dt in DTYPES.items():
        for n, c, h, w, r, s, ph, pw, has_b in cases:
            t = _tile_for(c, tile)
            x = _cl(torch.randn(n, c, h, w, device="cuda"))
            wt = torch.randn(c, 8, r, s, device="cuda") / (8 * r * s) ** 0.5
            if h % 2:  # weights of a channels_last model: read through their strides
                wt = _cl(wt)
            b = torch.randn(c, device="cuda") if has_b else None
            g = c // 8
            ref = F.conv2d(
                x.double(), wt.double(), b.double() if has_b else None, padding=(ph, pw), groups=g
            )
            same = F.conv2d(
                x.to(dt), wt.to(dt), b.to(dt) if has_b else None, padding=(ph, pw), groups=g
            )
            out = _cl(torch.full_like(same, float("nan")))
            gconv_cuda.fprop(_cl(x.to(dt)), wt.to(dt), b, out, ph, pw, t)
            torch.cuda.synchronize()
            msg = _judge(out, same, ref, ATOL[dt], "fprop")
            # dgrad: dx = conv(dy, flipped/transposed w, padding R-1-pad)
            dy = _cl(torch.randn_like(ref, dtype=torch.float32))
            dref = torch.nn.grad.conv2d_input(
                x.shape, wt.double(), dy.double(), padding=(ph, pw), groups=g
            )
            dsame = torch.nn.grad.conv2d_input(
                x.shape, wt.to(dt), dy.to(dt), padding=(ph, pw), groups=g
            )
            dx = _cl(torch.full((n, c, h, w), float("nan"), device="cuda", dtype=dt))
            gconv_cuda.fprop(
                _cl(dy.to(dt)),
                wt.to(dt),
                None,
                dx,
                r - 1 - ph,
                s - 1 - pw,
                t,
                True,
            )
            torch.cuda.synchronize()
            msg += "; " + _judge(dx, dsame, dref, ATOL[dt], "dgrad")
            if has_b or r == 3:
                wdy = _cl(torch.randn(ref.shape, device="cuda", dtype=dt))
                xd = _cl(x.to(dt))
                wref = torch.nn.grad.conv2d_weight(
                    xd.double(), wt.shape, wdy.double(), padding=(ph, pw), groups=g
                )
                wsame = torch.nn.grad.conv2d_weight(xd, wt.shape, wdy, padding=(ph, pw), groups=g)
                wt_tile = gconv_cuda.wgrad_candidates(c, r, s)[0]
                dw, _ = gconv_cuda.wgrad(wdy, xd, r, s, ph, pw, False, wt_tile)
                msg += "; " + _judge(dw, wsame, wref, ATOL[dt] * (n * h * w) ** 0.5, "wgrad")
            ok &= "BAD" not in msg
            print(f"{dname} n{n} c{c} {h}x{w} k{r}x{s} pad{ph},{pw} bias={has_b} {t.name}: {msg}")
    return ok


def _fprop_impls(c: int, tiles: list[CudaTile]) -> dict:
    impls = {
        "cudnn": lambda x, w, o, g=c // 8: F.conv2d(x, w, None, padding=1, groups=g),
        # tilewise's autotuned choice among the Triton configs and every NVRTC tile
        # (labelled "triton" in results before session 6)
        "tilewise": lambda x, w, o: gconv.forward(x, w, None, 1, 1),
    }
    for tile in tiles:
        t = _tile_for(c, tile)
        impls[t.name] = lambda x, w, o, t=t: gconv_cuda.fprop(x, w, None, o, 1, 1, t)
    return impls


def _dgrad_impls(c: int, tiles: list[CudaTile]) -> dict:
    """dx of a 3x3, padding-1 conv given dy (``x`` of the input set: the same shape)."""
    need = (True, False, False)
    impls = {
        "cudnn": lambda dy, w, o, g=c // 8: torch.nn.grad.conv2d_input(
            dy.shape, w, dy, padding=1, groups=g
        ),
        "tilewise": lambda dy, w, o: gconv.backward(dy, dy, w, None, 1, 1, need)[0],
    }
    for tile in tiles:
        t = _tile_for(c, tile)
        impls[t.name] = lambda dy, w, o, t=t: gconv_cuda.fprop(dy, w, None, o, 1, 1, t, True)
    return impls


def bench(
    tiles: list[CudaTile], n: int, copy_bw: float, passes: tuple[str, ...] = ("fprop",)
) -> list[dict]:
    """fprop (and with ``passes`` dgrad) of every tile beside cuDNN and tilewise's pick."""
    torch.backends.cudnn.benchmark = True
    rows = []
    for c, hw, dname, dt, pass_ in (
        (c, hw, dname, dt, pass_)
        for c, hw in ((64, 64), (128, 32), (256, 16))
        for dname, dt in DTYPES.items()
        for pass_ in passes
    ):
        sets = []
        for _ in range(3):  # 3 x >= 64 MB activations: past the 50 MB L2
            x = _cl(torch.randn(n, c, hw, hw, device="cuda", dtype=dt))
            w = torch.randn(c, 8, 3, 3, device="cuda", dtype=dt) * 0.1
            sets.append((x, w, _cl(torch.empty_like(x))))
        nbytes = 2 * sets[0][0].nbytes + sets[0][1].nbytes
        impls = (_fprop_impls if pass_ == "fprop" else _dgrad_impls)(c, tiles)
        res = {}
        for name, fn in impls.items():
            try:
                res[name] = time_events(fn, sets, warmup=5, reps=30).median_s
            except Exception as exc:  # a tile that fails to compile or launch is reported
                print(f"  {name}: {type(exc).__name__}: {exc}"[:300])
        agree = _agreement(
            impls, lambda s=sets[0]: (s[0], s[1], _cl(torch.full_like(s[0], float("nan"))))
        )
        for name, s in res.items():
            row = dict(
                pass_=pass_,
                c=c,
                hw=hw,
                n=n,
                dtype=dname,
                impl=name,
                median_s=s,
                gbps=nbytes / s / 1e9,
                frac_copy=nbytes / s / copy_bw,
                x_cudnn=res["cudnn"] / s if "cudnn" in res else None,
                rel_err_vs_cudnn=agree.get(name),
            )
            rows.append(row)
            print(
                f"{'' if pass_ == 'fprop' else 'dgrad '}"
                f"C={c:3d} {hw}x{hw} N={n} {dname} {name:24s} {s * 1e6:8.1f} us "
                f"{row['gbps']:7.0f} GB/s  {row['frac_copy']:.3f} of copy  "
                f"{row['x_cudnn'] or 0:.2f}x cuDNN  err {agree.get(name, float('nan')):.1e}"
            )
        del sets
    return rows


#: TMA wgrad tiles beyond the candidates (``--wgrad-extra``). Session 19's first sweep made the
#: 64-channel 16x16 tile a candidate (0.80-0.91 of copy at C=64); its neighbours (3 stages,
#: 8x16 / 16x8 / 8x32 tiles, 2 warps per group) were within 1-2% of it at C=64 N=256, the 8x32
#: ones 17% slower at C=256, the 4-stage 8x16 one 1% faster at C=128. These take 128-channel
#: blocks: 256-byte pixels, two 128-byte rows each (5-d tensor maps)
WGRAD_EXTRA_TILES = (
    CudaTile(8, 16, 128, 16, 1, 2, tma=1),
    CudaTile(16, 8, 128, 16, 1, 2, tma=1),
    CudaTile(8, 8, 128, 16, 2, 2, tma=1),
    CudaTile(8, 8, 128, 16, 1, 3, tma=1),
    CudaTile(4, 16, 128, 16, 2, 2, tma=1),
)

#: row-pair fprop tiles with 128-channel TMA boxes (``--fprop-extra``), as the wgrad's
FPROP_EXTRA_TILES = (
    CudaTile(8, 16, 128, 16, 1, 2, rowpair=True, tma=2),
    CudaTile(16, 8, 128, 16, 1, 2, rowpair=True, tma=2),
    CudaTile(8, 8, 128, 16, 2, 2, rowpair=True, tma=2),
    CudaTile(8, 16, 128, 16, 1, 2, rowpair=True, tma=1),
)


def bench_wgrad(n: int, copy_bw: float, extra: tuple = ()) -> list[dict]:
    """wgrad (non-deterministic) beside cuDNN: each NVRTC tile, and tilewise's autotuned pick."""
    rows = []
    for c, hw in ((64, 64), (128, 32), (256, 16)):
        for dname, dt in DTYPES.items():
            sets = []
            for _ in range(3):
                x = _cl(torch.randn(n, c, hw, hw, device="cuda", dtype=dt))
                sets.append((x, _cl(torch.randn_like(x))))
            nbytes = 2 * sets[0][0].nbytes + c * 8 * 9 * 2
            prob = GConvProblem.from_tensors(sets[0][0], torch.empty(c, 8, 3, 3), None, 1, 1)
            impls = {
                "cudnn": lambda x, dy, g=c // 8, c=c: torch.nn.grad.conv2d_weight(
                    x, (c, 8, 3, 3), dy, padding=1, groups=g
                ),
                "tilewise": lambda x, dy, p=prob: gconv_wgrad.wgrad(dy, x, p, False, False),
            }
            experimental = (
                gconv_cuda._fitted(t, c, True)
                for t in gconv_cuda.EXPERIMENTAL_WGRAD_TILES + tuple(extra)
            )
            tma = gconv_cuda.tma_usable(sets[0][0])
            tiles = list(gconv_cuda.wgrad_candidates(c, 3, 3)) + [
                t
                for t in experimental
                if gconv_cuda.wgrad_tile_ok(c, 3, 3, t) and (tma or not t.tma)
            ]
            for tile in tiles:
                impls[tile.name] = lambda x, dy, t=tile: gconv_cuda.wgrad(
                    dy, x, 3, 3, 1, 1, False, t
                )
            res = {}
            for name, fn in impls.items():
                try:
                    res[name] = time_events(fn, sets, warmup=5, reps=30).median_s
                except Exception as exc:
                    print(f"  {name}: {type(exc).__name__}: {exc}"[:300])
            agree = _agreement(impls, lambda s=sets[0]: s)
            for name, sec in res.items():
                row = dict(pass_="wgrad", c=c, hw=hw, n=n, dtype=dname, impl=name, median_s=sec,
                           gbps=nbytes / sec / 1e9, frac_copy=nbytes / sec / copy_bw,
                           x_cudnn=res["cudnn"] / sec if "cudnn" in res else None,
                           rel_err_vs_cudnn=agree.get(name))  # fmt: skip
                rows.append(row)
                print(
                    f"wgrad C={c:3d} {hw}x{hw} N={n} {dname} {name:26s} {sec * 1e6:8.1f} us "
                    f"{row['frac_copy']:.3f} of copy  {row['x_cudnn'] or 0:.2f}x cuDNN  "
                    f"err {agree.get(name, float('nan')):.1e}"
                )
            del sets
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", action="store_true", help="time several tile shapes")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument(
        "--rowpair", action="store_true", help="check the row-pair kernel; time every TILES entry"
    )
    ap.add_argument("--fprop-only", action="store_true", help="skip the wgrad timing")
    ap.add_argument("--wgrad-only", action="store_true", help="skip the fprop timing")
    ap.add_argument(
        "--shipped", action="store_true", help="with --rowpair: time only gconv_cuda.TILES"
    )
    ap.add_argument(
        "--wgrad-extra", action="store_true", help="time WGRAD_EXTRA_TILES too (TMA variants)"
    )
    ap.add_argument("--dgrad", action="store_true", help="time dgrad beside fprop")
    ap.add_argument(
        "--fprop-extra", action="store_true", help="with --rowpair: time FPROP_EXTRA_TILES too"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--no-check", action="store_true", help="time only (tests/test_gconv_cuda.py checks)"
    )
    args = ap.parse_args()
    # the autotuner's picks for the "tilewise" rows ("tilewise.autotune: op problem -> config")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("tilewise").setLevel(logging.INFO)
    base = CudaTile()
    check_ = (lambda tile: None) if args.no_check else check
    ok = check_(base) is not False
    tiles = [base]
    if args.rowpair:
        ok &= check_(CudaTile(rowpair=True)) is not False
        tiles = list(gconv_cuda.TILES)
        if gconv_cuda.tma_usable(torch.empty(0, device="cuda")):
            ok &= check_(CudaTile(rowpair=True, tma=2)) is not False
            tiles += list(gconv_cuda.TMA_TILES)
        if not args.shipped:
            # row-pair tiles not among the candidates: deeper prefetch (ncu, session 7: the
            # 16x16 two-stage tile is latency-bound at 12 warps per SM with one tile in flight
            # per CTA). Session 6's extras (16x8 m5, 16x16 8 warps, 8x16 m5) were all slower, and
            # so were these three in session 8 (by 2-10% at C=64 and C=128, fp16/bf16).
            tiles += [
                CudaTile(8, 16, 32, 4, 4, 3, rowpair=True),
                CudaTile(8, 16, 32, 4, 3, 4, rowpair=True),
                CudaTile(16, 16, 32, 4, 2, 3, rowpair=True),
            ]
    if args.rowpair and args.fprop_extra:
        tiles += list(FPROP_EXTRA_TILES)
    print("correctness:", "not checked" if args.no_check else "all ok" if ok else "FAILURES")
    if args.tiles:
        tiles += [
            CudaTile(8, 16, 32, 4, 4, 3),
            CudaTile(8, 16, 32, 4, 5, 2),
            CudaTile(8, 16, 32, 4, 4, 4),
            CudaTile(16, 16, 32, 8, 2, 2),
            CudaTile(8, 16, 64, 4, 3, 2),
            CudaTile(8, 8, 32, 4, 6, 3),
        ]
    copy_bw = measure_copy_bandwidth()
    print(f"copy {copy_bw / 1e12:.2f} TB/s")
    passes = ("fprop", "dgrad") if args.dgrad else ("fprop",)
    rows = [] if args.wgrad_only else bench(tiles, args.n, copy_bw, passes)
    if not args.fprop_only:
        rows += bench_wgrad(args.n, copy_bw, WGRAD_EXTRA_TILES if args.wgrad_extra else ())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": environment(),
                    "copy_bytes_per_s": copy_bw,
                    "correct": ok,
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
