"""Grouped conv2d, group width 8: fprop/dgrad/wgrad against fp64, every kernel size and config,
odd shapes, fallbacks, bad input, custom-op checks, torch.compile, nn drop-in and transform."""

from __future__ import annotations

import copy
import json
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from checks import ATOL, CPU_DTYPES, assert_three_way, leaf
from torch import nn

import tilewise
from tilewise.ops import gconv as ops
from tilewise.ops import gconv_wgrad
from tilewise.ops.gconv_config import GConvConfig, GConvProblem, WgradConfig, candidate_configs
from tilewise.runtime import alloc, dispatch, workspace

# R -> the S values paired with it, so every R and every S in 1..7 appears.
KERNELS = {1: [1, 4], 2: [3], 3: [3, 1], 4: [2], 5: [5, 7], 6: [1], 7: [7, 6]}
# Tests that launch kernels directly: the interpreter on CPU, the real thing on a GPU machine.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _no_search(monkeypatch):
    """Heuristic configs only (the GPU would otherwise time every candidate of every shape)."""
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")


def make_inputs(n, c, h, w, r, s, dtype, bias=True, device="cpu"):
    """channels_last x ~ N(0, 1), weight scaled like kaiming so outputs are O(1)."""
    x = torch.randn(n, c, h, w, device=device, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, 8, r, s, device=device, dtype=dtype) / (8 * r * s) ** 0.5
    b = torch.randn(c, device=device, dtype=dtype) if bias else None
    return x, wt, b


def run_case(x0, w0, b0, padding, dtype, seed, deterministic=True):
    """Forward + backward through tilewise, torch in ``dtype`` and torch in fp64; judge all."""
    groups = x0.shape[1] // 8
    grad = None
    outs = {}
    for name, dt in (("tw", dtype), ("torch", dtype), ("ref", torch.float64)):
        x, w = leaf(x0, dt), leaf(w0, dt)
        b = leaf(b0, dt) if b0 is not None else None
        if name == "tw":
            x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
            y = tilewise.grouped_conv2d(x, w, b, padding=padding, deterministic=deterministic)
            assert y.is_contiguous(memory_format=torch.channels_last)
        else:
            y = F.conv2d(x, w, b, padding=padding, groups=groups)
        if grad is None:
            grad = torch.randn(y.shape, device=y.device, dtype=dtype)
        y.backward(grad.to(dt))
        outs[name] = (y, x.grad, w.grad, b.grad if b is not None else None)
    n, _, p, q = outs["ref"][0].shape
    atol = ATOL[dtype]
    pixel_sum = max(1.0, (n * p * q) ** 0.5)  # dW and dbias sum over every output pixel
    for i, (what, scale) in enumerate((("y", 1), ("dx", 1), ("dw", pixel_sum), ("db", pixel_sum))):
        if outs["tw"][i] is None:
            continue
        tag = f"gconv {what} x{tuple(x0.shape)} w{tuple(w0.shape)} pad {padding} {dtype}"
        assert_three_way(
            outs["tw"][i], outs["torch"][i], outs["ref"][i], atol * scale, tag, seed, ulps=1
        )


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("r", sorted(KERNELS))
def test_all_passes_every_kernel_size_and_padding(r, dtype, rng_seed):
    """Every R and S in 1..7, every padding 0..R (past R - 1 the dgrad padding is negative)."""
    for pad_h in range(r + 1):
        s = KERNELS[r][pad_h % len(KERNELS[r])]
        pad_w = (pad_h + 1) % (s + 1)
        n, h, w = (2, 6, 5) if r * s <= 9 else (1, 5, 4)
        if h + 2 * pad_h < r or w + 2 * pad_w < s:
            continue
        x, wt, b = make_inputs(n, 16, h, w, r, s, dtype, bias=pad_h % 2 == 0)
        run_case(x, wt, b, (pad_h, pad_w), dtype, rng_seed)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize(
    "n,c,h,w,r,pad",
    [
        (1, 16, 1, 1, 3, 1),  # 1x1 image
        (3, 24, 7, 3, 3, 1),  # 3 groups: a channel block only partly used
        (1, 8, 6, 5, 5, 2),  # a single group
        (2, 32, 20, 19, 3, 0),
        (1, 16, 1, 9, 1, 0),
        (2, 16, 9, 1, 3, 1),
    ],
)
def test_odd_shapes(n, c, h, w, r, pad, dtype, rng_seed):
    x, wt, b = make_inputs(n, c, h, w, r, r, dtype)
    run_case(x, wt, b, pad, dtype, rng_seed)


def test_large_odd_image_49x33(rng_seed):
    x, wt, b = make_inputs(1, 16, 49, 33, 3, 3, torch.float16)
    run_case(x, wt, b, 1, torch.float16, rng_seed)


