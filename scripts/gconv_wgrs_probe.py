"""Prototype 2 (session 30): a grouped-conv fprop on ``wgmma`` with the pixels as M, read from the
TMA halo into registers by ``ldmatrix`` (wgmma's register-A form), and the weights as B.

``wgmma_rate_probe.py`` measured m64nNk16 at N = 8 at <= 0.26 of the H100's dense peak, N = 32
with A in registers at 0.78, N = 64 at 0.88. ``gconv_wgmma_probe.py`` (M = 8 output rows x 8
channels, N = pixels, Toeplitz A from shared memory) tied the row-pair kernel at 7x7 only.

Here, a warpgroup owns one group of 8 channels; per tile of TH output rows x 64 pixels:
- M = 64 pixels of a row (an ``ldmatrix.x4`` per warp: 16 pixels x 2 input rows x 8 channels, any
  pixel addresses, so the TMA's swizzled pixel-major halo serves as it is);
- N = 32 = 4 output rows x 8 out channels (one accumulator block a 4-row band, TH / 4 bands);
- K = 16 = 2 input rows x 8 in channels; the weights' B is Toeplitz in (input row, output row):
  its 8 x 8 core matrix (input row jj, band row nb) is W[r = 2j + jj + nb - 3][s] (the band's rows
  reversed), so with each kernel column's W[r] core matrices stored in order the descriptor's K
  and N strides are both 128 bytes. One A fragment (a kernel column, an input row pair) feeds
  every band whose window covers it.
MMA work per output: 560 multiply-adds at 7x7 (392 useful; the row-pair kernel: 448), 320 at
5x5, 144 at 3x3. Non-finite inputs and bias are not handled: a prototype.

    python scripts/gconv_wgrs_probe.py [--kernels 7 5 3] [--variants 8,4 16,2] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gconv_wgmma_probe import ROWPAIR_BEST, SMEM_MAX

from tilewise.bench.ceilings import measure_copy_bandwidth
from tilewise.bench.results import environment
from tilewise.bench.timing import time_events
from tilewise.ops import gconv_cuda
from tilewise.ops.gconv_config import channels_last_copy
from tilewise.runtime import cuda_launch, tma

TW = 64  # pixels a tile: wgmma's M

_SOURCE = r"""
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define R {R}
#define S {S}
#define TH {TH}
#define TW {TW}
#define NG {NG}
#define IS_BF16 {IS_BF16}
#define NB (TH / 4)
#define J ((R + 4) / 2)
#define IP ((TH + R) / 2)
#define HH (2 * IP)
#define HWD (TW + S - 1)
#define CB (8 * NG)
#define PIXB (CB * 2)
#define NT (128 * NG)
#define UP1K(v) (((v) + 1023) / 1024 * 1024)
// a pixel's 16-byte chunk of group g: the TMA swizzle of PIXB-byte rows
#define SWZ(p) (((p) * NG / 8) % NG)
#define HOFF(p, g) ((p) * PIXB + 16 * ((g) ^ SWZ(p)))
// B: per group, per kernel column s, core matrices W[r][s] (8 out x 8 in) at s * SPB + 3 + r
#define SPB (2 * J + 3)
#define B_BYTES (S * SPB * 128)
#define OFF_HALO UP1K(NG * B_BYTES)
#define HALO_BYTES UP1K(HH * HWD * PIXB)
#define OFF_STG (OFF_HALO + 2 * HALO_BYTES)
#define OFF_MBAR (OFF_STG + UP1K(TH * TW * PIXB))
struct __align__(64) TmaDesc {{ unsigned long long v[16]; }};

__device__ __forceinline__ u32 smem_u32(const void* p) {{
    u32 r;
    asm("{{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }}" : "=r"(r) : "l"(p));
    return r;
}}
__device__ __forceinline__ u64 desc(u32 addr, u32 kstride, u32 nstride) {{
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(kstride >> 4) << 16) |
           ((u64)(nstride >> 4) << 32);
}}
__device__ __forceinline__ u32 pack2(float a, float b) {{
    u32 r;
#if IS_BF16
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(a), "f"(b));
#else
    asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(a), "f"(b));
