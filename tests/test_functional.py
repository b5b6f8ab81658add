"""The public functions' two routes: the eager fast path (autograd.Function over the op bodies)
and the custom ops (what torch.compile, modes and transforms see) must agree bit for bit."""

from __future__ import annotations

import pytest
import torch
from checks import leaf
from torch.overrides import TorchFunctionMode

import tilewise
from tilewise import functional as tf


class _Passthrough(TorchFunctionMode):
    """A function mode that changes nothing, but forces the custom-op route."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _cases():
    """(name, fn(*leaves) -> output, input factory) for each public op, tiny CPU shapes."""
    x2 = lambda: torch.randn(5, 12)  # noqa: E731
    return [
        ("bias_act", lambda x, b: tf.bias_act(x, b, "gelu"), lambda: (x2(), torch.randn(12))),
        (
            "layer_norm",
            lambda x, w, b: tf.layer_norm(x, 12, w, b, relu=True),
            lambda: (x2(), torch.randn(12), torch.randn(12)),
        ),
        (
            "linear",
            lambda x, w, b: tf.linear(x, w, b, "silu"),
            lambda: (torch.randn(5, 16), torch.randn(12, 16), torch.randn(12)),
        ),
        (
            "grouped_conv2d",
            lambda x, w, b: tilewise.grouped_conv2d(x, w, b, padding=1),
            lambda: (
                torch.randn(2, 16, 5, 4).contiguous(memory_format=torch.channels_last),
                torch.randn(16, 8, 3, 3) * 0.2,
                torch.randn(16),
            ),
        ),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_eager_route_matches_custom_op_route(case):
    name, fn, make = case
    inputs = make()
    grad_out = None
    results = []
    for forced in (False, True):
        leaves = [leaf(t) for t in inputs]
        if forced:
            with _Passthrough():
                assert not tf._eager(*leaves)
                out = fn(*leaves)
        else:
            assert tf._eager(*leaves)
            out = fn(*leaves)
        if grad_out is None:
            grad_out = torch.randn_like(out)
        out.backward(grad_out)
        results.append([out.detach()] + [t.grad for t in leaves])
    for a, b in zip(*results, strict=True):
        assert a is not None and b is not None, name
        assert torch.equal(a, b), f"{name}: eager and custom-op routes differ"


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_double_backward_raises_instead_of_a_wrong_answer(case):
    """The fused backward is not differentiable: create_graph must fail loudly (the eager route
    refuses create_graph itself: the graph of a gradient once silently lacked the op's
    second-order terms when the incoming gradient did not require grad)."""
    name, fn, make = case
    leaves = [leaf(t) for t in make()]
    out = fn(*leaves)
    with pytest.raises(RuntimeError):
        (g,) = torch.autograd.grad(out.sum(), leaves[0], create_graph=True)
        g.sum().backward()


def test_eager_route_refused_for_subclasses_and_transforms():
    x = torch.randn(3, 4)

    class Sub(torch.Tensor):
        pass

    assert tf._eager(x, None)
    assert not tf._eager(x.as_subclass(Sub))
    seen = []

    def probe(t):
        seen.append(tf._eager(t))
        return t.sum()

    torch.func.grad(probe)(x)
    assert seen == [False]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_batched_grads_through_the_eager_route(case):
    """A graph built on the eager route, differentiated with batched grads (vmap inside the
    backward): the backward must take the custom op, not the body that cannot read batched
    tensors."""
    name, fn, make = case
    leaves = [leaf(t) for t in make()]
    out = fn(*leaves)
    basis = torch.randn(3, *out.shape)
    (g,) = torch.autograd.grad(out, leaves[0], basis, is_grads_batched=True, retain_graph=True)
    for i in range(3):
        (gi,) = torch.autograd.grad(out, leaves[0], basis[i], retain_graph=True)
        torch.testing.assert_close(g[i], gi, msg=name)


def test_backward_does_not_zero_fill_the_extra_outputs_grads():
    """LayerNorm's mean/rstd and Linear's pre-activation never get a gradient: the eager route
    must not materialize zeros for them (a fill launch per backward, a full-size one for
    Linear's saved pre-activation)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = leaf(torch.randn(6, 16))
    w, b = leaf(torch.randn(16)), leaf(torch.randn(16))
    lw, lb = leaf(torch.randn(8, 16)), leaf(torch.randn(8))
    for y in (tilewise.layer_norm(x, 16, w, b), tilewise.linear(x, lw, lb, "gelu")):
        log = Log()
        with log:
            y.backward(torch.ones_like(y))
        fills = [op for op in log.ops if "zero" in op or "fill" in op]
        assert not fills, fills


def test_backward_through_an_op_whose_output_gets_no_gradient():
    """A downstream Function that returns no gradient for tilewise's output: the eager route's
    backward runs with an undefined gradient and must give None, not fail."""

    class Drop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, z):
            return z * 2

        @staticmethod
        def backward(ctx, grad):
            return None, grad * 2

    x = leaf(torch.randn(6, 16))
    w, b = leaf(torch.randn(16)), leaf(torch.randn(16))
    z = leaf(torch.randn(3))
    for y in (tilewise.layer_norm(x, 16, w, b), tilewise.bias_act(x, b, "gelu")):
        Drop.apply(y, z).sum().backward()
        assert x.grad is None and b.grad is None and z.grad is not None


