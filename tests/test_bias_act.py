"""Fused bias + activation: forward and gradients against fp64, layouts, fallbacks, bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from checks import ATOL, DEVICE_DTYPES, assert_three_way, deterministic_algorithms, leaf

import tilewise
from tilewise.ops import _common
from tilewise.ops import bias_act as ops
from tilewise.runtime import alloc, dispatch

ACTS = ["none", "relu", "gelu", "silu"]
SHAPES = [(1, 1), (3, 5), (37, 19), (2, 3, 130), (5, 64)]
GPU_SHAPES = [(4097, 4096), (3, 100_003), (1000, 77)]


def _run_case(x0, b0, activation, dim, dtype, seed):
    """Forward + backward through tilewise, torch in ``dtype`` and torch in fp64; judge all."""
    grad = torch.randn_like(x0, dtype=dtype)
    outs = {}
    for name, dt, fn in (
        ("tw", dtype, tilewise.bias_act),
        ("torch", dtype, ops.reference),
        ("ref", torch.float64, ops.reference),
    ):
        x, b = leaf(x0, dt), (leaf(b0, dt) if b0 is not None else None)
        if name == "tw" and x0.dim() == 4 and x0.is_contiguous(memory_format=torch.channels_last):
            x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
        y = fn(x, b, activation, dim)
        y.backward(grad.to(dt))
        outs[name] = (y, x.grad, b.grad if b is not None else None)
    atol = ATOL[dtype]
    for i, what in enumerate(("y", "dx", "dbias")):
        if outs["tw"][i] is None:
            continue
        scale = x0.numel() / x0.shape[dim] if what == "dbias" else 1.0
        assert_three_way(
            outs["tw"][i],
            outs["torch"][i],
            outs["ref"][i],
            atol * max(1.0, scale**0.5),
            f"bias_act {activation} {what}",
            seed,
        )


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("has_bias", [True, False])
def test_forward_backward(device, dtype, activation, has_bias, rng_seed):
    shapes = SHAPES if device == "cpu" else SHAPES + GPU_SHAPES
    for shape in shapes:
        x = torch.randn(shape, device=device, dtype=dtype)
        b = torch.randn(shape[-1], device=device, dtype=dtype) if has_bias else None
        _run_case(x, b, activation, -1, dtype, rng_seed)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_deterministic_mode_sums_partials_in_order(device, dtype, rng_seed):
    """PyTorch's deterministic mode takes the stored-partials path: judged by the same rule, and
    bit-identical from call to call."""
    shapes = [(37, 19), (5, 64)] if device == "cpu" else [(4097, 4096), (1000, 77)]
    with deterministic_algorithms():
        for shape in shapes:
            x = torch.randn(shape, device=device, dtype=dtype)
            b = torch.randn(shape[-1], device=device, dtype=dtype)
            _run_case(x, b, "gelu", -1, dtype, rng_seed)
            dy = torch.randn_like(x)
            first, again = (ops.backward(dy, x, b, "gelu") for _ in range(2))
            assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_atomic_sum_over_accumulator_copies(device, dtype, monkeypatch, rng_seed):
    """Programs spread their atomics over several accumulator copies that the last one sums."""
    monkeypatch.setattr(ops, "atomic_slots", lambda *_: 4)
    for shape in [(37, 19), (130, 64)] if device == "cpu" else [(4097, 4096)]:
        x = torch.randn(shape, device=device, dtype=dtype)
        b = torch.randn(shape[-1], device=device, dtype=dtype)
        _run_case(x, b, "silu", -1, dtype, rng_seed)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize(
    "kernel,variant",
    [
        ("bias_act_bwd", dict(prefetch=False)),
        ("bias_act_bwd", dict(prefetch=True)),
        ("bias_act_bwd", dict(stages=3)),
        ("bias_act_bwd", dict(stages=2, num_warps=8)),
        ("bias_act_fwd", dict(stages=2, progs_per_sm=1)),
        ("bias_act_fwd", dict(stages=4, block_m=2)),
        ("bias_act_fwd", dict(streaming=True)),
        ("bias_act_bwd", dict(prefetch=True, streaming=True)),
        ("bias_act_bwd", dict(stages=3, streaming=True)),
    ],
    ids=[
        "bwd-plain",
        "bwd-prefetch",
        "bwd-stages3",
        "bwd-stages2-8warps",
        "fwd-persistent2",
        "fwd-persistent4",
        "fwd-streaming",
        "bwd-prefetch-streaming",
        "bwd-stages3-streaming",
    ],
)
def test_launch_variants(device, dtype, kernel, variant, monkeypatch, rng_seed):
    """Configs that tuning sweeps pick among give the same outputs and gradients: the backward's
    plain, register-prefetched (the fp32 default) and software-pipelined (the half-precision
    default) row loops; a persistent forward
    grid walking several row blocks per program through a pipelined loop; evict-first loads and
    streaming stores in either pass."""

    def override(m, n, elem, variant=variant):
        return replace(_common.TileConfig(4, 32, 4, progs_per_sm=2), **variant)

    monkeypatch.setitem(_common.CONFIG_OVERRIDES, kernel, override)
    for shape in [(37, 19), (130, 64)] if device == "cpu" else [(4097, 4096), (1000, 77)]:
        x = torch.randn(shape, device=device, dtype=dtype)
        b = torch.randn(shape[-1], device=device, dtype=dtype)
        _run_case(x, b, "silu" if kernel.endswith("fwd") else "gelu", -1, dtype, rng_seed)


@pytest.mark.gpu
def test_atomic_bias_grad_is_complete_on_every_call(rng_seed):
    """The last program of each column block casts the atomically summed bias gradient; a missed
    partial (a memory-ordering bug) would show as a large error on some call."""
    x = torch.randn(4097, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, device="cuda", dtype=torch.float16)
    dy = torch.randn_like(x)
    with deterministic_algorithms():
        _, want = ops.backward(dy, x, b, "relu")
    for _ in range(50):
        _, got = ops.backward(dy, x, b, "relu")
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=0.25)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_channels_last_bias_on_dim1(device, dtype, rng_seed):
    x = torch.randn(2, 6, 3, 5, device=device, dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    b = torch.randn(6, device=device, dtype=dtype)
    assert dispatch.use_kernel("bias_act", [x]) == (device == "cuda" or dispatch.INTERPRET)
    assert ops._rows_view(x, 1) is not None, "channels_last with dim=1 must take the kernel path"
    _run_case(x, b, "silu", 1, dtype, rng_seed)


@pytest.mark.parametrize("layout", ["nchw_dim1", "transposed"])
def test_unsupported_layouts_fall_back_correctly(layout, caplog, rng_seed):
    x = torch.randn(2, 6, 3, 5) if layout == "nchw_dim1" else torch.randn(7, 9).t()
    dim = 1 if layout == "nchw_dim1" else -1
    assert ops._rows_view(x, dim) is None
    b = torch.randn(x.shape[dim])
    with caplog.at_level("WARNING", logger="tilewise"):
        _run_case(x, b, "gelu", dim, torch.float32, rng_seed)


def test_mixed_precision_fp32_bias(rng_seed):
    x = torch.randn(9, 24, dtype=torch.float16)
    b = torch.randn(24, dtype=torch.float32)
    y = tilewise.bias_act(x, b, "relu")
    assert y.dtype == torch.float16
    ref = torch.relu(x.double() + b.double())
    torch_same = torch.relu(x + b.half())
    assert_three_way(y, torch_same, ref, ATOL[torch.float16], "mixed bias", rng_seed)


@pytest.mark.parametrize("activation", ACTS)
def test_nan_inf_propagate(activation):
    x = torch.randn(4, 8)
    x[0, 1], x[1, 2], x[2, 3] = float("nan"), float("inf"), float("-inf")
    b = torch.zeros(8)
    y = tilewise.bias_act(x, b, activation)
    expect = ops.reference(x, b, activation)
    assert torch.isnan(y[0, 1])
    if activation in ("none", "relu"):  # gelu/silu at +-inf differ between PyTorch backends
        assert torch.equal(y.isnan(), expect.isnan()) and torch.equal(y.isinf(), expect.isinf())
    finite = torch.ones_like(x, dtype=torch.bool)
    finite[0, 1] = finite[1, 2] = finite[2, 3] = False
    torch.testing.assert_close(y[finite], expect[finite])


def test_bad_input_names_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.bias_act(x, torch.randn(7))
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.bias_act(x, torch.randn(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="'bias'"):
        tilewise.bias_act(x, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="'activation'"):
        tilewise.bias_act(x, torch.randn(8), "tanh")
    with pytest.raises(ValueError, match="'dim'"):
        tilewise.bias_act(x, torch.randn(8), "relu", dim=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU runs do not use the interpreter")
def test_kernel_runs_on_cpu_interpreter():
    """CPU tests must exercise the Triton kernel, not the reference."""
    x = torch.randn(3, 8)
    assert dispatch.INTERPRET, "tests must run with TRITON_INTERPRET=1 on CPU"
    assert dispatch.use_kernel("bias_act", [x])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck(device):
    x = torch.randn(5, 12, device=device, requires_grad=True)
    b = torch.randn(12, device=device, requires_grad=True)
    torch.library.opcheck(tilewise.functional._bias_act_op, (x, b, "gelu", -1))
    torch.library.opcheck(tilewise.functional._bias_act_op, (x, None, "relu", -1))
    g = torch.randn(5, 12, device=device)
    torch.library.opcheck(
        tilewise.functional._bias_act_backward_op, (g, x.detach(), b.detach(), "silu", -1)
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_compile_fullgraph(device, rng_seed):
    backend = "inductor" if device == "cuda" else "aot_eager"  # CPU: no C++ build in CI

    def f(x, b):
        return tilewise.bias_act(x * 2.0, b, "silu").sum()

    x = torch.randn(6, 16, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    out = compiled(x, b)
    out.backward()
    gx, gb = x.grad.clone(), b.grad.clone()
    x.grad = b.grad = None
    f(x, b).backward()
    torch.testing.assert_close(out, f(x, b))
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gb, b.grad)


def test_module_drop_in(rng_seed):
    m = tilewise.nn.BiasAct(10, activation="gelu")
    with torch.no_grad():
        m.bias.normal_()
    x = torch.randn(3, 10)
    torch.testing.assert_close(m(x), torch.nn.functional.gelu(x + m.bias))
    with pytest.raises(ValueError, match="'activation'"):
        tilewise.nn.BiasAct(10, activation="bad")


@pytest.mark.parametrize("activation", ["gelu", "silu"])
@pytest.mark.parametrize("device,dtype", [p for p in DEVICE_DTYPES if "float32" not in p.id])
def test_half_precision_tails(device, dtype, activation):
    """Half-precision GELU and SiLU take approximate forms (GELU's polynomial normal CDF sharing
    the density's exp; on a GPU one-instruction ex2/rcp approximations for both, which flush
    subnormal results): over z in [-100, 100], where exp over- and underflows, plus +-inf and
    NaN, both passes stay within the three-way rule of fp64 and propagate non-finite values as
    PyTorch does."""
    z = torch.linspace(-100.0, 100.0, 8199, device=device)
    z = torch.cat([z, torch.linspace(-12.0, 10.0, 4099, device=device)]).to(dtype)
    dy = torch.full_like(z, 1.5)
    # non-finite inputs: the same outputs as PyTorch's in the same dtype (NaN where it has NaN)
    odd = torch.tensor([float("inf"), -float("inf"), float("nan")], device=device).to(dtype)
    z_all, dy_all = torch.cat([z, odd]).reshape(1, -1), torch.full((1, z.numel() + 3), 1.5)
    with alloc.poison_outputs():
        y = ops.forward(z_all, None, activation).flatten()
        dx, _ = ops.backward(dy_all.to(device, dtype), z_all, None, activation)
    dx = dx.flatten()
    y_odd, dx_odd, y, dx = y[-3:], dx[-3:], y[:-3], dx[:-3]
    want_y = _common.act_reference(odd, activation)
    want_dx = _common.act_grad_reference(torch.full_like(odd, 1.5), odd, activation)
    for got, want, what in ((y_odd, want_y, "forward"), (dx_odd, want_dx, "backward")):
        torch.testing.assert_close(got, want, equal_nan=True, msg=f"{activation} {what} at inf/nan")
    z64 = z.double()
    ref = _common.act_reference(z64, activation)
    ref_grad = _common.act_grad_reference(dy.double(), z64, activation)
    same = _common.act_reference(z.float(), activation).to(dtype)
    same_grad = _common.act_grad_reference(dy.float(), z.float(), activation).to(dtype)
    name = f"{activation} {{}} tails"
    assert_three_way(y, same, ref, ATOL[dtype], name.format("forward"), ulps=1)
    assert_three_way(dx, same_grad, ref_grad, ATOL[dtype], name.format("backward"), ulps=1)
    # The tails' values are far below atol, so also hold every finite output to its own scale:
    # one unit of the dtype's precision at |ref| plus 1e-6 (a correctly rounded value is within
    # half of that; the approximate forms add <= 3e-7). A CDF cut to 0 below z = -3, or off by
    # 1e-4, fails this.
    eps = torch.finfo(dtype).eps
    for got, r, what in ((y, ref, "forward"), (dx, ref_grad, "backward")):
        keep = torch.isfinite(r)
        err = (got.double() - r).abs()[keep]
        bound = eps * r.abs()[keep] + 1e-6
        worst = int((err - bound).argmax())
        assert bool((err <= bound).all()), (
            f"{activation} {what} at z={z[keep].flatten()[worst].item():.3f}: "
            f"err {err.flatten()[worst]:.3e} > {bound.flatten()[worst]:.3e}"
        )


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_strided_and_expanded_bias(activation):
    """A bias with stride 2 or stride 0 (expanded) gives PyTorch's output and gradients (the
    kernels index the bias element by element; session 14 found both wrong before the copy)."""
    x0, dy = torch.randn(5, 6), torch.randn(5, 6)
    for base0, view in (
        (torch.randn(12), lambda t: t[::2]),
        (torch.randn(1), lambda t: t.expand(6)),
    ):
        grads = []
        for fn in (tilewise.bias_act, ops.reference):
            x, base = x0.clone().requires_grad_(), base0.clone().requires_grad_()
            y = fn(x, view(base), activation)
            y.backward(dy)
            grads.append((y.detach(), x.grad, base.grad))
        for got, want in zip(*grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fallback_keeps_the_input_dtype_with_an_fp32_bias():
    """fp16 x with an fp32 bias: fp16 out on the kernel path, and also where the layout or an
    empty batch sends the call to the reference (which once returned fp32 there)."""
    b = torch.randn(40)
    for x in (
        torch.randn(6, 40, dtype=torch.float16),
        torch.randn(40, 6, dtype=torch.float16).t(),
        torch.randn(0, 40, dtype=torch.float16),
    ):
        y = tilewise.bias_act(x, b, "gelu")
        assert y.dtype == torch.float16
        want = torch.nn.functional.gelu(x.float() + b).half()
        torch.testing.assert_close(y, want, rtol=2e-3, atol=2e-3)
