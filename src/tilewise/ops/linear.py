"""Fused linear layer: ``y = act(x @ W^T + b)`` with ``W`` in ``nn.Linear``'s [N, K] layout.

The GEMMs run ``ops.gemm``'s Triton kernel (epilogue: bias, activation, the pre-bias product when
the backward needs it; prologue: the activation's derivative applied to ``dy`` as it loads) or a
cuBLAS backend, chosen per GEMM and shape by timing (``_choose``).

What the backward keeps (``saved``):

* gelu / silu: ``g = x @ W^T`` (pre-bias, input dtype); ``dz = dy * act'(g + b)``.
* relu: nothing extra; ``y`` itself (``y > 0`` exactly where ``z > 0``, NaN included); ``dz = dy
  where y > 0``.
* none: nothing; ``dz = dy``.

The backward is two launches of the same kernel: ``dx = dz @ W`` and ``dW = dz^T @ x``, each
turning ``dy`` into ``dz`` as it loads it, the second also summing ``db = colsum(dz)``.

Every GEMM also has a cuBLAS candidate (``torch.mm``, with bias_act's one-pass kernel for what
cannot be fused into it); the forward of bias + ReLU also cuBLASLt's fused bias + ReLU epilogue
(one kernel); true-fp32 forwards with few output tiles also cuBLAS over K slices
(``ops.gemm_splitk``), and those of at most 16 rows (64 in row chunks of 16) a CUDA GEMV
(``ops.gemv_cuda``).
``_choose`` times them against the kernel's tile configs on first use per shape and fused work
and caches the winner like any kernel config. True fp32 defaults to cuBLAS
untimed: the kernel's IEEE path runs on CUDA cores.

fp32 is true fp32 by default: cuBLAS's SGEMM, the kernel's IEEE path, or (forwards, timed like the
rest; ``TILEWISE_FP32_TENSOR_CORES=0`` turns it off) the kernel's 3xTF32 path on tensor cores, as
accurate as cuBLAS's SGEMM against fp64 (``ops.gemm_fp32tc``). ``allow_tf32=True`` lets fp32
products use TF32 tensor cores. fp16 /
bf16 accumulate in fp32 (the cuBLAS backend follows PyTorch's reduced-precision-reduction flags,
exactly as ``F.linear`` does). The bias may be fp32 with a half-precision ``x``; ``x`` and
``weight`` share one dtype.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from tilewise.ops import bias_act as _bias_act
from tilewise.ops import gemm, gemm_fp32tc, gemm_splitk, gemv_cuda
from tilewise.ops._common import act_reference, activation_code, l2_bytes, num_sms, unit_stride
from tilewise.ops.gemm import (  # noqa: F401 (re-exported: tests and scripts reach them here)
    _SMALL_TILE_ROWS,
    _TILES_IEEE,
    _TILES_TC,
    GemmConfig,
    Tf32x3Config,
    _busy_slices,
    _fit,
    _split_configs,
    gemm_config,
)
from tilewise.ops.gemm import launch as _launch
from tilewise.runtime import alloc, autotune, dispatch

OP = "linear"
#: GEMMs whose operands reach this size choose their config with L2 flushed before each timed run:
#: inside a model their weights come from DRAM, and a warm-L2 winner can lose there. 4 MB
#: (session 7, was 8): the 1 x 512 x 1024 half-precision MLP cells (4 MB of operands) chose a
#: warm winner that ran at 0.92-0.96x PyTorch + graph; the 8-layer training step's GEMMs
#: (64 x 1024 x 1024, 2.25 MB) still choose warm.
COLD_L2_MIN_BYTES = 4 << 20

#: How much faster (fraction) another candidate of a long true-fp32 forward with no activation
#: or ReLU must time than ``CUBLAS``, PyTorch's own path, to be chosen over it (session 24: the
#: fused fp32 chain read 0.977x, 0.982x and 0.991x PyTorch + CUDA graph at 8 layers of 512 x
#: 8192, 1024 x 4096 and 1024 x 8192, against 50.9 TFLOP/s for PyTorch's addmm; session 18 read
#: 512 x 8192 at 0.975x: the one-GEMM timing's pick lost in the chain). Session 25, H100: with it
#: the pick there is ``CUBLAS`` and the chain reads 1.000-1.001x; forced onto cuBLASLt's bias +
#: ReLU the same chain reads 0.977-0.991x (``scripts/mlp_cell_probe.py --backends``).
PREFER_CUBLAS_WITHIN = 0.02

#: Activations whose backward needs the pre-activation, which the forward then also stores.
SAVES_PRE_ACTIVATION = frozenset({"gelu", "silu"})


@functools.lru_cache(maxsize=4096)
def _candidates(
    m: int,
    n: int,
    k: int,
    elem_bytes: int,
    ieee: bool,
    cublas: bool,
    sms: int,
    epilogue_split: bool = False,
    lt_relu: bool = False,
    split_k: bool = False,
    cublas_split_k: bool = False,
    gemv: bool = False,
    fp32_tc: bool = False,
):
    """Default first (cuBLAS for true fp32, else the heuristic tile), then the other tiles fitted
    to the problem, then cuBLAS (with ``epilogue_split`` also cuBLAS's plain product followed by
    bias_act's epilogue kernel, with ``lt_relu`` also cuBLASLt's bias + ReLU epilogue, with
    ``cublas_split_k`` also cuBLAS over K slices, ``gemm_splitk``, where the output leaves SMs
    idle); with ``split_k`` (forwards) also split-K tiles where the output tiles are fewer than
    the SMs; with ``gemv`` (true-fp32 forwards as ``gemv_cuda.usable`` takes them) also
    ``gemv_cuda``'s configs; with ``fp32_tc`` (true-fp32 forwards) also the tensor-core tiles and
    their split-K forms as ``Tf32x3Config`` (3xTF32); one tuple object per shape (the autotuner's
    memo keys on it)."""
    dev = torch.device("cuda") if sms else torch.device("cpu")
    default = gemm_config(m, n, k, elem_bytes, dev)
    hook = gemm.CONFIG_OVERRIDE
    overridden = hook is not None and hook(m, n, k, elem_bytes) is not None
    if overridden:
        tiles: list[GemmConfig] = [default]
    else:
        tiles = [default] + _fitted_tiles(_TILES_IEEE if ieee else _TILES_TC, m, n, k)
    if split_k and sms and not overridden:
        tiles += _split_configs(m, n, k, ieee, sms)
    if fp32_tc and ieee and sms and not overridden:
        tc = _fitted_tiles(_TILES_TC, m, n, k)
        # fp32 operands take twice the shared memory of half ones: K steps of 32, not 64 (the
        # split-K forms below keep their bases' steps; each compiled and ran on the H100 in
        # session 27's review, and a config that does not fit is skipped as a failed candidate)
        tc = [replace(c, block_k=min(c.block_k, 32)) for c in tc]
        tc += _split_configs(m, n, k, False, sms) if split_k else []
        tiles += [Tf32x3Config(**asdict(c)) for c in tc]
    tiles = list(dict.fromkeys(tiles))
    if gemv and sms and not overridden:
        tiles += gemv_cuda.candidates(m, n, k, sms)
    if not cublas:
        return tuple(tiles)
    libs = (CUBLAS, CUBLAS_EPILOGUE) if epilogue_split else (CUBLAS,)
    if lt_relu:
        libs = (*libs, CUBLAS_LT_RELU)
    if cublas_split_k:
        libs = (*libs, *gemm_splitk.candidates(m, n, k, sms))
    return (*libs, *tiles) if ieee else (*tiles, *libs)


def _fitted_tiles(table: tuple, m: int, n: int, k: int) -> list[GemmConfig]:
    """The table's tiles fitted to the problem: small-row tiles only for problems of at most 4x
    their rows, tiles past 128 x 128 only where the output holds 64 of them."""
    return [
        _fit(GemmConfig(bm, bn, bk, num_warps=w, num_stages=st), m, n, k)
        for bm, bn, bk, w, st in table
        if bm >= _SMALL_TILE_ROWS or m <= 4 * bm
        if bm * bn <= 128 * 128 or m * n >= 64 * bm * bn
    ]


@dataclass(frozen=True)
class GemmProblem:
    """Autotune key of one GEMM: shape, dtype, precision and what is fused around it."""

    m: int
    n: int
    k: int
    dtype: str
    allow_tf32: bool
    epilogue: str  # "none", or the activation/bias fused before or after the product


@dataclass(frozen=True)
class Backend:
    """A GEMM that runs on cuBLAS (``torch.mm``, then bias_act's fused epilogue kernel when there
    is one) instead of this module's kernel with a ``GemmConfig``."""

    name: str


