"""The few-row fp32 CUDA GEMV (``ops.gemv_cuda``): forced on every forward it is offered for,
through forward and backward against fp64, with K splits, strided x, NaN/Inf, CUDA graphs; its
offer rule and bad configs on any machine."""

from __future__ import annotations

import pytest
import torch
from test_gconv_cuda_compile import NVCC, _ptxas
from test_linear import _inputs, _run_case

import tilewise
from tilewise.ops import gemv_cuda
from tilewise.ops import linear as ops
from tilewise.runtime import workspace

GemvConfig = gemv_cuda.GemvConfig
gpu = pytest.mark.gpu


def _force(monkeypatch, cfg) -> list:
    """``ops._choose`` returns ``cfg`` where the GEMV is offered, cuBLAS elsewhere; the offers
    are recorded (``cfg`` None: each shape's first candidate)."""
    offered = []

    def choose(a, b, *args, **kwargs):
        if kwargs.get("gemv"):
            offered.append(tuple(a.shape))
            return cfg or gemv_cuda.candidates(a.shape[0], b.shape[1], a.shape[1], 132)[0]
        return ops.CUBLAS

    monkeypatch.setattr(ops, "_choose", choose)
    return offered


SHAPES = [((1, 4), 1), ((3, 100), 97), ((16, 1024), 1024), ((7, 4100), 1031), ((2, 5, 256), 33)]


@gpu
@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize(
    "cfg",
    [None, GemvConfig(2, 4), GemvConfig(4, 4, 3), GemvConfig(1, 8, 8), GemvConfig(2, 8, 32)],
    ids=repr,
)
def test_forward_backward(monkeypatch, activation, cfg, rng_seed):
    """Odd rows (1-16), N off every column block, K split into slices (some short); every
    forward offered the GEMV takes it; the column blocks' ticket counters are left zero."""
    _forced_cases(monkeypatch, cfg, activation, SHAPES, rng_seed)


def _forced_cases(monkeypatch, cfg, activation, shapes, rng_seed) -> None:
    """Forward and backward of every (x shape, N) with and without a bias, the GEMV forced
    (``cfg``) wherever offered, against fp64; each forward was offered it, counters left zero."""
    offered = _force(monkeypatch, cfg)
    for x_shape, n in shapes:
        for has_bias in (True, False):
            x, w, b = _inputs(x_shape, n, "cuda", has_bias)
            _run_case(x, w, b, activation, torch.float32, rng_seed)
    assert len(offered) == 2 * len(shapes) and workspace.all_zero()


@gpu
def test_every_candidate(monkeypatch, rng_seed):
    """Every config the autotuner may pick, on shapes whose candidates differ (33 rows: the
    row chunks, ``ROW_CHUNKS``)."""
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", True)
    for (m, k), n in (((16, 1024), 1000), ((2, 2048), 2048), ((9, 8192), 64), ((33, 1024), 100)):
        for cfg in gemv_cuda.candidates(m, n, k, 132):
            _force(monkeypatch, cfg)
            x, w, b = _inputs((m, k), n, "cuda", True)
            try:
                _run_case(x, w, b, "relu", torch.float32, rng_seed)
            except AssertionError as exc:
                raise AssertionError(f"{cfg}: {exc}") from None
    assert workspace.all_zero()