def test_every_fprop_config(rng_seed):
    """Each fprop/dgrad candidate (one kernel) on a small problem, poisoned outputs."""
    x, wt, b = make_inputs(1, 64, 6, 5, 3, 3, torch.float32, device=KERNEL_DEVICE)
    problem = GConvProblem.from_tensors(x, wt, b, 1, 1)
    configs = candidate_configs(problem, "fprop") + candidate_configs(problem, "dgrad", sms=2)
    assert {c.block_c for c in configs} == {16, 32, 64}
    ref = F.conv2d(x.double(), wt.double(), b.double(), padding=1, groups=8)
    same = F.conv2d(x, wt, b, padding=1, groups=8)
    for cfg in dict.fromkeys(configs):
        assert isinstance(cfg, GConvConfig) and cfg.block_m >= 16
        out = alloc.empty(1, 64, 6, 5, device=x.device, memory_format=torch.channels_last)
        ops.launch_fprop(x, wt, b, out, 1, 1, cfg)
        assert_three_way(out, same, ref, ATOL[torch.float32], f"fprop {cfg.name}", rng_seed)


@pytest.mark.parametrize("deterministic", [True, False])
def test_every_wgrad_config(deterministic, rng_seed):
    x, wt, _ = make_inputs(2, 64, 5, 6, 3, 3, torch.float32, bias=False, device=KERNEL_DEVICE)
    problem = GConvProblem.from_tensors(x, wt, torch.zeros(64), 1, 1)
    dy = torch.randn(2, 64, 5, 6, device=x.device).contiguous(memory_format=torch.channels_last)
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), padding=1, groups=8)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, padding=1, groups=8)
    db_ref = dy.double().sum((0, 2, 3))
    configs = list(
        dict.fromkeys(candidate_configs(problem, "wgrad") + candidate_configs(problem, "wgrad", 2))
    )
    if not deterministic:  # the atomic variant differs only in its epilogue: a few suffice
        configs = configs[::2]
    # the candidates cover these 60 pixels in one chunk; the multi-chunk reductions need more
    configs += [WgradConfig(16, 16, 1, 4, 1, 4), WgradConfig(16, 32, 2, 4, 1, 16)]
    assert any(cfg.block_m * cfg.chunk_steps < 2 * 5 * 6 for cfg in configs), "no multi-chunk"
    assert any(cfg.block_m * cfg.chunk_steps >= 2 * 5 * 6 for cfg in configs), "no single chunk"
    for cfg in configs:
        assert isinstance(cfg, WgradConfig)
        for _ in range(2):  # the one-launch mode must leave its workspace clean for the next
            dw, db = gconv_wgrad.launch_wgrad(dy, x, problem, cfg, True, deterministic)
            assert dw.shape == wt.shape and dw.is_contiguous() and dw.dtype == x.dtype
            assert_three_way(dw, same, ref, ATOL[torch.float32] * 8, f"wgrad {cfg.name}", rng_seed)
            assert_three_way(db, dy.sum((0, 2, 3)), db_ref, 1e-4, f"dbias {cfg.name}", rng_seed)
            if not deterministic:
                assert workspace.all_zero()


