"""Prototype (session 31): the grouped conv's weight gradient on Hopper's warpgroup MMA.

The library's wgrad read 0.24 of copy at 7x7 and 0.45 at 5x5 in session 31 (C=64 64x64, N = 128
fp16; session 24: 0.29-0.33 and 0.52-0.61 at N = 128-256), against the issue's 0.75. Its MMAs are
m16n8k16 per warp; here one ``wgmma`` covers a whole input row's contribution to a group's
weights:

    dW[o][c][r][s] = sum over n, y, x of dy[n][y][x][o] * xpad[n][y + r][x + s][c]

For padded input row Y of an image and 16 output columns x0..x0+15 (K = 16):
- M = 64 = 8 out channels o x 8 kernel rows r (r < R used): A[(r, o)][k] = dy[Y - r][x0 + k][o],
  zero where Y - r is outside the image; in registers by ``ldmatrix.x4.trans`` from a ring of the
  last R + 3 dy rows (8 channels a pixel, 16 bytes; a zero row stands in for rows outside);
- N = 8 S = kernel columns s x 8 in channels c: B[k][(s, c)] = xpad[Y][x0 + k + s][c], read by
  the tensor cores from the input row in shared memory (16 bytes a pixel), MN-major (``tnspB``):
  core matrix (8 pixels, 8 channels) at x0 + 8 kb pixels, kernel column s at +16 bytes.
MMA work: 64 x 8S x 16 multiply-adds per row and 16 columns, (R / 8) x (H / (H + R - 1)) useful
(7x7 at 64x64: 80%, against the fprop's Toeplitz 70%). One warpgroup per group, its accumulator
(4 S fp32 a thread) over all rows of its images; atomics into an fp32 dW at the end. Rows arrive
by ``cp.async`` (16 bytes a thread, zero-filled outside the image), PD steps of RB rows ahead.

    python scripts/gconv_wgrad_wgmma_probe.py [--kernels 7 5 3] [--n 128] [--variants 2,2,1,1,4 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
from dataclasses import dataclass

import torch

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.results import environment
from tilewise.bench.timing import TIMERS, time_calls
from tilewise.ops import gconv_cuda, gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem, channels_last_copy
from tilewise.ops.gconv_cuda_src import SMEM_U32
from tilewise.ops.gconv_wgmma_src import DESC, wgmma_asm
from tilewise.runtime import cuda_launch

_SOURCE = (
    r"""
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define R {R}
#define S {S}
#define NG {NG}
#define WOP {WOP}
#define SWAP {SWAP}
#define PD {PD}
#define RB {RB}
#define DRAIN {DRAIN}
#define DYR {DYR}
#define XR {XR}
#define WX (WOP + S - 1)
#define KC (WOP / 16)
#define NT (128 * NG)
#define DY_ROW (WOP * 16)
#define X_ROW (WX * 16)
#define X_OFF (DYR * DY_ROW)
#define GROUP_BYTES (X_OFF + XR * X_ROW + 16)
#define ZERO_OFF (NG * GROUP_BYTES)
#define XJ ((WX * NG + NT - 1) / NT)
#define DJ ((WOP * NG + NT - 1) / NT)

"""
    + SMEM_U32
    + DESC
    + r"""__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}}
__device__ __forceinline__ void ldsm_x4_t(u32* a, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}}
__device__ __forceinline__ void wgmma(float* d, const u32* a, u64 db, int accumulate) {{
{WGMMA}
}}

// Rows are numbered u = 0 .. U - 1 over the CTA's images ((Ho + R - 1) padded input rows each);
// row u's input row goes to x slot u % XR, its dy row (Y < Ho) to dy slot u % DYR. A step takes
// RB rows behind one pair of CTA barriers; loads run PD steps ahead.
extern "C" __global__ void __launch_bounds__(NT, {MIN_CTAS})
tw_gconv_wgrad_proto(const u16* __restrict__ dy, const u16* __restrict__ x, float* __restrict__ dw,
                  int N, int H, int W, int Ho, int Wo, int C, int pad_h, int pad_w, int per_cta)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = warp >> 2, w4 = warp & 3;
    const int c0 = blockIdx.x * 8 * NG, n0 = blockIdx.y * per_cta;
    const int n1 = min(N, n0 + per_cta);
    if (n0 >= n1) return;
    const u32 sb = smem_u32(smem);
    for (int i = tid; i < DY_ROW / 4; i += NT) ((u32*)(smem + ZERO_OFF))[i] = 0u;
    const int rows = Ho + R - 1, U = (n1 - n0) * rows, T = (U + RB - 1) / RB;
    // this thread's 16-byte pieces of a row (pixel p, group gg): the same every row
    u32 xs[XJ], ds[DJ];
    int xg[XJ], dg[DJ];
    bool xin[XJ], xv[XJ], din[DJ], dv[DJ];
