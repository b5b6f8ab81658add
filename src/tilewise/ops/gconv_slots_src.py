"""CUDA C++ source of the wgrad's slot-sum kernel (``ops.gconv_slots`` compiles it).

The tap or warpgroup wgrad with slots (``CudaTile.slots``) leaves one slot of fp32 sums per CTA
column (``gridDim.x`` of them), each ``R x S x C x 8`` weight sums ([tap, out channel, in
channel]) and then ``C`` bias sums. This kernel, launched as a programmatic dependent of it,
adds the slots up and writes dw in the input dtype (contiguous [C, 8, R, S], or with ``DW_CL``
[C, R, S, 8]) and db (fp32, or the input dtype with ``DB_HALF``). Each warp of a CTA takes 32
consecutive elements over every ``SUM_WARPS``-th slot (``BATCH`` loads in flight before the
first add); the CTA adds its warps' partials in warp order. The order of every addition is fixed
by the launch shape alone, so the result does not vary from run to run. A ``str.format``
template: ``{R}``, ``{S}``, ``{DW_CL}``, ``{IS_BF16}``, ``{HAS_BIAS}``, ``{DB_HALF}`` (literal
braces doubled).
"""

#: warps of a slot-sum CTA (its 32 elements' slots split over them)
SUM_WARPS = 8
#: slot loads a thread has in flight before it adds them
BATCH = 8
#: the kernel's entry point
ENTRY = "tw_gconv_wgrad_slot_sum"

SOURCE = (
    r"""
#define R_FULL {R}
#define S {S}
#define DW_CL {DW_CL}
#define IS_BF16 {IS_BF16}
#define HAS_BIAS {HAS_BIAS}
#define DB_HALF {DB_HALF}
"""
    + f"#define SUM_WARPS {SUM_WARPS}\n#define BATCH {BATCH}\n"
    + r"""
typedef unsigned short u16;

__device__ __forceinline__ u16 to_u16(float v) {{
    u16 h;
#if IS_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
    return h;
}}

// an L2 load (the slots were written by the grid before; nothing of them sits in L1). The
// memory clobber keeps it below the dependency wait; a batch of them is still in flight at once,
// as nothing uses a value until the batch is issued
__device__ __forceinline__ float ld_cg(const float* p) {{
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
    return v;
}}

// slots: [nslots][R_FULL * S * C * 8 + C] fp32; dw_out as the wgrad kernels' (see DW_CL);
// db_out [C] (unused without HAS_BIAS)
extern "C" __global__ void __launch_bounds__(SUM_WARPS * 32)
tw_gconv_wgrad_slot_sum(const float* __restrict__ slots, u16* __restrict__ dw_out,
                        void* __restrict__ db_out, int C, int nslots)
{{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the slots' writer has finished
#endif
    __shared__ float part[SUM_WARPS][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long words = (long long)(R_FULL * S) * C * 8;
    const long long total = words + (HAS_BIAS ? C : 0);
    const long long e = (long long)blockIdx.x * 32 + lane;
    const float* const p = slots + (e < total ? e : 0);
    const long long stride = words + C;
    float v = 0.f;
    for (int k0 = w; k0 < nslots; k0 += BATCH * SUM_WARPS) {{
        float got[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {{
            const int k = k0 + j * SUM_WARPS;
            got[j] = k < nslots ? ld_cg(p + k * stride) : 0.f;
        }}
#pragma unroll
        for (int j = 0; j < BATCH; ++j) v += got[j];
    }}
    part[w][lane] = v;
    __syncthreads();
    if (w != 0 || e >= total) return;
    float sum = part[0][lane];
#pragma unroll
    for (int k = 1; k < SUM_WARPS; ++k) sum += part[k][lane];
    if (e < words) {{
        const int c8 = C * 8, tap = (int)(e / c8), oi = (int)(e - (long long)tap * c8);
#if DW_CL
        dw_out[((long long)(oi >> 3) * (R_FULL * S) + tap) * 8 + (oi & 7)] = to_u16(sum);
#else
        dw_out[(long long)oi * (R_FULL * S) + tap] = to_u16(sum);
#endif
    }} else {{
#if DB_HALF
        ((u16*)db_out)[e - words] = to_u16(sum);
#else
        ((float*)db_out)[e - words] = sum;
#endif
    }}
}}
"""
)