def _op_cases():
    """(name, tilewise call, PyTorch call, input) for the four public ops."""
    import torch.nn.functional as F

    w, b = torch.randn(12, 12) / 4, torch.randn(12)
    cw, cb = torch.randn(16, 8, 3, 3) / 8, torch.randn(16)
    x, xc = torch.randn(4, 12), torch.randn(2, 16, 6, 6).to(memory_format=torch.channels_last)
    return [
        ("bias_act", lambda t: tilewise.bias_act(t, b, "gelu"), lambda t: F.gelu(t + b), x),
        (
            "layer_norm",
            lambda t: tilewise.layer_norm(t, 12, b, b, relu=True),
            lambda t: F.relu(F.layer_norm(t, (12,), b, b)),
            x,
        ),
        (
            "linear",
            lambda t: tilewise.linear(t, w, b, "silu"),
            lambda t: F.silu(F.linear(t, w, b)),
            x,
        ),
        (
            "grouped_conv2d",
            lambda t: tilewise.grouped_conv2d(t, cw, cb, padding=1),
            lambda t: F.conv2d(t, cw, cb, padding=1, groups=2),
            xc,
        ),
    ]


@pytest.mark.parametrize("case", range(4), ids=["bias_act", "layer_norm", "linear", "gconv"])
def test_forward_mode_ad_matches_pytorch(case):
    """torch.func.jvp and forward_ad dual tensors through each op give PyTorch's tangent (the
    custom ops have no forward-mode rule: jvp once returned zero tangents)."""
    from torch.autograd import forward_ad

    _, tw, ref, x = _op_cases()[case]
    tangent = torch.randn_like(x)
    got = torch.func.jvp(tw, (x,), (tangent,))[1]
    want = torch.func.jvp(ref, (x,), (tangent,))[1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert want.abs().sum() > 0
    with forward_ad.dual_level():
        dual = tw(forward_ad.make_dual(x, tangent))
        torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", range(4), ids=["bias_act", "layer_norm", "linear", "gconv"])
def test_torch_func_grad_and_vmap_match_pytorch(case):
    """torch.func.grad (with functional_call, over parameters and inputs) and vmap through each
    op give PyTorch's results; grad once raised a RuntimeError about setup_context from inside
    the custom op's generated autograd (session 14 audit finding)."""
    _, tw, ref, x = _op_cases()[case]
    got = torch.func.grad(lambda t: tw(t).square().sum())(x)
    want = torch.func.grad(lambda t: ref(t).square().sum())(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert want.abs().sum() > 0
    xs = torch.stack([x, 2 * x])
    torch.testing.assert_close(torch.func.vmap(tw)(xs), torch.func.vmap(ref)(xs), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    lin = tilewise.nn.Linear(12, 5, activation="relu")
    params = dict(lin.named_parameters())
    inp = torch.randn(3, 12)
    g = torch.func.grad(lambda p: torch.func.functional_call(lin, p, (inp,)).sum())(params)
    lin(inp).sum().backward()
    for k, p in params.items():
        torch.testing.assert_close(g[k], p.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", range(4), ids=["bias_act", "layer_norm", "linear", "gconv"])
def test_compiled_transforms_match_pytorch(case):
    """torch.compile around jvp, grad and vmap through each op gives PyTorch's results (compiled
    jvp once returned zero tangents and compiled grad raised: Dynamo hides which transform is
    active, so under compile every transform runs the reference; fullgraph: no graph break)."""
    _, tw, ref, x = _op_cases()[case]
    tangent = torch.randn_like(x)
    torch._dynamo.reset()
    jvp = torch.compile(lambda f, t, d: torch.func.jvp(f, (t,), (d,))[1], fullgraph=True)
    want = torch.func.jvp(ref, (x,), (tangent,))[1]
    torch.testing.assert_close(jvp(tw, x, tangent), want, rtol=1e-4, atol=1e-4)
    assert want.abs().sum() > 0
    grad = torch.compile(
        lambda f, t: torch.func.grad(lambda u: f(u).square().sum())(t), fullgraph=True
    )
    want = torch.func.grad(lambda u: ref(u).square().sum())(x)
    torch.testing.assert_close(grad(tw, x), want, rtol=1e-4, atol=1e-4)
    xs = torch.stack([x, 2 * x])
    vmap = torch.compile(lambda f, t: torch.func.vmap(f)(t), fullgraph=True)
    torch.testing.assert_close(vmap(tw, xs), torch.func.vmap(ref)(xs), rtol=1e-4, atol=1e-4)


def test_linear_follows_autocast():
    """Under autocast a tilewise linear computes and returns the autocast dtype, as F.linear."""
    lin = tilewise.nn.Linear(12, 12, activation="relu")
    x = torch.randn(4, 12)
    with torch.autocast("cpu", dtype=torch.float16):
        y = lin(x)
        want = torch.nn.Linear(12, 12)(x)
    assert y.dtype == want.dtype == torch.float16


def test_grouped_conv2d_takes_an_unbatched_input():
    """[C, H, W] input, as F.conv2d and nn.Conv2d take it (the result of the batched call)."""
    conv = tilewise.nn.GroupedConv2d(16, 16, 3, padding=1, groups=2)
    ref = torch.nn.Conv2d(16, 16, 3, padding=1, groups=2)
    ref.load_state_dict(conv.state_dict())
    x = torch.randn(16, 5, 6, requires_grad=True)
    y = conv(x)
    assert y.shape == (16, 5, 6)
    torch.testing.assert_close(y, ref(x), rtol=1e-4, atol=1e-4)
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_ref,) = torch.autograd.grad(ref(x).sum(), x)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4)