CUBLAS = Backend("cublas")
#: fp32 forward only: ``torch.mm`` then bias_act's bias + activation kernel. cuBLAS's ``addmm``
#: with a broadcast bias runs a scaling pass and a slower kernel (batch 64, hidden 1024 on an
#: H100: ~27 us against ~13 + 2); in fp32 storing the product before the bias add rounds nothing.
CUBLAS_EPILOGUE = Backend("cublas+epilogue")
#: forward of bias + ReLU only: ``torch._addmm_activation``, cuBLASLt's RELU_BIAS epilogue, one
#: kernel where ``CUBLAS`` runs ``addmm`` and then a ReLU launch. The bias is added to the fp32
#: sum before rounding, as in ``addmm``, so for finite values the ReLU mask is ``F.linear``'s
#: element for element. NaN is not: some of cuBLASLt's kernels turn relu(NaN) into 0 (fp16/bf16
#: at K = 100, N = 97 on an H100, session 13's review), so the candidate is offered only for
#: shapes whose kernel ``lt_relu_keeps_nonfinite`` has checked, and only run on 16-byte aligned
#: operands (cuBLASLt picks kernels by alignment too).
CUBLAS_LT_RELU = Backend("cublaslt-relu")


def _aligned(*tensors: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _lt_relu_offered(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a @ b`` (+ bias, ReLU) may take ``CUBLAS_LT_RELU``: CUDA, aligned operands, a
    shape whose kernel keeps NaN/Inf."""
    if not a.is_cuda or not _aligned(a, b):
        return False
    dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
    return lt_relu_keeps_nonfinite(a.shape[0], b.shape[1], a.shape[1], a.dtype, dev)


@functools.lru_cache(maxsize=1024)
def lt_relu_keeps_nonfinite(m: int, n: int, k: int, dtype: torch.dtype, device: int) -> bool:
    """Whether cuBLASLt's bias + ReLU kernel for this GEMM shape keeps NaN and Inf where
    ``relu(F.linear(x, w, b))`` has them: one run on aligned probe operands with NaN and +-Inf
    planted in ``x``, once per shape and process. False while a CUDA graph is being captured
    (nothing may run then) and on anything but CUDA."""
    if device < 0 or torch.cuda.is_current_stream_capturing():
        return False
    dev = torch.device("cuda", device)
    x = torch.randn(m, k, device=dev).to(dtype)
    w = torch.randn(n, k, device=dev).to(dtype)
    b = torch.randn(n, device=dev).to(dtype)
    x[0, 0] = float("nan")
    x[m - 1, k - 1] = float("inf")
    x[m // 2, k // 2] = float("-inf")
    got = torch._addmm_activation(b, x, w.t())
    want = torch.relu(torch.nn.functional.linear(x, w, b))
    return bool(torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()))


CublasSplitK = gemm_splitk.CublasSplitK
GemvConfig = gemv_cuda.GemvConfig
Choice = Backend | GemmConfig | CublasSplitK | GemvConfig


def _cublas_legal(a: torch.Tensor, allow_tf32: bool) -> bool:
    """cuBLAS honours the process-wide TF32 flag, so fp32 may use it only when that flag says
    what the caller asked for."""
    if a.device.type != "cuda":
        return False
    return a.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 == allow_tf32


def _choose(
    a: torch.Tensor,
    b: torch.Tensor,
    allow_tf32: bool,
    epilogue: str,
    run: Callable[[Choice], Any],
    epilogue_split: bool = False,
    lt_relu: bool = False,
    split_k: bool = False,
    cublas_split_k: bool = False,
    gemv: bool = False,
) -> Choice:
    """cuBLAS or a tile config for ``a @ b`` with ``epilogue`` fused, timed on first use per shape
    and cached like every config. Without timing: cuBLAS for true fp32 (the kernel's IEEE path
    runs on CUDA cores), else the heuristic tile."""
    m, k = a.shape
    n = b.shape[1]
    if a.device.type != "cuda":  # the interpreter: nothing to time, cuBLAS not legal
        return gemm_config(m, n, k, a.element_size(), a.device)
    ieee = a.dtype == torch.float32 and not allow_tf32
    sms = num_sms(a.device)
    cublas = _cublas_legal(a, allow_tf32)
    # true-fp32 forwards may also run 3xTF32 on tensor cores (``gemm.Tf32x3Config``)
    fp32_tc = split_k and ieee and gemm_fp32tc.enabled()
    cands = _candidates(
        m,
        n,
        k,
        a.element_size(),
        ieee,
        cublas,
        sms,
        epilogue_split,
        lt_relu,
        split_k,
        cublas_split_k and ieee,
        gemv and ieee,
        fp32_tc,
    )
    prob = GemmProblem(m, n, k, str(a.dtype).removeprefix("torch."), allow_tf32, epilogue)
    nbytes = (m * k + k * n + m * n) * a.element_size()
    cold, warm_too = timing_mode(nbytes, l2_bytes(a.device))
    # forwards (their candidates grew in session 13: cuBLASLt's bias + ReLU, split-K; in session
    # 14 cuBLAS split-K; fwd4, session 15: L2 flushed by reading, the few-row CUDA GEMV; fwd5,
    # session 18: near-ties of long problems timed again in rotating rounds; fwd6, session 24:
    # PyTorch's own path kept for long true-fp32 forwards unless beaten by a margin) under
    # their own key, so choices cached before are timed again
    # (GemmConfig's split_k field also keeps older cached tile choices of the backward GEMMs from
    # matching: those are re-timed too)
    op = gemm_op_key(split_k, any(isinstance(c, GemvConfig) for c in cands), fp32_tc)
    return autotune.choose_config(
        op,
        prob,
        cands,
        run,
        device=a.device,
        cold_l2=cold,
        warm_too=warm_too,
        prefer=preferred_backend(split_k, ieee and cublas, epilogue),
        prefer_within=PREFER_CUBLAS_WITHIN,
    )


#: the forward epilogues whose ``CUBLAS`` path is PyTorch's own (``addmm`` [+ ReLU in place])
_PREFER_EPILOGUES = frozenset({"none", "relu", "none+bias", "relu+bias"})


def preferred_backend(forward: bool, ieee_cublas: bool, epilogue: str) -> Backend | None:
    """``CUBLAS`` for true-fp32 forwards with no activation or ReLU (cuBLAS legal): there it is
    PyTorch's own path (``addmm``, then ReLU in place), which the autotuner keeps for long
    problems unless another candidate wins by more than ``PREFER_CUBLAS_WITHIN``; else None."""
    return CUBLAS if forward and ieee_cublas and epilogue in _PREFER_EPILOGUES else None


def gemm_op_key(forward: bool, gemv_offered: bool, fp32_tc: bool = False) -> str:
    """The autotune op name of a GEMM choice: forwards apart from the backward's GEMMs, and
    forwards offered the GEMV (which depends on the operands' alignment and strides, not only on
    the shape) apart from those that were not, so neither overwrites the other's cached choice;
    likewise true-fp32 forwards offered the 3xTF32 tiles (".tc", session 27) apart from those that
    were not (``TILEWISE_FP32_TENSOR_CORES=0``)."""
    if not forward:
        return OP + ".gemm"
    return OP + ".gemm.fwd6" + (".tc" if fp32_tc else "") + (".gemv" if gemv_offered else "")


def timing_mode(nbytes: int, l2: int) -> tuple[bool, bool]:
    """``(cold_l2, warm_too)`` for a GEMM whose operands take ``nbytes`` on a device with ``l2``
    bytes of L2. From ``COLD_L2_MIN_BYTES`` on, cold; operands that also fit in L2 stay there in
    some models (a single large layer) and stream from DRAM in others, so those are timed both
    ways and the smaller worst-case loss wins. Larger ones never stay in L2, and their warm
    timing only adds noise (session 15, call 9: bf16 512 x 8192 x 8192 lost 6-10% to a min-max
    pick; call 8: a cold-only pick lost 1.5x at bf16 8 x 4096 x 4096, 32 MB of operands)."""
    cold = nbytes >= COLD_L2_MIN_BYTES
    return cold, cold and nbytes <= l2


def matmul(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, allow_tf32: bool = False
) -> torch.Tensor:
    """``a @ b`` for 2-D operands of any strides, fp32 accumulation, output in ``out_dtype``."""
    if not dispatch.use_kernel(OP + "_backward", [a, b]):
        return torch.matmul(a, b).to(out_dtype)

    def run(ch: Choice) -> torch.Tensor:
        if ch == CUBLAS:
            return torch.mm(a, b).to(out_dtype)
        return _launch(a, b, out_dtype, allow_tf32, cfg=ch)[0]

    return run(_choose(a, b, allow_tf32, "none", run))


def reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none"
) -> torch.Tensor:
    """Plain PyTorch ``act(F.linear(x, W, b))``: the numerical reference and the eager baseline."""
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return act_reference(torch.nn.functional.linear(x, weight, bias), activation)


def validate(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> None:
    """Raise ``ValueError`` naming the bad argument."""
    activation_code(activation)
    if weight.ndim != 2:
        raise ValueError(
            f"tilewise.{OP}: argument 'weight' must be 2-D [out_features, in_features], "
            f"got shape {tuple(weight.shape)}"
        )
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"tilewise.{OP}: argument 'x' has shape {tuple(x.shape)}; its last dim must be "
            f"in_features={weight.shape[1]} (weight.shape[1])"
        )
    dispatch.check_same_device(OP, x=x, weight=weight, bias=bias)
    dispatch.check_same_dtype(OP, x=x, weight=weight)
    if bias is not None:
        dispatch.check_param_dtype(OP, x, bias=bias)
        if bias.ndim != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"tilewise.{OP}: argument 'bias' has shape {tuple(bias.shape)}, expected "
                f"({weight.shape[0]},) to match weight.shape[0]"
            )


def _rows(t: torch.Tensor, cols: int) -> torch.Tensor:
    """``t`` as [rows, cols]; unlike ``reshape(-1, cols)`` also for ``cols == 0`` (PyTorch's
    ``F.linear`` takes in_features = 0 and returns the bias)."""
    return t.reshape(math.prod(t.shape[:-1]), cols)


def output_shape(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, ...]:
    return (*x.shape[:-1], weight.shape[0])


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    allow_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(y, saved)``: ``y = act(x @ W^T + b)`` of shape [..., N] and what ``backward`` needs
    (the pre-bias ``x @ W^T`` for gelu/silu, ``y`` itself for relu, None for none)."""
    validate(x, weight, bias, activation)
    bias = unit_stride(bias)
    shape = output_shape(x, weight)
    x2 = _rows(x, weight.shape[1])
    if not dispatch.use_kernel(OP, [x2, weight]):
        b = None if bias is None else bias.to(x.dtype)
        if activation in SAVES_PRE_ACTIVATION:
            g = torch.nn.functional.linear(x2, weight)
            y = act_reference(g if b is None else g + b, activation).view(shape)
            pre = g.view(shape)
        else:
            # bias inside F.linear's GEMM, as PyTorch does: one rounding, so the ReLU mask is
            # PyTorch's element for element (a separate add rounded twice and flipped the mask
            # of near-zero outputs in bf16, ~1 run in 20)
            y = act_reference(torch.nn.functional.linear(x2, weight, b), activation).view(shape)
            pre = None
    else:
        store_g = activation in SAVES_PRE_ACTIVATION
        wt = weight.t()

        def run(ch: Choice) -> tuple[torch.Tensor, torch.Tensor | None]:
            if isinstance(ch, GemvConfig):  # offered where gemv_cuda.usable says so
                return gemv_cuda.forward(x2, weight, bias, activation, ch), None
            if isinstance(ch, CublasSplitK):  # fp32, activation none or relu (offered so)
                return gemm_splitk.forward(x2, wt, bias, activation, ch), None
            if ch == CUBLAS_EPILOGUE:  # fp32 only: the stored product is the exact fp32 sum
                z = torch.mm(x2, wt)
                if bias is None and activation == "none":
                    return z, None
                return _bias_act.forward(z, bias, activation, -1), None
            if ch == CUBLAS_LT_RELU and _aligned(x2, wt):  # offered for bias + ReLU only
                return torch._addmm_activation(bias.to(x.dtype), x2, wt), None
            if ch in (CUBLAS, CUBLAS_LT_RELU):  # cuBLASLt's kernel only on aligned operands
                if activation in ("none", "relu"):
                    # bias added in cuBLAS's fp32 epilogue, before rounding, exactly as F.linear
                    # does: the ReLU mask (y > 0) then matches PyTorch's element for element.
                    # The ReLU is PyTorch's, in place on the fresh product: a Triton launch costs
                    # 15-25 us of host time against ~6, for the same device work.
                    b = None if bias is None else bias.to(x.dtype)
                    z = torch.mm(x2, wt) if b is None else torch.addmm(b, x2, wt)
                    return (z if activation == "none" else torch.relu_(z)), None
                g = torch.mm(x2, wt)
                return _bias_act.forward(g, bias, activation, -1), g
            return _launch(x2, wt, x.dtype, allow_tf32, bias, activation, store_g, cfg=ch)

        epilogue = f"{activation}{'+bias' if bias is not None else ''}"
        split = x.dtype == torch.float32 and activation in ("none", "relu")
        lt = activation == "relu" and bias is not None and _lt_relu_offered(x2, wt)
        y2, g2 = run(
            _choose(
                x2,
                wt,
                allow_tf32,
                epilogue,
                run,
                split and epilogue != "none",
                lt_relu=lt,
                split_k=True,
                cublas_split_k=split,
                gemv=gemv_cuda.usable(x2, weight, activation),
            )
        )
        y, pre = y2.view(shape), (g2.view(shape) if store_g else None)
    return y, (y if activation == "relu" else pre)


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    saved: torch.Tensor | None,
    activation: str = "none",
    allow_tf32: bool = False,
    need_dx: bool = True,
    dw_out: torch.Tensor | None = None,
    db_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """``(dx, dweight, dbias)`` from ``dy`` and ``forward``'s ``saved``; dbias None without bias,
    dx None when not ``need_dx``. ``dw_out``/``db_out`` (contiguous, the weight's and bias's
    shape and dtype: a fused optimizer's gradient slots) receive the gradients when given.

    On the kernel path the activation's derivative is applied as each GEMM loads ``dy`` (no
    ``dz`` tensor) and the weight-gradient GEMM also sums the bias gradient: two launches. A GEMM
    that cuBLAS runs faster (timed per shape) gets a ``dz`` from bias_act's backward kernel."""
    validate(x, weight, bias, activation)
    bias = unit_stride(bias)
    shape = output_shape(x, weight)
    if tuple(dy.shape) != shape:
        raise ValueError(
            f"tilewise.{OP}: argument 'grad' has shape {tuple(dy.shape)}, expected {shape}"
        )
    if activation != "none" and (saved is None or tuple(saved.shape) != shape):
        raise ValueError(f"tilewise.{OP}: argument 'saved' must have shape {shape}")
    dispatch.check_same_device(OP + "_backward", x=x, grad=dy, saved=saved)
    n, k = weight.shape
    dy2 = _rows(dy, n)
    if dy2.dtype != x.dtype:
        dy2 = dy2.to(x.dtype)
    x2 = _rows(x, k)
    s2 = _rows(saved, n) if activation != "none" else None
    if not dispatch.use_kernel(OP + "_backward", [dy2, x2, weight]):
        dz, db = _dz_db(dy2, s2, bias, activation)
        dx = torch.matmul(dz, weight).view(x.shape) if need_dx else None
        dw = torch.matmul(dz.t(), x2).to(weight.dtype)
        return dx, _into(dw_out, dw), _into(db_out, db)

    # the saved bias enters the derivative only where the forward saved the pre-bias product
    sb = bias if activation in SAVES_PRE_ACTIVATION else None
    tag = f"dact:{activation}{'+bias' if sb is not None else ''}"
    dz_memo: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def fresh_dz_db() -> tuple[torch.Tensor, torch.Tensor | None]:  # timing: a new one per run
        return _dz_db(dy2, s2, bias, activation)

    def dz_db() -> tuple[torch.Tensor, torch.Tensor | None]:  # the real call: at most one
        if not dz_memo:
            dz_memo.append(fresh_dz_db())
        return dz_memo[0]

    def run_dx(ch: Choice, dz_db=fresh_dz_db) -> torch.Tensor:
        if ch == CUBLAS:
            return torch.mm(dz_db()[0], weight)
        dact = None if s2 is None else (activation, s2, sb, 1)
        return _launch(dy2, weight, x.dtype, allow_tf32, cfg=ch, dact=dact)[0]

    def run_dw(ch: Choice, dz_db=fresh_dz_db, dw_out=None, db_out=None):
        if ch == CUBLAS:
            dz, db = dz_db()
            if dw_out is not None and dz.dtype == dw_out.dtype:
                return torch.mm(dz.t(), x2, out=dw_out), _into(db_out, db)
            return _into(dw_out, torch.mm(dz.t(), x2).to(weight.dtype)), _into(db_out, db)
        db = db_out
        if db is None and bias is not None:
            db = alloc.empty(n, device=x.device, dtype=bias.dtype)
        dact = None if s2 is None else (activation, s2.t(), sb, 2)
        dw = _launch(dy2.t(), x2, weight.dtype, allow_tf32, cfg=ch, dact=dact, db=db, out=dw_out)
        return dw[0], db

    dx = None
    if need_dx:
        dx = run_dx(_choose(dy2, weight, allow_tf32, tag, run_dx), dz_db).view(x.shape)
    db_tag = "+db" if bias is not None else ""
    choice = _choose(dy2.t(), x2, allow_tf32, tag + db_tag, run_dw)
    dw, db = run_dw(choice, dz_db, dw_out, db_out if bias is not None else None)
    return dx, dw, db


def _into(out: torch.Tensor | None, t: torch.Tensor | None) -> torch.Tensor | None:
    """``t``, copied into ``out`` when one is given."""
    if out is None or t is None or t is out:
        return t
    return out.copy_(t)


def _dz_db(
    dy2: torch.Tensor, s2: torch.Tensor | None, bias: torch.Tensor | None, activation: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dz = act'(saved (+ bias)) * dy`` and the bias gradient, materialized (cuBLAS path)."""
    if activation == "none":
        if bias is None:
            return dy2, None
        return dy2, dy2.sum(0, dtype=torch.promote_types(dy2.dtype, torch.float32)).to(bias.dtype)
    # relu: dz = dy where y > 0, bias_act's relu rule on y, whose bias is already in it
    return _bias_act.backward(dy2, s2, bias, activation, -1, add_bias=activation != "relu")
