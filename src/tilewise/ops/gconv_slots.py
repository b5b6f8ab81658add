"""The wgrad's slots (``CudaTile.slots``): the buffer the tap kernel's CTAs store their sums in,
one slot each (the warpgroup kernel's CTAs, since session 50: one slot a CTA column, each of its
channel blocks' CTAs storing its channels), and the slot-sum kernel (``gconv_slots_src``) that
adds them up.

Why (session 48, H200, C=64 64x64 3x3 N = 8, clock stamps): the one-launch wgrad's 128 CTAs add
their sums into the same 144 lines of the workspace, and the count that finds the last of them
completed 3.1 us after the last CTA's sums left, its pass over the sums 0.9 us more. With slots
no two CTAs write one word, nothing is counted, and the sum runs on every SM as a second,
programmatic dependent launch (it is scheduled while the first drains and waits for its end).
The order of every addition is fixed by the two launch shapes: a deterministic wgrad. (The bits
stay the same from run to run of one choice; the autotuner may choose another tile, with
another order, in a process without the same cache, as it may among the Triton configs.)
"""

from __future__ import annotations

import functools

import torch

from tilewise.ops._common import cdiv
from tilewise.ops.gconv_slots_src import ENTRY, SUM_WARPS
from tilewise.ops.gconv_slots_src import SOURCE as _SOURCE
from tilewise.runtime import alloc, nvrtc_cache

#: the slot-sum kernel's arguments: slots, dw_out, db_out; C, the slot count
SIGNATURE = "ppp" + "ii"


def slot_words(c: int, r: int, s: int) -> int:
    """fp32 words of one slot: the R x S x C x 8 weight sums, then C bias sums."""
    return r * s * c * 8 + c


def slot_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """The slots of one launch, ``numel`` fp32 words (slots x ``slot_words``; uninitialised:
    every word is stored before it is read; NaN under ``alloc.poison_outputs``, so a test sees a
    word left unstored; from PyTorch's caching allocator, so a CUDA graph keeps its own)."""
    return alloc.empty(numel, device=device, dtype=torch.float32)


Dim3 = tuple[int, int, int]


def sum_grid(c: int, r: int, s: int, bias: bool) -> tuple[Dim3, Dim3]:
    """(grid, block) of the slot-sum kernel: a CTA per 32 elements (weights, then the bias)."""
    elements = r * s * c * 8 + (c if bias else 0)
    return (cdiv(elements, 32), 1, 1), (SUM_WARPS * 32, 1, 1)


def source(r: int, s: int, bf16: bool, db_mode: int, dw_cl: bool) -> str:
    """The slot-sum kernel's source. ``db_mode``: 0 no bias gradient, 1 fp32, 2 the input dtype."""
    return _SOURCE.format(
        R=r, S=s, DW_CL=int(dw_cl), IS_BF16=int(bf16), HAS_BIAS=int(db_mode > 0),
        DB_HALF=int(db_mode == 2),
    )  # fmt: skip


@functools.cache
def kernel(r: int, s: int, bf16: bool, db_mode: int, dw_cl: bool, device: int):
    """The compiled slot-sum kernel for one variant on CUDA device ``device`` (cached on disk
    by ``runtime.nvrtc_cache``)."""
    with torch.cuda.device(device):
        return nvrtc_cache.compile_kernel(source(r, s, bf16, db_mode, dw_cl), ENTRY)