@pytest.mark.parametrize("deterministic", [True, False])
def test_wgrad_writes_a_channels_last_dw(deterministic, rng_seed):
    """With ``dw_cl`` every reduction mode (one chunk; several chunks by atomics or by the host's
    fixed-order sum) writes dw in a channels_last weight's layout, with the same values."""
    x, wt, _ = make_inputs(2, 16, 5, 6, 3, 2, torch.float32, bias=False, device=KERNEL_DEVICE)
    problem = GConvProblem.from_tensors(x, wt, torch.zeros(16), 1, 0)
    dy = torch.randn(2, 16, problem.p, problem.q, device=x.device)
    dy = dy.contiguous(memory_format=torch.channels_last)
    kw = {"padding": (1, 0), "groups": 2}
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), **kw)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, **kw)
    pixels = 2 * problem.p * problem.q
    for cfg in (WgradConfig(16, 16, 1, 4, 1, 4), WgradConfig(64, 16, 2, 4, 1, 16)):
        chunks = -(-pixels // (cfg.block_m * cfg.chunk_steps))
        dw, db = gconv_wgrad.launch_wgrad(dy, x, problem, cfg, True, deterministic, dw_cl=True)
        assert dw.shape == wt.shape and dw.is_contiguous(memory_format=torch.channels_last)
        assert not dw.is_contiguous()
        tag = f"wgrad channels_last dw {cfg.name} chunks {chunks}"
        assert_three_way(dw, same, ref, ATOL[torch.float32] * 8, tag, rng_seed)
        torch.testing.assert_close(db, dy.sum((0, 2, 3)), atol=1e-4, rtol=1e-4)
        if not deterministic:
            assert workspace.all_zero()


def test_channels_last_weight_grad_is_kept_by_autograd(rng_seed):
    """A channels_last weight (a model moved to channels_last) gets its gradient from the op in
    its own layout, so AccumulateGrad installs that tensor as ``.grad`` with no copy; the fake
    kernel promises the same strides (torch.compile); any other layout gets a contiguous one,
    which autograd lays out like the parameter."""
    x0, w0, _ = make_inputs(2, 16, 5, 4, 3, 3, torch.float32, bias=False)
    made = []  # (data_ptr, strides) of the op's dw: no reference, or autograd would copy it
    real_backward = ops.backward

    def spy(*args, **kwargs):
        out = real_backward(*args, **kwargs)
        made.append((out[1].data_ptr(), out[1].stride()))
        return out

    layouts = {
        "channels_last": w0.contiguous(memory_format=torch.channels_last),
        "contiguous": w0.clone(),
        "transposed": w0.transpose(2, 3).contiguous().transpose(2, 3),
    }
    for layout, w in layouts.items():
        x, w = leaf(x0), w.detach().requires_grad_()
        made.clear()
        with mock.patch.object(ops, "backward", spy):
            tilewise.grouped_conv2d(x, w, None, padding=1).square().sum().backward()
        (ptr, stride), = made  # fmt: skip
        cl = layout == "channels_last"
        want = torch.empty(
            w.shape, memory_format=torch.channels_last if cl else torch.contiguous_format
        )
        assert stride == want.stride(), layout
        assert w.grad.stride() == w.stride(), layout
        # the op's tensor itself, not a copy into the weight's layout (transposed: a copy)
        assert (w.grad.data_ptr() == ptr) is (layout != "transposed"), layout
        ref = torch.nn.grad.conv2d_weight(x0, w0.shape, 2 * F.conv2d(x0, w0, padding=1, groups=2),
                                          padding=1, groups=2)  # fmt: skip
        torch.testing.assert_close(w.grad, ref, atol=1e-4, rtol=1e-4)
        wd, gd = w.detach(), torch.empty(2, 16, 5, 4, memory_format=torch.channels_last)
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            g, fx, fw = (mode.from_tensor(t) for t in (gd, x0, wd))
            bwd = tilewise.functional._grouped_conv2d_backward_op
            _, fdw, _ = bwd(g, fx, fw, None, 1, 1, False, True, False, True)
        assert fdw.stride() == stride, layout


@pytest.mark.gpu
@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_wgrad_config_half_with_bias_grad(k, dtype, rng_seed):
    """Half precision takes the tensor-core dot: with the fused bias gradient and full tap blocks
    (5x5, 7x7) a per-step reduction once corrupted dw on the H100, and pipelined configs gave
    run-dependent wrong dw (hence every candidate, twice per mode)."""
    x, wt, _ = make_inputs(4, 64, 24, 20, k, k, dtype, bias=False, device="cuda")
    problem = GConvProblem.from_tensors(x, wt, torch.zeros(64, device="cuda"), k // 2, k // 2)
    dy = torch.randn(x.shape, device="cuda", dtype=dtype)
    dy = dy.contiguous(memory_format=torch.channels_last)
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), padding=k // 2, groups=8)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, padding=k // 2, groups=8)
    db_ref = dy.double().sum((0, 2, 3))
    atol = ATOL[dtype] * (4 * 24 * 20) ** 0.5
    # twice over: the pipelined configs failed in some runs only
    for det in (True, False, True, False):
        for cfg in gconv_wgrad.wgrad_candidates(problem, 132):
            dw, db = gconv_wgrad.launch_wgrad(dy, x, problem, cfg, True, det)
            tag = f"wgrad {cfg.name} det={det}"
            assert_three_way(dw, same, ref, atol, tag, rng_seed, ulps=1)
            assert workspace.all_zero(), f"{tag} left its workspace dirty"
            assert_three_way(db, dy.float().sum((0, 2, 3)), db_ref, 1e-3, f"db {tag}", rng_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("c,hw", [(64, 64), (128, 32), (256, 16)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_single_chunk_wgrad_batch1(c, hw, dtype, rng_seed):
    """Batch 1 of the issue's shapes: the single-chunk configs write dW in its final layout."""
    x, wt, _ = make_inputs(1, c, hw, hw, 3, 3, dtype, bias=False, device="cuda")
    problem = GConvProblem.from_tensors(x, wt, torch.zeros(c, device="cuda"), 1, 1)
    dy = torch.randn(x.shape, device="cuda", dtype=dtype)
    dy = dy.contiguous(memory_format=torch.channels_last)
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), padding=1, groups=c // 8)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, padding=1, groups=c // 8)
    db_ref = dy.double().sum((0, 2, 3))
    atol = ATOL[dtype] * hw
    direct = [
        cfg
        for cfg in gconv_wgrad.wgrad_candidates(problem, 132)
        if cfg.block_m * cfg.chunk_steps >= hw * hw
    ]
    assert direct, "no single-chunk candidate at batch 1"
    for cfg in direct:
        dw, db = gconv_wgrad.launch_wgrad(dy, x, problem, cfg, True, False)
        assert dw.dtype == dtype and dw.shape == wt.shape
        assert_three_way(dw, same, ref, atol, f"direct {cfg.name}", rng_seed, ulps=1)
        assert_three_way(db, dy.float().sum((0, 2, 3)), db_ref, 1e-3, f"db {cfg.name}", rng_seed)


def test_deterministic_and_atomic_wgrad_agree(rng_seed):
    x0, w0, b0 = make_inputs(2, 32, 7, 6, 3, 3, torch.float32)
    grads = []
    for det in (True, True, False):
        x, w, b = leaf(x0), leaf(w0), leaf(b0)
        y = tilewise.grouped_conv2d(x, w, b, padding=1, deterministic=det)
        y.backward(torch.ones_like(y))
        grads.append((w.grad, b.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    torch.testing.assert_close(grads[2][0], grads[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[2][1], grads[0][1])
    run_case(x0, w0, b0, 1, torch.float32, rng_seed, deterministic=False)


def test_mixed_precision_fp32_bias(rng_seed):
    x, w, _ = make_inputs(2, 16, 5, 5, 3, 3, torch.float16)
    b = torch.randn(16, requires_grad=True)
    y = tilewise.grouped_conv2d(x, w, b, padding=1)
    assert y.dtype == torch.float16
    y.backward(torch.ones_like(y))
    assert b.grad.dtype == torch.float32
    torch.testing.assert_close(b.grad, torch.full((16,), 50.0))
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1, groups=2)
    same = F.conv2d(x, w, b.half(), padding=1, groups=2)
    assert_three_way(y, same, ref, ATOL[torch.float16], "fp32 bias", rng_seed)


def test_kernel_path_is_taken_on_the_interpreter(monkeypatch):
    """CPU tests must exercise the kernels: the references are made to fail here."""
    if torch.cuda.is_available():
        pytest.skip("GPU runs do not use the interpreter")
    assert dispatch.INTERPRET

    def boom(*args, **kwargs):
        raise AssertionError("reference path taken")

    monkeypatch.setattr(ops, "reference", boom)
    monkeypatch.setattr(ops, "reference_backward", boom)
    x, w, b = (leaf(t) for t in make_inputs(1, 16, 4, 4, 3, 3, torch.float32))
    tilewise.grouped_conv2d(x, w, b, padding=1).sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


def test_grad_in_other_layouts(rng_seed):
    """Gradients arriving NCHW or expanded (from .sum()) give the same results."""
    x0, w0, b0 = make_inputs(2, 16, 5, 4, 3, 3, torch.float32)
    results = []
    for make_grad in (
        lambda y: torch.ones_like(y, memory_format=torch.channels_last),
        lambda y: torch.ones(y.shape),
        lambda y: torch.ones(()).expand(y.shape),
    ):
        x, w, b = leaf(x0), leaf(w0), leaf(b0)
        y = tilewise.grouped_conv2d(x, w, b, padding=1)
        y.backward(make_grad(y))
        results.append((x.grad, w.grad, b.grad))
    for other in results[1:]:
        for a, e in zip(other, results[0], strict=True):
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_inf_propagate_like_pytorch(value, rng_seed):
    """A NaN or Inf reaches exactly the outputs (and input gradients) PyTorch's does, and no
    other group: the kernel never multiplies one group's values by another group's zeros."""
    for cfg_c, dtype in ((16, torch.float32), (32, torch.float32), (32, torch.float16)):
        x, w, b = make_inputs(1, 32, 5, 6, 3, 3, dtype, device=KERNEL_DEVICE)
        x[0, 3, 2, 2] = value
        x[0, 20, 0, 5] = value
        cfg = GConvConfig(block_p=4, block_q=4, block_c=cfg_c)
        y = alloc.empty(
            1, 32, 5, 6, device=x.device, dtype=dtype, memory_format=torch.channels_last
        )
        ops.launch_fprop(x, w, b, y, 1, 1, cfg)
        ref = F.conv2d(x.double(), w.double(), b.double(), padding=1, groups=4)
        assert ref.isnan().any() or ref.isinf().any()
        tag = f"block_c={cfg_c} {dtype}"
        assert torch.equal(y.isnan(), ref.isnan()), f"NaN pattern, {tag}"
        assert torch.equal(y.isinf(), ref.isinf()), f"Inf pattern, {tag}"
        finite = torch.isfinite(ref)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(y[finite].double(), ref[finite], atol=tol, rtol=tol)
        same_sign = torch.sign(y[ref.isinf()]) == torch.sign(ref[ref.isinf()])
        assert same_sign.all()


# --- fallbacks and bad input --------------------------------------------------------------------

FALLBACKS = {
    "stride2": ((16, 8, 3, 3), dict(stride=2, padding=1), "stride"),
    "dilation2": ((16, 8, 3, 3), dict(dilation=2, padding=2), "dilation"),
    "nchw_input": ((16, 8, 3, 3), dict(padding=1), "channels_last"),
    "group_width4": ((16, 4, 3, 3), dict(padding=1), "group width 4"),
    "kernel9": ((16, 8, 9, 9), dict(padding=4), "kernel 9x9"),
    "cin_ne_cout": ((32, 8, 3, 3), dict(padding=1), "output channels"),
    "same_even_kernel": ((16, 8, 4, 4), dict(padding="same"), "asymmetric"),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_fallbacks_are_correct_and_logged_once(case, caplog, rng_seed):
    wshape, kwargs, words = FALLBACKS[case]
    x0 = torch.randn(2, 16, 7, 6)
    if case != "nchw_input":
        x0 = x0.contiguous(memory_format=torch.channels_last)
    w0 = torch.randn(wshape)
    b0 = torch.randn(wshape[0])
    groups = 16 // wshape[1]
    dispatch._log_once.cache_clear()
    with caplog.at_level("WARNING", logger="tilewise"):
        for _ in range(3):
            x, w, b = leaf(x0), leaf(w0), leaf(b0)
            y = tilewise.grouped_conv2d(x, w, b, **kwargs)
            y.backward(torch.ones_like(y))
    xr, wr, br = leaf(x0), leaf(w0), leaf(b0)
    ref = F.conv2d(xr, wr, br, groups=groups, **kwargs)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(y, ref)
    for got, exp in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        torch.testing.assert_close(got, exp)
    msgs = [r.getMessage() for r in caplog.records if "grouped_conv2d" in r.getMessage()]
    assert len(msgs) == 1 and words in msgs[0], msgs


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_non_contiguous_weight_takes_the_kernel(layout, caplog, rng_seed):
    """Weights of a model moved to channels_last (or any strides) still run the kernels."""
    x0 = torch.randn(2, 16, 7, 6).contiguous(memory_format=torch.channels_last)
    w0 = torch.randn(16, 8, 3, 3)
    w0 = (
        w0.contiguous(memory_format=torch.channels_last)
        if layout == "channels_last"
        else torch.randn(16, 8, 3, 3).transpose(2, 3)
    )
    assert not w0.is_contiguous()
    dispatch._log_once.cache_clear()
    with caplog.at_level("WARNING", logger="tilewise"):
        with mock.patch.object(ops, "launch_fprop", wraps=ops.launch_fprop) as launch:
            x, w = leaf(x0), leaf(w0)
            y = tilewise.grouped_conv2d(x, w, None, padding=1)
            y.backward(torch.ones_like(y))
    assert launch.call_count == 2  # fprop and dgrad
    assert not [r for r in caplog.records if "grouped_conv2d" in r.getMessage()]
    xr, wr = leaf(x0), leaf(w0)
    ref = F.conv2d(xr, wr, None, padding=1, groups=2)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad, wr.grad, atol=1e-3, rtol=1e-3)


def test_bad_input_names_the_argument():
    x = torch.randn(2, 16, 5, 5).contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3)
    cases = [
        ("'x'", (torch.randn(16, 25), w), {}),  # 2-D (3-D is F.conv2d's unbatched input)
        ("'weight'", (x, torch.randn(16, 8, 3)), {}),
        ("'weight'", (x, torch.randn(16, 6, 3, 3)), {}),  # 6 per group does not divide 16
        ("'weight'", (x, torch.randn(15, 8, 3, 3)), {}),  # 15 outputs for 2 groups
        ("'groups'", (x, w), {"groups": 4}),
        ("'bias'", (x, w, torch.randn(15)), {}),
        ("'bias'", (x, w, torch.randn(16, dtype=torch.float64)), {}),
        ("'weight'", (x, w.half()), {}),
        ("'weight'", (x, torch.randn(16, 8, 3, 3, device="meta")), {}),
        ("'padding'", (x, w), {"padding": -1}),
        ("'padding'", (x, w), {"padding": "full"}),
        ("'stride'", (x, w), {"stride": "2"}),
    ]
    for name, args, kwargs in cases:
        with pytest.raises(ValueError, match=name):
            tilewise.grouped_conv2d(*args, **kwargs)
    # 12 output channels with 2 groups is a valid F.conv2d: it falls back instead of raising
    torch.testing.assert_close(
        tilewise.grouped_conv2d(x, torch.randn(12, 8, 3, 3).mul_(0)), torch.zeros(2, 12, 3, 3)
    )
    # The custom op checks the group-width-8 contract itself.
    op = tilewise.functional._grouped_conv2d_op
    with pytest.raises(ValueError, match="'x'"):
        op(torch.randn(1, 12, 4, 4), torch.randn(12, 8, 3, 3), None, 1, 1, True)
    with pytest.raises(ValueError, match="'weight'"):
        op(x, torch.randn(16, 4, 3, 3), None, 1, 1, True)
    with pytest.raises(ValueError, match="'x'"):  # output would be empty
        op(torch.randn(1, 16, 2, 2), torch.randn(16, 8, 5, 5), None, 0, 0, True)
    with pytest.raises(ValueError, match="'grad'"):
        ops.backward(torch.randn(2, 16, 4, 4), x, w, None, 1, 1)


# --- custom ops, compile, autocast --------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck(device):
    x, w, b = make_inputs(2, 16, 5, 4, 3, 3, torch.float32, device=device)
    x, w, b = leaf(x), leaf(w), leaf(b)
    fwd = tilewise.functional._grouped_conv2d_op
    bwd = tilewise.functional._grouped_conv2d_backward_op
    torch.library.opcheck(fwd, (x, w, b, 1, 1, True))
    torch.library.opcheck(fwd, (x, w, None, 0, 2, False))
    g = torch.randn(2, 16, 5, 4, device=device).contiguous(memory_format=torch.channels_last)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    torch.library.opcheck(bwd, (g, xd, wd, bd, 1, 1, True, True, True, True))
    torch.library.opcheck(bwd, (g, xd, wd, None, 1, 1, False, True, False, False))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last"])
def test_torch_compile_fullgraph(device, weight_layout, rng_seed):
    """fullgraph compiles; a channels_last weight's gradient keeps its layout (the fake kernel
    promises the strides the real one returns)."""
    backend = "inductor" if device == "cuda" else "aot_eager"  # CPU: no C++ build in CI

    def f(x, w, b):
        y = tilewise.grouped_conv2d(x * 2.0, w, b, padding=1)
        return (F.silu(y) ** 2).sum()

    x, w, b = make_inputs(2, 16, 5, 6, 3, 3, torch.float32, device=device)
    if weight_layout == "channels_last":
        w = w.contiguous(memory_format=torch.channels_last)
    x, w, b = (leaf(t) for t in (x, w, b))
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    out = compiled(x, w, b)
    out.backward()
    got = [t.grad.clone() for t in (x, w, b)]
    assert w.grad.stride() == w.stride()
    x.grad = w.grad = b.grad = None
    expect = f(x, w, b)
    expect.backward()
    torch.testing.assert_close(out, expect)
    for g, t in zip(got, (x, w, b), strict=True):
        # inductor's fused silu backward rounds the upstream gradient differently from eager
        torch.testing.assert_close(g, t.grad, atol=1e-4, rtol=1e-4)


def _autocast_case(device, dtype, seed):
    x, w, b = make_inputs(2, 16, 5, 5, 3, 3, torch.float32, device=device)
    with torch.autocast(device, dtype=dtype):
        y = tilewise.grouped_conv2d(x, w, b, padding=1)
        same = F.conv2d(x, w, b, padding=1, groups=2)
    assert y.dtype == same.dtype == dtype
    ref = F.conv2d(
        x.to(dtype).double(), w.to(dtype).double(), b.to(dtype).double(), padding=1, groups=2
    )
    assert_three_way(y, same, ref, ATOL[dtype], f"autocast {dtype}", seed)


def test_autocast_cpu(rng_seed):
    _autocast_case("cpu", torch.float16, rng_seed)


# --- nn drop-in and transform -------------------------------------------------------------------


def test_module_drop_in_shares_parameters(rng_seed):
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    mod = tilewise.nn.GroupedConv2d.from_conv(conv)
    assert mod.weight is conv.weight and mod.bias is conv.bias
    assert list(mod.state_dict()) == list(conv.state_dict())
    assert mod.unsupported_reason() is None
    x = torch.randn(2, 16, 6, 5).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(mod(x), conv(x), rtol=1e-5, atol=1e-5)
    mod(x).sum().backward()
    assert conv.weight.grad is not None and conv.bias.grad is not None  # one set of parameters
    # An NCHW input or a non-zero padding mode runs nn.Conv2d's forward.
    torch.testing.assert_close(mod(x.contiguous()), conv(x.contiguous()))
    refl = tilewise.nn.GroupedConv2d(16, 16, 3, padding=1, groups=2, padding_mode="reflect")
    assert "padding_mode" in refl.unsupported_reason()
    torch.testing.assert_close(refl(x), nn.Conv2d.forward(refl, x))
    direct = tilewise.nn.GroupedConv2d(16, 16, 5, padding=2, groups=2, bias=False)
    expect = F.conv2d(x, direct.weight, None, padding=2, groups=2)
    torch.testing.assert_close(direct(x), expect, rtol=1e-5, atol=1e-5)


class _SubConv(nn.Conv2d):
    pass


def _mixed_model() -> nn.Sequential:
    mid = nn.Conv2d(32, 32, 5, padding=2, groups=4, bias=False)
    block = nn.Sequential(
        nn.Conv2d(32, 32, 3, padding=1, groups=8),  # group width 4
        nn.Conv2d(32, 32, 3, padding="same", groups=4),  # eligible
        mid,  # the same module again: stays shared
    )
    return nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, groups=2),  # 0 eligible
        nn.BatchNorm2d(16),
        nn.Conv2d(16, 32, 1),  # 2 C_in != C_out
        nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=4),  # 3 stride
        mid,  # 4 eligible
        block,  # 5
        nn.Conv2d(32, 32, 9, padding=4, groups=4),  # 6 kernel 9x9
        _SubConv(32, 32, 3, padding=1, groups=4),  # 7 a subclass
    )


def test_transform_mixed_model(rng_seed):
    model = _mixed_model().eval()
    original = copy.deepcopy(model)
    x = torch.randn(2, 16, 8, 7).contiguous(memory_format=torch.channels_last)
    report = tilewise.transform(model)
    assert report.model is model
    assert [n for n, _ in report.swapped] == ["0", "4", "5.1"]
    left = dict(report.left)
    assert sorted(left) == ["2", "3", "5.0", "6", "7"]
    for name, words in (("2", "output channels"), ("3", "stride"), ("5.0", "group width 4")):
        assert words in left[name], left
    assert "9x9" in left["6"] and "subclasses" in left["7"]
    assert type(model[0]) is tilewise.nn.GroupedConv2d and model[4] is model[5][2]
    text = str(report)
    assert "3 swapped, 5 left" in text and "swapped 5.1" in text and "left    3" in text
    torch.testing.assert_close(model(x), original(x), rtol=1e-4, atol=1e-4)
    # Not in place: the input model is untouched.
    fresh = _mixed_model()
    report2 = tilewise.transform(fresh, inplace=False)
    assert type(fresh[0]) is nn.Conv2d and type(report2.model[0]) is tilewise.nn.GroupedConv2d
    # In place shares the Parameter objects.
    plain = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))
    weight = plain[0].weight
    tilewise.transform(plain)
    assert plain[0].weight is weight


