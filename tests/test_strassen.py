"""Fused Strassen chains: each kernel against its torch reference, whole chains against fp64 by
the three-way rule, the 2N+1 structure, the StrassenMLP module, selection, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from checks import ATOL, DEVICE_DTYPES, allow_tf32, assert_three_way, fake_gpu_autotuner
from torch import nn

import tilewise
from tilewise.nn.strassen import StrassenMLP
from tilewise.ops import strassen as ops
from tilewise.runtime import dispatch

# (x shape, out_features per layer): odd and even sizes so every padding case is hit
SHAPES = [
    ((1, 1), [1]),
    ((3, 6), [7]),
    ((7, 10), [3, 6]),
    ((10, 7), [1, 10, 3]),
    ((2, 3, 5), [6, 7]),
]
GPU_SHAPES = [((512, 4096), [4096] * 2), ((513, 4097), [4095]), ((1024, 4096), [4096] * 8)]


def _chain(x_shape, outs, device, has_bias=True):
    """Random input and He-scaled layers (values stay O(1) through ReLU); last layer linear."""
    k = x_shape[-1]
    x = torch.randn(x_shape, device=device)
    ws, bs = [], []
    for n in outs:
        ws.append(torch.randn(n, k, device=device) * (2.0 / k) ** 0.5)
        bs.append(torch.randn(n, device=device) * 0.5 if has_bias else None)
        k = n
    acts = ["relu"] * (len(outs) - 1) + ["none"]
    return x, ws, bs, acts


def _cast(ts, dtype):
    return [None if t is None else t.to(dtype) for t in ts]


def _atol(dtype: torch.dtype, ref: torch.Tensor, k: int = 1) -> float:
    """fp32: test_linear's GEMM tolerance, ``ATOL * sqrt(K) * rms``. (Without the sqrt(K) factor
    the H100 run failed at K = 4096, 2 layers: 69 of 2M outputs at 2.6e-5 against a 1.6e-5 bound;
    one-level Strassen's fp32 error is ~2x cuBLAS's, as the CPU measurements also show.)

    fp16/bf16 miss the usual rule (test_linear's ``ATOL * sqrt(K) * rms`` failed ~0.6% of the
    tiny CPU cases): operands, formatted weights and products are rounded to half precision at
    the magnitude of the Strassen sums, so the error is ~3.5x PyTorch's in RMS, a few ulps of the
    largest outputs, independent of K. Half precision is judged with ``4 * ATOL * max|ref|``
    (0 failures in 5000 measured tiny cases; needed <= 1.1 units at K = 1024-4097).
    """
    if dtype == torch.float32:
        return ATOL[dtype] * k**0.5 * max(1.0, ref.double().square().mean().sqrt().item())
    return 4 * ATOL[dtype] * max(1.0, ref.double().abs().max().item())


def _judge_chain(x0, ws0, bs0, acts, dtype, seed, groups=None):
    x, ws, bs = x0.to(dtype), _cast(ws0, dtype), _cast(bs0, dtype)
    outs = [w.shape[0] for w in ws]
    blocks = [ops.format_weights(w) for w in ws]
    y = ops.forward(x, blocks, bs, acts, [x.shape[-1], *outs], groups=groups)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], outs[-1])
    y_torch = ops.reference(x, ws, bs, acts)
    ref = ops.reference(x.double(), _cast(ws, torch.float64), _cast(bs, torch.float64), acts)
    k = max(x.shape[-1], *outs)
    assert_three_way(y, y_torch, ref, _atol(dtype, ref, k), f"strassen {len(ws)} layers", seed)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("has_bias", [True, False])
def test_chain_matches_fp64(device, dtype, has_bias, rng_seed):
    shapes = SHAPES if device == "cpu" else SHAPES + GPU_SHAPES
    for x_shape, outs in shapes:
        x, ws, bs, acts = _chain(x_shape, outs, device, has_bias)
        _judge_chain(x, ws, bs, acts, dtype, rng_seed)


@pytest.mark.gpu
@pytest.mark.parametrize("layers", [1, 4])
def test_fp32_tf32_off_large(layers, rng_seed):
    """The benchmark's setting: fp32, TF32 off, hidden 4096, batch >= 512."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for batch in (512, 2048):
            x, ws, bs, acts = _chain((batch, 4096), [4096] * layers, "cuda")
            _judge_chain(x, ws, bs, ["relu"] * layers, torch.float32, rng_seed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefix_kernel_matches_reference(dtype):
    for m, k in ((1, 1), (3, 6), (7, 10), (10, 7)):
        x = torch.randn(m, k).to(dtype)
        p = ops.prefix(x)
        assert p.shape == (7, (m + 1) // 2, (k + 1) // 2)
        assert torch.equal(p, ops.prefix_reference(x))
        xt = torch.randn(k, m).to(dtype).t()  # a transposed view, read in place
        assert torch.equal(ops.prefix(xt), ops.prefix_reference(xt.contiguous()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("activation", ["relu", "none", "gelu"])
@pytest.mark.parametrize("to_prefix", [False, True])
def test_suffix_kernel_matches_reference(dtype, activation, to_prefix):
    # same operation order as the reference; gelu's erf differs by ulps between Triton and torch
    fp32_atol = 1e-5 if activation == "gelu" else 1e-6
    tol = (
        {"rtol": 1e-6, "atol": fp32_atol}
        if dtype == torch.float32
        else {"rtol": 1e-3, "atol": 1e-3}
    )
    for m, n in ((1, 1), (3, 6), (7, 10), (10, 7)):
        mh, nh = (m + 1) // 2, (n + 1) // 2
        mprod = torch.randn(7, mh, nh).to(dtype)
        for bias in (torch.randn(n).to(dtype), torch.randn(n), None):  # fp32 bias: mixed
            got = ops.suffix(mprod, bias, activation, m, n, to_prefix)
            want = ops.suffix_reference(mprod, bias, activation, m, n, to_prefix)
            assert got.shape == want.shape == ((7, mh, nh) if to_prefix else (m, n))
            torch.testing.assert_close(got, want, **tol)


def test_next_layer_padding_is_exact_zero():
    """With odd M and N the next layer's padded row and column must be 0, not act(bias)."""
    m, n = 5, 7
    mprod = torch.randn(7, 3, 4)
    p = ops.suffix(mprod, torch.ones(n), "relu", m, n, to_prefix=True)
    # P = [A11+A22, A21+A22, A11, A22, A11+A12, A21-A11, A12-A22]; the padding sits in row 2 of
    # A21/A22 and column 3 of A12/A22
    a11, a22 = p[2], p[3]
    a12, a21 = p[4] - a11, p[5] + a11
    assert torch.equal(a22[-1], torch.zeros(4)) and torch.equal(a22[:, -1], torch.zeros(3))
    assert torch.equal(a21[-1], torch.zeros(4)) and torch.equal(a12[:, -1], torch.zeros(3))
    assert torch.equal(p[6][:, -1], torch.zeros(3)) and torch.equal(p[1][-1], torch.zeros(4))


def test_format_weights_and_algebra(monkeypatch):
    monkeypatch.delenv("TILEWISE_FP32_TENSOR_CORES", raising=False)
    w = torch.randn(5, 7, dtype=torch.float64)
    f = ops.format_weights(w)
    assert f.shape == (7, 3, 4) and f.dtype == torch.float64
    assert f.transpose(1, 2).is_contiguous()  # stored K-major: NN GEMMs for the products
    wp = torch.zeros(6, 8, dtype=torch.float64)
    wp[:5, :7] = w
    w11, w12, w21, w22 = wp[:3, :4], wp[:3, 4:], wp[3:, :4], wp[3:, 4:]
    torch.testing.assert_close(f[0], w11 + w22, rtol=0, atol=0)
    torch.testing.assert_close(f[2], w21 - w22, rtol=0, atol=0)
    torch.testing.assert_close(f[3], w12 - w11, rtol=0, atol=0)
    assert ops.format_weights(w.half()).dtype == torch.float16
    # "nt": contiguous (K fastest), the tensor-core fp32 products' layout; the default for fp32
    # with TF32 off, where they are offered
    nt = ops.format_weights(w, layout="nt")
    assert nt.is_contiguous() and torch.equal(nt, f)
    with allow_tf32(False):
        assert ops.format_weights(w.float()).is_contiguous()
        assert ops.format_weights(w.half()).transpose(1, 2).is_contiguous()
    with allow_tf32(True):
        assert ops.format_weights(w.float()).transpose(1, 2).is_contiguous()
    with pytest.raises(ValueError, match="'layout'"):
        ops.format_weights(w, layout="tn")
    # the Strassen algebra in fp64 equals the plain chain (rounding only)
    x, ws, bs, acts = _chain((9, 7), [5, 4, 3], "cpu")
    ws, bs, x = _cast(ws, torch.float64), _cast(bs, torch.float64), x.double()
    blocks = [ops.format_weights(w) for w in ws]
    got = ops.strassen_reference(x, blocks, bs, acts, [7, 5, 4, 3])
    torch.testing.assert_close(got, ops.reference(x, ws, bs, acts), rtol=1e-12, atol=1e-12)


def test_chain_is_2n_plus_1_kernels(monkeypatch):
    calls = {"prefix": 0, "products": 0, "suffix": 0}
    for name in calls:
        real = getattr(ops, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(ops, name, counted)
    x, ws, bs, acts = _chain((6, 4), [4, 5, 3], "cpu")
    ops.forward(x, [ops.format_weights(w) for w in ws], bs, acts, [4, 4, 5, 3])
    assert calls == {"prefix": 1, "products": 3, "suffix": 3}


def test_kernel_paths_on_cpu_interpreter():
    if torch.cuda.is_available():
        pytest.skip("GPU runs do not use the interpreter")
    assert dispatch.INTERPRET and dispatch.use_kernel(ops.OP, [torch.randn(2, 2)])


def test_nan_reaches_its_row_and_empty_batch():
    x, ws, bs, acts = _chain((6, 5), [4, 3], "cpu")
    blocks = [ops.format_weights(w) for w in ws]
    x[1, 2] = float("nan")
    y = ops.forward(x, blocks, bs, acts, [5, 4, 3])
    assert torch.isnan(y[1]).all()  # (row 1 + 3, its Strassen partner, may be NaN too)
    empty = ops.forward(torch.randn(0, 5), blocks, bs, acts, [5, 4, 3])
    assert empty.shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_no_kernel_dtypes_run_the_torch_strassen(dtype, rng_seed):
    if dtype == torch.bfloat16 and torch.cuda.is_available():
        pytest.skip("bf16 has a kernel on the GPU")
    x, ws, bs, acts = _chain((5, 6), [3, 4], "cpu")
    x, ws, bs = x.to(dtype), _cast(ws, dtype), _cast(bs, dtype)
    blocks = [ops.format_weights(w) for w in ws]
    y = ops.forward(x, blocks, bs, acts, [6, 3, 4])
    assert torch.equal(y, ops.strassen_reference(x, blocks, bs, acts, [6, 3, 4]))
    ref = ops.reference(x.double(), _cast(ws, torch.float64), _cast(bs, torch.float64), acts)
    if dtype == torch.float64:
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    else:
        y_torch = ops.reference(x, ws, bs, acts)
        assert_three_way(y, y_torch, ref, _atol(dtype, ref), "bf16 fallback", rng_seed)


def test_bad_input_names_the_argument():
    x, ws, bs, acts = _chain((4, 6), [5, 3], "cpu")
    blocks = [ops.format_weights(w) for w in ws]
    sizes = [6, 5, 3]
    with pytest.raises(ValueError, match="'x'"):
        ops.forward(torch.randn(4, 5), blocks, bs, acts, sizes)  # 5 pads to 6: caught by sizes
    with pytest.raises(ValueError, match=r"'blocks\[1\]'"):
        ops.forward(x, [blocks[0], blocks[0]], bs, acts, sizes)
    with pytest.raises(ValueError, match=r"'biases\[0\]'"):
        ops.forward(x, blocks, [torch.randn(4), bs[1]], acts, sizes)
    with pytest.raises(ValueError, match=r"'blocks\[0\]'"):
        ops.forward(x, [blocks[0].half(), blocks[1]], bs, acts, sizes)
    with pytest.raises(ValueError, match=r"'biases\[1\]'"):
        ops.forward(x, blocks, [bs[0], torch.randn(3, device="meta")], acts, sizes)
    with pytest.raises(ValueError, match=r"'biases\[1\]'"):
        ops.forward(x, blocks, [bs[0], torch.randn(3, dtype=torch.float64)], acts, sizes)
    with pytest.raises(ValueError, match="'activation'"):
        ops.forward(x, blocks, bs, ["relu", "tanh"], sizes)
    with pytest.raises(ValueError, match="'biases'"):
        ops.forward(x, blocks, bs[:1], acts, sizes)
    with pytest.raises(ValueError, match="'sizes'"):
        ops.forward(x, blocks, bs, acts, [5, 3])
    with pytest.raises(ValueError, match="'blocks'"):
        ops.forward(x, [], [], [], [6])
    with pytest.raises(ValueError, match="'weight'"):
        ops.format_weights(torch.randn(3))


# --- StrassenMLP and selection -----------------------------------------------------------------


def _mlp(sizes, dtype=torch.float32, last_relu=True):
    mods: list[nn.Module] = []
    for i, (k, n) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        mods.append(nn.Linear(k, n, dtype=dtype))
        if last_relu or i < len(sizes) - 2:
            mods.append(nn.ReLU(inplace=True))
    return nn.Sequential(*mods)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mlp_strassen_mode_matches_sequential(dtype, rng_seed):
    seq = _mlp([7, 6, 9, 5], dtype, last_relu=False)
    model = StrassenMLP.from_modules(seq, mode="strassen")
    assert model.activations == ("relu", "relu", "none") and not model.training
    assert model.layers[0].weight is seq[0].weight  # shared, not copied
    x = torch.randn(3, 7).to(dtype)
    with torch.no_grad():
        y, y_torch = model(x), seq(x.clone())
        ref = seq.double()(x.double())
    assert_three_way(y, y_torch, ref, _atol(dtype, ref), "StrassenMLP", rng_seed)
    assert model.state_dict().keys() == {
        f"layers.{i}.{p}" for i in range(3) for p in "weight bias".split()
    }


def test_mlp_from_a_transformed_sequential(rng_seed):
    """A Sequential that ``tilewise.transform`` already fused (tilewise Linear with ReLU, an
    nn.Identity in the ReLU's place) builds the same chain as the original."""
    seq = _mlp([7, 6, 9, 5], torch.float32, last_relu=False)
    x = torch.randn(3, 7)
    with torch.no_grad():
        want = seq(x.clone())
    fused = tilewise.transform(copy.deepcopy(seq)).model
    assert any(isinstance(m, nn.Identity) for m in fused)
    model = StrassenMLP.from_modules(fused, mode="strassen")
    assert model.activations == ("relu", "relu", "none")
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-4)


def test_mlp_auto_mode_and_selection_hook(monkeypatch):
    model = StrassenMLP.from_modules(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 6))
    x = torch.randn(2, 3, 6)
    assert model.mode == "auto" and not model.uses_strassen(x)  # CPU: the Linear chain
    seen = []
    monkeypatch.setattr(ops, "SELECTION_OVERRIDE", lambda *a: seen.append(a) or True)
    assert model.uses_strassen(x)
    assert seen[-1] == (6, 4, torch.float32, torch.device("cpu"))
    y = model(x)
    with torch.no_grad():
        want = model.layers[1](torch.relu(model.layers[0](x)))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(ops, "SELECTION_OVERRIDE", lambda *a: None)  # defer to the default rule
    assert not model.uses_strassen(x)


def test_mlp_linear_mode_formats_lazily_and_reformat():
    model = StrassenMLP.from_modules([nn.Linear(5, 3), nn.ReLU()], mode="linear")
    assert model.blocks0 is None
    x = torch.randn(4, 5)
    y_lin = model(x)
    model.mode = "strassen"
    torch.testing.assert_close(model(x), y_lin, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        model.layers[0].weight.mul_(2.0)
    model.reformat()
    with torch.no_grad():
        torch.testing.assert_close(model(x), torch.relu(model.layers[0](x)), rtol=1e-5, atol=1e-5)
    model.half()  # formatted weights are buffers: they follow dtype and device moves
    assert model.blocks0.dtype == torch.float16 and model(x.half()).dtype == torch.float16


def test_mlp_bad_input():
    with pytest.raises(ValueError, match="GELU"):
        StrassenMLP.from_modules(nn.Linear(4, 4), nn.GELU())
    with pytest.raises(ValueError, match="ReLU"):
        StrassenMLP.from_modules(nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(ValueError, match="in_features"):
        StrassenMLP.from_modules(nn.Linear(4, 5), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(ValueError, match="'mode'"):
        StrassenMLP.from_modules(nn.Linear(4, 4), mode="fast")
    model = StrassenMLP.from_modules(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(ValueError, match="'x'"):
        model(torch.randn(2, 4, requires_grad=True))
    with pytest.raises(ValueError, match="'x'"):
        model(torch.randn(2, 5))
    model.train()
    with pytest.raises(ValueError, match="training"):
        model(torch.randn(2, 4))
    with torch.no_grad():
        assert model(torch.randn(2, 4)).shape == (2, 4)


def test_strassen_wins_default_rule(monkeypatch):
    monkeypatch.setattr(ops, "SELECTION_OVERRIDE", None)
    matmul = torch.backends.cuda.matmul  # a module whose allow_tf32 is a property
    previous = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert ops.strassen_wins(512, 4096, torch.float32, "cuda")
        assert not ops.strassen_wins(511, 4096, torch.float32, "cuda")
        assert not ops.strassen_wins(512, 2048, torch.float32, "cuda")
        assert not ops.strassen_wins(4096, 8192, torch.float16, "cuda")
        assert not ops.strassen_wins(4096, 8192, torch.float32, "cpu")
        matmul.allow_tf32 = True
        assert not ops.strassen_wins(512, 4096, torch.float32, "cuda")
    finally:
        matmul.allow_tf32 = previous


@pytest.mark.gpu
def test_mlp_auto_picks_strassen_on_gpu(rng_seed, monkeypatch):
    """The untimed rule (TILEWISE_AUTOTUNE=0: timing would make the choice machine-dependent)."""
    from tilewise.runtime import autotune

    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")
    autotune.clear_memory_cache()
    seq = _mlp([4096] * 3).cuda()
    model = StrassenMLP.from_modules(seq)
    x = torch.randn(512, 4096, device="cuda")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        assert model.uses_strassen(x) and not model.uses_strassen(x[:64])
        with torch.no_grad():
            y, y_torch, ref = model(x), seq(x.clone()), seq.double()(x.double())
        assert_three_way(y, y_torch, ref, _atol(torch.float32, ref, 4096), "MLP gpu", rng_seed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_load_state_dict_reformats_the_strassen_blocks(rng_seed):
    """The formatted blocks are derived buffers: loading new weights must rebuild them."""
    seq, other = _mlp([6, 10, 4]), _mlp([6, 10, 4])
    model = StrassenMLP.from_modules(seq, mode="strassen")
    model.load_state_dict(StrassenMLP.from_modules(other, mode="strassen").state_dict())
    x = torch.randn(5, 6)
    with torch.no_grad():
        torch.testing.assert_close(model(x), other(x), atol=1e-5, rtol=1e-5)


def _fake_gpu_autotune(monkeypatch, tmp_path, timings: list[float]) -> None:
    """``fake_gpu_autotuner`` whose timings run the candidate once and answer the next of
    ``timings``."""
    answers = iter(timings)

    def fake_bench(fn):
        fn()
        return next(answers)

    fake_gpu_autotuner(monkeypatch, tmp_path, fake_bench)


def test_auto_mode_times_both_paths_once_and_keeps_the_winner(monkeypatch, tmp_path):
    """On a (faked) CUDA machine, fp32 "auto" times Strassen against the fused chain on first
    use of a shape and caches the faster; the second call times nothing."""
    from tilewise.runtime import autotune

    # the rule's default (linear at this size) first, then Strassen
    _fake_gpu_autotune(monkeypatch, tmp_path, [2.0, 1.0])
    model = StrassenMLP.from_modules(_mlp([6, 10, 4]))  # mode "auto"
    x = torch.randn(5, 6)
    assert not ops.strassen_wins(5, 4, torch.float32, "cpu")
    assert model.uses_strassen(x)  # measured faster, although the rule says no
    monkeypatch.setattr(autotune, "_bench", lambda fn: pytest.fail("timed twice"))
    assert model.uses_strassen(x)
    assert not model.uses_strassen(x.half())  # half precision: the rule alone decides
    autotune.clear_memory_cache()


@pytest.mark.skipif(not dispatch.INTERPRET, reason="CPU kernels need the Triton interpreter")
def test_products_plans_agree():
    """One bmm or seven mm launches: the same 7 products (``ops.run_products``)."""
    p, blocks = torch.randn(7, 5, 6), torch.randn(7, 3, 6)
    want = torch.bmm(p, blocks.transpose(1, 2))
    kmajor = blocks.transpose(1, 2).contiguous().transpose(1, 2)  # format_weights' "nn" storage
    for plan in ops.FP32_PLANS:  # the tensor-core ones through the interpreter on the CPU
        for b in (blocks, kmajor):
            out = torch.full((7, 5, 3), float("nan"))
            assert ops.run_products(plan, p, b, out) is out
            torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_streams_plan_in_graph_and_side_stream():
    """The 7 products on side streams: inside a captured CUDA graph (forked and joined branches)
    and issued from a non-default stream, each equal to the one-bmm result."""
    torch.manual_seed(0)
    p = torch.randn(7, 96, 130, device="cuda")
    blocks = ops.format_weights(torch.randn(140, 260, device="cuda"), layout="nn")
    assert blocks.shape == (7, 70, 130)
    want = torch.bmm(p, blocks.transpose(1, 2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = torch.full((7, 96, 70), float("nan"), device="cuda")
        ops.run_products(ops.MM7_STREAMS, p, blocks, out)  # warm-up, off the default stream
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.run_products(ops.MM7_STREAMS, p, blocks, out)
    for _ in range(2):
        out.fill_(float("nan"))
        p.copy_(torch.randn_like(p))
        graph.replay()
        torch.testing.assert_close(out, torch.bmm(p, blocks.transpose(1, 2)), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "plan",
    ops.FP32_PLANS,
    ids=lambda p: (
        f"tc{p.tc.block_m}x{p.tc.block_n}-w{p.tc.num_warps}"
        if p.tc
        else f"launches{p.launches}-streams{p.streams}"
    ),
)
def test_chain_with_each_products_plan(plan, monkeypatch, rng_seed):
    """Each products plan the autotuner may pick, forced, through whole chains (fp32 and fp16;
    the tensor-core 3xTF32 plans are offered for fp32 with TF32 off only)."""
    import types

    def choose(op, *args, **kwargs):  # the plan for the products; one row group for the chain
        return plan if op.endswith(".products") else ops.RowGroups(1)

    monkeypatch.setattr(ops, "autotune", types.SimpleNamespace(choose_config=choose))
    with allow_tf32(False):
        for dtype in (torch.float32,) if plan.tc else (torch.float32, torch.float16):
            for x_shape, outs in GPU_SHAPES:
                x, ws, bs, acts = _chain(x_shape, outs, "cuda", True)
                _judge_chain(x, ws, bs, acts, dtype, rng_seed)


def test_strided_and_expanded_bias():
    """A bias with stride 2 or stride 0 (expanded): the chain's result, as with a contiguous one
    (the suffix kernel indexes the bias element by element; session 14 found both wrong)."""
    x, w = torch.randn(6, 8), torch.randn(10, 8)
    for b in (torch.randn(20)[::2], torch.randn(1).expand(10)):
        y = ops.forward(x, [ops.format_weights(w)], [b], ["relu"], [8, 10])
        want = torch.relu(torch.nn.functional.linear(x, w, b))
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_row_bounds():
    """Row groups: equal even ranges, the last taking the rest; a bad count names 'groups'."""
    assert ops._row_bounds(512, 2) == [(0, 256), (256, 512)]
    assert ops._row_bounds(513, 2) == [(0, 256), (256, 513)]
    assert ops._row_bounds(1024, 4) == [(0, 256), (256, 512), (512, 768), (768, 1024)]
    assert ops._row_bounds(9, 4) == [(0, 2), (2, 4), (4, 6), (6, 9)]
    assert ops._row_bounds(3, 2) == [(0, 2), (2, 3)]
    assert ops._row_bounds(7, 4) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert ops._row_bounds(5, 1) == [(0, 5)]
    for m, groups in ((2, 2), (6, 4), (5, 0), (5, 2.0), (5, "2")):
        with pytest.raises(ValueError, match="'groups'"):
            ops._row_bounds(m, groups)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("groups", [2, 3, 4])
def test_row_groups_match_fp64(dtype, groups, rng_seed, monkeypatch):
    """The chain split into row groups (odd group sizes and odd features included): each group's
    own 2N+1 kernels, judged against fp64 like the whole chain."""
    calls = {"prefix": 0}
    real = ops.prefix

    def counted(*args, **kwargs):
        calls["prefix"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "prefix", counted)
    for x_shape, outs in (((9, 6), [7, 5]), ((2, 4, 5), [6]), ((13, 10), [1, 10, 3])):
        calls["prefix"] = 0
        x, ws, bs, acts = _chain(x_shape, outs, "cpu")
        _judge_chain(x, ws, bs, acts, dtype, rng_seed, groups=groups)
        assert calls["prefix"] == groups


def test_row_groups_bad_count_and_cpu_default(monkeypatch):
    """A count that cannot split the rows raises before any launch; off CUDA, forward(groups=None)
    runs one chain without timing anything."""
    from tilewise.runtime import autotune

    x, ws, bs, acts = _chain((6, 4), [4], "cpu")
    blocks = [ops.format_weights(w) for w in ws]
    for groups in (0, 4, 2.5, True):
        with pytest.raises(ValueError, match="'groups'"):
            ops.forward(x, blocks, bs, acts, [4, 4], groups=groups)
    monkeypatch.setattr(dispatch, "use_kernel", lambda *args: False)  # the reference path too
    with pytest.raises(ValueError, match="'groups'"):
        ops.forward(x, blocks, bs, acts, [4, 4], groups=0)
    monkeypatch.undo()
    monkeypatch.setattr(autotune, "_bench", lambda fn: pytest.fail("timed off CUDA"))
    autotune.clear_memory_cache()
    try:
        x = torch.randn(2 * ops.MIN_GROUP_ROWS, 4)
        assert ops._choose_row_groups(x, (blocks, bs, acts, [4, 4])) == 1
        y = ops.forward(x, blocks, bs, acts, [4, 4])
        want = torch.nn.functional.linear(x, ws[0], bs[0])
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    finally:
        autotune.clear_memory_cache()


def test_row_groups_timed_stored_and_reloaded(monkeypatch, tmp_path):
    """On a (faked) CUDA machine the row-group count is timed once per chain shape, stored in the
    on-disk cache (its candidates are dataclasses) and loaded by a fresh process's first call."""
    from tilewise.runtime import autotune

    _fake_gpu_autotune(monkeypatch, tmp_path, [3.0, 1.0, 2.0])  # 1, 2, 4 groups: 2 fastest
    monkeypatch.setattr(autotune, "_retime_close", lambda times, *a, **k: times)
    x, ws, bs, acts = _chain((4 * ops.MIN_GROUP_ROWS, 4), [4], "cpu")
    layers = ([ops.format_weights(w) for w in ws], bs, acts, [4, 4])
    try:
        assert ops._choose_row_groups(x, layers) == 2
        monkeypatch.setattr(autotune, "_bench", lambda fn: pytest.fail("timed twice"))
        assert ops._choose_row_groups(x, layers) == 2
        autotune.clear_memory_cache()  # a new process: the choice comes from the disk cache
        assert ops._choose_row_groups(x, layers) == 2
        y = ops.forward(x, *layers)
        want = torch.nn.functional.linear(x, ws[0], bs[0])
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    finally:
        autotune.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_groups_on_streams_in_graph_and_timed(dtype, rng_seed):
    """Row groups on CUDA: the groups' chains on parallel streams (also issued from a stream that
    is one of the side streams, and with more groups than lanes), eager and captured in a CUDA
    graph (replayed on new inputs), judged against fp64; the timed choice is recorded and its
    forward judged the same way."""
    from tilewise.runtime import autotune

    for x_shape, outs in GPU_SHAPES:
        x, ws, bs, acts = _chain(x_shape, outs, "cuda", True)
        for groups in (2, 4):
            _judge_chain(x, ws, bs, acts, dtype, rng_seed, groups=groups)
    x, ws, bs, acts = _chain((512, 256), [256] * 2, "cuda", True)
    side = ops._streams(x.device, 2)[0]  # the lanes forward(groups=2) takes
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the current stream is a side stream of the row groups
        _judge_chain(x, ws, bs, acts, dtype, rng_seed, groups=2)
        _judge_chain(x, ws, bs, acts, dtype, rng_seed, groups=40)  # more groups than streams
    torch.cuda.current_stream().wait_stream(side)
    x0, ws, bs, acts = _chain((1024, 4096), [4096] * 2, "cuda", True)
    ws, bs = _cast(ws, dtype), _cast(bs, dtype)
    blocks, sizes = [ops.format_weights(w) for w in ws], [4096, 4096, 4096]
    static_x = x0.to(dtype)

    def judge(y, what):
        ref = ops.reference(
            static_x.double(), _cast(ws, torch.float64), _cast(bs, torch.float64), acts
        )
        y_torch = ops.reference(static_x, ws, bs, acts)
        assert_three_way(y, y_torch, ref, _atol(dtype, ref, 4096), what, rng_seed)

    ops.forward(static_x, blocks, bs, acts, sizes, groups=2)  # warm-up (autotune) off capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = ops.forward(static_x, blocks, bs, acts, sizes, groups=2)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        judge(static_y, "strassen row groups graph")
    with autotune.recording() as picks:
        y = ops.forward(static_x, blocks, bs, acts, sizes)  # groups=None: timed (or cached)
    chosen = [cfg for op, _, cfg in picks if op == "strassen.row_groups"]
    assert len(chosen) == 1 and chosen[0] in ops._GROUP_CANDIDATES[2]
    judge(y, f"strassen row groups chosen {chosen[0]}")