#pragma unroll
    for (int j = 0; j < XJ; ++j) {{
        const int i = tid + j * NT, gg = i % NG, p = i / NG, col = p - pad_w;
        xin[j] = i < WX * NG;
        xv[j] = xin[j] && col >= 0 && col < W;
        xs[j] = sb + gg * GROUP_BYTES + X_OFF + p * 16;
        xg[j] = xv[j] ? col * C + c0 + 8 * gg : 0;
    }}
#pragma unroll
    for (int j = 0; j < DJ; ++j) {{
        const int i = tid + j * NT, gg = i % NG, p = i / NG;
        din[j] = i < WOP * NG;
        dv[j] = din[j] && p < Wo;
        ds[j] = sb + gg * GROUP_BYTES + p * 16;
        dg[j] = dv[j] ? p * C + c0 + 8 * gg : 0;
    }}
    int lu = 0, ln = n0, ly = 0;  // the next row to load
    auto load_step = [&]() {{
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {{
            if (lu < U) {{
                const int xr = ly - pad_h;
                if (xr >= 0 && xr < H) {{
                    const u16* src = x + ((long long)ln * H + xr) * W * C;
                    const u32 slot = (lu & (XR - 1)) * X_ROW;
#pragma unroll
                    for (int j = 0; j < XJ; ++j)
                        if (xin[j]) cp_async16(xs[j] + slot, src + xg[j], xv[j] ? 16 : 0);
                }}
                if (ly < Ho) {{
                    const u16* src = dy + ((long long)ln * Ho + ly) * Wo * C;
                    const u32 slot = (lu & (DYR - 1)) * DY_ROW;
#pragma unroll
                    for (int j = 0; j < DJ; ++j)
                        if (din[j]) cp_async16(ds[j] + slot, src + dg[j], dv[j] ? 16 : 0);
                }}
                ++lu;
                if (++ly == rows) {{ ly = 0; ++ln; }}
            }}
        }}
    }};
#pragma unroll
    for (int t = 0; t < PD; ++t) {{
        load_step();
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }}
    float acc[4 * S];
#pragma unroll
    for (int i = 0; i < 4 * S; ++i) acc[i] = 0.f;
    // this lane's ldmatrix row: matrix q = lane / 8 is (kernel row 2 w4 + (q & 1), pixels
    // 8 (q >> 1) .. + 7) of the 16 columns: A's (rows 0-7 | 8-15) x (k 0-7 | 8-15) blocks
    const int q = lane >> 3, ar = 2 * w4 + (q & 1), apx = (lane & 7) + 8 * (q >> 1);
    const u32 gbase = sb + g * GROUP_BYTES;
    int cu = 0, cy = 0;  // the next row to compute
    // DRAIN: a step waits for all MMAs before its loads, then loads the A registers of all its
    // RB rows (one set a row), one fence, RB x KC wgmma, one commit: the fewest instructions.
    // Otherwise two sets by row parity, a wait, a fence and a commit a row.
#if DRAIN
    u32 a[RB][KC][4];
#else
    u32 a[2][KC][4];