# --- training: a ConvFirst-like network, tilewise vs PyTorch from identical init and data -------


class ConvFirstBlock(nn.Module):
    """grouped kxk conv -> BN -> 1x1 expand -> SiLU -> 1x1 project, plus residual."""

    def __init__(self, c: int, k: int = 3, expand: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, k, padding=k // 2, groups=c // 8, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.expand = nn.Conv2d(c, c * expand, 1)
        self.act = nn.SiLU()
        self.project = nn.Conv2d(c * expand, c, 1)

    def forward(self, x):
        return x + self.project(self.act(self.expand(self.bn(self.conv(x)))))


def _convfirst_net(c: int, blocks: int, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1),
        *[ConvFirstBlock(c) for _ in range(blocks)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(c, classes),
    )


def train_losses(model, batches, autocast_dtype=None) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, label in batches:
        device = x.device.type
        with torch.autocast(
            device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
        ):
            loss = F.cross_entropy(model(x), label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def compare_training(c, blocks, hw, batch, steps, device, autocast_dtype, tol):
    torch.manual_seed(1234)
    ref_model = _convfirst_net(c, blocks).to(device).to(memory_format=torch.channels_last)
    tw_model = copy.deepcopy(ref_model)
    report = tilewise.transform(tw_model)
    assert len(report.swapped) == blocks, str(report)
    gen = torch.Generator().manual_seed(99)
    teacher = torch.randn(3, 10, generator=gen)
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, 3, hw, hw, generator=gen)
        label = (x.mean((2, 3)) @ teacher).argmax(1)
        x = x.to(device).contiguous(memory_format=torch.channels_last)
        batches.append((x, label.to(device)))
    ref = train_losses(ref_model, batches, autocast_dtype)
    # the model is channels_last, weights too: the kernels must still run (no silent fallback);
    # fprop and dgrad go through one launcher, whether the Triton or an NVRTC kernel was chosen
    with mock.patch.object(ops, "_launch", wraps=ops._launch) as launch:
        got = train_losses(tw_model, batches, autocast_dtype)
    assert launch.call_count >= 2 * blocks * steps, "tilewise kernels did not run"
    diffs = [abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, ref, strict=True)]
    assert max(diffs) <= tol, f"loss curves diverge: max rel diff {max(diffs):.2e}"
    assert ref[-1] < ref[0], "the reference run did not learn; the comparison says little"
    return got, ref


