"""LayerNorm (+ fused ReLU): forward and x/weight/bias gradients against fp64, both kernel paths."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from checks import ATOL, DEVICE_DTYPES, assert_three_way, deterministic_algorithms, leaf

import tilewise
from tilewise.ops import _common
from tilewise.ops import layernorm as ops

# (x shape, normalized_shape)
CASES = [
    ((1, 1), (1,)),
    ((3, 7), (7,)),
    ((5, 7, 33), (7, 33)),
    ((4, 130), (130,)),
    ((2, 3, 64), (64,)),
]
GPU_CASES = [
    ((4099, 4096), (4096,)),
    ((33, 256, 102), (256, 102)),
    ((777, 1000), (1000,)),
    ((5, 256, 1008), (256, 1008)),
]


def _torch_ln(x, shape, w, b, relu):
    y = torch.nn.functional.layer_norm(x, shape, w, b)
    return torch.relu(y) if relu else y


def _run_case(x0, shape, affine, relu, dtype, param_dtype, seed, offset=0.0):
    # inputs rounded to the dtypes under test first, so the fp64 reference sees the same values
    x0 = (x0 + offset).to(dtype).float()
    w0 = 1.0 + 0.5 * torch.randn(shape, device=x0.device) if affine in ("w", "wb") else None
    b0 = 0.5 * torch.randn(shape, device=x0.device) if affine == "wb" else None
    w0 = w0.to(param_dtype).float() if w0 is not None else None
    b0 = b0.to(param_dtype).float() if b0 is not None else None
    grad = torch.randn_like(x0, dtype=dtype)
    outs = {}
    for name, dt, pdt in (
        ("tw", dtype, param_dtype),
        ("torch", dtype, dtype),
        ("ref", torch.float64, torch.float64),
    ):
        x = leaf(x0, dt)
        w = leaf(w0, pdt) if w0 is not None else None
        b = leaf(b0, pdt) if b0 is not None else None
        if name == "tw":
            y = tilewise.layer_norm(x, shape, w, b, relu=relu)
        else:
            y = _torch_ln(x, shape, w, b, relu)
        y.backward(grad.to(dt))
        outs[name] = (
            y,
            x.grad,
            w.grad if w is not None else None,
            b.grad if b is not None else None,
        )
    rows = x0.numel() // ops.row_size(shape)
    atol = ATOL[dtype] * (1 + abs(offset))
    if relu:
        outs["ref"] = _relu_ref_at_kinks(
            x0, shape, w0, b0, grad, outs["tw"][0], 1e-4 * (1 + abs(offset))
        )
    for i, what in enumerate(("y", "dx", "dweight", "dbias")):
        if outs["tw"][i] is None:
            continue
        a = atol * max(1.0, rows**0.5) if what in ("dweight", "dbias") else atol
        if what == "dx":
            # dx = rstd * (g - ...): a rounding of g (fp32 fma contraction on the GPU) comes out
            # multiplied by rstd, up to 1/sqrt(eps) ~ 316 on a constant row (the (1, 1) case)
            a *= max(1.0, float(_ref_rstd(x0, shape).max()))
        assert_three_way(
            outs["tw"][i],
            outs["torch"][i],
            outs["ref"][i],
            a * 4,
            f"layer_norm relu={relu} affine={affine} {what}",
            seed,
        )


def _ref_rstd(x0, shape, eps=1e-5):
    """Per-row 1 / std in fp64: the factor dx's rounding errors are scaled by."""
    x = x0.double().reshape(-1, ops.row_size(shape))
    return torch.rsqrt(x.var(1, unbiased=False) + eps)