#endif
    for (int t = 0; t < T; ++t) {{
        // every row group (DRAIN) or all but the last has completed: the slots loaded below
        // are free
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(DRAIN ? 0 : 1) : "memory");
        __syncthreads();
        load_step();
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group %0;\n" :: "n"(PD) : "memory");
        __syncthreads();
#if DRAIN
        u32 xrows[RB];
        bool oks[RB];
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {{
            const int xr = cy - pad_h, y = cy - ar;
            oks[rb] = cu < U && xr >= 0 && xr < H;
            xrows[rb] = gbase + X_OFF + (cu & (XR - 1)) * X_ROW;
            const u32 arow = (ar < R && y >= 0 && y < Ho)
                                 ? gbase + ((cu - ar) & (DYR - 1)) * DY_ROW : sb + ZERO_OFF;
            if (oks[rb]) {{
#pragma unroll
                for (int kc = 0; kc < KC; ++kc) ldsm_x4_t(a[rb][kc], arow + (16 * kc + apx) * 16);
            }}
            ++cu;
            if (++cy == rows) cy = 0;
        }}
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int rb = 0; rb < RB; ++rb)
            if (oks[rb]) {{
#pragma unroll
                for (int kc = 0; kc < KC; ++kc)
                    wgmma(acc, a[rb][kc],
                          desc(xrows[rb] + 256 * kc, SWAP ? 128 : 16, SWAP ? 16 : 128), 1);
            }}
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {{
            const int xr = cy - pad_h;
            if (cu < U && xr >= 0 && xr < H) {{
                const int y = cy - ar, set = cu & 1;
                const u32 arow = (ar < R && y >= 0 && y < Ho)
                                     ? gbase + ((cu - ar) & (DYR - 1)) * DY_ROW : sb + ZERO_OFF;
                const u32 xrow = gbase + X_OFF + (cu & (XR - 1)) * X_ROW;
                // this set's registers were last read by the row group two back
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#pragma unroll
                for (int kc = 0; kc < KC; ++kc) ldsm_x4_t(a[set][kc], arow + (16 * kc + apx) * 16);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                for (int kc = 0; kc < KC; ++kc)
                    wgmma(acc, a[set][kc],
                          desc(xrow + 256 * kc, SWAP ? 128 : 16, SWAP ? 16 : 128), 1);
            }}
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            ++cu;
            if (++cy == rows) cy = 0;
        }}
#endif
    }}
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    // D: row 16 w4 + lane / 4 (+ 8 h) = (kernel row 2 w4 + h, out channel lane / 4); column
    // 8 i + 2 (lane % 4) + e = (kernel column i, in channel 2 (lane % 4) + e)
    const int o = c0 + 8 * g + (lane >> 2);
#pragma unroll
    for (int i = 0; i < S; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {{
                const int r = 2 * w4 + h;
                if (r < R)
                    atomicAdd(dw + (((long long)o * 8 + 2 * (lane & 3) + e) * R + r) * S + i,
                              acc[4 * i + 2 * h + e]);
            }}
}}
"""
)


@dataclass(frozen=True)
class Variant:
    ng: int  # groups (warpgroups) a CTA
    min_ctas: int
    swap: int = 1  # which descriptor field takes the K stride (1: the leading one, call 4)
    pd: int = 2  # steps loaded ahead
    rb: int = 1  # rows a step (behind one pair of CTA barriers)
    drain: int = 0  # 1: all MMAs waited for at a step's start, one fence and commit a step

    @property
    def name(self) -> str:
        tag = f"wgwg_g{self.ng}m{self.min_ctas}p{self.pd}r{self.rb}" + ("d" if self.drain else "")
        return tag + ("" if self.swap else "_noswap")

    def rings(self, r: int) -> tuple[int, int]:
        """(dy rows, input rows) the rings hold: powers of two with room for the rows read
        by the steps still in flight when a step's loads overwrite a slot."""
        dyr = 1 << (r - 1 + self.rb * (self.pd + 3) - 1).bit_length()
        return dyr, 1 << (self.rb * (self.pd + 3) - 1).bit_length()

    @classmethod
    def parse(cls, text: str) -> Variant:
        return cls(*(int(v) for v in text.split(",")))