def test_training_tiny_cpu():
    compare_training(16, 2, 6, 4, 20, "cpu", None, 1e-4)


def test_problem_bytes_flops_and_configs():
    p = GConvProblem(n=2, c=16, h=6, w=5, r=3, s=3, pad_h=1, pad_w=0, dtype="fp16", has_bias=True)
    assert (p.p, p.q, p.groups) == (6, 3, 2)
    inp, out, wgt = 2 * 16 * 6 * 5 * 2, 2 * 16 * 6 * 3 * 2, 16 * 8 * 9 * 2
    assert p.bytes("fprop") == inp + wgt + 16 * 2 + out
    assert p.bytes("dgrad") == p.bytes("wgrad") == out + wgt + inp
    assert p.flops("wgrad") == p.flops("fprop") == 2 * 2 * 6 * 3 * 16 * 8 * 9
    with pytest.raises(ValueError, match="'pass_'"):
        p.bytes("bwd")
    for pass_ in ("fprop", "dgrad", "wgrad"):
        for sms in (2, 132):
            cands = candidate_configs(p, pass_, sms)
            assert len(cands) == len(set(cands)) >= 1
            assert all(c.block_c in (16, 32, 64) for c in cands)
            assert all(c.block_m >= 16 for c in cands)
    assert GConvConfig(4, 8, 32).name == "p4q8c32w4s3"