#endif
    return r;
}}
__device__ __forceinline__ void ldsm_x4(u32* a, u32 addr) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}}
__device__ __forceinline__ void wgmma(float* d, const u32* a, u64 db, int accumulate) {{
{WGMMA}
}}
__device__ __forceinline__ void mbar_wait(u32 mbar, u32 parity) {{
    u32 done;
    do {{
        asm volatile("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }}\n"
                     : "=r"(done) : "r"(mbar), "r"(parity) : "memory");
    }} while (!done);
}}
__device__ __forceinline__ void tile_pos(int t, int tiles_h, int tiles_w, int& n, int& y0,
                                         int& x0) {{
    x0 = (t % tiles_w) * TW;
    y0 = ((t / tiles_w) % tiles_h) * TH;
    n = t / (tiles_w * tiles_h);
}}
__device__ __forceinline__ void tma_halo(u32 dst, u32 mbar, const TmaDesc* map, int t, int c0,
                                         int pad_h, int pad_w, int tiles_h, int tiles_w) {{
    int n, y0, x0;
    tile_pos(t, tiles_h, tiles_w, n, y0, x0);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(mbar), "r"(HH * HWD * PIXB) : "memory");
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {{%2, %3, %4, %5}}], [%6];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(x0 - pad_w), "r"(y0 - pad_h), "r"(n),
                    "r"(mbar)
                 : "memory");
}}