@gpu
def test_strided_x_and_what_is_not_offered(monkeypatch, rng_seed):
    """x a column slice (rows of unit stride, aligned) is read in place; x a transposed view, a
    non-contiguous weight, K not a multiple of 4, fp16, GELU or more than 16 rows are not offered
    the GEMV (cuBLAS runs)."""
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", False)  # 17 rows: offered only in chunks
    offered = _force(monkeypatch, GemvConfig(2, 4, 2))
    x, w, b = _inputs((9, 72), 21, "cuda", True)
    _run_case(x, w, b, "relu", torch.float32, rng_seed, xfn=lambda t: t.t().contiguous().t())
    assert not offered
    xs = torch.randn(5, 2 * 72, device="cuda")[:, 36:108]
    got = tilewise.linear(xs, w, b, "relu")
    torch.testing.assert_close(got, ops.reference(xs, w, b, "relu"), rtol=1e-5, atol=1e-5)
    assert len(offered) == 1
    cases = [
        (torch.randn(4, 64, device="cuda"), torch.randn(64, 8, device="cuda").t(), "relu"),
        (torch.randn(4, 66, device="cuda"), torch.randn(8, 66, device="cuda"), "relu"),
        (
            torch.randn(4, 64, device="cuda").half(),
            torch.randn(8, 64, device="cuda").half(),
            "none",
        ),
        (torch.randn(4, 64, device="cuda"), torch.randn(8, 64, device="cuda"), "gelu"),
        (torch.randn(17, 64, device="cuda"), torch.randn(8, 64, device="cuda"), "relu"),
        # misaligned: x one element into its rows, a row stride not a multiple of 4, W one
        # element into its storage
        (torch.randn(4, 73, device="cuda")[:, 1:], torch.randn(8, 72, device="cuda"), "relu"),
        (torch.randn(4, 74, device="cuda")[:, :72], torch.randn(8, 72, device="cuda"), "relu"),
        (
            torch.randn(4, 72, device="cuda"),
            torch.randn(577, device="cuda")[1:].view(8, 72),
            "none",
        ),
    ]
    for xc, wc, act in cases:
        tilewise.linear(xc, wc, None, act)
    assert len(offered) == 1


@gpu
def test_one_row_and_expanded_x(monkeypatch, rng_seed):
    """One row of a wider tensor (its row stride unused) and an expanded x (row stride 0, equal
    rows) are offered and read in place."""
    offered = _force(monkeypatch, GemvConfig(1, 4, 2))
    w, b = torch.randn(40, 512, device="cuda") / 16, torch.randn(40, device="cuda")
    for x in (
        torch.randn(3, 515, device="cuda")[:1, :512],
        torch.randn(1, 512, device="cuda").expand(6, 512),
    ):
        got = tilewise.linear(x, w, b, "relu")
        torch.testing.assert_close(got, ops.reference(x, w, b, "relu"), rtol=1e-5, atol=1e-5)
    assert len(offered) == 2


@gpu
def test_nan_and_inf_propagate(monkeypatch):
    """NaN and +-Inf in x reach exactly the outputs F.linear gives NaN/Inf, K split or not."""
    for cfg in (GemvConfig(2, 4), GemvConfig(2, 4, 4)):
        _force(monkeypatch, cfg)
        x = torch.randn(6, 512, device="cuda")
        x[0, 3], x[2, 500], x[4, 10] = float("nan"), float("inf"), float("-inf")
        w, b = torch.randn(20, 512, device="cuda") / 8, torch.randn(20, device="cuda")
        for act in ("none", "relu"):
            got, want = tilewise.linear(x, w, b, act), ops.reference(x, w, b, act)
            assert torch.equal(got.isnan(), want.isnan()), (cfg, act)
            assert torch.equal(got.isinf(), want.isinf()), (cfg, act)
            fin = want.isfinite()
            torch.testing.assert_close(got[fin], want[fin], rtol=1e-5, atol=1e-5)


@gpu
def test_in_a_cuda_graph(monkeypatch):
    """Captured with a K split (workspace and counters inside the graph), replayed on new x."""
    _force(monkeypatch, GemvConfig(2, 4, 4))
    x = torch.randn(8, 1024, device="cuda")
    w, b = torch.randn(512, 1024, device="cuda") / 32, torch.randn(512, device="cuda")
    tilewise.linear(x, w, b, "relu")  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = tilewise.linear(x, w, b, "relu")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, ops.reference(x, w, b, "relu"), rtol=1e-5, atol=1e-5)