def _relu_ref_at_kinks(x0, shape, w0, b0, grad, y_tw, kink_tol, eps=1e-5):
    """fp64 LayerNorm + ReLU and its gradients, with tilewise's ReLU mask where the exact
    pre-activation is within ``kink_tol`` of 0.

    There either mask is right to working precision (the kernel's fp32 pre-activation and
    PyTorch's differ by ~1e-7), but a flip moves a whole gradient element, far outside the
    elementwise bound; on 16M elements a few such flips are expected per run. Judging those
    elements against tilewise's own choice keeps the rule strict everywhere else.
    """
    n = ops.row_size(shape)
    x = x0.double().reshape(-1, n)
    mean = x.mean(1, keepdim=True)
    rstd = torch.rsqrt(((x - mean) ** 2).mean(1, keepdim=True) + eps)
    xhat = (x - mean) * rstd
    w = (
        w0.double().reshape(-1)
        if w0 is not None
        else torch.ones(n, dtype=torch.float64, device=x.device)
    )
    z = xhat * w + (b0.double().reshape(-1) if b0 is not None else 0)
    mask = torch.where(z.abs() <= kink_tol, y_tw.detach().reshape(z.shape) > 0, z > 0)
    g = grad.double().reshape(z.shape) * mask
    gw = g * w
    dx = (gw - xhat * (gw * xhat).mean(1, keepdim=True) - gw.mean(1, keepdim=True)) * rstd
    dw = (g * xhat).sum(0).reshape(shape) if w0 is not None else None
    db = g.sum(0).reshape(shape) if b0 is not None else None
    return torch.relu(z).reshape(x0.shape), dx.reshape(x0.shape), dw, db


