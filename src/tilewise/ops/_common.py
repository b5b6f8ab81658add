"""Helpers shared by the op families: activation codes, device facts, block-size arithmetic."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilewise.runtime import dispatch, workspace

#: Activation name -> code baked into kernels as a constexpr.
ACTIVATIONS: dict[str, int] = {"none": 0, "relu": 1, "gelu": 2, "silu": 3}


def activation_code(activation: str) -> int:
    """Map an activation name to its kernel code, or raise ``ValueError`` naming the argument."""
    try:
        return ACTIVATIONS[activation]
    except KeyError:
        raise ValueError(
            f"argument 'activation' must be one of {sorted(ACTIVATIONS)}, got {activation!r}"
        ) from None


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=16)
def _l2_bytes(index: int) -> int:
    return int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0)


def l2_bytes(device: torch.device) -> int:
    """L2 cache size of ``device`` in bytes (0 off CUDA)."""
    if device.type == "cuda":
        return _l2_bytes(device.index if device.index is not None else torch.cuda.current_device())
    return 0


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on ``device`` (a small stand-in on the CPU interpreter)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 2


#: shared memory a pipelined pointwise program may fill on the H100 (2 programs per SM)
PIPELINE_SMEM_BYTES = 96 * 1024


@functools.lru_cache(maxsize=16)
def _smem_optin(index: int) -> int:
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 0)


def pipeline_smem_budget(device: torch.device | None) -> int:
    """Shared memory for the stages of a software-pipelined row loop: 96 KB, or half of what one
    block may use on a smaller GPU (Triton would otherwise fail to launch there)."""
    if device is None or device.type != "cuda":
        return PIPELINE_SMEM_BYTES
    index = device.index if device.index is not None else torch.cuda.current_device()
    optin = _smem_optin(index)
    return min(PIPELINE_SMEM_BYTES, optin // 2) if optin else PIPELINE_SMEM_BYTES


def unit_stride(vec: torch.Tensor | None) -> torch.Tensor | None:
    """A 1-D parameter (bias, weight) the kernels can index element by element: a strided or
    expanded one is copied (session 14: ``b[::2]`` and ``b.expand(n)`` gave wrong outputs from
    linear's and bias_act's kernels, the expanded one read past its buffer)."""
    return vec.contiguous() if vec is not None and vec.stride(-1) != 1 else vec


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code: ``triton.cdiv`` is a constexpr function object whose call
    costs microseconds, several times per launch."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class TileConfig:
    """A 2-D tile over a [rows, cols] view, the launch shape of the pointwise-style kernels.

    ``progs_per_sm`` sizes the persistent grid of the backward kernels that reduce over rows.
    """

    block_m: int
    block_n: int
    num_warps: int = 4
    progs_per_sm: int = 8
    prefetch: bool = True  # backward kernels: load the next step's tile before this step's math
    # backward kernels: software-pipeline depth of the row loop (``tl.range(num_stages=)``: the
    # next steps' tiles are copied into shared memory asynchronously); 1 = not pipelined
    stages: int = 1
    # read the inputs with an evict-first policy and write the outputs with streaming (.cs)
    # stores, data touched once (a tuning option; off by default until measured)
    streaming: bool = False


def backward_launch_args(cfg: TileConfig) -> dict:
    """The tile and loop keywords every pointwise backward kernel takes from its config."""
    return dict(
        PREFETCH=cfg.prefetch and cfg.stages <= 1,
        STAGES=cfg.stages,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        STREAM=cfg.streaming,
        num_warps=cfg.num_warps,
    )


def persistent_rows(m: int, cfg: TileConfig, col_blocks: int, device: torch.device) -> int:
    """Rows per program of a forward kernel: one tile (``block_m`` rows) per program, or, when
    ``cfg.stages > 1``, a persistent grid of ``progs_per_sm`` programs per SM (over all column
    blocks) walking whole tiles through a software-pipelined loop."""
    if cfg.stages <= 1:
        return cfg.block_m
    progs = max(1, cfg.progs_per_sm * num_sms(device) // max(1, col_blocks))
    return cdiv(cdiv(m, progs), cfg.block_m) * cfg.block_m


#: Config overrides by kernel name ("bias_act_fwd", ...): a hook for tuning sweeps.
CONFIG_OVERRIDES: dict[str, Callable[[int, int, int], TileConfig | None]] = {}


def pick_config(kernel: str, m: int, n: int, elem_bytes: int, default: TileConfig) -> TileConfig:
    """``default`` unless a tuning sweep installed an override for ``kernel``."""
    override = CONFIG_OVERRIDES.get(kernel)
    cfg = override(m, n, elem_bytes) if override is not None else None
    return cfg or default


def zeroed_accumulators(
    n_floats: int, n_counters: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 accumulators and int32 ticket counters for ``atomic_row_sum``: views of the stream's
    self-cleaning workspace (``runtime.workspace``; ``atomic_row_sum`` leaves them zero), so the
    backward passes need no memset launch."""
    acc, count = workspace.zeroed(device, (n_floats, n_counters))
    return acc, count.view(torch.int32)


