"""Shared kernel helpers: activation codes and config overrides."""

from __future__ import annotations

import pytest

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
