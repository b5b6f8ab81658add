"""CUDA C++ source of the wgrad's slot-sum kernel (``ops.gconv_slots`` compiles it).

The tap or warpgroup wgrad with slots (``CudaTile.slots``) leaves one slot of fp32 sums per CTA
column (``gridDim.x`` of them), each ``R x S x C x 8`` weight sums ([tap, out channel, in
channel]) and then ``C`` bias sums. This kernel, launched as a programmatic dependent of it,
adds the slots up and writes dw in the input dtype (contiguous [C, 8, R, S], or with ``DW_CL``
[C, R, S, 8]) and db (fp32, or the input dtype with ``DB_HALF``).
A CTA takes 32 consecutive elements: each lane 4 of them (one 16-byte load a slot) and a quarter
warp of them a slot, so a warp loads 4 slots at once and the CTA ``4 x SUM_WARPS``; a thread has
``BATCH`` such loads in flight before its first add (one batch for up to ``4 x SUM_WARPS x
BATCH`` slots). The quarter warps' partials are added by two shuffles, the warps' in warp
order in shared memory. The order of every addition is fixed by the launch shape alone, so the
result does not vary from run to run. (Session 51; session 49's form had a lane an element and
a warp a slot: three batches of L2 round trips for ~130 slots.) A ``str.format``
template: ``{R}``, ``{S}``, ``{DW_CL}``, ``{IS_BF16}``, ``{HAS_BIAS}``, ``{DB_HALF}`` (literal
braces doubled).
"""

#: warps of a slot-sum CTA (its 32 elements' slots split over them, 4 slots a warp at once)
SUM_WARPS = 16
#: 16-byte slot loads a thread has in flight before it adds them
BATCH = 3
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

// an L2 load of 4 sums (the slots were written by the grid before; nothing of them sits in L1).
// The memory clobber keeps it below the dependency wait; a batch of them is still in flight at
// once, as nothing uses a value until the batch is issued
__device__ __forceinline__ float4 ld_cg4(const float* p) {{
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {{%0, %1, %2, %3}}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}}

__device__ __forceinline__ void add4(float4& a, const float4& b) {{
    a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
}}

__device__ __forceinline__ float4 shfl_xor4(const float4& v, int m) {{
    return make_float4(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m),
                       __shfl_xor_sync(0xffffffffu, v.z, m), __shfl_xor_sync(0xffffffffu, v.w, m));
}}

// slots: [nslots][R_FULL * S * C * 8 + C] fp32 (a slot's words a multiple of 8: C % 8 == 0, so
// every 4-element piece is 16-byte aligned); dw_out as the wgrad kernels' (see DW_CL); db_out [C]
// (unused without HAS_BIAS)
extern "C" __global__ void __launch_bounds__(SUM_WARPS * 32)
tw_gconv_wgrad_slot_sum(const float* __restrict__ slots, u16* __restrict__ dw_out,
                        void* __restrict__ db_out, int C, int nslots)
{{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the slots' writer has finished
#endif
    __shared__ float4 part[SUM_WARPS][8];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int words = R_FULL * S * C * 8;
    const int total = words + (HAS_BIAS ? C : 0);
    // lane: elements 4 (lane & 7) .. + 3 of the CTA's 32, from slots 4 w + (lane >> 3) + 64 k
    const int e4 = blockIdx.x * 32 + (lane & 7) * 4;
    const float* const p = slots + (e4 < total ? e4 : 0);
    const long long stride = words + C;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k0 = w * 4 + (lane >> 3); k0 < nslots; k0 += BATCH * SUM_WARPS * 4) {{
        float4 got[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {{
            const int k = k0 + j * SUM_WARPS * 4;
            got[j] = k < nslots ? ld_cg4(p + k * stride) : make_float4(0.f, 0.f, 0.f, 0.f);
        }}
#pragma unroll
        for (int j = 0; j < BATCH; ++j) add4(v, got[j]);
    }}
    add4(v, shfl_xor4(v, 16));  // the warp's 4 quarters: every lane gets the same sum
    add4(v, shfl_xor4(v, 8));
    if (lane < 8) part[w][lane] = v;
    __syncthreads();
    const int e = blockIdx.x * 32 + lane;  // warp 0: a lane an element
    if (w != 0 || e >= total) return;
    const float* const mine = &part[0][lane >> 2].x + (lane & 3);
    float sum = mine[0];
#pragma unroll
    for (int k = 1; k < SUM_WARPS; ++k) sum += mine[k * 8 * 4];
    if (e < words) {{
        const int c8 = C * 8, tap = e / c8, oi = e - tap * c8;
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