def use_atomics() -> bool:
    """Backward reductions over rows add their per-program partials with fp32 atomics (one launch;
    the summation order, hence the last bits, varies run to run) unless PyTorch's deterministic
    mode is on, in which case the partials are stored and summed in a fixed order."""
    return not torch.are_deterministic_algorithms_enabled()


#: values over all copies of one accumulated vector that the finishing program of
#: ``atomic_row_sum`` reads and zeroes (layer_norm accumulates two vectors, dw and db)
SLOT_VALUES = 4096


def atomic_slots(programs: int, width: int) -> int:
    """Accumulator copies for ``atomic_row_sum`` over rows ``width`` values wide: about 64
    programs per copy, so the atomics on one address (serialized in L2) stay few, but at most
    ``SLOT_VALUES // width`` copies of each accumulated vector, since the one program that
    finishes the sum reads and zeroes them all on its own; a power of two up to 16 (each value
    is a compile). Session 17 (benchmarks/pointwise_ab.py, 64 MB fp16 layer_norm backward):
    n = 4096 at 132 programs, 1 copy 0.860 of copy, 4 copies 0.828-0.846, 16 0.708; n = 1024 at
    528 programs, 1-4 copies 0.883-0.885, 16 0.849-0.866."""
    cap = max(1, SLOT_VALUES // max(1, width))
    cap = 1 << (cap.bit_length() - 1)  # a power of two
    return min(16, cap, next_pow2(cdiv(programs, 64)))


@triton.jit
def atomic_row_sum(
    acc_a_ptr,
    acc_b_ptr,
    part_a,
    part_b,
    out_a_ptr,
    out_b_ptr,
    count_ptr,
    n_progs,
    slot,
    stride,
    offs,
    mask,
    HAS_A: tl.constexpr,
    HAS_B: tl.constexpr,
    SLOTS: tl.constexpr,
):
    """Add this program's partial sums into accumulator copy ``slot`` (of ``SLOTS``, ``stride``
    apart), then take a ticket; the program that takes the last one (every other program's adds
    are in) sums the copies and stores the totals cast to the outputs' dtype, so finishing the
    reduction needs no second launch. It then zeroes the copies it summed and the ticket counter:
    the accumulators are a shared workspace that the next launch takes as zero."""
    if HAS_A:
        tl.atomic_add(acc_a_ptr + slot * stride + offs, part_a, mask=mask, sem="relaxed")
    if HAS_B:
        tl.atomic_add(acc_b_ptr + slot * stride + offs, part_b, mask=mask, sem="relaxed")
    tl.debug_barrier()  # every thread of the program has issued its atomics
    ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if ticket == n_progs - 1:
        if HAS_A:
            tot_a = tl.zeros_like(part_a)
            for k in tl.static_range(SLOTS):  # .cg: read from L2, where the atomics landed
                tot_a += tl.load(
                    acc_a_ptr + k * stride + offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
        if HAS_B:
            tot_b = tl.zeros_like(part_b)
            for k in tl.static_range(SLOTS):
                tot_b += tl.load(
                    acc_b_ptr + k * stride + offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
        # a reduced row can be held by several threads (replicas); every replica must have read
        # the sums before any of them zeroes the accumulators
        tl.debug_barrier()
        if HAS_A:
            tl.store(out_a_ptr + offs, tot_a.to(out_a_ptr.dtype.element_ty), mask=mask)
            for k in tl.static_range(SLOTS):
                tl.store(acc_a_ptr + k * stride + offs, tl.zeros_like(part_a), mask=mask)
        if HAS_B:
            tl.store(out_b_ptr + offs, tot_b.to(out_b_ptr.dtype.element_ty), mask=mask)
            for k in tl.static_range(SLOTS):
                tl.store(acc_b_ptr + k * stride + offs, tl.zeros_like(part_b), mask=mask)
        tl.atomic_xchg(count_ptr, 0, sem="relaxed")


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)``, the output tile of program ``pid`` in L2-grouped order: ``GROUP_M``
    row blocks in a row share each column block of B while it is in L2 (the GEMMs' tile order)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def load_once(ptr, mask, STREAM: tl.constexpr):
    """A masked load (zeros outside ``mask``) of data read once: evict-first with ``STREAM``."""
    if STREAM:
        v = tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        v = tl.load(ptr, mask=mask, other=0.0)
    return v


@triton.jit
def store_once(ptr, value, mask, STREAM: tl.constexpr):
    """A masked store of data not read again here: streaming (``.cs``) with ``STREAM``."""
    if STREAM:
        tl.store(ptr, value, mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptr, value, mask=mask)


def fast_act_level(dtype: torch.dtype, device: torch.device) -> int:
    """``FAST`` for ``act_fwd``/``act_bwd``: 0 (exact forms) for fp32 outputs; for half outputs 2
    on an NVIDIA GPU (approximate ``ex2``/``rcp`` instructions that flush subnormals, one
    instruction each) and 1 elsewhere: under the interpreter, which cannot run inline PTX, and on
    ROCm (the same formulas through Triton's portable ``exp2`` and ``fdiv``)."""
    if dtype == torch.float32:
        return 0
    ptx = device.type == "cuda" and not dispatch.INTERPRET and torch.version.hip is None
    return 2 if ptx else 1


@triton.jit
def exp2_approx(x, ASM: tl.constexpr):
    """2^x; with ``ASM`` one ``ex2.approx.ftz`` (2 ulp, subnormal results flush to zero), where
    Triton's ``exp2`` adds a subnormal range fix-up around the same instruction (session 17)."""
    if ASM:
        y = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        y = tl.exp2(x)
    return y


@triton.jit
def rcp_approx(x, ASM: tl.constexpr):
    """1 / x to about 1 ulp; with ``ASM`` one ``rcp.approx.ftz`` instruction (``fdiv`` adds range
    checks around it)."""
    if ASM:
        y = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        y = tl.math.fdiv(1.0, x)
    return y


@triton.jit
def normal_cdf_given_density_exp(z, e, ASM: tl.constexpr):
    """The normal CDF at z given e = exp(-z^2 / 2), for the GELU backward, which needs e for the
    density anyway: Abramowitz & Stegun 7.1.26, absolute error <= 7.4e-8 (<= 3e-7 evaluated in
    fp32), one approximate division and a polynomial instead of erf's branches. The error is
    absolute: in the negative tail the tiny CDF's relative error grows (0.16% at z = -5, where
    the CDF is 3e-7; 2% at -10 and 3% at -12, where it is below 1e-23; more beyond)."""
    t = rcp_approx(1.0 + 0.23164189750 * tl.abs(z), ASM)  # 0.3275911 / sqrt(2)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))  # fmt: skip
    tail = 0.5 * poly * e  # 1 - cdf(|z|)
    return tl.where(z >= 0.0, 1.0 - tail, tail)


@triton.jit
def act_fwd(z, ACT: tl.constexpr, FAST: tl.constexpr = 0):
    """Activation of an fp32 tile; NaN propagates like PyTorch's.

    ``FAST`` (``fast_act_level``: 0 exact; 1 and 2 for half-precision outputs): GELU's normal CDF
    from ``normal_cdf_given_density_exp`` (one exp, one approximate division, a 5-term
    polynomial; absolute error <= 3e-7 in fp32) and SiLU's sigmoid as 1 / (1 + 2^(-z log2 e)),
    both through ``exp2_approx``/``rcp_approx`` (single PTX instructions at level 2).
    Nsight Compute put the erf forward at 73% issue-slot use with the integer/logic pipe busiest
    (session 10: 0.78 of copy, instruction-bound like the backward was). A 10-term erfc fit
    with an exact division measured no gain in session 7."""
    if ACT == 1:
        y = tl.where(z < 0.0, 0.0, z)
    elif ACT == 2:
        if FAST:
            e = exp2_approx(z * z * -0.7213475204444817, FAST == 2)  # exp(-z^2 / 2)
            y = z * normal_cdf_given_density_exp(z, e, FAST == 2)
        else:
            y = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif ACT == 3:
        if FAST:
            y = z * rcp_approx(1.0 + exp2_approx(z * -1.4426950408889634, FAST == 2), FAST == 2)
        else:
            y = z * tl.sigmoid(z)
    else:
        y = z
    return y


@triton.jit
def act_bwd(dy, z, ACT: tl.constexpr, FAST: tl.constexpr = 0):
    """dL/dz given dL/dy and the pre-activation z (fp32 tiles).

    ``FAST`` (``fast_act_level``: 0 exact; 1 and 2 for half-precision outputs): GELU's normal CDF
    from ``normal_cdf_given_density_exp``, which reuses the density's exp(-z^2/2) (the erf form
    left the GELU backward at 0.67 of copy, instruction-bound; 0.79-0.81 with this, session 7),
    and SiLU's sigmoid as in ``act_fwd``; at level 2 through single ``ex2``/``rcp`` PTX
    instructions (session 17: GELU backward 1170 -> 815 SASS instructions per 32 values).
    Absolute error <= 3e-7 of dL/dz per unit dL/dy in fp32, below half an fp16/bf16 ulp at any
    |dL/dz| >= 2^-10.
    """
    if ACT == 1:
        dz = tl.where(z <= 0.0, 0.0, dy)
    elif ACT == 2:
        if FAST:
            e = exp2_approx(z * z * -0.7213475204444817, FAST == 2)  # exp(-z^2 / 2)
            cdf = normal_cdf_given_density_exp(z, e, FAST == 2)
        else:
            e = tl.exp(-0.5 * z * z)
            cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        dz = dy * (cdf + z * (e * 0.3989422804014327))
    elif ACT == 3:
        if FAST:
            s = rcp_approx(1.0 + exp2_approx(z * -1.4426950408889634, FAST == 2), FAST == 2)
        else:
            s = tl.sigmoid(z)
        dz = dy * (s * (1.0 + z * (1.0 - s)))
    else:
        dz = dy
    return dz


def act_reference(z: torch.Tensor, activation: str) -> torch.Tensor:
    """PyTorch activation, the reference for ``act_fwd``."""
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return torch.nn.functional.gelu(z)
    if activation == "silu":
        return torch.nn.functional.silu(z)
    return z


def act_grad_reference(dy: torch.Tensor, z: torch.Tensor, activation: str) -> torch.Tensor:
    """dL/dz from dL/dy and z in PyTorch ops, the reference for ``act_bwd``."""
    if activation == "relu":
        return torch.where(z <= 0, torch.zeros_like(dy), dy)
    if activation == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(z * 0.7071067811865476))
        pdf = torch.exp(-0.5 * z * z) * 0.3989422804014327
        return dy * (cdf + z * pdf)
    if activation == "silu":
        s = torch.sigmoid(z)
        return dy * (s * (1.0 + z * (1.0 - s)))
    return dy
