"""cuDNN as an autotune candidate of the grouped conv (``ops.gconv_library``): each pass through
the library path against fp64 by the three-way rule, output layouts, when it is offered, and the
autotune keys that keep its picks apart."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checks import ATOL, assert_three_way

from tilewise.ops import gconv as ops
from tilewise.ops import gconv_library as lib
from tilewise.ops import gconv_wgrad
from tilewise.ops.gconv_config import GConvProblem

DEVICE_DTYPES = [
    ("cpu", torch.float32),
    pytest.param("cuda", torch.float16, marks=pytest.mark.gpu),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu),
]


def _inputs(n, c, h, w, r, s, dtype, device, weight_layout):
    x = torch.randn(n, c, h, w, device=device, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c, 8, r, s, device=device, dtype=dtype) / (8 * r * s) ** 0.5
    if weight_layout == "channels_last":
        wt = wt.contiguous(memory_format=torch.channels_last)
    b = torch.randn(c, device=device, dtype=dtype)
    return x, wt, b


def _poisoned_out(like: torch.Tensor, shape) -> torch.Tensor:
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    out = out.contiguous(memory_format=torch.channels_last)
    return out.fill_(float("nan"))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [(2, 16, 7, 5, 3, 3, 1, 1), (1, 8, 1, 1, 7, 7, 3, 3)])
def test_fprop_and_dgrad_through_the_library(device, dtype, weight_layout, shape, rng_seed):
    n, c, h, w, r, s, ph, pw = shape
    x, wt, b = _inputs(n, c, h, w, r, s, dtype, device, weight_layout)
    g = c // 8
    p, q = ops.output_size(h, w, r, s, ph, pw)
    y = ops._launch(x, wt, b, _poisoned_out(x, (n, c, p, q)), ph, pw, lib.CUDNN, False)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == (n, c, p, q)
    ref = F.conv2d(x.double(), wt.double(), b.double(), padding=(ph, pw), groups=g)
    same = F.conv2d(x, wt, b, padding=(ph, pw), groups=g)
    assert_three_way(y, same, ref, ATOL[dtype], "fprop", rng_seed)

    dy = torch.randn(n, c, p, q, device=device, dtype=dtype)
    dy = dy.contiguous(memory_format=torch.channels_last)
    dx_buf = _poisoned_out(x, x.shape)
    dx = ops._launch(dy, wt, None, dx_buf, r - 1 - ph, s - 1 - pw, lib.CUDNN, True)
    assert dx.stride() == dx_buf.stride() and dx.shape == x.shape
    kw = {"padding": (ph, pw), "groups": g}
    ref_dx = torch.nn.grad.conv2d_input(x.shape, wt.double(), dy.double(), **kw)
    same_dx = torch.nn.grad.conv2d_input(x.shape, wt, dy, **kw)
    assert_three_way(dx, same_dx, ref_dx, ATOL[dtype], "dgrad", rng_seed)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("need_db", [False, True])
@pytest.mark.parametrize("db_dtype", ["x", "fp32"])
@pytest.mark.parametrize("dw_cl", [False, True], ids=["dw-contiguous", "dw-channels-last"])
def test_wgrad_through_the_library(device, dtype, need_db, db_dtype, dw_cl, rng_seed):
    n, c, h, w, r, s, ph, pw = 3, 16, 6, 5, 5, 3, 2, 0
    x, wt, _ = _inputs(n, c, h, w, r, s, dtype, device, "contiguous")
    problem = GConvProblem.from_tensors(x, wt, None, ph, pw)
    dy = torch.randn(n, c, problem.p, problem.q, device=device, dtype=dtype)
    dy = dy.contiguous(memory_format=torch.channels_last)
    want_db = dtype if db_dtype == "x" else torch.float32
    dw, db = gconv_wgrad._launch(dy, x, problem, lib.CUDNN, need_db, False, want_db, dw_cl)
    fmt = torch.channels_last if dw_cl else torch.contiguous_format
    assert dw.shape == (c, 8, r, s) and dw.is_contiguous(memory_format=fmt) and dw.dtype == dtype
    kw = {"padding": (ph, pw), "groups": c // 8}
    ref = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), **kw)
    same = torch.nn.grad.conv2d_weight(x, wt.shape, dy, **kw)
    assert_three_way(dw, same, ref, ATOL[dtype], "wgrad", rng_seed)
    if not need_db:
        assert db is None
        return
    assert db.shape == (c,) and db.dtype in (dtype, torch.float32)
    ref_db = dy.double().sum((0, 2, 3))
    same_db = dy.sum((0, 2, 3))
    assert_three_way(db, same_db, ref_db, ATOL[dtype] * n * problem.p * problem.q, "db", rng_seed)
    if want_db == torch.float32:
        assert db.dtype == torch.float32


def test_offered_only_for_half_cuda_without_determinism(monkeypatch):
    cpu_half = torch.empty(1, 8, 2, 2, dtype=torch.float16)
    assert not lib.offered(cpu_half), "CPU tensors run the reference, never the candidate"
    if torch.cuda.is_available():
        half = cpu_half.cuda()
        assert lib.offered(half) == torch.backends.cudnn.is_available()
        assert not lib.offered(half, deterministic=True)
        assert not lib.offered(half.float())
        monkeypatch.setenv(lib.ENV, "0")
        assert not lib.offered(half)
    monkeypatch.setenv(lib.ENV, "0")
    assert not lib.enabled()
    monkeypatch.setenv(lib.ENV, "1")
    assert lib.enabled()


def _pick_library(monkeypatch, seen: list):
    """cuDNN offered as on a GPU, and an autotuner that records each candidate list and picks
    cuDNN where offered (on the CPU nothing is timed: the heuristic default would run)."""
    from tilewise.runtime import autotune

    monkeypatch.setattr(lib, "offered", lambda x, deterministic=False: not deterministic)

    def choose(op, problem, candidates, run_fn, **kw):
        seen.append((op, tuple(candidates)))
        return lib.CUDNN if lib.CUDNN in candidates else kw["default"]

    monkeypatch.setattr(autotune, "choose_config", choose)


@pytest.mark.parametrize("deterministic", [False, True])
def test_every_pass_takes_the_library_when_chosen(deterministic, monkeypatch, rng_seed):
    """Through ``gconv.forward`` / ``gconv.backward`` (the op's paths, the kernels on the
    interpreter): fprop, dgrad and wgrad each offer cuDNN and run it where it is chosen, except
    a deterministic backward's; results by the three-way rule, layouts as the op's fakes."""
    seen: list = []
    _pick_library(monkeypatch, seen)
    n, c, h, w, r, s, ph, pw = 2, 16, 7, 6, 3, 5, 1, 2
    x, wt, b = _inputs(n, c, h, w, r, s, torch.float32, "cpu", "channels_last")
    y = ops.forward(x, wt, b, ph, pw)
    g = c // 8
    ref = F.conv2d(x.double(), wt.double(), b.double(), padding=(ph, pw), groups=g)
    assert_three_way(y, F.conv2d(x, wt, b, padding=(ph, pw), groups=g), ref, 1e-5, "y", rng_seed)
    assert y.is_contiguous(memory_format=torch.channels_last)
    dy = torch.randn(y.shape).contiguous(memory_format=torch.channels_last)
    dx, dw, db = ops.backward(dy, x, wt, b, ph, pw, (True, True, True), deterministic)
    kw = {"padding": (ph, pw), "groups": g}
    ref_dx = torch.nn.grad.conv2d_input(x.shape, wt.double(), dy.double(), **kw)
    same_dx = torch.nn.grad.conv2d_input(x.shape, wt, dy, **kw)
    assert_three_way(dx, same_dx, ref_dx, 1e-5, "dx", rng_seed)
    ref_dw = torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), **kw)
    same_dw = torch.nn.grad.conv2d_weight(x, wt.shape, dy, **kw)
    assert_three_way(dw, same_dw, ref_dw, 1e-5, "dw", rng_seed)
    torch.testing.assert_close(db, dy.sum((0, 2, 3)))
    # dw in the weight's layout (channels_last here), as the fake kernel promises
    assert dw.stride() == ops.empty_weight_grad(wt, wt.dtype).stride()
    assert dx.is_contiguous(memory_format=torch.channels_last)
    offered = {op.split("@")[0]: lib.CUDNN in cands for op, cands in seen}
    fprop = [k for k in offered if k.endswith(".fprop+cudnn.wcl")]
    assert fprop and offered[fprop[0]], offered
    dgrad = [k for k in offered if ".dgrad" in k]
    wgrad = [k for k in offered if ".wgrad" in k]
    assert len(dgrad) == len(wgrad) == 1, offered
    assert offered[dgrad[0]] is (not deterministic) and offered[wgrad[0]] is (not deterministic)
    assert ("+cudnn" in dgrad[0]) is (not deterministic)


def test_no_library_for_an_fp32_bias_on_half_inputs(monkeypatch):
    """cuDNN would add the bias rounded to half; tilewise's kernels add it in fp32."""
    seen: list = []
    _pick_library(monkeypatch, seen)
    x, wt, _ = _inputs(1, 8, 5, 5, 3, 3, torch.float16, "cpu", "contiguous")
    ops.forward(x, wt, torch.randn(8), 1, 1)
    assert seen and not any(lib.CUDNN in cands for _, cands in seen)


def test_candidates_and_keys(monkeypatch):
    prob = GConvProblem(4, 64, 16, 16, 7, 7, 3, 3)
    without = ops._candidates(prob, "fprop", 132, 0, False)
    with_lib = ops._candidates(prob, "fprop", 132, 0, True)
    assert with_lib == without + (lib.CUDNN,) and lib.CUDNN not in without
    assert gconv_wgrad._candidates(prob, 132, False, False, True)[-1] == lib.CUDNN
    assert lib.CUDNN not in gconv_wgrad._candidates(prob, 132, False, False, False)
    w = torch.empty(64, 8, 7, 7)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert lib.cache_tag(w, False) == ""  # no cuDNN in the choice: no tag
    assert lib.cache_tag(w, True) == lib.cache_tag(None, True) == "+cudnn"
    assert lib.cache_tag(w.contiguous(memory_format=torch.channels_last), True) == "+cudnn.wcl"
    assert lib.cache_tag(torch.empty(64, 8, 1, 1), True) == "+cudnn"  # both layouts at once
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    assert lib.cache_tag(w, True) == "+cudnn.bm"  # cuDNN's own timing picks its algorithm
    assert lib.CUDNN.name == "cudnn"
