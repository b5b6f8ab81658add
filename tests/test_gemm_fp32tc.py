"""The fp32-accurate tensor-core batched GEMM (``ops.gemm_fp32tc``, 3xTF32): every config on odd
shapes through the interpreter (which computes in plain fp32), and on the GPU against fp64 by the
three-way rule, its RMS error against cuBLAS's (TF32 off), Inf/NaN propagation and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from checks import ATOL, allow_tf32, assert_three_way

from tilewise.ops import gemm_fp32tc as tc
from tilewise.ops import strassen
from tilewise.runtime import dispatch

CONFIG_IDS = [f"{c.block_m}x{c.block_n}x{c.block_k}-w{c.num_warps}" for c in tc.CONFIGS]


def _operands(batch, m, k, n, device, kmajor=True):
    a = torch.randn(batch, m, k, device=device)
    if kmajor:  # K fastest, as Strassen's "nt" blocks: a transposed view of contiguous [B, N, K]
        return a, torch.randn(batch, n, k, device=device).transpose(1, 2)
    return a, torch.randn(batch, k, n, device=device)


INTERPRETER = pytest.mark.skipif(
    not dispatch.INTERPRET, reason="CPU kernels need the Triton interpreter"
)


@INTERPRETER
@pytest.mark.parametrize("cfg", tc.CONFIGS, ids=CONFIG_IDS)
def test_every_config_on_odd_shapes(cfg):
    for batch, m, k, n, kmajor in ((3, 5, 7, 9, True), (1, 17, 33, 1, False), (2, 1, 1, 18, True)):
        a, b = _operands(batch, m, k, n, "cpu", kmajor)
        out = torch.full((batch, m, n), float("nan"))
        assert tc.bmm(a, b, out, cfg) is out
        want = torch.bmm(a.double(), b.double()).float()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@INTERPRETER
def test_empty_and_zero_depth():
    cfg = tc.CONFIGS[0]
    out = torch.full((2, 3, 4), float("nan"))
    tc.bmm(torch.randn(2, 3, 0), torch.randn(2, 0, 4), out, cfg)
    assert torch.equal(out, torch.zeros(2, 3, 4))
    empty = torch.empty(0, 3, 4)
    assert tc.bmm(torch.randn(0, 3, 5), torch.randn(0, 5, 4), empty, cfg) is empty


def test_bad_input_names_the_argument():
    cfg = tc.CONFIGS[0]
    a, b, out = torch.randn(2, 3, 5), torch.randn(2, 5, 4), torch.empty(2, 3, 4)
    with pytest.raises(ValueError, match="'a'"):
        tc.bmm(a.half(), b, out, cfg)
    with pytest.raises(ValueError, match="'out'"):
        tc.bmm(a, b, out[0], cfg)
    with pytest.raises(ValueError, match="do not make a batched product"):
        tc.bmm(a, b[:, :4], out, cfg)
    with pytest.raises(ValueError, match="share one device"):
        tc.bmm(a, b.to("meta"), out, cfg)
    big = torch.empty(tc.MAX_BATCH + 1, 1, 1)
    with pytest.raises(ValueError, match="at most 65535"):
        tc.bmm(big, big, big.clone(), cfg)


def test_offered_only_for_fp32_with_tf32_off(monkeypatch):
    monkeypatch.delenv(tc.ENV_FP32_TC, raising=False)
    with allow_tf32(False):
        assert strassen.fp32_tc_offered(torch.float32)
        assert not strassen.fp32_tc_offered(torch.float16)
        assert strassen.chain_problem(512, [4096, 4096], torch.float32).fp32_tc
        monkeypatch.setenv(tc.ENV_FP32_TC, "0")
        assert not strassen.fp32_tc_offered(torch.float32)
        assert not strassen.chain_problem(512, [4096, 4096], torch.float32).fp32_tc
        monkeypatch.delenv(tc.ENV_FP32_TC)
    with allow_tf32(True):  # TF32 on: cuBLAS's TF32 GEMM is what was asked for, and faster
        assert not strassen.fp32_tc_offered(torch.float32)
    monkeypatch.setattr(tc, "_triton_version", lambda: (3, 5))  # older than the checked one
    with allow_tf32(False):
        assert not strassen.fp32_tc_offered(torch.float32)


def _rms(x):
    return x.double().square().mean().sqrt().item()


@pytest.mark.gpu
@pytest.mark.parametrize("kmajor", [True, False], ids=["b-k-fastest", "b-n-fastest"])
@pytest.mark.parametrize("cfg", tc.CONFIGS, ids=CONFIG_IDS)
def test_gpu_three_way_and_as_accurate_as_cublas(cfg, kmajor):
    """Against fp64 by the three-way rule (PyTorch's fp32 bmm, TF32 off, as the same-dtype
    result), and an RMS error no larger than cuBLAS's: the claim that makes it an fp32 GEMM.
    B both ways: Strassen's "nt" blocks (the fast layout) and "nn" ones (weights formatted while
    TF32 was on, then run with it off)."""
    for batch, m, k, n in ((7, 256, 2048, 2048), (3, 129, 1000, 257), (2, 1, 4097, 33)):
        a, b = _operands(batch, m, k, n, "cuda", kmajor)
        out = torch.full((batch, m, n), float("nan"), device="cuda")
        tc.bmm(a, b, out, cfg)
        ref = torch.bmm(a.double(), b.double())
        with allow_tf32(False):
            cublas = torch.bmm(a, b)
        atol = ATOL[torch.float32] * k**0.5 * _rms(ref)
        assert_three_way(out, cublas, ref, atol, f"fp32_tc {cfg} {batch}x{m}x{k}x{n}")
        if out.numel() >= 4096:  # an RMS over enough outputs to compare
            assert _rms(out.double() - ref) <= _rms(cublas.double() - ref), (batch, m, k, n)


@pytest.mark.gpu
def test_gpu_inf_and_nan_propagate_as_in_cublas():
    """An Inf input gives the Inf an IEEE GEMM gives (the split's Inf - Inf tails are zeroed, not
    NaN), and a NaN its NaNs, where PyTorch's fp32 bmm puts them."""
    a = torch.randn(2, 64, 96, device="cuda")
    b = torch.rand(2, 96, 80, device="cuda") + 0.5  # positive: an Inf row stays +Inf
    a[0, 3, 10] = float("inf")
    a[1, 7, 20] = float("nan")
    b[1, 5, 11] = float("-inf")
    with allow_tf32(False):
        want = torch.bmm(a, b)
    for cfg in tc.CONFIGS:
        out = torch.full((2, 64, 80), float("nan"), device="cuda")
        tc.bmm(a, b, out, cfg)
        assert torch.equal(torch.isnan(out), torch.isnan(want)), cfg
        assert torch.equal(torch.isinf(out), torch.isinf(want)), cfg
        inf = torch.isinf(want)
        assert torch.equal(out[inf], want[inf]), cfg


@pytest.mark.gpu
def test_gpu_in_a_cuda_graph():
    """Launches on the current stream: a captured graph replays it on fresh inputs."""
    a, b = _operands(7, 96, 130, 70, "cuda")
    out = torch.full((7, 96, 70), float("nan"), device="cuda")
    cfg = tc.CONFIGS[0]
    tc.bmm(a, b, out, cfg)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tc.bmm(a, b, out, cfg)
    for _ in range(2):
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))
        graph.replay()
        want = torch.bmm(a.double(), b.double()).float()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)
