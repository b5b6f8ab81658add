"""Problems, kernel configs, config heuristics and eligibility of the group-width-8 conv.

Frozen dataclasses, so a problem is a cache key and a config encodes into a short name. The
heuristic default is the first candidate; ``tilewise.runtime.autotune`` times the rest on CUDA.
``unsupported_reason`` / ``check_conv_args`` say which F.conv2d calls have a kernel.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from tilewise.ops._common import next_pow2
from tilewise.runtime import dispatch

OP = "grouped_conv2d"
GROUP_WIDTH = 8


def dw_format(channels_last: bool) -> torch.memory_format:
    """The memory format a weight gradient is written in: channels_last for a channels_last
    weight (``gconv.dw_channels_last``), else contiguous."""
    return torch.channels_last if channels_last else torch.contiguous_format


def channels_last_copy(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A channels_last copy of ``t`` (in ``dtype``, default its own) with exactly the strides
    ``torch.empty`` gives (as the fakes do)."""
    out = torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device,
                      memory_format=torch.channels_last)  # fmt: skip
    return out.copy_(t)


MAX_KERNEL = 7
PASSES = ("fprop", "dgrad", "wgrad")

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
}
_ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}

#: passes that move at least this multiple of the L2 size are autotuned with L2 read out before
#: each run (``timing_mode``). Off (inf): session 20 (call 1, ``autotune_screen_probe.py`` at
#: N = 256, cold from 1.0x L2 against warm) saw the picks differ in 9 of 18 passes and the warm
#: pick read faster in 7 of those 9, by 1-2% (the same tile read 0.848 and 0.877 in the two
#: runs), while cold tuning took 202 s against 169 s.
COLD_L2_MULTIPLE = math.inf


@dataclass(frozen=True)
class GConvProblem:
    """One conv: x [n, c, h, w], weight [c, 8, r, s], zero padding (pad_h, pad_w), stride 1."""

    n: int
    c: int
    h: int
    w: int
    r: int
    s: int
    pad_h: int
    pad_w: int
    dtype: str = "fp16"
    has_bias: bool = False

    @classmethod
    def from_tensors(
        cls,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        pad_h: int,
        pad_w: int,
    ) -> GConvProblem:
        n, c, h, w = (int(d) for d in x.shape)
        r, s = int(weight.shape[2]), int(weight.shape[3])
        dtype = DTYPE_NAMES.get(x.dtype, str(x.dtype))
        return cls(n, c, h, w, r, s, int(pad_h), int(pad_w), dtype, bias is not None)

    @property
    def p(self) -> int:
        """Output height."""
        return self.h + 2 * self.pad_h - self.r + 1

    @property
    def q(self) -> int:
        """Output width."""
        return self.w + 2 * self.pad_w - self.s + 1

    @property
    def groups(self) -> int:
        return self.c // GROUP_WIDTH

    @property
    def elem_bytes(self) -> int:
        return _ELEM_BYTES.get(self.dtype, 2)

    def bytes(self, pass_: str = "fprop") -> int:
        """Compulsory bytes of one pass (anchors.md): every tensor it reads or writes, once.

        fprop = input + weight (+ bias) + output; dgrad = grad_out + weight + grad_in;
        wgrad = grad_out + input + grad_weight.
        """
        e = self.elem_bytes
        inp = self.n * self.c * self.h * self.w * e
        out = self.n * self.c * self.p * self.q * e
        wgt = self.c * GROUP_WIDTH * self.r * self.s * e
        if pass_ == "fprop":
            return inp + wgt + out + (self.c * e if self.has_bias else 0)
        if pass_ in ("dgrad", "wgrad"):
            return out + wgt + inp
        raise ValueError(f"argument 'pass_' must be one of {PASSES}, got {pass_!r}")

    def flops(self, pass_: str = "fprop") -> int:
        """2 * multiply-adds of the conv, the same count for every pass (padding included)."""
        if pass_ not in PASSES:
            raise ValueError(f"argument 'pass_' must be one of {PASSES}, got {pass_!r}")
        return 2 * self.n * self.p * self.q * self.c * GROUP_WIDTH * self.r * self.s

    def label(self) -> str:
        return (
            f"n{self.n} c{self.c} {self.h}x{self.w} k{self.r}x{self.s} "
            f"pad{self.pad_h},{self.pad_w} {self.dtype}{' bias' if self.has_bias else ''}"
        )