def test_autotune_timing_mode_by_size(monkeypatch):
    """Small passes are timed warm and cold (the smaller worst-case loss wins); large ones warm,
    or cold from ``COLD_L2_MULTIPLE`` x the L2 size when that is switched on; no L2 (the CPU):
    warm."""
    from tilewise.ops import gconv_config

    big = GConvProblem(n=128, c=64, h=64, w=64, r=3, s=3, pad_h=1, pad_w=1)  # 134 MB
    mid = GConvProblem(n=8, c=64, h=64, w=64, r=3, s=3, pad_h=1, pad_w=1)  # 8.4 MB
    tiny = GConvProblem(n=1, c=256, h=16, w=16, r=3, s=3, pad_h=1, pad_w=1)  # 0.3 MB
    l2 = 50 << 20
    for pass_ in ("fprop", "dgrad", "wgrad"):
        assert gconv_config.timing_mode(tiny, pass_, l2) == (True, True)
        assert gconv_config.timing_mode(mid, pass_, l2) == (False, False)
        assert gconv_config.timing_mode(big, pass_, l2) == (False, False)  # cold is off
        assert gconv_config.timing_mode(tiny, pass_, 0) == (False, False)
    monkeypatch.setattr(gconv_config, "COLD_L2_MULTIPLE", 1.0)
    assert gconv_config.timing_mode(big, "fprop", l2) == (True, False)
    assert gconv_config.timing_mode(mid, "fprop", l2) == (False, False)


