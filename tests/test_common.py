"""Shared kernel helpers: activation codes and config overrides."""

from __future__ import annotations

import pytest
import torch

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
