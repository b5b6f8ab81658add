"""Shared kernel helpers: the deterministic partial-sum reduction and activation codes."""

from __future__ import annotations

import pytest
import torch

from tilewise.ops import _common


@pytest.mark.parametrize("k,p,n", [(1, 1, 1), (2, 70, 300), (1, 33, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sum_partials_matches_fp64(k, p, n, dtype):
    partial = torch.randn(k, p, n)
    outs = [torch.full((n,), float("nan"), dtype=dtype) for _ in range(k)]
    _common.sum_partials(partial, outs)
    ref = partial.double().sum(1)
    for i in range(k):
        torch.testing.assert_close(
            outs[i].double(),
            ref[i],
            rtol=1e-3 if dtype == torch.float16 else 1e-5,
            atol=1e-3 if dtype == torch.float16 else 1e-5,
        )


def test_sum_partials_is_deterministic():
    partial = torch.randn(2, 50, 64)
    a = [torch.empty(64), torch.empty(64)]
    b = [torch.empty(64), torch.empty(64)]
    _common.sum_partials(partial, a)
    _common.sum_partials(partial, b)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_sum_partials_rejects_mismatch():
    with pytest.raises(ValueError, match="slices"):
        _common.sum_partials(torch.zeros(2, 3, 4), [torch.zeros(4)])


def test_activation_code_names_argument():
    assert _common.activation_code("silu") == 3
    with pytest.raises(ValueError, match="'activation'"):
        _common.activation_code("swish")