def _wop(wo: int) -> int:
    return -(-wo // 16) * 16


def smem_bytes(r: int, s: int, wo: int, v: Variant) -> int:
    wop = _wop(wo)
    dyr, xr = v.rings(r)
    group = dyr * wop * 16 + xr * (wop + s - 1) * 16 + 16
    return v.ng * group + wop * 16


@functools.cache
def _kernel(r: int, s: int, wo: int, v: Variant, bf16: bool):
    src = _SOURCE.format(
        R=r, S=s, NG=v.ng, WOP=_wop(wo), SWAP=v.swap, PD=v.pd, RB=v.rb, DYR=v.rings(r)[0],
        XR=v.rings(r)[1], DRAIN=v.drain, MIN_CTAS=v.min_ctas,
        WGMMA=wgmma_asm(bf16, 8 * s, trans_b=True),
    )  # fmt: skip
    k = torch.cuda._compile_kernel(src, "tw_gconv_wgrad_proto", compute_capability="90a")
    k.set_shared_memory_config(smem_bytes(r, s, wo, v))
    return k


def wgrad(dy: torch.Tensor, x: torch.Tensor, r: int, s: int, pad: int, v: Variant) -> torch.Tensor:
    """dW [C, 8, R, S] in x's dtype of the grouped conv (stride 1, zero padding ``pad``) of
    channels_last ``x`` whose output gradient is channels_last ``dy``."""
    n, c, h, w = x.shape
    ho, wo = dy.shape[2:]
    if c % (8 * v.ng):
        raise ValueError(f"argument 'x': {c} channels, not a multiple of {8 * v.ng}")
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    blocks = c // (8 * v.ng)
    split = max(1, min(n, v.min_ctas * sms // blocks))
    per_cta = -(-n // split)
    split = -(-n // per_cta)
    dw = torch.zeros(c, 8, r, s, device=x.device, dtype=torch.float32)
    k = _kernel(r, s, wo, v, x.dtype == torch.bfloat16)
    args = [dy, x, dw, n, h, w, ho, wo, c, pad, pad, per_cta]
    launcher = cuda_launch.lean_launcher(k, "ppp" + "i" * 9)
    cuda_launch.launch(
        k, (blocks, split, 1), (128 * v.ng, 1, 1), args, smem_bytes(r, s, wo, v), x.device.index,
        launcher,
    )  # fmt: skip
    return dw.to(x.dtype)


def emulate(
    dy: torch.Tensor, x: torch.Tensor, r: int, s: int, pad: int, v: Variant, per_cta: int
) -> torch.Tensor:
    """The kernel's index logic on the CPU (fp64, NHWC tensors ``x`` [N, H, W, C] and ``dy``
    [N, Ho, Wo, C]): its row counters, ring slots, zero row, padding and (row, kernel row) to
    MMA mapping, CTA by CTA; not its timing (``rings`` and its slot-reuse bound cover that)."""
    n, h, w, c = x.shape
    ho, wo = dy.shape[1:3]
    wop, (dyr, xr_) = _wop(wo), v.rings(r)
    wx, rows = wop + s - 1, ho + r - 1
    dw = torch.zeros(c, 8, r, s, dtype=torch.float64)
    for c0 in range(0, c, 8 * v.ng):
        for n0 in range(0, n, per_cta):
            n1 = min(n, n0 + per_cta)
            u_end = (n1 - n0) * rows
            dring = torch.full((v.ng, dyr, wop, 8), float("nan"), dtype=torch.float64)
            xring = torch.full((v.ng, xr_, wx, 8), float("nan"), dtype=torch.float64)
            acc = torch.zeros(v.ng, 8, 8, s, 8, dtype=torch.float64)  # g, kernel row, o, s, c
            lu, ln, ly = 0, n0, 0

            def load_step(xring=xring, dring=dring, c0=c0, u_end=u_end):
                nonlocal lu, ln, ly
                for _ in range(v.rb):
                    if lu >= u_end:
                        return
                    if 0 <= ly - pad < h:
                        xring[:, lu % xr_] = 0.0
                        lo, hi = max(0, pad), min(wx, w + pad)
                        row = x[ln, ly - pad, lo - pad : hi - pad, c0 : c0 + 8 * v.ng]
                        xring[:, lu % xr_, lo:hi] = row.reshape(hi - lo, v.ng, 8).transpose(0, 1)
                    if ly < ho:
                        dring[:, lu % dyr] = 0.0
                        row = dy[ln, ly, :, c0 : c0 + 8 * v.ng].reshape(wo, v.ng, 8)
                        dring[:, lu % dyr, :wo] = row.transpose(0, 1)
                    lu += 1
                    ly += 1
                    if ly == rows:
                        ly, ln = 0, ln + 1

            for _ in range(v.pd):
                load_step()
            cu, cy = 0, 0
            for _ in range(-(-u_end // v.rb)):
                load_step()
                for _ in range(v.rb):
                    if cu < u_end and 0 <= cy - pad < h:
                        xrow = xring[:, cu % xr_]  # [g, wx, 8]
                        for ar in range(8):
                            ok = ar < r and 0 <= cy - ar < ho
                            arow = dring[:, (cu - ar) % dyr] if ok else torch.zeros(v.ng, wop, 8)
                            # B[k][(s, c)] = xrow[k + s][c]; A[(ar, o)][k] = arow[k][o]
                            b = torch.stack([xrow[:, j : j + wop] for j in range(s)], 2)
                            acc[:, ar] += torch.einsum("gko,gksc->gosc", arow.double(), b)
                    cu += 1
                    cy = 0 if cy + 1 == rows else cy + 1
            for g in range(v.ng):
                lo = c0 + 8 * g
                dw[lo : lo + 8] += acc[g, :r].permute(1, 3, 0, 2)  # [o, c, r, s]
    return dw


def _emulate_check(k: int, v: Variant, shape: tuple, per_cta: int) -> float:
    """Max |emulated - reference| over max |reference| for a random fp64 problem."""
    n, c, h, w = shape
    pad = k // 2
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    ho, wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    dy = torch.randn(n, c, ho, wo, dtype=torch.float64)
    ref = torch.nn.grad.conv2d_weight(x, (c, 8, k, k), dy, padding=pad, groups=c // 8)
    got = emulate(dy.permute(0, 2, 3, 1), x.permute(0, 2, 3, 1), k, k, pad, v, per_cta)
    return float((got - ref).abs().max() / ref.abs().max())


def _data(n, c, hw, k, dt):
    pad = k // 2
    x = channels_last_copy(torch.randn(n, c, hw, hw, device="cuda", dtype=dt))
    dy = channels_last_copy(torch.randn(n, c, hw, hw, device="cuda", dtype=dt))
    return x, dy, pad


def _check(k: int, dt: torch.dtype, v: Variant, shape: tuple) -> float:
    """Max error against fp64 over PyTorch's own same-dtype error (<= ~2 passes)."""
    torch.manual_seed(0)
    n, c, h, w = shape
    pad = k // 2
    x = channels_last_copy(torch.randn(n, c, h, w, device="cuda", dtype=dt))
    ho, wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    dy = channels_last_copy(torch.randn(n, c, ho, wo, device="cuda", dtype=dt))
    wshape = (c, 8, k, k)
    g = c // 8
    ref = torch.nn.grad.conv2d_weight(x.double(), wshape, dy.double(), padding=pad, groups=g)
    same = torch.nn.grad.conv2d_weight(x, wshape, dy, padding=pad, groups=g).double()
    got = wgrad(dy, x, k, k, pad, v).double()
    return (got - ref).abs().max().item() / max((same - ref).abs().max().item(), 1e-6)


_ORIGINAL_SOURCE = gconv_cuda._SOURCE_WWG
_mode = [0]


def _lib_wgrad(dy, x, k: int, pad: int, tile, mode: int):
    """The library's wgmma wgrad with tile; ``mode`` (``WG_PROBE`` in the kernel, producer tiles
    only) 1 drops the MMAs and 2 the loads, so the timings bound the kernel (wrong answers)."""
    _set_mode(mode)
    return gconv_cuda.wgrad(dy, x, k, k, pad, pad, False, tile)[0]


def _set_mode(mode: int) -> None:
    if mode != _mode[0]:
        gconv_cuda._SOURCE_WWG = (f"#define WG_PROBE {mode}\n" if mode else "") + _ORIGINAL_SOURCE
        gconv_cuda._kernel.cache_clear()
        _mode[0] = mode


def _mode_label(mode: int) -> str:
    names = (
        (1, "nomma"),
        (2, "noload"),
        (4, "nored"),
        (16, "pf128"),
        (32, "pf256"),
        (64, "il"),
        (128, "gb"),
        (256, "nodup"),
        (512, "ca"),
    )
    return "+".join(n for b, n in names if mode & b) or "full"


def _timeline(data, k: int, tile, mode: int) -> None:
    """One launch with ``WG_PROBE`` bit 8: each CTA's consumer and producer print globaltimer at
    the start, after their loop and before the finish; summarised in microseconds from the
    first start (the kernel's stdout caught through file descriptor 1)."""
    x, dy, pad = data
    _lib_wgrad(dy, x, k, pad, tile, mode)  # compile and warm up first (its printf too)
    torch.cuda.synchronize()
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile("w+") as f:
        os.dup2(f.fileno(), 1)
        try:
            _lib_wgrad(dy, x, k, pad, tile, mode)
            torch.cuda.synchronize()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        rows = [ln.split()[1:] for ln in f if ln.startswith("TL ")]
    vals = torch.tensor([[float(v) for v in r] for r in rows], dtype=torch.float64)
    if not len(vals):
        print(f"timeline {tile.name} {_mode_label(mode)}: no output")
        return
    t0 = vals[:, 4].min()
    us = (vals[:, 4:7] - t0) / 1e3
    for role, name in ((0, "consumer"), (1, "producer")):
        sel = us[vals[:, 2] == role]
        busy = sel[vals[vals[:, 2] == role][:, 7] > 0]
        q = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
        print(
            f"timeline {k}x{k} {tile.name} {_mode_label(mode)} {name} ({len(busy)} CTAs with "
            f"units): start {_quantiles(busy[:, 0], q)} loop end {_quantiles(busy[:, 1], q)} "
            f"done {_quantiles(busy[:, 2], q)} us (min/p10/p50/p90/max)"
        )


def _quantiles(v: torch.Tensor, q: torch.Tensor) -> str:
    return "/".join(f"{x:.1f}" for x in torch.quantile(v, q).tolist()) if len(v) else "-"


def _time_cell(
    k,
    n,
    c,
    hw,
    dt,
    dname,
    variants,
    copy_bw,
    lib_tiles=(),
    bound_tiles=(),
    bound_modes=(),
    timeline_modes=(),
    timer="graph",
) -> list[dict]:
    sets = [_data(n, c, hw, k, dt) for _ in range(3)]
    nbytes = sets[0][0].nbytes + sets[0][1].nbytes
    g, wshape = c // 8, (c, 8, k, k)
    prob = GConvProblem(n, c, hw, hw, k, k, k // 2, k // 2, dtype=dname)
    impls = {
        "cudnn": lambda x, dy, p: torch.nn.grad.conv2d_weight(x, wshape, dy, padding=p, groups=g),
        "tilewise": lambda x, dy, p: (
            _set_mode(0) or gconv_wgrad.wgrad(dy, x, prob, False, False)[0]
        ),
    }  # the library's autotuned wgrad with the kernel as shipped
    for v in variants:
        if smem_bytes(k, k, hw, v) <= 227 * 1024:
            impls[v.name] = lambda x, dy, p, v=v: wgrad(dy, x, k, k, p, v)
    for t in lib_tiles:  # the library's wgmma wgrad (A from shared memory too), tile by tile
        if gconv_cuda.wgrad_tile_ok(c, k, k, t):
            impls[t.name] = lambda x, dy, p, t=t: _lib_wgrad(dy, x, k, p, t, 0)
    for t in bound_tiles:  # the same kernel without its MMAs, its loads or its atomics
        if gconv_cuda.wgrad_tile_ok(c, k, k, t) and gconv_cuda.wgrad_wg_producer(t):
            for mode in bound_modes:
                impls[f"{t.name}_{_mode_label(mode)}"] = lambda x, dy, p, t=t, m=mode: _lib_wgrad(
                    dy, x, k, p, t, m
                )
            for mode in timeline_modes:
                _timeline(sets[0], k, t, mode)
    x0, dy0, p0 = sets[0]
    ref = impls["cudnn"](x0, dy0, p0).float()
    base, rows = None, []
    for name, fn in impls.items():
        try:
            got = fn(x0, dy0, p0).float()
            err = float((got - ref).abs().max() / ref.abs().max())
            sec = time_calls(fn, sets, timer).median_s
        except Exception as exc:
            print(f"  {name}: {type(exc).__name__}: {exc}"[:300])
            continue
        base = base or sec
        frac = nbytes / sec / copy_bw
        row = dict(k=k, n=n, c=c, hw=hw, dtype=dname, impl=name, median_s=sec, frac_copy=frac,
                   x_cudnn=base / sec, rel_err=err, timer=timer)  # fmt: skip
        rows.append(row)
        print(
            f"wgrad C={c} {hw}x{hw} {k}x{k} N={n} {dname} {name:22s} {sec * 1e6:8.1f} us "
            f"{frac:.3f} of copy {base / sec:5.2f}x cuDNN err {err:.1e}"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[7, 5, 3])
    ap.add_argument("--n", type=int, nargs="+", default=[128])
    ap.add_argument("--shapes", nargs="+", default=["64:64"], help="C:HW")
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    ap.add_argument(
        "--variants",
        nargs="*",
        default=["2,2,1,2,1", "2,2,1,1,4", "2,2,1,2,2", "2,2,1,1,4,1"],
        help="NG,MIN_CTAS,SWAP,PD,RB[,DRAIN] (none: the library's tiles only)",
    )
    ap.add_argument(
        "--library-tiles",
        action="store_true",
        help="also time every wgmma wgrad tile of the library (gconv_cuda.WGMMA_WGRAD_TILES)",
    )
    ap.add_argument("--tile-names", nargs="*", help="only these library tiles (by name)")
    ap.add_argument(
        "--bounds",
        type=int,
        nargs="*",
        default=[],
        help="WG_PROBE modes to time the producer tiles named (else the first two offered) in: "
        "bits 1 no MMAs, 2 no loads, 4 no atomics, 16 / 32 L2 fetches of 128 / 256 bytes, 64 "
        "(with 1) rows landing with a pixel's groups side by side, 128 lanes taking 8 pixels of "
        "one group, 256 no dy copies past the ring's end, 512 the row loads through L1 "
        "(cp.async.ca; bit 2 does not stop tma=1 tiles' tensor copies)",
    )
    ap.add_argument(
        "--timeline",
        type=int,
        nargs="*",
        default=[],
        help="WG_PROBE modes (bit 8 added) to print a per-CTA timeline summary in",
    )
    ap.add_argument("--checks", type=int, default=2, help="odd shapes checked a variant")
    ap.add_argument("--emulate", action="store_true", help="the index logic on the CPU only")
    ap.add_argument("--timer", choices=TIMERS, default="graph", help="before session 42: events")
    ap.add_argument("--json")
    args = ap.parse_args()
    dts = {"fp16": torch.float16, "bf16": torch.bfloat16}
    variants = [Variant.parse(t) for t in args.variants]
    if args.emulate:
        for k in args.kernels:
            for v in variants:
                for shape, per_cta in (((3, 8 * v.ng, 9, 21), 2), ((2, 8 * v.ng, 5, 33), 2)):
                    err = _emulate_check(k, v, shape, per_cta)
                    print(f"emulate {k}x{k} {v.name} {shape} {per_cta} a CTA: rel err {err:.1e}")
        return
    # the descriptor's field order for an MN-major B, read from correctness (both tried; the
    # variants take the one with the smaller error)
    ratios = {}
    for swap in (0, 1) if variants else ():
        v = dataclasses.replace(variants[0], swap=swap)
        try:
            ratios[swap] = _check(3, torch.float16, v, (2, 16 * v.ng, 9, 21))
            print(f"descriptor swap={swap}: error ratio {ratios[swap]:.3g}")
        except Exception as exc:
            print(f"descriptor swap={swap}: {type(exc).__name__}: {exc}"[:300])
    if ratios:
        best = min(ratios, key=ratios.get)
        variants = [dataclasses.replace(v, swap=best) for v in variants]
    for k in args.kernels:
        for v in variants:
            for dname in args.dtypes:
                for shape in ((3, 16 * v.ng, 19, 45), (2, 32, 64, 64))[: args.checks]:
                    if shape[1] % (8 * v.ng):
                        continue
                    try:
                        ratio = f"error ratio {_check(k, dts[dname], v, shape):.3g}"
                    except Exception as exc:
                        ratio = f"{type(exc).__name__}: {exc}"[:300]
                    print(f"check {k}x{k} {dname} {v.name} {shape}: {ratio}")
    lib_tiles = ()
    if args.library_tiles:
        lib_tiles = gconv_cuda.WGMMA_WGRAD_TILES + gconv_cuda.EXPERIMENTAL_WGMMA_WGRAD_TILES
    if args.tile_names:
        lib_tiles = tuple(t for t in lib_tiles if t.name in args.tile_names)
    bound_tiles = ()
    if args.bounds or args.timeline:  # the named producer tiles, else the first two offered
        named = [t for t in lib_tiles if gconv_cuda.wgrad_wg_producer(t)] if args.tile_names else 0
        bound_tiles = named or gconv_cuda.WGMMA_WGRAD_TILES[:2]
    timeline_modes = [m | 8 for m in args.timeline]
    copy_bw = measure_copy_bandwidth(torch.device("cuda"))
    print(f"copy: {copy_bw / 1e12:.3f} TB/s; timer: {args.timer}")
    rows = []
    for shape in args.shapes:
        c, hw = (int(t) for t in shape.split(":"))
        for k in args.kernels:
            for n in args.n:
                for dname in args.dtypes:
                    rows += _time_cell(
                        k, n, c, hw, dts[dname], dname, variants, copy_bw, lib_tiles,
                        bound_tiles, args.bounds, timeline_modes, args.timer,
                    )  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            doc = {"environment": environment(), "copy_Bps": copy_bw, "rows": rows}
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