@dataclass(frozen=True)
class GConvConfig:
    """fprop/dgrad launch: a block_p x block_q pixel tile times block_c channels per program.

    ``block_c`` is 16, 32 or 64 (2, 4 or 8 groups; tl.dot needs >= 16), block_p * block_q >= 16.
    """

    block_p: int
    block_q: int
    block_c: int
    num_warps: int = 4
    num_stages: int = 3

    @property
    def block_m(self) -> int:
        return self.block_p * self.block_q

    @property
    def name(self) -> str:
        return f"p{self.block_p}q{self.block_q}c{self.block_c}w{self.num_warps}s{self.num_stages}"


@dataclass(frozen=True)
class WgradConfig:
    """wgrad launch: each program reduces ``chunk_steps`` runs of ``block_m`` output pixels
    (flattened over n, p, q) for one block of ``block_c`` channels and ``tap_block`` taps (a power
    of two; the taps of one program share one tl.dot and one load of dy per step)."""

    block_m: int
    block_c: int
    chunk_steps: int
    num_warps: int = 4
    num_stages: int = 1
    tap_block: int = 1

    @property
    def name(self) -> str:
        return (
            f"m{self.block_m}c{self.block_c}k{self.chunk_steps}w{self.num_warps}s{self.num_stages}"
            f"t{self.tap_block}"
        )


#: passes of at most this many bytes are timed both warm and cold (``timing_mode``)
BOTH_WAYS_MAX_BYTES = 4 << 20


def timing_mode(problem: GConvProblem, pass_: str, l2: int) -> tuple[bool, bool]:
    """``(cold_l2, warm_too)`` for the autotuner's choice of a config for ``pass_``.

    Small passes (at most ``BOTH_WAYS_MAX_BYTES``) are timed both ways and the config with the
    smaller worst-case loss wins: in a model their input is often still in L2, in the study
    (inputs rotated past L2) never, and the fastest warm config can lose cold (session 20: at N=1
    C=256 16x16 the Triton wgrad the warm replays chose, 4.0-4.5 us, ran 5.17 us in the study
    against cuDNN's 4.69). Larger passes are timed warm unless ``COLD_L2_MULTIPLE`` says
    otherwise: replaying one input keeps the part of it that fits in L2 there, and session 19's
    autotuned fprop at C=64 N=256 read 0.884 of copy in its own replays but 0.846 rotated; yet
    cold picks were no better (``COLD_L2_MULTIPLE``). No L2 (the CPU): warm.
    """
    if l2 <= 0:
        return False, False
    nbytes = problem.bytes(pass_)
    if nbytes <= BOTH_WAYS_MAX_BYTES:
        return True, True
    return nbytes >= COLD_L2_MULTIPLE * l2, False


def conv_dims(problem: GConvProblem, pass_: str) -> tuple[int, int, int, int]:
    """(in_h, in_w, out_h, out_w) of the conv the fprop kernel runs for this pass."""
    if pass_ == "dgrad":
        return problem.p, problem.q, problem.h, problem.w
    return problem.h, problem.w, problem.p, problem.q


def _block_cs(c: int) -> list[int]:
    return [bc for bc in (16, 32, 64) if bc <= max(16, next_pow2(c))]


def _warps(block_m: int, block_c: int) -> list[int]:
    return [4] if block_m * block_c < 4096 else [4, 8]