def test_candidates_and_offer_rule(monkeypatch):
    """Offered for 1-16 rows with K % 4 == 0 and SMs to fill; each split leaves no slice empty."""
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", False)
    assert gemv_cuda.candidates(17, 1024, 1024, 132) == ()
    assert gemv_cuda.candidates(0, 1024, 1024, 132) == ()
    assert gemv_cuda.candidates(16, 1024, 1024, 0) == ()  # no GPU: nothing to time
    assert gemv_cuda.candidates(16, 1024, 1022, 132) == ()  # K % 4 != 0
    for m, n, k in ((16, 1024, 1024), (2, 256, 256), (8, 4096, 4096), (1, 1, 4), (5, 97, 4100)):
        cands = gemv_cuda.candidates(m, n, k, 132)
        assert cands, (m, n, k)
        for c in cands:
            ks = gemv_cuda._slice(k, c.split_k)
            assert -(-k // ks) == c.split_k, c  # every slice has work
    x, w = torch.randn(4, 64), torch.randn(8, 64)
    assert not gemv_cuda.usable(x, w, "relu")  # CPU tensors


def test_bad_input():
    x, w = torch.randn(4, 64), torch.randn(8, 64)
    with pytest.raises(ValueError, match="few-row CUDA GEMM"):
        gemv_cuda.forward(x, w, None, "relu", GemvConfig(2, 4))


@gpu
def test_bad_config():
    x, w = torch.randn(4, 8192, device="cuda"), torch.randn(8, 8192, device="cuda")
    for cfg in (GemvConfig(2, 4, 0), GemvConfig(2, 33), GemvConfig(0, 4)):
        with pytest.raises(ValueError, match="'cfg'"):
            gemv_cuda.forward(x, w, None, "relu", cfg)
    assert workspace.all_zero()


def test_row_chunks_offer_rule(monkeypatch):
    """With ``ROW_CHUNKS`` (the default) 17-64 rows are offered in chunks of 16: the same
    accumulator budget per lane as 16 rows, and the K split counts the chunks' CTAs."""
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", True)
    assert gemv_cuda.row_limit() == gemv_cuda.CHUNKED_MAX_ROWS == 64
    assert gemv_cuda.candidates(65, 1024, 1024, 132) == ()
    for m in (17, 32, 33, 64):
        cands = gemv_cuda.candidates(m, 1024, 1024, 132)
        assert cands and cands == gemv_cuda.candidates(m, 1024, 1024, 132)
        sixteen = gemv_cuda.candidates(16, 1024, 1024, 132)
        # the shapes of 16 rows but those whose chunked variant spills; splits no larger
        shapes = {(c.rows_per_warp, c.warps) for c in sixteen} - set(gemv_cuda._CHUNKED_SPILLS)
        assert {(c.rows_per_warp, c.warps) for c in cands} == shapes
        assert max(c.split_k for c in cands) <= max(c.split_k for c in sixteen)
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", False)
    assert gemv_cuda.candidates(32, 1024, 1024, 132) == () and gemv_cuda.row_limit() == 16


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_candidate_compiles_without_spills(tmp_path, monkeypatch):
    """Every variant the candidates use, row chunks (grid z) included, compiles offline
    without spills."""
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", True)
    variants = set()
    for m in (1, 3, 8, 16, 17, 64):
        mp = gemv_cuda.next_pow2(min(m, gemv_cuda.MAX_ROWS))
        for c in gemv_cuda.candidates(m, 4096, 4096, 132):
            variants.add((mp, c.rows_per_warp, c.warps, m > gemv_cuda.MAX_ROWS))
    assert any(v[3] for v in variants) and any(not v[3] for v in variants)
    for mp, npw, warps, chunked in sorted(variants):
        src = gemv_cuda.source(mp, npw, warps, 1, True, chunked)
        regs, spills = _ptxas(src, tmp_path, entry="tw_gemv")
        assert spills == 0, (mp, npw, warps, chunked, regs)


CHUNK_SHAPES = [((17, 1024), 1000), ((32, 128), 128), ((33, 4100), 97), ((2, 25, 256), 64)]


@gpu
@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize("cfg", [None, GemvConfig(1, 4), GemvConfig(4, 8, 3), GemvConfig(2, 8, 32)],
                         ids=repr)  # fmt: skip
def test_row_chunks_forward_backward(monkeypatch, activation, cfg, rng_seed):
    """17-64 rows in chunks of 16 (``ROW_CHUNKS``): a ragged last chunk, N off the column
    blocks, K splits with their per-chunk tickets; counters left zero."""
    monkeypatch.setattr(gemv_cuda, "ROW_CHUNKS", True)
    _forced_cases(monkeypatch, cfg, activation, CHUNK_SHAPES, rng_seed)