# --- the GPU: full-size shapes, bf16, autocast, real autotuning, 200 training steps -------------

GPU_SHAPES = [
    (8, 64, 64, 64, 3),
    (8, 128, 32, 32, 3),
    (16, 256, 16, 16, 3),
    (4, 64, 64, 64, 5),
    (4, 128, 32, 32, 7),
    (3, 64, 49, 33, 3),
]


@pytest.mark.gpu
class TestGPU:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "n{}c{}_{}x{}_k{}".format(*s))
    def test_full_size(self, shape, dtype, rng_seed):
        n, c, h, w, k = shape
        for bias, deterministic in ((True, True), (False, False)):
            x, wt, b = make_inputs(n, c, h, w, k, k, dtype, bias=bias, device="cuda")
            run_case(x, wt, b, k // 2, dtype, rng_seed, deterministic=deterministic)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
    def test_autocast(self, dtype, rng_seed):
        _autocast_case("cuda", dtype, rng_seed)

    def test_autotune_searches_once_then_hits_the_cache(self, tmp_path, monkeypatch):
        from tilewise.runtime import autotune

        monkeypatch.setenv("TILEWISE_AUTOTUNE", "1")
        monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
        autotune.clear_memory_cache()
        x, w, b = (leaf(t) for t in make_inputs(2, 32, 16, 16, 3, 3, torch.float16, device="cuda"))
        tilewise.grouped_conv2d(x, w, b, padding=1).sum().backward()
        entries = autotune._read(autotune.cache_path())
        ops_seen = sorted(json.loads(k)["op"] for k in entries)
        assert len(ops_seen) == 3 and any("wgrad" in o for o in ops_seen), ops_seen
        autotune.clear_memory_cache()  # a "second process": it must not time anything

        def no_timing(fn):
            raise AssertionError("timed again despite the cache")

        monkeypatch.setattr(autotune, "_bench", no_timing)
        y = tilewise.grouped_conv2d(x, w, b, padding=1)
        torch.testing.assert_close(y, F.conv2d(x, w, b, padding=1, groups=4), atol=2e-3, rtol=2e-3)
        y.sum().backward()
        autotune.clear_memory_cache()

    @pytest.mark.parametrize(
        "autocast_dtype,tol", [(None, 2e-3), (torch.float16, 5e-2)], ids=["fp32", "amp_fp16"]
    )
    def test_training_convfirst_200_steps(self, autocast_dtype, tol, monkeypatch):
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
        compare_training(64, 3, 16, 32, 200, "cuda", autocast_dtype, tol)