@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_relu_reference_matches_autograd(affine):
    """The fp64 reference the ReLU cases are judged by is PyTorch's fp64 autograd away from the
    kinks. (Until session 11 its dx dropped the xhat-weighted mean; the three-way rule hid that,
    tilewise and PyTorch being off the wrong reference by the same amount, except in rows where
    PyTorch's ReLU mask flipped at a kink: hence the "intermittent" fp32 failures.)"""
    x0 = torch.randn(37, 100)
    w0 = 1.0 + 0.5 * torch.randn(100) if affine != "none" else None
    b0 = 0.5 * torch.randn(100) if affine == "wb" else None
    grad = torch.randn(37, 100)
    x = leaf(x0, torch.float64)
    w = leaf(w0, torch.float64) if w0 is not None else None
    b = leaf(b0, torch.float64) if b0 is not None else None
    y = torch.relu(torch.nn.functional.layer_norm(x, (100,), w, b))
    y.backward(grad.double())
    ref = _relu_ref_at_kinks(x0, (100,), w0, b0, grad, y.detach(), kink_tol=0.0)
    exact = (y, x.grad, w.grad if w is not None else None, b.grad if b is not None else None)
    for got, exp in zip(ref, exact, strict=True):
        if exp is None:
            assert got is None
        else:
            torch.testing.assert_close(got, exp.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_forward_backward(device, dtype, relu, affine, rng_seed):
    cases = CASES if device == "cpu" else CASES + GPU_CASES
    for xshape, shape in cases:
        x = torch.randn(xshape, device=device, dtype=torch.float32)
        _run_case(x, shape, affine, relu, dtype, dtype, rng_seed)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_deterministic_mode_sums_partials_in_order(device, dtype, rng_seed):
    """PyTorch's deterministic mode takes the stored-partials path: judged by the same rule, and
    bit-identical from call to call."""
    cases = CASES[2:4] if device == "cpu" else GPU_CASES[:2]
    with deterministic_algorithms():
        for relu in (False, True):
            for xshape, shape in cases:
                x = torch.randn(xshape, device=device, dtype=torch.float32)
                _run_case(x, shape, "wb", relu, dtype, dtype, rng_seed)
        xshape, shape = cases[0]
        x = torch.randn(xshape, device=device, dtype=dtype)
        w, b = (
            torch.randn(shape, device=device, dtype=dtype),
            torch.randn(shape, device=device, dtype=dtype),
        )
        _, mean, rstd = ops.forward(x, shape, w, b)
        dy = torch.randn_like(x)
        first, again = (ops.backward(dy, x, shape, w, b, mean, rstd, True) for _ in range(2))
        for a, c in zip(first, again, strict=True):
            assert torch.equal(a, c)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_atomic_sum_over_accumulator_copies(device, dtype, monkeypatch, rng_seed):
    """Programs spread their atomics over several accumulator copies that the last one sums."""
    monkeypatch.setattr(ops, "atomic_slots", lambda *_: 4)
    for xshape, shape in CASES[2:4] if device == "cpu" else GPU_CASES[:2]:
        x = torch.randn(xshape, device=device, dtype=torch.float32)
        _run_case(x, shape, "wb", True, dtype, dtype, rng_seed)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize(
    "kernel,variant",
    [
        ("layer_norm_bwd", dict(prefetch=True)),
        ("layer_norm_bwd", dict(stages=2)),
        ("layer_norm_bwd", dict(stages=4, block_m=2, num_warps=8)),
        ("layer_norm_fwd", dict(stages=2, progs_per_sm=1)),
        ("layer_norm_fwd", dict(stages=3, block_m=2)),
        ("layer_norm_fwd", dict(streaming=True)),
        ("layer_norm_bwd", dict(prefetch=True, streaming=True)),
        ("layer_norm_bwd", dict(stages=2, streaming=True)),
    ],
    ids=[
        "bwd-prefetch",
        "bwd-stages2",
        "bwd-stages4-2rows",
        "fwd-persistent2",
        "fwd-persistent3",
        "fwd-streaming",
        "bwd-prefetch-streaming",
        "bwd-stages2-streaming",
    ],
)
def test_launch_variants(device, dtype, kernel, variant, monkeypatch, rng_seed):
    """Configs that tuning sweeps pick among give the same outputs, mean/rstd and gradients: the
    backward's register-prefetched and software-pipelined row loops; a persistent forward grid
    walking several row blocks per program through a pipelined loop; evict-first loads and
    streaming stores in either pass."""

    def override(m, n, elem, variant=variant):
        base = ops.TileConfig(1, ops.next_pow2(n), 4, progs_per_sm=2, prefetch=False)
        return replace(base, **variant)

    monkeypatch.setitem(_common.CONFIG_OVERRIDES, kernel, override)
    for xshape, shape in CASES[2:4] if device == "cpu" else GPU_CASES:
        x = torch.randn(xshape, device=device, dtype=torch.float32)
        _run_case(x, shape, "wb", True, dtype, dtype, rng_seed)


@pytest.mark.parametrize("device,dtype", [p for p in DEVICE_DTYPES if "float32" not in p.id])
@pytest.mark.parametrize("n", [1000, 2500])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-mode", "deterministic"])
def test_no_affine_backward_register_loop(device, dtype, n, deterministic, rng_seed):
    """Without weight and bias the half-precision backward of 1024- and 4096-wide blocks runs the
    register loop at several programs per SM (session 18's config), over ragged rows, in either
    reduction mode (neither has anything to reduce)."""
    cfg = ops._config("layer_norm_bwd", 5, n, 2, torch.device(device), affine=False)
    assert cfg.stages == 1 and cfg.progs_per_sm >= 4 and not cfg.prefetch
    x = torch.randn(5 if device == "cpu" else 4099, n, device=device)
    with deterministic_algorithms() if deterministic else contextlib.nullcontext():
        for relu in (False, True):
            _run_case(x, (n,), "none", relu, dtype, dtype, rng_seed)


@pytest.mark.gpu
def test_atomic_weight_grads_are_complete_on_every_call(rng_seed):
    """The last program casts the atomically summed dw/db; a missed partial (a memory-ordering
    bug) would show as a large error on some call."""
    x = torch.randn(8191, 1024, device="cuda", dtype=torch.float16)
    w, b = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    _, mean, rstd = ops.forward(x, (1024,), w, b)
    dy = torch.randn_like(x)
    with deterministic_algorithms():
        _, dw0, db0 = ops.backward(dy, x, (1024,), w, b, mean, rstd)
    for _ in range(50):
        _, dw, db = ops.backward(dy, x, (1024,), w, b, mean, rstd)
        torch.testing.assert_close(dw, dw0, rtol=1e-3, atol=1e-2)
        torch.testing.assert_close(db, db0, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_looped_path_long_rows(device, dtype, monkeypatch, rng_seed):
    """Rows over MAX_FUSED_N take the chunked kernels; shrink the limit to test them small."""
    if device == "cpu":
        monkeypatch.setattr(ops, "MAX_FUSED_N", 16)
        monkeypatch.setattr(ops, "CHUNK_N", 8)
        cases = [((3, 37), (37,)), ((2, 5, 9), (5, 9))]
    else:
        cases = [((7, 40_000), (40_000,)), ((3, 256, 1008), (256, 1008))]
    for relu in (False, True):
        for xshape, shape in cases:
            x = torch.randn(xshape, device=device)
            _run_case(x, shape, "wb", relu, dtype, dtype, rng_seed, offset=20.0)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("affine", ["wb", "w", "b"])
def test_looped_path_weight_grads_share_the_kernels_mask(device, dtype, affine, monkeypatch):
    """The long-row backward's dweight and dbias come from the kernel that computes dx, with its
    ReLU mask, never from a PyTorch recomputation whose mask can differ at a kink (session 23:
    a dbias without a row that dx had). Each gradient must equal its per-row terms' sum."""
    if device == "cpu":
        monkeypatch.setattr(ops, "MAX_FUSED_N", 16)
        monkeypatch.setattr(ops, "CHUNK_N", 8)
        xshape, n = (4, 37), 37
    else:
        xshape, n = (5, 20_000), 20_000

    def no_reference(*args, **kwargs):
        raise AssertionError("the long-row backward called the PyTorch reference")

    monkeypatch.setattr(ops, "reference_backward", no_reference)
    x = torch.randn(xshape, device=device).to(dtype)
    w = (1 + 0.5 * torch.randn(n, device=device)).to(dtype) if "w" in affine else None
    b = (0.5 * torch.randn(n, device=device)).to(dtype) if "b" in affine else None
    dy = torch.randn(xshape, device=device).to(dtype)
    y, mean, rstd = ops.forward(x, (n,), w, b, relu=True)
    dx, dw, db = ops.backward(dy, x, (n,), w, b, mean, rstd, relu=True)
    assert dx.isfinite().all()
    # PyTorch's ReLU backward reads the output: the mask the kernel's dx used is y > 0
    g = torch.where(y > 0, dy, 0).double()
    xhat = (x.double() - mean.double()[:, None]) * rstd.double()[:, None]
    atol = ATOL[dtype] * 4 * xshape[0] ** 0.5
    if w is not None:
        torch.testing.assert_close(dw.double(), (g * xhat).sum(0), rtol=1e-2, atol=atol)
    if b is not None:
        torch.testing.assert_close(db.double(), g.sum(0), rtol=1e-2, atol=atol)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_fp32_params_with_half_input(device, dtype, rng_seed):
    if dtype == torch.float32:
        pytest.skip("mixed precision case is for half inputs")
    x = torch.randn(6, 48, device=device)
    w0 = 1.0 + 0.5 * torch.randn(48, device=device)
    b0 = 0.5 * torch.randn(48, device=device)
    y = tilewise.layer_norm(x.to(dtype), (48,), w0, b0, relu=True)
    assert y.dtype == dtype
    ref = torch.relu(
        torch.nn.functional.layer_norm(x.to(dtype).double(), (48,), w0.double(), b0.double())
    )
    same = torch.relu(
        torch.nn.functional.layer_norm(x.to(dtype), (48,), w0.to(dtype), b0.to(dtype))
    )
    assert_three_way(y, same, ref, ATOL[dtype] * 4, "layer_norm mixed", rng_seed)


def test_non_contiguous_input(rng_seed):
    x = torch.randn(16, 6).t()  # [6, 16], not contiguous
    _run_case(x, (16,), "wb", False, torch.float32, torch.float32, rng_seed)


@pytest.mark.parametrize("relu", [False, True])
def test_nan_row_stays_nan_others_finite(relu):
    x = torch.randn(4, 10)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    y = tilewise.layer_norm(x, (10,), relu=relu)
    ref = torch.nn.functional.layer_norm(x, (10,))
    ref = torch.relu(ref) if relu else ref  # relu keeps NaN
    assert torch.equal(y.isnan(), ref.isnan()) and bool(ref.isnan().any())
    torch.testing.assert_close(y[[0, 3]], ref[[0, 3]])


def test_bad_input_names_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="'normalized_shape'"):
        tilewise.layer_norm(x, (7,))
    with pytest.raises(ValueError, match="'weight'"):
        tilewise.layer_norm(x, (8,), torch.ones(7))
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.layer_norm(x, (8,), torch.ones(8), torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="'weight'"):
        tilewise.layer_norm(x, (8,), torch.ones(8, device="meta"))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck(device):
    x = torch.randn(5, 3, 12, device=device, requires_grad=True)
    w = torch.randn(3, 12, device=device, requires_grad=True)
    b = torch.randn(3, 12, device=device, requires_grad=True)
    op = tilewise.functional._layer_norm_op
    torch.library.opcheck(op, (x, [3, 12], w, b, 1e-5, True))
    torch.library.opcheck(op, (x, [12], None, None, 1e-5, False))
    y, mean, rstd = op(x.detach(), [3, 12], w.detach(), b.detach(), 1e-5, False)
    g = torch.randn_like(y)
    torch.library.opcheck(
        tilewise.functional._layer_norm_backward_op,
        (g, x.detach(), [3, 12], w.detach(), b.detach(), mean, rstd, False),
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_compile_fullgraph(device, rng_seed):
    backend = "inductor" if device == "cuda" else "aot_eager"  # CPU: no C++ build in CI
    m = tilewise.nn.LayerNorm(32, relu=True).to(device)
    x = torch.randn(8, 32, device=device, requires_grad=True)
    compiled = torch.compile(lambda t: m(t * 3.0).square().sum(), backend=backend, fullgraph=True)
    out = compiled(x)
    out.backward()
    gx, gw = x.grad.clone(), m.weight.grad.clone()
    x.grad = None
    m.weight.grad = None
    ref = m(x * 3.0).square().sum()
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, m.weight.grad)


def test_module_drop_in_shares_parameters(rng_seed):
    base = torch.nn.LayerNorm((4, 6))
    with torch.no_grad():
        base.weight.normal_()
        base.bias.normal_()
    m = tilewise.nn.LayerNorm.from_torch(base)
    assert m.weight is base.weight and m.bias is base.bias
    assert isinstance(m, torch.nn.LayerNorm)
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(m(x), base(x))
    fused = tilewise.nn.LayerNorm((4, 6), relu=True, bias=False)
    torch.testing.assert_close(
        fused(x), torch.relu(torch.nn.functional.layer_norm(x, (4, 6), fused.weight))
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.nn.LayerNorm(6), tilewise.nn.LayerNorm.from_torch),
        lambda: (torch.nn.Linear(6, 6), tilewise.nn.Linear.from_linear),
        lambda: (torch.nn.Conv2d(8, 8, 3, groups=1), tilewise.nn.GroupedConv2d.from_conv),
    ],
    ids=["layernorm", "linear", "gconv"],
)
def test_drop_ins_share_parameters_but_not_hooks(make):
    """A drop-in built from a module shares its Parameter objects but not its per-module dicts:
    a hook or a parameter registered on one is not on the other (LayerNorm.from_torch shared
    them until session 15's fix)."""
    base, convert = make()
    new = convert(base)
    assert all(a is b for a, b in zip(new.parameters(), base.parameters(), strict=True))
    seen = []
    new.register_forward_hook(lambda *a: seen.append("new"))
    new.register_forward_pre_hook(lambda *a: seen.append("pre"))
    new.register_parameter("extra", torch.nn.Parameter(torch.zeros(1)))
    assert not base._forward_hooks and not base._forward_pre_hooks
    assert "extra" not in dict(base.named_parameters())
    base.register_forward_hook(lambda *a: seen.append("base"))
    assert len(new._forward_hooks) == 1
    new.register_buffer("stat", torch.zeros(1), persistent=False)
    assert "stat" not in base._non_persistent_buffers_set
    base.register_buffer("stat", torch.zeros(1))  # persistent on the original only
    assert "stat" not in new.state_dict() and "stat" in base.state_dict()
    param = make()[0]
    torch.nn.utils.parametrize.register_parametrization(param, "weight", torch.nn.Identity())
    with pytest.raises(ValueError, match="parametrized"):
        convert(param)


def test_long_row_with_inf_is_all_nan():
    """Rows past the one-tile kernel (n > 16384) take the looped kernel, whose variance is
    E[x^2] - E[x]^2: with an Inf in the row that is Inf - Inf = NaN, which must reach every
    output of the row as in PyTorch (a plain maximum once clamped it to 0)."""
    x = torch.randn(2, 20000)
    x[1, 5] = float("inf")
    y = tilewise.layer_norm(x, (20000,))
    want = torch.nn.functional.layer_norm(x, (20000,))
    assert torch.equal(y.isnan(), want.isnan()) and bool(y[1].isnan().all())
    torch.testing.assert_close(y[0], want[0], rtol=1e-4, atol=1e-4)


def test_empty_normalized_shape():
    """normalized_shape (0,): an empty output and gradient, as F.layer_norm gives."""
    x = torch.randn(5, 0, requires_grad=True)
    y = tilewise.layer_norm(x, (0,))
    y.sum().backward()
    assert y.shape == (5, 0) and x.grad.shape == (5, 0)
