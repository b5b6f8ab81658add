"""The few-row forward GEMM (``ops.gemm_skinny``): forced on every forward it is offered for,
through forward and backward against fp64, with K splits, strided operands, NaN/Inf and bad
configs."""

from __future__ import annotations

import pytest
import torch
from checks import DEVICE_DTYPES
from test_linear import ACTS, _inputs, _run_case

import tilewise
from tilewise.ops import gemm_skinny
from tilewise.ops import linear as ops
from tilewise.runtime import workspace

SkinnyConfig = gemm_skinny.SkinnyConfig
CONFIGS = [SkinnyConfig(16, 32), SkinnyConfig(32, 16, split_k=3), SkinnyConfig(64, 16, split_k=8)]


def _force(monkeypatch, cfg: SkinnyConfig) -> list:
    """``ops._choose`` returns ``cfg`` where the few-row kernel is offered (forwards of at most
    16 rows), cuBLAS (or, off CUDA, the default tile) elsewhere; the offers are recorded."""
    offered = []

    def choose(a, b, *args, **kwargs):
        if kwargs.get("skinny") and a.shape[0] <= gemm_skinny.MAX_ROWS:
            offered.append(a.shape)
            return cfg
        if a.is_cuda:
            return ops.CUBLAS
        return ops.gemm_config(a.shape[0], b.shape[1], a.shape[1], a.element_size(), a.device)

    monkeypatch.setattr(ops, "_choose", choose)
    return offered


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
def test_forward_backward(monkeypatch, device, dtype, activation, cfg, rng_seed):
    """Odd rows (1-16), K and N off every block edge, slices left empty where K is short; the
    column blocks' ticket counters are left zero."""
    offered = _force(monkeypatch, cfg)
    shapes = [((1, 1), 1), ((3, 17), 5), ((16, 70), 33), ((2, 5, 40), 24)]
    if device == "cuda":
        shapes += [((7, 4099), 1031), ((16, 1024), 1024), ((1, 8192), 64)]
    for x_shape, n in shapes:
        for has_bias in (True, False):
            x, w, b = _inputs(x_shape, n, device, has_bias)
            _run_case(x, w, b, activation, dtype, rng_seed)
    assert len(offered) == 2 * len(shapes) and workspace.all_zero()


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_strided_operands(monkeypatch, device, dtype, rng_seed):
    """x a column slice and a transposed view, W a transposed view (K not contiguous), the bias
    every other element: read in place, as F.linear reads them."""
    _force(monkeypatch, SkinnyConfig(16, 32, split_k=2))
    x, w, b = _inputs((9, 72), 21, device, True)
    _run_case(x, w, b, "gelu", dtype, rng_seed, xfn=lambda t: t.t().contiguous().t())
    xw = torch.randn(5, 2 * 72, device=device, dtype=dtype)[:, 40:112]
    wt = torch.randn(72, 21, device=device, dtype=dtype).t() / 8
    bs = torch.randn(42, device=device, dtype=dtype)[::2]
    got = tilewise.linear(xw, wt, bs, "relu")
    want = ops.reference(xw.double(), wt.double(), bs.double(), "relu")
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2 if dtype != torch.float32
                               else 1e-5)  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_nan_and_inf_propagate(monkeypatch, device):
    """NaN and +-Inf in x reach exactly the outputs F.linear gives NaN/Inf, with K split."""
    _force(monkeypatch, SkinnyConfig(16, 16, split_k=4))
    x = torch.randn(6, 64, device=device)
    x[0, 3], x[2, 60], x[4, 10] = float("nan"), float("inf"), float("-inf")
    w, b = torch.randn(20, 64, device=device) / 8, torch.randn(20, device=device)
    for act in ("none", "relu"):
        got, want = tilewise.linear(x, w, b, act), ops.reference(x, w, b, act)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        fin = want.isfinite()
        torch.testing.assert_close(got[fin], want[fin], rtol=1e-5, atol=1e-5)


def test_candidates(monkeypatch):
    """Offered only for 1-16 rows with SMs to fill; each split leaves no slice empty and keeps
    at least two K steps per slice."""
    from tilewise.ops import gemm

    monkeypatch.setattr(gemm, "num_sms", lambda device: 132)  # gemm_config's: an H100's count
    assert gemm_skinny.candidates(17, 1024, 1024, 132) == ()
    assert gemm_skinny.candidates(0, 1024, 1024, 132) == ()
    assert gemm_skinny.candidates(16, 1024, 1024, 0) == ()  # no GPU: nothing to time
    for m, n, k in ((16, 1024, 1024), (2, 256, 256), (8, 4096, 4096), (1, 1, 7), (5, 97, 4099)):
        cands = gemm_skinny.candidates(m, n, k, 132)
        assert cands, (m, n, k)
        for c in cands:
            steps = -(-k // c.block_k)
            per = -(-steps // c.split_k)
            assert (c.split_k - 1) * per < steps, c  # the last slice has work
            assert c.split_k == 1 or k >= 2 * c.split_k * c.block_k, c
    cands = ops._candidates(8, 1024, 1024, 4, True, True, 132, True, True, True, True, True)
    assert any(isinstance(c, SkinnyConfig) for c in cands)
    cands = ops._candidates(64, 1024, 1024, 4, True, True, 132, True, True, True, True, True)
    assert not any(isinstance(c, SkinnyConfig) for c in cands)  # too many rows


def test_bad_input():
    x, w = torch.randn(17, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="'x'"):
        gemm_skinny.forward(x, w, None, "none", SkinnyConfig(16, 16))
    with pytest.raises(ValueError, match="'cfg'"):
        gemm_skinny.forward(x[:4], w, None, "none", SkinnyConfig(16, 16, split_k=0))
