"""How fast Hopper's warpgroup MMA runs at small N (session 30): ``wgmma.mma_async`` m64nNk16
(fp16 in, fp32 accumulate) for N = 8 .. 256, A from shared memory (SS) or from registers (RS),
with NACC independent accumulator chains a warpgroup and NWG warpgroups a CTA (one CTA per SM),
as TFLOP/s against the dense fp16 peak (989 TFLOP/s on an H100 SXM).

Why: a grouped conv with group width 8 has M = 8 output channels. Stacking 8 output rows into
wgmma's M = 64 (session 30's first prototype, ``scripts/gconv_wgmma_probe.py`` at commit
ba412e7) wastes half the MMA work at 7x7 on zeros; putting 64
pixels into M and the 8 channels into N = 8 wastes none, if an m64n8k16 runs near the per-FMA rate
of wide ones. Operand values do not matter here (zeros); the MMAs run all the same.

    python scripts/wgmma_rate_probe.py [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from tilewise.bench.results import environment

_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#define N {N}
#define RS {RS}
#define NACC {NACC}
#define NWG {NWG}

__device__ __forceinline__ u64 desc(u32 addr, u32 kstride, u32 mstride) {{
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(kstride >> 4) << 16) |
           ((u64)(mstride >> 4) << 32);
}}
__device__ __forceinline__ void mma(float* d, const u32* a, u64 da, u64 db, int acc) {{
{MMA}
}}

extern "C" __global__ void __launch_bounds__(128 * NWG, 1)
tw_wgmma_rate(float* __restrict__ out, int iters)
{{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x;
    for (int i = tid; i < (2048 + N * 32) / 4; i += 128 * NWG) ((u32*)smem)[i] = 0;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    u32 base;
    asm("{{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }}" : "=r"(base) : "l"(smem));
    const u64 da = desc(base, 128, 256), db = desc(base + 2048, 128, 256);
    u32 a[4] = {{0u, 0u, 0u, (u32)tid >> 30}};  // RS: A in registers (zeros the compiler keeps)
    float acc[NACC][N / 2];
    for (int it = 0; it < iters; ++it) {{
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int c = 0; c < NACC; ++c) mma(acc[c], a, da, db, it);
    }}
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < NACC; ++c)
#pragma unroll
        for (int i = 0; i < N / 2; ++i) s += acc[c][i];
    if (s != 0.f) out[blockIdx.x * blockDim.x + tid] = s;
}}
"""


def _mma_asm(n: int, rs: bool) -> str:
    k = n // 2
    regs = ", ".join(f"%{i}" for i in range(k))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(k))
    op = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16"
    if rs:
        a = f"{{%{k}, %{k + 1}, %{k + 2}, %{k + 3}}}"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)'
        body, p = f"{op} {{{regs}}}, {a}, %{k + 4}, p, 1, 1, 0;", k + 5
    else:
        ins = '"l"(da), "l"(db), "r"(acc)'
        body, p = f"{op} {{{regs}}}, %{k}, %{k + 1}, p, 1, 1, 0, 0;", k + 2
    pred = f"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p}, 0;\\n"
    return f'    asm volatile("{pred}"\n        "{body}\\n}}\\n"\n        : {outs} : {ins});'


@functools.cache
def _kernel(n: int, rs: bool, nacc: int, nwg: int):
    src = _SOURCE.format(N=n, RS=int(rs), NACC=nacc, NWG=nwg, MMA=_mma_asm(n, rs))
    return torch.cuda._compile_kernel(src, "tw_wgmma_rate", compute_capability="90a")


def rate(n: int, rs: bool, nacc: int, nwg: int, iters: int = 2000) -> float:
    """TFLOP/s of m64n{n}k16 wgmmas over every SM (median of 5 timed launches)."""
    k = _kernel(n, rs, nacc, nwg)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(sms * 128 * nwg, device="cuda")
    smem = 2048 + n * 32

    def go() -> None:
        k((sms, 1, 1), (128 * nwg, 1, 1), [out, iters], smem)

    go()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        go()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    sec = sorted(times)[2]
    flops = 2 * sms * nwg * iters * nacc * 64 * n * 16
    return flops / sec / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--nacc", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--nwg", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for rs in (False, True):
        for n in args.n:
            for nwg in args.nwg:
                for nacc in args.nacc:
                    if nacc * n // 2 > 160:  # accumulators past the register file
                        continue
                    try:
                        tf = rate(n, rs, nacc, nwg)
                    except Exception as exc:
                        print(f"{'RS' if rs else 'SS'} n{n} wg{nwg} acc{nacc}: {exc}"[:200])
                        continue
                    rows.append(dict(mode="RS" if rs else "SS", n=n, nwg=nwg, nacc=nacc, tflops=tf))
                    print(
                        f"{'RS' if rs else 'SS'} m64n{n}k16 wg{nwg} acc{nacc}: {tf:6.0f} TFLOP/s"
                        f" ({tf / 989:.2f} of 989)"
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
