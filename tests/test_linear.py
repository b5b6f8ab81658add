"""Fused linear + bias + activation: forward and all gradients against fp64, strides, bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from checks import ATOL, DEVICE_DTYPES, allow_tf32, assert_three_way, leaf

import tilewise
from tilewise.ops import linear as ops
from tilewise.runtime import dispatch

ACTS = ["none", "relu", "gelu", "silu"]
# (x shape, out_features): odd sizes so every tile edge is masked
SHAPES = [((1, 1), 1), ((3, 17), 5), ((33, 20), 17), ((2, 3, 40), 24)]
GPU_SHAPES = [((4097, 1024), 1000), ((3, 100, 257), 4096), ((2048, 4096), 4096)]


def _inputs(x_shape, n, device, has_bias):
    k = x_shape[-1]
    x = torch.randn(x_shape, device=device)
    w = torch.randn(n, k, device=device) / k**0.5  # nn.Linear-like scale: y stays O(1)
    b = torch.randn(n, device=device) if has_bias else None
    return x, w, b


def _run_case(x0, w0, b0, activation, dtype, seed, *, allow_tf32=False, bias_dtype=None, xfn=None):
    """Forward + backward through tilewise, torch in ``dtype`` and torch in fp64; judge all."""
    grad = torch.randn(ops.output_shape(x0, w0), device=x0.device).to(dtype)
    outs = {}
    for name, dt in (("tw", dtype), ("torch", dtype), ("ref", torch.float64)):
        x, w = leaf(x0, dt), leaf(w0, dt)
        bdt = bias_dtype if name == "tw" and bias_dtype is not None else dt
        b = leaf(b0, bdt) if b0 is not None else None
        if name == "tw":
            xin = xfn(x) if xfn is not None else x
            y = tilewise.linear(xin, w, b, activation, allow_tf32=allow_tf32)
        else:
            y = ops.reference(x, w, b, activation)
        y.backward(grad.to(dt))
        outs[name] = (y, x.grad, w.grad, b.grad if b is not None else None)
    assert outs["tw"][0].dtype == dtype and outs["tw"][1] is not None
    if b0 is not None:
        assert outs["tw"][3].dtype == (bias_dtype or dtype)
    m, k, n = x0.numel() // x0.shape[-1], x0.shape[-1], w0.shape[0]
    tf32 = allow_tf32 and dtype == torch.float32  # TF32 keeps fp16's 10 mantissa bits
    atol = ATOL[torch.float16 if tf32 else dtype]
    if activation == "relu":
        outs["ref"] = _relu_ref_at_kinks(x0, w0, b0, grad, outs["tw"][0], atol * max(1.0, k**0.5))
    # atol scales with each output's reduction length and magnitude (half-precision rounding of
    # dz, shared by both paths at different points, is relative to it)
    for i, (what, red) in enumerate((("y", k), ("dx", n), ("dweight", m), ("dbias", m))):
        if outs["tw"][i] is None:
            continue
        rms = outs["ref"][i].detach().double().square().mean().sqrt().item()
        assert_three_way(
            outs["tw"][i],
            outs["torch"][i],
            outs["ref"][i],
            atol * max(1.0, red**0.5) * max(1.0, rms),
            f"linear {activation} {what}",
            seed,
            # a correctly rounded half-precision output may sit one ulp from PyTorch's (session
            # 17, H100: 1 of 1.02M bf16 GELU dweight elements, 0.126 against a bound of 0.111
            # at |dW| ~ 16-32, where an ulp is 0.125; split-K tile, seed 1409859485)
            ulps=1,
        )


def _relu_ref_at_kinks(x0, w0, b0, grad, y_tw, kink_tol):
    """The fp64 reference of relu(x W^T + b), whose gradient takes tilewise's mask where the
    exact pre-activation is within ``kink_tol`` of 0.

    There either mask is right to working precision, but which one a GEMM picks depends on its
    summation order: a flip moves a whole dy * x term into dW, far outside the elementwise bound,
    and PyTorch's own flips sit at other elements. Judging those few elements against tilewise's
    own choice keeps the rule strict everywhere else.
    """
    x, w = x0.double().reshape(-1, x0.shape[-1]), w0.double()
    z = x @ w.t() + (b0.double() if b0 is not None else 0)
    kink = z.abs() <= kink_tol
    mask = torch.where(kink, y_tw.detach().reshape(z.shape) > 0, z > 0)
    dz = grad.double().reshape(z.shape) * mask
    y = torch.relu(z).reshape(*x0.shape[:-1], -1)
    db = dz.sum(0) if b0 is not None else None
    return (y, (dz @ w).reshape(x0.shape), dz.t() @ x, db)


@pytest.mark.parametrize("has_bias", [True, False])
def test_relu_reference_matches_autograd(has_bias):
    """The fp64 reference the ReLU cases are judged by is PyTorch's fp64 autograd away from the
    kinks (the three-way rule cannot catch a reference that is wrong for tilewise and PyTorch
    alike; the LayerNorm test's once was)."""
    x0, w0 = torch.randn(3, 5, 24), torch.randn(17, 24)
    b0 = torch.randn(17) if has_bias else None
    grad = torch.randn(3, 5, 17)
    x, w = leaf(x0, torch.float64), leaf(w0, torch.float64)
    b = leaf(b0, torch.float64) if has_bias else None
    y = torch.relu(torch.nn.functional.linear(x, w, b))
    y.backward(grad.double())
    ref = _relu_ref_at_kinks(x0, w0, b0, grad, y.detach(), kink_tol=0.0)
    exact = (y, x.grad, w.grad, b.grad if has_bias else None)
    for got, exp in zip(ref, exact, strict=True):
        if exp is None:
            assert got is None
        else:
            torch.testing.assert_close(got, exp.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("has_bias", [True, False])
def test_forward_backward(monkeypatch, device, dtype, activation, has_bias, rng_seed):
    # untimed default choices here (timing every candidate of 3 GEMMs x 7 shapes x 24 cases took
    # minutes); every candidate is judged in test_every_gemm_candidate_fused_backward
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")
    shapes = SHAPES if device == "cpu" else SHAPES + GPU_SHAPES
    for x_shape, n in shapes:
        x, w, b = _inputs(x_shape, n, device, has_bias)
        _run_case(x, w, b, activation, dtype, rng_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("allow_tf32", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fp32_tf32_switch(monkeypatch, allow_tf32, activation, rng_seed):
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")
    for x_shape, n in GPU_SHAPES:
        x, w, b = _inputs(x_shape, n, "cuda", True)
        _run_case(x, w, b, activation, torch.float32, rng_seed, allow_tf32=allow_tf32)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_strided_views_are_read_in_place(device, dtype, rng_seed):
    x, w, b = _inputs((19, 33), 21, device, True)  # x: a transposed view, w: a column slice
    w_wide = torch.randn(21, 66, device=device)

    def transposed(t):
        tt = t.t().contiguous().t()  # same values, strides (1, 19); differentiable
        assert not tt.is_contiguous() and tt.stride() == (1, 19)
        return tt

    _run_case(x, w, b, "gelu", dtype, rng_seed, xfn=transposed)
    # a non-contiguous weight view (every other column), gradients reaching the wide parameter
    grad = torch.randn(19, 21, device=device)
    res = {}
    for name, dt, fn in (
        ("tw", dtype, tilewise.linear),
        ("torch", dtype, ops.reference),
        ("ref", torch.float64, ops.reference),
    ):
        xl, wl = leaf(x, dt), leaf(w_wide, dt)
        wv = wl[:, ::2]
        assert not wv.is_contiguous()
        y = fn(xl, wv, b.to(dt), "silu")
        y.backward(grad.to(dt))
        res[name] = (y, xl.grad, wl.grad)
    for i, (what, red) in enumerate((("y", 33), ("dx", 21), ("dweight", 19))):
        tw, th, ref = (res[k][i] for k in ("tw", "torch", "ref"))
        atol = ATOL[dtype] * red**0.5 * max(1.0, ref.detach().square().mean().sqrt().item())
        assert_three_way(tw, th, ref, atol, f"strided weight {what}", rng_seed)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("activation", ["relu", "silu", "none"])
def test_mixed_precision_fp32_bias(device, activation, rng_seed):
    x, w, b = _inputs((9, 24), 13, device, True)
    _run_case(x, w, b, activation, torch.float16, rng_seed, bias_dtype=torch.float32)


def test_kernel_paths_on_cpu_interpreter():
    """CPU tests must exercise the Triton kernels, not the references."""
    if torch.cuda.is_available():
        pytest.skip("GPU runs do not use the interpreter")
    assert dispatch.INTERPRET, "tests must run with TRITON_INTERPRET=1 on CPU"
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    assert dispatch.use_kernel(ops.OP, [x, w])
    y, g = ops.forward(x, w, torch.randn(5), "gelu")  # saves the pre-bias product
    assert g is not None and g.shape == y.shape
    torch.testing.assert_close(g, x @ w.t())
    y, saved = ops.forward(x, w, None, "relu")  # relu's backward uses y itself
    assert saved is y
    assert ops.forward(x, w, None, "none")[1] is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_no_kernel_dtypes_run_the_reference(dtype, caplog, rng_seed):
    if dtype == torch.bfloat16 and torch.cuda.is_available():
        pytest.skip("bf16 has a kernel on the GPU")
    x0, w0, b0 = _inputs((4, 2, 6), 3, "cpu", True)
    with caplog.at_level("WARNING", logger="tilewise"):
        for activation in ACTS:
            x, w, b = leaf(x0, dtype), leaf(w0, dtype), leaf(b0, dtype)
            y = tilewise.linear(x, w, b, activation)
            y.backward(torch.ones_like(y))
            xr, wr, br = leaf(x0, dtype), leaf(w0, dtype), leaf(b0, dtype)
            yr = ops.reference(xr, wr, br, activation)
            yr.backward(torch.ones_like(yr))
            x64, w64, b64 = (
                leaf(x0, torch.float64),
                leaf(w0, torch.float64),
                leaf(b0, torch.float64),
            )
            y64 = ops.reference(x64, w64, b64, activation)
            y64.backward(torch.ones_like(y64))
            pairs = zip(
                (y, x.grad, w.grad, b.grad),
                (yr, xr.grad, wr.grad, br.grad),
                (y64, x64.grad, w64.grad, b64.grad),
                strict=True,
            )
            for got, want, ref in pairs:
                assert got.dtype == want.dtype
                if dtype == torch.bfloat16:  # the three-way rule: bf16 rounding differs by path
                    # atol scaled like the rest of this file: sqrt(reduction length) x output rms
                    rms = max(1.0, ref.detach().square().mean().sqrt().item())
                    atol = ATOL[dtype] * 8**0.5 * rms  # reductions here are at most 8 long
                    assert_three_way(got, want, ref.detach(), atol, activation, rng_seed)
                else:  # bias_act's reference backward does its math in fp32, fp64 inputs too
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bad_input_names_the_argument():
    x, w, b = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5)
    with pytest.raises(ValueError, match="'x'"):
        tilewise.linear(torch.randn(4, 7), w, b)
    with pytest.raises(ValueError, match="'weight'"):
        tilewise.linear(x, torch.randn(5, 8, 1), b)
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.linear(x, w, torch.randn(4))
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.linear(x, w, torch.randn(5, 1))
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.linear(x.half(), w.half(), torch.randn(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="'weight'"):
        tilewise.linear(x, w.half(), b)
    with pytest.raises(ValueError, match="'weight'"):
        tilewise.linear(x, torch.randn(5, 8, device="meta"), b)
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.linear(x, w, torch.randn(5, device="meta"))
    with pytest.raises(ValueError, match="'activation'"):
        tilewise.linear(x, w, b, "tanh")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck(device):
    x = torch.randn(2, 5, 12, device=device, requires_grad=True)
    w = torch.randn(7, 12, device=device, requires_grad=True)
    b = torch.randn(7, device=device, requires_grad=True)
    fwd, bwd = tilewise.functional._linear_op, tilewise.functional._linear_backward_op
    torch.library.opcheck(fwd, (x, w, b, "gelu", False))
    torch.library.opcheck(fwd, (x, w, None, "relu", False))
    torch.library.opcheck(fwd, (x, w, b, "none", True))
    g = torch.randn(2, 5, 7, device=device)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    pre = torch.nn.functional.linear(xd, wd)
    torch.library.opcheck(bwd, (g, xd, wd, bd, pre, "silu", False))
    torch.library.opcheck(bwd, (g, xd, wd, None, torch.relu(pre), "relu", False))
    torch.library.opcheck(bwd, (g, xd, wd, bd, None, "none", False))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_torch_compile_fullgraph(device, activation, rng_seed):
    backend = "inductor" if device == "cuda" else "aot_eager"  # CPU: no C++ build in CI

    def f(x, w, b):
        return tilewise.linear(x * 2.0, w, b, activation).square().sum()

    x = torch.randn(2, 3, 16, device=device, requires_grad=True)
    w = torch.randn(9, 16, device=device, requires_grad=True)
    b = torch.randn(9, device=device, requires_grad=True)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    out = compiled(x, w, b)
    out.backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    x.grad = w.grad = b.grad = None
    f(x, w, b).backward()
    torch.testing.assert_close(out, f(x, w, b))
    for got, t in zip(grads, (x, w, b), strict=True):
        torch.testing.assert_close(got, t.grad)


def test_module_drop_in_shares_parameters(rng_seed):
    base = torch.nn.Linear(12, 6)
    m = tilewise.nn.Linear.from_linear(base, activation="silu")
    assert m.weight is base.weight and m.bias is base.bias
    assert isinstance(m, torch.nn.Linear)
    x = torch.randn(4, 12)
    torch.testing.assert_close(m(x), torch.nn.functional.silu(base(x)))
    m(x).sum().backward()
    assert base.weight.grad is not None and base.bias.grad is not None
    assert m.state_dict().keys() == base.state_dict().keys()
    fresh = tilewise.nn.Linear(12, 6, bias=False, activation="relu")
    assert fresh.bias is None and "activation='relu'" in repr(fresh)
    torch.testing.assert_close(fresh(x), torch.relu(x @ fresh.weight.t()))
    with pytest.raises(ValueError, match="'activation'"):
        tilewise.nn.Linear(12, 6, activation="bad")
    with pytest.raises(ValueError, match="'activation'"):
        tilewise.nn.Linear.from_linear(base, activation="bad")


def test_transform_fuses_linear_activation_pairs_in_sequentials(rng_seed):
    """Linear -> ReLU/erf-GELU/SiLU inside an nn.Sequential become one fused tilewise Linear that
    shares the original parameters; other pairs (tanh GELU) and lone Linears are left alone."""
    import torch.nn as tnn

    torch.manual_seed(rng_seed)
    model = tnn.Sequential(
        tnn.Linear(8, 16),
        tnn.ReLU(),
        tnn.Linear(16, 16),
        tnn.GELU(approximate="tanh"),
        tnn.Sequential(tnn.Linear(16, 12), tnn.GELU(), tnn.Linear(12, 4), tnn.SiLU()),
        tnn.Linear(4, 3),
    )
    x = torch.randn(5, 8)
    expect = model(x)
    params = list(model.parameters())
    report = tilewise.transform(model)
    swapped = dict(report.swapped)
    assert set(swapped) == {"0", "4.0", "4.2"}, swapped
    assert "activation='gelu'" in swapped["4.0"] and "activation='silu'" in swapped["4.2"]
    assert isinstance(model[1], tnn.Identity) and isinstance(model[3], tnn.GELU)
    assert model[0].activation == "relu" and model[0].weight is params[0]
    y = model(x)
    torch.testing.assert_close(y, expect, atol=1e-5, rtol=1e-5)
    y.sum().backward()
    assert all(p.grad is not None for p in params)


def test_transform_leaves_pairs_with_hooks_alone():
    """A hook on the Linear would see the fused (activated) output; one on the activation would
    never run: such pairs are not fused."""
    import torch.nn as tnn

    model = tnn.Sequential(tnn.Linear(4, 4), tnn.ReLU(), tnn.Linear(4, 4), tnn.ReLU())
    seen = []
    model[1].register_forward_hook(lambda m, i, o: seen.append("relu"))
    report = tilewise.transform(model)
    assert [name for name, _ in report.swapped] == ["2"]
    assert type(model[0]) is tnn.Linear and type(model[1]) is tnn.ReLU
    model(torch.randn(2, 4))
    assert seen == ["relu"]


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("backend", ["cublas", "cublas+epilogue", "cublaslt-relu"])
def test_cublas_backend_path_on_cpu(monkeypatch, activation, has_bias, backend, rng_seed):
    """The cuBLAS backends (torch GEMM + tilewise or PyTorch epilogue, cuBLASLt's bias + ReLU
    epilogue) are only legal on CUDA; forced here on the CPU so their host logic (bias cast,
    in-place ReLU, saved pre-activation, the fp32 product + epilogue kernel or the fused
    bias + ReLU where the forward offers them) is tested everywhere."""

    def choose(*args, **kwargs):
        return _offered_or_cublas(ops.Backend(backend), args, kwargs)

    monkeypatch.setattr(ops, "_choose", choose)
    monkeypatch.setattr(ops, "_lt_relu_offered", lambda a, b: True)  # CUDA-only otherwise
    for x_shape, n in SHAPES:
        x, w, b = _inputs(x_shape, n, "cpu", has_bias)
        _run_case(x, w, b, activation, torch.float32, rng_seed)


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("has_bias", [True, False])
def test_cublas_split_k_path_on_cpu(monkeypatch, activation, has_bias, rng_seed):
    """cuBLAS over K slices + the fused sum/bias/activation kernel (``gemm_splitk``), forced
    wherever the forward offers it (fp32, none or relu; plain cuBLAS elsewhere), through forward
    and backward on odd M and N; the GEMM runs as torch.bmm on the CPU, the epilogue through the
    interpreter."""
    for split in (2, 4, 16):

        def choose(*args, split=split, **kwargs):
            if kwargs.get("cublas_split_k", False):
                return ops.CublasSplitK(split)
            return ops.CUBLAS

        monkeypatch.setattr(ops, "_choose", choose)
        for x_shape, n in (((3, 64), 5), ((33, 128), 17), ((2, 3, 256), 24)):
            x, w, b = _inputs(x_shape, n, "cpu", has_bias)
            _run_case(x, w, b, activation, torch.float32, rng_seed)
        # strided operands: x a column slice, W a transposed view, the bias every other element
        x = torch.randn(9, 2 * 128)[:, 64:192]
        w = torch.randn(128, 7).t()
        b = torch.randn(14)[::2] if has_bias else None
        _run_case(x, w, b, activation, torch.float32, rng_seed)


@pytest.mark.parametrize("split_k", [False, True])
def test_strided_and_expanded_bias(monkeypatch, split_k):
    """A bias with stride 2 or stride 0 (expanded) gives F.linear's result on every kernel path
    (the kernels index the bias element by element; the review of session 14 found both wrong)."""
    if split_k:
        monkeypatch.setattr(
            ops,
            "_choose",
            lambda *a, **k: ops.CublasSplitK(4) if k["cublas_split_k"] else ops.CUBLAS,
        )
    x, w = torch.randn(5, 64), torch.randn(6, 64) / 8
    for b in (torch.randn(12)[::2], torch.randn(1).expand(6)):
        for act in ("none", "relu", "gelu"):
            got = tilewise.linear(x, w, b, act)
            torch.testing.assert_close(got, ops.reference(x, w, b, act), rtol=1e-5, atol=1e-5)


def test_cublas_split_k_candidates_and_bad_choice(monkeypatch):
    from tilewise.ops import gemm, gemm_splitk

    monkeypatch.setattr(gemm, "num_sms", lambda device: 132)  # gemm_config's: an H100's count

    assert gemm_splitk.candidates(64, 1024, 1024, 132) == tuple(
        gemm_splitk.CublasSplitK(s) for s in (4, 8, 16)
    )
    assert gemm_splitk.candidates(64, 1024, 1024, 0) == ()  # no GPU: nothing to time
    assert gemm_splitk.candidates(4096, 4096, 1024, 132) == ()  # the output fills the SMs
    assert gemm_splitk.candidates(64, 1024, 1000, 132) == tuple(
        gemm_splitk.CublasSplitK(s) for s in (4, 8)
    )  # 1000 / 16 is not whole
    assert gemm_splitk.candidates(64, 1024, 1001, 132) == ()
    assert gemm_splitk.candidates(8, 2048, 2048, 132) == ()  # few rows: small W or K >= 8192
    assert gemm_splitk.candidates(8, 1024, 1024, 132) == tuple(
        gemm_splitk.CublasSplitK(s) for s in (4, 8, 16)
    )
    assert gemm_splitk.candidates(2, 8192, 8192, 132) == tuple(
        gemm_splitk.CublasSplitK(s) for s in (4, 8, 16)
    )
    assert gemm_splitk.candidates(64, 1024, 256, 132) == (gemm_splitk.CublasSplitK(4),)
    cands = ops._candidates(64, 1024, 1024, 4, True, True, 132, True, False, True, True)
    assert gemm_splitk.CublasSplitK(8) in cands
    assert not any(
        isinstance(c, gemm_splitk.CublasSplitK)
        for c in ops._candidates(64, 1024, 1024, 4, True, True, 132, True, False, True)
    )
    assert not any(  # cuBLAS not legal (e.g. TF32 off asked while the global flag is on)
        isinstance(c, gemm_splitk.CublasSplitK)
        for c in ops._candidates(64, 1024, 1024, 4, True, False, 132, True, False, True, True)
    )
    a, b = torch.randn(4, 30), torch.randn(30, 5)
    with pytest.raises(ValueError, match="choice"):
        gemm_splitk.forward(a, b, None, "none", gemm_splitk.CublasSplitK(4))
    with pytest.raises(ValueError, match="fp32"):
        gemm_splitk.forward(a.half(), b.half(), None, "none", gemm_splitk.CublasSplitK(2))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_cublas_split_k_forward_gpu(monkeypatch, activation, rng_seed):
    """Every split offered, forced, on the GPU: three-way rule through forward and backward on
    odd and issue-sized shapes, and NaN/Inf where relu(F.linear) has them."""
    from tilewise.ops import gemm_splitk

    for x_shape, n in (((64, 1024), 1024), ((16, 3, 512), 1000), ((3, 8192), 97)):
        m, k = x_shape[0] * (x_shape[1] if len(x_shape) == 3 else 1), x_shape[-1]
        choices = gemm_splitk.candidates(m, n, k, 132)
        assert choices, (x_shape, n)
        for choice in choices:

            def choose(*args, choice=choice, **kwargs):
                return choice if kwargs.get("cublas_split_k", False) else ops.CUBLAS

            monkeypatch.setattr(ops, "_choose", choose)
            x, w, b = _inputs(x_shape, n, "cuda", True)
            _run_case(x, w, b, activation, torch.float32, rng_seed)
            x = x.clone()
            x.view(-1, k)[0, 0] = float("nan")
            x.view(-1, k)[-1, -1] = float("inf")
            got = tilewise.linear(x, w, b, activation)
            want = ops.reference(x, w, b, activation)
            assert torch.equal(got.isnan(), want.isnan()), choice
            assert torch.equal(got.isinf(), want.isinf()), choice


def _offered_or_cublas(choice, args, kwargs):
    """``choice``, or plain cuBLAS where the GEMM being chosen does not offer it (the split
    epilogue: fp32 forward; the fused bias + ReLU: forward with a bias and ReLU)."""
    split = args[5] if len(args) > 5 else kwargs.get("epilogue_split", False)
    lt = kwargs.get("lt_relu", False)
    if choice == ops.CUBLAS_EPILOGUE and not split or choice == ops.CUBLAS_LT_RELU and not lt:
        return ops.CUBLAS
    if isinstance(choice, ops.GemmConfig) and not kwargs.get("split_k", False):
        return replace(choice, split_k=1)  # split-K is for forwards only
    return choice


def test_fused_relu_backend_is_offered_only_for_bias_and_relu(monkeypatch):
    """The cuBLASLt bias + ReLU candidate reaches the chooser exactly for forwards with a bias
    and ReLU (a forward without bias, or with another activation, cannot use it), given a shape
    whose kernel keeps NaN/Inf (``_lt_relu_offered``, CUDA only: forced here)."""
    seen = []

    def choose(*args, **kwargs):
        seen.append(kwargs.get("lt_relu", False))
        return ops.CUBLAS

    monkeypatch.setattr(ops, "_choose", choose)
    monkeypatch.setattr(ops, "_lt_relu_offered", lambda a, b: True)
    for act, has_bias in (("relu", True), ("relu", False), ("gelu", True), ("none", True)):
        seen.clear()
        x, w, b = _inputs((5, 8), 6, "cpu", has_bias)
        ops.forward(x, w, b, act)
        assert seen == [act == "relu" and has_bias], (act, has_bias, seen)
    cands = ops._candidates(64, 64, 64, 2, False, True, 0, False, True)
    assert cands[-1] == ops.CUBLAS_LT_RELU and ops.CUBLAS in cands
    assert ops.CUBLAS_LT_RELU not in ops._candidates(64, 64, 64, 2, False, True, 0, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_every_gemm_candidate_fused_backward(monkeypatch, dtype, activation, rng_seed):
    """Each tile config the autotuner may pick, forced for every GEMM of forward and backward
    (the backward's derivative prologue and bias-gradient sum included), on odd shapes."""
    for x_shape, n in (((65, 130), 97), ((8, 1024), 1000)):
        m, k = x_shape
        fp32 = dtype == torch.float32
        cands = ops._candidates(m, n, k, dtype.itemsize, fp32, True, 132, True, True, True)
        for cfg in cands:

            def choose(*args, cfg=cfg, **kwargs):  # the cuBLAS variants only where offered
                return _offered_or_cublas(cfg, args, kwargs)

            monkeypatch.setattr(ops, "_choose", choose)
            x, w, b = _inputs(x_shape, n, "cuda", True)
            try:
                _run_case(x, w, b, activation, dtype, rng_seed)
            except AssertionError as exc:
                raise AssertionError(f"{cfg}: {exc}") from None


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("split", [2, 3, 16])
def test_split_k_forward(monkeypatch, device, dtype, activation, split, rng_seed):
    """Split-K forwards (each tile's K in slices summed by its last program, then the fused
    epilogue), forced on every forward, with slices left empty where K is short; the stream's
    ticket counters are left zero."""
    from dataclasses import replace

    from tilewise.runtime import workspace

    def choose(a, b, *args, **kwargs):
        m, k = a.shape
        cfg = ops.gemm_config(m, b.shape[1], k, a.element_size(), a.device)
        return replace(cfg, split_k=split) if kwargs.get("split_k") else cfg

    monkeypatch.setattr(ops, "_choose", choose)
    gpu_shapes = [((64, 1024), 1024), ((3, 100, 257), 97), ((1, 4096), 1), ((7, 2049), 33)]
    shapes = SHAPES if device == "cpu" else gpu_shapes
    for x_shape, n in shapes:
        x, w, b = _inputs(x_shape, n, device, True)
        _run_case(x, w, b, activation, dtype, rng_seed)
    assert workspace.all_zero()


def test_split_k_configs_only_where_tiles_are_few():
    """Split-K candidates appear for forwards whose output tiles cannot fill the SMs, each
    slice at least two K steps; never for large outputs, and the backward refuses them."""
    few = ops._split_configs(64, 1024, 1024, True, 132)
    assert few and all(c.split_k >= 2 for c in few)
    for c in few:
        tiles = -(-64 // c.block_m) * -(-1024 // c.block_n)
        assert tiles < 132 and 1024 >= 2 * c.split_k * c.block_k
    for c in ops._split_configs(7, 33, 2049, True, 132):  # 2049 is not a multiple of a split
        steps = -(-2049 // c.block_k)
        per = -(-steps // c.split_k)
        assert (c.split_k - 1) * per < steps, c  # the last slice has work
    assert ops._busy_slices(2049, 64, 16) == 11 and ops._busy_slices(1024, 32, 8) == 8
    assert not ops._split_configs(4096, 4096, 4096, False, 132)
    assert not ops._split_configs(64, 1024, 32, True, 132)  # K too short to split
    x, w = torch.randn(8, 16), torch.randn(16, 12)
    with pytest.raises(ValueError, match="'cfg'"):
        ops._launch(x, w, torch.float32, False, cfg=ops.GemmConfig(16, 16, 16, split_k=2),
                    db=torch.empty(8))  # fmt: skip


def test_fused_relu_backend_needs_cuda_and_alignment():
    """On the CPU, or with an operand off a 16-byte boundary, cuBLASLt's bias + ReLU is not
    offered (its kernel choice, and with it NaN handling, depends on alignment)."""
    x, w = torch.randn(8, 16), torch.randn(16, 12)
    assert not ops._lt_relu_offered(x, w)
    assert not ops.lt_relu_keeps_nonfinite(8, 12, 16, torch.float32, -1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_fused_relu_backend_keeps_nan_and_inf(monkeypatch, dtype):
    """Forced onto cuBLASLt's bias + ReLU wherever it is offered, on odd and aligned shapes, the
    forward keeps NaN and Inf exactly where relu(F.linear) has them; where the shape's kernel
    drops them, the candidate is not offered and plain cuBLAS runs."""

    def choose(*args, **kwargs):
        return _offered_or_cublas(ops.CUBLAS_LT_RELU, args, kwargs)

    monkeypatch.setattr(ops, "_choose", choose)
    offered = 0
    for m, k, n in ((3, 100, 97), (64, 100, 97), (64, 1024, 1024), (4097, 1024, 1000), (2, 8, 8)):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        x[0, 0], x[m - 1, k - 1], x[m // 2, 1] = float("nan"), float("inf"), float("-inf")
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        b = torch.randn(n, device="cuda", dtype=dtype)
        y, _ = ops.forward(x, w, b, "relu")
        want = torch.relu(torch.nn.functional.linear(x, w, b))
        assert torch.equal(y.isnan(), want.isnan()) and torch.equal(y.isinf(), want.isinf())
        offered += ops._lt_relu_offered(x, w.t())
    print(f"cuBLASLt bias + ReLU offered at {offered} of 5 shapes ({dtype})")


@pytest.mark.parametrize("activation", ACTS)
def test_zero_in_features(activation):
    """in_features = 0: act(bias) broadcast over the rows and its gradients, as F.linear gives
    (``reshape(-1, 0)`` once raised here)."""
    x = torch.randn(3, 0, requires_grad=True)
    w = torch.randn(4, 0, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    y = tilewise.linear(x, w, b, activation)
    want = ops.reference(x, w, b, activation)
    torch.testing.assert_close(y, want)
    (gb,) = torch.autograd.grad(y.sum(), b)
    (gb_want,) = torch.autograd.grad(want.sum(), b)
    torch.testing.assert_close(gb, gb_want)


def test_transform_leaves_pairs_with_backward_pre_hooks_alone():
    """A backward pre-hook on the Linear would see the gradient of the fused (activated)
    output, one on the activation would never run: such pairs are not fused either."""
    import torch.nn as tnn

    model = tnn.Sequential(tnn.Linear(4, 4), tnn.ReLU(), tnn.Linear(4, 4), tnn.ReLU())
    model[0].register_full_backward_pre_hook(lambda m, g: None)
    model[3].register_full_backward_pre_hook(lambda m, g: None)
    report = tilewise.transform(model)
    assert report.swapped == []
    assert [type(m) for m in model] == [tnn.Linear, tnn.ReLU, tnn.Linear, tnn.ReLU]


def test_timing_mode_times_l2_sized_operands_warm_and_cold():
    """Small operands: warm timing; from COLD_L2_MIN_BYTES: cold, and warm too while they fit in
    L2 (a single large layer keeps them there); beyond L2: cold only."""
    l2 = 50 << 20
    assert ops.timing_mode(1 << 20, l2) == (False, False)
    assert ops.timing_mode(ops.COLD_L2_MIN_BYTES, l2) == (True, True)
    assert ops.timing_mode(32 << 20, l2) == (True, True)
    assert ops.timing_mode(136 << 20, l2) == (True, False)
    assert ops.timing_mode(32 << 20, 0) == (True, False)  # no L2 size known


def test_gemm_op_keys_keep_gemv_offers_apart():
    """A forward offered the GEMV (aligned, unit-stride operands) and one of the same shape that
    was not are cached under different keys: neither overwrites the other's choice; so are
    true-fp32 forwards offered the 3xTF32 tiles and those that were not."""
    keys = {ops.gemm_op_key(f, g) for f in (False, True) for g in (False, True)}
    assert keys == {"linear.gemm", "linear.gemm.fwd6", "linear.gemm.fwd6.gemv"}
    assert ops.gemm_op_key(True, True, True) == "linear.gemm.fwd6.tc.gemv"
    assert ops.gemm_op_key(False, False, True) == "linear.gemm"  # backward GEMMs: never offered


def test_tf32x3_tiles_offered_for_true_fp32_forwards_only(monkeypatch):
    """``Tf32x3Config`` tiles (and split-K forms where the output tiles are few) join the
    candidates of true-fp32 forwards; with TF32 allowed or half precision they do not."""
    from tilewise.ops import gemm

    monkeypatch.setattr(gemm, "num_sms", lambda device: 132)  # gemm_config's: an H100's count
    tc = [c for c in ops._candidates(512, 4096, 4096, 4, True, True, 132, fp32_tc=True)]
    tc = [c for c in tc if isinstance(c, ops.Tf32x3Config)]
    assert tc and all(c.block_k <= 32 for c in tc) and all(c.split_k == 1 for c in tc)
    few = ops._candidates(64, 1024, 1024, 4, True, True, 132, split_k=True, fp32_tc=True)
    assert any(isinstance(c, ops.Tf32x3Config) and c.split_k > 1 for c in few)
    for ieee, size in ((False, 4), (False, 2)):
        cands = ops._candidates(512, 4096, 4096, size, ieee, True, 132, fp32_tc=True)
        assert not any(isinstance(c, ops.Tf32x3Config) for c in cands)
    plain = ops._candidates(512, 4096, 4096, 4, True, True, 132)
    assert not any(isinstance(c, ops.Tf32x3Config) for c in plain)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda"]
)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_tf32x3_forward(monkeypatch, device, activation, rng_seed):
    """Forwards forced onto a 3xTF32 tile (and its split-K form), backward as chosen: judged
    against fp64 by the three-way rule (PyTorch fp32 with TF32 off as the same-dtype result);
    the interpreter on the CPU computes in plain fp32."""
    real = ops._choose
    split = {"k": 1}

    def choose(a, b, *args, **kwargs):
        if not kwargs.get("split_k"):
            return real(a, b, *args, **kwargs)
        m, k = a.shape
        cfg = ops.gemm_config(m, b.shape[1], k, a.element_size(), a.device)
        cfg = ops.Tf32x3Config(**{**vars(cfg), "block_k": min(cfg.block_k, 32)})
        return replace(cfg, split_k=split["k"])

    monkeypatch.setattr(ops, "_choose", choose)
    with allow_tf32(False):
        for split["k"] in (1, 3):
            for x_shape, n in SHAPES if device == "cpu" else GPU_SHAPES:
                x, w, b = _inputs(x_shape, n, device, True)
                _run_case(x, w, b, activation, torch.float32, rng_seed)


@pytest.mark.gpu
def test_tf32x3_forward_keeps_inf_and_nan():
    """A 3xTF32 forward puts Inf and NaN where PyTorch's fp32 ``F.linear`` does (the split's
    Inf - Inf tails are zeroed, so an Inf input gives Inf, not NaN)."""
    x = torch.randn(64, 96, device="cuda")
    w = torch.rand(80, 96, device="cuda") + 0.5  # positive: an Inf row stays +Inf
    x[3, 10], x[7, 20] = float("inf"), float("nan")
    want = torch.nn.functional.linear(x, w)
    cfg = ops.Tf32x3Config(64, 64, 32, num_warps=4, num_stages=3)
    for c in (cfg, replace(cfg, split_k=3)):
        got = ops._launch(x, w.t(), torch.float32, False, cfg=c)[0]
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        assert torch.equal(got[want.isinf()], want[want.isinf()])