extern "C" __global__ void __launch_bounds__(NT, 1)
tw_gconv_wgrs(const u16* __restrict__ w, int C, int pad_h, int pad_w, int tiles_h, int tiles_w,
              int n_tiles, const __grid_constant__ TmaDesc tmap,
              const __grid_constant__ TmaDesc tmap_y)
{{
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = warp >> 2, w4 = warp & 3;
    const int c0 = blockIdx.y * CB;
    // the swizzled TMA tiles need 1024-byte alignment (the host adds the slack)
    const u32 sbase = (smem_u32(smem) + 1023) & ~1023u;
    u16* const sb = (u16*)(smem + (sbase - smem_u32(smem)));
    for (int i = tid; i < NG * S * SPB * 64; i += NT) {{
        const int ci = i & 7, co = (i >> 3) & 7, m = (i >> 6) % (S * SPB);
        const int gg = i / (64 * S * SPB), s = m / SPB, r = m % SPB - 3;
        const long long wi = ((long long)(c0 + gg * 8 + co) * 8 + ci) * (R * S) + r * S + s;
        sb[i] = (r >= 0 && r < R) ? w[wi] : (u16)0;
    }}
    const u32 mbar = sbase + OFF_MBAR;
    if (tid == 0) {{
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(mbar));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(mbar + 8));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }}
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (tid == 0 && blockIdx.x < n_tiles)
        tma_halo(sbase + OFF_HALO, mbar, &tmap, blockIdx.x, c0, pad_h, pad_w, tiles_h, tiles_w);
    const u32 bg = sbase + g * B_BYTES;
    // this lane's ldmatrix row: matrix q = lane / 8 (rows + 8 for q odd, input row + 1 for q > 1)
    const int q = lane >> 3, lm = 16 * w4 + (lane & 7) + 8 * (q & 1), ljj = q >> 1;
    float acc[NB][16];
    int it = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x, ++it) {{
        const int buf = it & 1, tn = t + gridDim.x;
        if (tid == 0 && tn < n_tiles)
            tma_halo(sbase + OFF_HALO + (buf ^ 1) * HALO_BYTES, mbar + 8 * (buf ^ 1), &tmap, tn,
                     c0, pad_h, pad_w, tiles_h, tiles_w);
        mbar_wait(mbar + 8 * buf, (it >> 1) & 1);
        const u32 hb = sbase + OFF_HALO + buf * HALO_BYTES;
        u32 bgt;  // opaque a tile: the descriptors are made where used, not kept in registers
        asm volatile("mov.b32 %0, %1;\n" : "=r"(bgt) : "r"(bg));
        // A fragments in two sets by kernel column parity: a column's set is loaded once the
        // wgmmas of the column two back (the same set) have completed (wait_group 1)
        u32 a[2][IP][4];
#pragma unroll
        for (int s = 0; s < S; ++s) {{
            if (s >= 2) asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#pragma unroll
            for (int ip = 0; ip < IP; ++ip)
                ldsm_x4(a[s & 1][ip], hb + HOFF((2 * ip + ljj) * HWD + lm + s, g));
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int ip = 0; ip < IP; ++ip)
#pragma unroll
                for (int b = 0; b < NB; ++b) {{
                    const int j = ip - 2 * b;
                    if (j >= 0 && j < J)
                        wgmma(acc[b], a[s & 1][ip],
                              desc(bgt + (s * SPB + 2 * j) * 128, 128, 128), s > 0 || j > 0);
                }}
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        }}
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // the previous tile's output copy has read the staging tile
        if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        __syncthreads();
        // D of band b: rows 16 w4 + lane / 4 (+ 8) = pixels; cols 8 i + 2 (lane % 4) (+ 1):
        // band row 3 - i, out channels 2 (lane % 4) (+ 1)
        const u32 stg = sbase + OFF_STG;
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {{
                    const int p = (4 * b + 3 - i) * TW + 16 * w4 + (lane >> 2) + 8 * h;
                    const u32 v = pack2(acc[b][4 * i + 2 * h], acc[b][4 * i + 2 * h + 1]);
                    asm volatile("st.shared.u32 [%0], %1;\n"
                                 :: "r"(stg + HOFF(p, g) + 4 * (lane & 3)), "r"(v) : "memory");
                }}
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (tid == 0) {{
            int n, y0, x0;
            tile_pos(t, tiles_h, tiles_w, n, y0, x0);
            asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                         " [%0, {{%1, %2, %3, %4}}], [%5];\n"
                         :: "l"(&tmap_y), "r"(c0), "r"(x0), "r"(y0), "r"(n), "r"(stg)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }}
    }}
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}}
"""


def _wgmma_asm(bf16: bool) -> str:
    regs = ", ".join(f"%{i}" for i in range(16))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(16))
    ty = "bf16" if bf16 else "f16"
    op = f"wgmma.mma_async.sync.aligned.m64n32k16.f32.{ty}.{ty}"
    ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate)'
    return (
        '    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %21, 0;\\n"\n'
        f'        "{op} {{{regs}}}, {{%16, %17, %18, %19}}, %20, p, 1, 1, 0;\\n}}\\n"\n'
        f"        : {outs} : {ins});"
    )


@dataclass(frozen=True)
class Variant:
    """TH output rows a tile (a multiple of 4), NG warpgroups (= groups) a CTA."""

    th: int = 8
    ng: int = 4

    @property
    def name(self) -> str:
        return f"wgrs th{self.th} g{self.ng}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        return cls(*(int(v) for v in text.split(",")))


def _up1k(v: int) -> int:
    return -(-v // 1024) * 1024


def smem_bytes(r: int, s: int, v: Variant) -> int:
    j, ip = (r + 4) // 2, (v.th + r) // 2
    pixb = 16 * v.ng
    b = _up1k(v.ng * s * (2 * j + 3) * 128)
    halo = _up1k(2 * ip * (TW + s - 1) * pixb)
    return b + 2 * halo + _up1k(v.th * TW * pixb) + 16 + 1024  # + 1024: alignment slack


def source(r: int, s: int, v: Variant, bf16: bool) -> str:
    return _SOURCE.format(
        R=r, S=s, TH=v.th, TW=TW, NG=v.ng, IS_BF16=int(bf16), WGMMA=_wgmma_asm(bf16)
    )


@functools.cache
def _kernel(r: int, s: int, v: Variant, bf16: bool):
    k = torch.cuda._compile_kernel(source(r, s, v, bf16), "tw_gconv_wgrs", compute_capability="90a")
    k.set_shared_memory_config(smem_bytes(r, s, v))
    return k


_MAPS = tma.MapCache()


def conv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, pad: int, v: Variant):
    """y = grouped conv of channels_last x by w (stride 1, zero padding ``pad``) into ``out``."""
    n, c, h, wd = x.shape
    r, s = w.shape[2:]
    if c % (8 * v.ng):
        raise ValueError(f"argument 'x': {c} channels, not a multiple of {8 * v.ng}")
    p, q = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    tiles_h, tiles_w = -(-p // v.th), -(-q // TW)
    n_tiles = n * tiles_h * tiles_w
    k = _kernel(r, s, v, x.dtype == torch.bfloat16)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    gy = c // (8 * v.ng)
    gx = max(1, min(n_tiles, sms // gy))
    hh = 2 * ((v.th + r) // 2)
    spec = tma.nhwc_halo_map(x, 8 * v.ng, TW + s - 1, hh)
    tmap = _MAPS.get((x.data_ptr(), x.shape, "x", v, r, s), lambda: (spec, x.data_ptr()))
    spec_y = tma.nhwc_halo_map(out, 8 * v.ng, TW, v.th)
    tmap_y = _MAPS.get((out.data_ptr(), out.shape, "y", v), lambda: (spec_y, out.data_ptr()))
    args = [w.contiguous(), c, pad, pad, tiles_h, tiles_w, n_tiles, tmap, tmap_y]
    launcher = cuda_launch.lean_launcher(k, "p" + "i" * 6 + "tt")
    cuda_launch.launch(
        k, (gx, gy, 1), (128 * v.ng, 1, 1), args, smem_bytes(r, s, v), x.device.index, launcher
    )
    return out


def _check(k: int, dt: torch.dtype, v: Variant, shape=(3, 19, 45)) -> float:
    """Max error against fp64 over PyTorch's own same-dtype error."""
    torch.manual_seed(0)
    n, h, wd = shape
    c = 16 * v.ng
    x = channels_last_copy(torch.randn(n, c, h, wd, device="cuda", dtype=dt))
    w = (torch.randn(c, 8, k, k, device="cuda") / (8 * k * k) ** 0.5).to(dt)
    out = torch.full_like(x, float("nan"))
    got = conv(x, w, out, k // 2, v).double()
    ref = F.conv2d(x.double(), w.double(), padding=k // 2, groups=c // 8)
    same = F.conv2d(x, w, padding=k // 2, groups=c // 8).double()
    return (got - ref).abs().max().item() / max((same - ref).abs().max().item(), 1e-6)


def _time_cell(k, n, dt, dname, variants, copy_bw) -> list[dict]:
    sets = []
    for _ in range(3):
        x = channels_last_copy(torch.randn(n, 64, 64, 64, device="cuda", dtype=dt))
        w = (torch.randn(64, 8, k, k, device="cuda") / (8 * k * k) ** 0.5).to(dt)
        sets.append((x, w, torch.empty_like(x)))
    nbytes = 2 * sets[0][0].nbytes
    mma_fma = sets[0][0].numel() * 16 * k * ((k + 4) // 2)  # zeros included
    pad = k // 2
    impls = {
        "cudnn": lambda x, w, o: F.conv2d(x, w, None, padding=pad, groups=8),
        f"rowpair {ROWPAIR_BEST[k].name}": lambda x, w, o, t=ROWPAIR_BEST[k]: gconv_cuda.fprop(
            x, w, None, o, pad, pad, t, False
        ),
    }
    for v in variants:
        if smem_bytes(k, k, v) <= SMEM_MAX:
            impls[v.name] = lambda x, w, o, v=v: conv(x, w, o, pad, v)
    ref = impls["cudnn"](*sets[0]).float()
    base, rows = None, []
    for name, fn in impls.items():
        try:
            got = fn(*sets[0]).float()
            err = float((got - ref).abs().max() / ref.abs().max())
            sec = time_events(fn, sets, warmup=5, reps=30).median_s
        except Exception as exc:
            print(f"  {name}: {type(exc).__name__}: {exc}"[:300])
            continue
        base = base or sec
        frac = nbytes / sec / copy_bw
        tflops = 2 * mma_fma / sec / 1e12 if name.startswith("wgrs") else None
        row = dict(k=k, n=n, dtype=dname, impl=name, median_s=sec, frac_copy=frac,
                   x_cudnn=base / sec, rel_err=err, mma_tflops=tflops)  # fmt: skip
        rows.append(row)
        pipe = f" wgmma {tflops:5.0f} TFLOP/s" if tflops else ""
        print(
            f"fprop {k}x{k} N={n} {dname} {name:34s} {sec * 1e6:8.1f} us {frac:.3f} of copy "
            f"{base / sec:5.2f}x cuDNN err {err:.1e}{pipe}"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[7, 5, 3])
    ap.add_argument("--n", type=int, nargs="+", default=[128])
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--variants", nargs="+", default=["8,4", "16,2", "8,2"], help="TH,NG")
    ap.add_argument("--json")
    args = ap.parse_args()
    dts = {"fp16": torch.float16, "bf16": torch.bfloat16}
    variants = [Variant.parse(t) for t in args.variants]
    for k in args.kernels:
        for v in variants:
            if smem_bytes(k, k, v) > SMEM_MAX:
                print(f"{k}x{k} {v.name}: {smem_bytes(k, k, v)} bytes of shared memory, skipped")
                continue
            for dname in args.dtypes:
                for shape in ((3, 19, 45), (1, 5, 64)):
                    try:
                        ratio = f"error ratio {_check(k, dts[dname], v, shape):.3g}"
                    except Exception as exc:
                        ratio = f"{type(exc).__name__}: {exc}"[:300]
                    print(f"check {k}x{k} {dname} {v.name} {shape}: {ratio}")
    copy_bw = measure_copy_bandwidth(torch.device("cuda"))
    print(f"copy: {copy_bw / 1e12:.3f} TB/s")
    rows = []
    for k in args.kernels:
        for n in args.n:
            for dname in args.dtypes:
                rows += _time_cell(k, n, dts[dname], dname, variants, copy_bw)
    if args.json:
        with open(args.json, "w") as f:
            doc = {"environment": environment(), "copy_Bps": copy_bw, "rows": rows}
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
