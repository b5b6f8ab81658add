"""Shared kernel helpers: activation codes and config overrides."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tilewise.ops import _common


def test_activation_code_names_argument():
    assert _common.activation_code("silu") == 3
    with pytest.raises(ValueError, match="'activation'"):
        _common.activation_code("swish")


def test_config_override_hook():
    default = _common.TileConfig(4, 64)
    other = _common.TileConfig(1, 128, 8, 4)
    assert _common.pick_config("k", 10, 10, 2, default) is default
    _common.CONFIG_OVERRIDES["k"] = lambda m, n, e: other
    try:
        assert _common.pick_config("k", 10, 10, 2, default) is other
    finally:
        _common.CONFIG_OVERRIDES.pop("k")


def test_pipelined_defaults_fit_a_smaller_gpu(monkeypatch):
    """The pipelined backward defaults size their stages to the GPU's shared memory: on a GPU
    allowing ~99 KB per block (consumer parts) they fall back to the register loop rather than
    fail to launch; on the H100 (227 KB) they keep 3-4 stages."""
    from tilewise.ops import bias_act, layernorm

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(_common, "_smem_optin", lambda index: 227 * 1024)
    assert _common.pipeline_smem_budget(cuda) == 96 * 1024
    assert layernorm._config("layer_norm_bwd", 8192, 4096, 2, cuda).stages == 3
    assert bias_act._config("bias_act_bwd", 8192, 4096, 2, cuda).stages == 3
    monkeypatch.setattr(_common, "_smem_optin", lambda index: 99 * 1024)
    small = _common.pipeline_smem_budget(cuda)
    for cfg in (
        layernorm._config("layer_norm_bwd", 8192, 4096, 2, cuda),
        bias_act._config("bias_act_bwd", 8192, 4096, 2, cuda),
        layernorm._config("layer_norm_bwd", 8192, 1024, 2, cuda),
    ):
        per_stage = 2 * cfg.block_m * cfg.block_n * 2
        assert cfg.stages == 1 or cfg.stages * per_stage <= small, cfg


@triton.jit
def _spans_kernel(out_ptr, M):
    start, end = _common.program_rows(M)
    tl.store(out_ptr + 2 * tl.program_id(0), start)
    tl.store(out_ptr + 2 * tl.program_id(0) + 1, end)


@pytest.mark.parametrize("m,programs", [(8192, 132), (7, 7), (37, 5), (1000, 999), (65, 2)])
def test_program_rows_split_evenly(m, programs):
    """Each program's rows follow the last's, cover [0, m) and differ in count by at most one."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the interpreter
    out = torch.full((programs, 2), -1, dtype=torch.int32, device=dev)
    _spans_kernel[(programs,)](out, m)
    starts, ends = out[:, 0].tolist(), out[:, 1].tolist()
    assert starts[0] == 0 and ends[-1] == m
    assert all(starts[i + 1] == ends[i] for i in range(programs - 1))
    counts = [e - s for s, e in zip(starts, ends, strict=True)]
    assert max(counts) - min(counts) <= 1


def test_persistent_grids_use_every_sm(monkeypatch):
    """A persistent grid gets ``progs_per_sm`` programs per SM over the column blocks, however
    the rows divide (8192 rows of 2-row tiles on 132 SMs: 132 programs, not 128 of 64 rows)."""
    monkeypatch.setattr(_common, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    cfg = _common.TileConfig(2, 4096, 16, progs_per_sm=1, stages=3)
    assert _common.row_programs(8192, cfg, 1, cpu, persistent=True) == 132
    assert _common.row_programs(100, cfg, 1, cpu, persistent=True) == 50  # one tile each
    four = _common.TileConfig(4, 1024, 4, progs_per_sm=4, stages=3)
    assert _common.row_programs(8192, four, 4, cpu, persistent=True) == 132
    plain = _common.TileConfig(64, 64, 4, progs_per_sm=8)  # one tile per program
    assert _common.row_programs(1000, plain, 1, cpu, persistent=False) == 16