@functools.lru_cache(maxsize=4096)
def default_config(problem: GConvProblem, pass_: str = "fprop", sms: int = 132):
    """A reasonable config without timing: a GConvConfig, or a WgradConfig for ``"wgrad"``.

    fprop/dgrad (H100 sweep, ``benchmarks/sweep_gconv.py``): 256-pixel tiles, 16 wide, 32
    channels, 3 pipeline stages, shrunk until there are >= 2 programs per SM.
    """
    if pass_ == "wgrad":
        return _default_wgrad(problem, sms)
    _, _, out_h, out_w = conv_dims(problem, pass_)
    block_c = 32 if problem.c % 32 == 0 else 16
    block_q = min(16, next_pow2(out_w))
    block_p = max(16 // block_q, min(next_pow2(out_h), 256 // block_q))

    def programs(bp: int, bq: int) -> int:
        tiles = -(-out_h // bp) * -(-out_w // bq)
        return problem.n * tiles * -(-problem.c // block_c)

    while block_p * block_q > 16 and programs(block_p, block_q) < 2 * sms:
        if block_p > 1 and block_p >= block_q // 2:
            block_p //= 2
        else:
            block_q //= 2
    return GConvConfig(block_p, block_q, block_c, 4, 3)


def candidate_configs(problem: GConvProblem, pass_: str = "fprop", sms: int = 132) -> list:
    """The legal configs worth timing for this problem and pass, the heuristic default first.

    fprop/dgrad: the default with 2 and 4 pipeline stages and 8 warps, then tiles of 64-512
    pixels (4-32 wide; narrower only for narrow images, never much larger than the image) times
    16, 32 or 64 channels. Kept short: each config is a compile on first use. wgrad: every config
    unpipelined (see ``gconv_wgrad.wgrad_candidates``).
    """
    return list(candidate_tuple(problem, pass_, sms))  # a copy: callers may edit it


def candidate_tuple(problem: GConvProblem, pass_: str = "fprop", sms: int = 132) -> tuple:
    """``candidate_configs`` as the one cached tuple per problem: the launch path passes it to
    the autotuner, whose per-call memo then skips hashing the candidates."""
    return _candidates(problem, pass_, sms)


@functools.lru_cache(maxsize=4096)
def _candidates(problem: GConvProblem, pass_: str, sms: int) -> tuple:
    if pass_ == "wgrad":
        return tuple(_wgrad_candidates(problem, sms))
    if pass_ not in PASSES:
        raise ValueError(f"argument 'pass_' must be one of {PASSES}, got {pass_!r}")
    _, _, out_h, out_w = conv_dims(problem, pass_)
    max_p, max_q = next_pow2(out_h), next_pow2(out_w)
    d = default_config(problem, pass_, sms)
    configs = [d, replace(d, num_stages=2), replace(d, num_stages=4), replace(d, num_warps=8)]
    tiles = []
    for bq in (4, 8, 16, 32):
        for bm in (64, 128, 256, 512):
            bp = bm // bq
            if (bq > max_q and bq > 4) or (bp > max_p and bp > 1) or bp < 1:
                continue
            tiles.append((bp, bq))
    preferred = [(16, 16), (8, 16), (32, 16), (8, 32)]  # the H100 sweep's best shapes
    tiles = ([t for t in preferred if t in tiles] + [t for t in tiles if t not in preferred])[:3]
    for bc in _block_cs(problem.c):
        for bp, bq in tiles:
            configs.append(GConvConfig(bp, bq, bc, 4 if bp * bq * bc < 8192 else 8, 3))
    return tuple(dict.fromkeys(configs))


def _wgrad_steps(m: int, block_m: int, other_blocks: int, sms: int) -> int:
    """Steps per program so that the grid (chunks x channel blocks x tap blocks) has about 4
    programs per SM."""
    chunks = max(1, (4 * sms) // other_blocks)
    return max(1, min(1024, next_pow2(-(-m // (block_m * chunks)))))


def _wgrad_config(problem: GConvProblem, sms: int, bm: int, bc: int, tb: int, nw: int, scale=1):
    m = problem.n * problem.p * problem.q
    blocks = -(-problem.c // bc) * -(-(problem.r * problem.s) // tb)
    steps = _wgrad_steps(m, bm, blocks, sms)
    # num_stages=1: with Triton 3.6's software pipelining (2 or 3 stages) several configs returned
    # wrong dw in half precision, differently from run to run; unpipelined, every config was exact
    # (scripts/wgrad_diag.py --all --stages 1 on the H100; PERF_NOTES, session 4)
    return WgradConfig(bm, bc, max(1, min(1024, steps * scale)), nw, 1, tb)


def _default_wgrad(problem: GConvProblem, sms: int) -> WgradConfig:
    """16 channels (2 groups), all taps of a kernel up to 3x3 in one tl.dot (8 of larger ones)."""
    taps = min(16, next_pow2(problem.r * problem.s))
    return _wgrad_config(problem, sms, 64, 16, taps, 4)


def _wgrad_candidates(problem: GConvProblem, sms: int) -> list[WgradConfig]:
    """Tap blocks of 4-16 taps x 16 channels or 1-8 taps x 32 channels (the accumulator is
    [tap_block * block_c, block_c] fp32), pixel steps of 32-128, about 4 programs per SM. Kept
    short: each config is a compile on first use."""
    m = problem.n * problem.p * problem.q
    rs = next_pow2(problem.r * problem.s)
    configs = [_default_wgrad(problem, sms)]
    shapes = [(16, tb) for tb in (4, 8, 16)]
    if problem.c >= 32:
        shapes += [(32, 1), (32, 4), (32, 8)]
    for bc, tb in shapes:
        tb = min(tb, rs)
        for bm in (64, 128):
            if bm > max(64, next_pow2(m)) or bm * tb > 1024:
                continue
            nw = 8 if bm * tb * bc >= 16384 else 4
            configs.append(_wgrad_config(problem, sms, bm, bc, tb, nw))
    if m <= SINGLE_CHUNK_MAX_PIXELS:  # one chunk: the kernel writes the final dW itself
        for bc, tb in shapes:
            tb = min(tb, rs)
            configs.append(WgradConfig(64, bc, -(-m // 64), 4, 1, tb))
    return list(dict.fromkeys(configs))


#: wgrad problems up to this many output pixels also get single-chunk candidates (batch 1 of
#: every issue shape: 64x64 = 4096 pixels)
SINGLE_CHUNK_MAX_PIXELS = 4096


# --- which convs have a kernel ------------------------------------------------------------------


def pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """``(v, v)`` for an int, the pair itself for a pair; else ``ValueError`` naming ``name``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) in (1, 2):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return (value[0], value[-1])
    raise ValueError(f"argument '{name}' must be an int or a pair of ints, got {value!r}")


def resolve_padding(padding: int | Sequence[int] | str, r: int, s: int) -> tuple[int, int] | None:
    """Symmetric (pad_h, pad_w) of ``padding`` (int, pair, "valid", "same"), or None when it is
    not symmetric ("same" with an even kernel); ``ValueError`` for anything F.conv2d rejects."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0
        if padding == "same":
            return ((r - 1) // 2, (s - 1) // 2) if r % 2 == 1 and s % 2 == 1 else None
        raise ValueError(f"argument 'padding' must be 'valid', 'same' or ints, got {padding!r}")
    ph, pw = pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"argument 'padding'={padding!r} is negative")
    return ph, pw


def unsupported_reason(
    c_in: int,
    c_out: int,
    kernel_size: tuple[int, int],
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    padding_mode: str = "zeros",
) -> str | None:
    """Why a conv with these hyper-parameters has no tilewise kernel, or None if it has one."""
    r, s = kernel_size
    if padding_mode != "zeros":
        return f"padding_mode={padding_mode!r} (kernels exist for 'zeros')"
    if pair(stride, "stride") != (1, 1):
        return f"stride {pair(stride, 'stride')} (kernels exist for stride 1)"
    if pair(dilation, "dilation") != (1, 1):
        return f"dilation {pair(dilation, 'dilation')} (kernels exist for dilation 1)"
    if c_in != c_out:
        return f"{c_in} input channels != {c_out} output channels"
    if groups < 1 or c_in % groups or c_in // groups != GROUP_WIDTH:
        return f"group width {c_in / max(groups, 1):g} (kernels exist for group width 8)"
    if not (1 <= r <= MAX_KERNEL and 1 <= s <= MAX_KERNEL):
        return f"kernel {r}x{s} (kernels exist for 1x1 to 7x7)"
    if resolve_padding(padding, r, s) is None:
        return f"padding={padding!r} with an even kernel is asymmetric"
    return None


def check_conv_args(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, groups: int | None
) -> int:
    """F.conv2d-style checks (``ValueError`` naming the argument); returns the group count,
    inferred from the shapes when ``groups`` is None."""
    if x.ndim != 4:
        raise ValueError(f"tilewise.{OP}: argument 'x' must be 4-D [N, C, H, W], got {x.ndim}-D")
    if weight.ndim != 4:
        raise ValueError(f"tilewise.{OP}: argument 'weight' must be 4-D, got {weight.ndim}-D")
    dispatch.check_same_device(OP, x=x, weight=weight, bias=bias)
    dispatch.check_same_dtype(OP, x=x, weight=weight)
    c, c_out, per_group = x.shape[1], weight.shape[0], weight.shape[1]
    if groups is None:
        if per_group < 1 or c % per_group:
            raise ValueError(
                f"tilewise.{OP}: argument 'weight' has {per_group} input channels per group, "
                f"which does not divide the {c} channels of 'x'"
            )
        groups = c // per_group
    elif groups < 1 or per_group * groups != c:
        raise ValueError(
            f"tilewise.{OP}: argument 'groups'={groups} does not match 'x' ({c} channels) and "
            f"'weight' ({per_group} input channels per group)"
        )
    if c_out % groups:
        raise ValueError(
            f"tilewise.{OP}: argument 'weight' has {c_out} output channels, not a multiple of "
            f"groups={groups}"
        )
    if bias is not None:
        dispatch.check_param_dtype(OP, x, bias=bias)
        if bias.ndim != 1 or bias.shape[0] != c_out:
            raise ValueError(
                f"tilewise.{OP}: argument 'bias' has shape {tuple(bias.shape)}, expected ({c_out},)"
            )
    return groups
