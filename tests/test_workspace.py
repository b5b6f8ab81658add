"""The self-cleaning reduction workspace: every backward that sums with atomics leaves it zero,
repeated and interleaved launches stay right, a failed launch never hands a dirty one on, and a
CUDA-graph capture takes a workspace of its own."""

from __future__ import annotations

import pytest
import torch
from checks import ATOL, DEVICE_DTYPES

from tilewise.ops import _common, bias_act, gconv_wgrad, layernorm
from tilewise.ops._common import TileConfig
from tilewise.ops.gconv_config import GConvProblem, WgradConfig
from tilewise.runtime import workspace


def _problems(device: str, dtype: torch.dtype):
    x = torch.randn(300, 19, device=device, dtype=dtype)
    b = torch.randn(19, device=device, dtype=dtype)
    dy = torch.randn_like(x)
    w = 1 + 0.1 * torch.randn(19, device=device, dtype=dtype)
    _, mean, rstd = layernorm.forward(x, (19,), w, b)
    # the grouped conv's one-launch wgrad: 60 pixels in 16-pixel chunks, 3 tap blocks
    cl = torch.channels_last
    xc = torch.randn(2, 16, 5, 6, device=device, dtype=dtype).contiguous(memory_format=cl)
    dyc = torch.randn_like(xc)
    wc = torch.randn(16, 8, 3, 3, device=device, dtype=dtype)
    prob = GConvProblem.from_tensors(xc, wc, torch.zeros(16, device=device, dtype=dtype), 1, 1)
    chunks = WgradConfig(16, 16, 1, 4, 1, 4)
    return (
        lambda: bias_act.backward(dy, x, b, "silu"),
        lambda: gconv_wgrad.launch_wgrad(dyc, xc, prob, chunks, True, False),
        lambda: layernorm.backward(dy, x, (19,), w, b, mean, rstd),
        lambda: bias_act.backward(dy, x, b, "relu"),
    )


@pytest.fixture
def many_programs():
    """Configs with hundreds of programs, so the atomics spread over several accumulator copies
    (slots) and, for bias_act, two column blocks."""
    _common.CONFIG_OVERRIDES["bias_act_bwd"] = lambda *_: TileConfig(
        1, 16, 1, progs_per_sm=100, prefetch=False
    )
    _common.CONFIG_OVERRIDES["layer_norm_bwd"] = lambda *_: TileConfig(
        1, 32, 1, progs_per_sm=100, prefetch=False
    )
    yield
    _common.CONFIG_OVERRIDES.pop("bias_act_bwd")
    _common.CONFIG_OVERRIDES.pop("layer_norm_bwd")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_backward_leaves_workspace_zero(device, dtype, many_programs):
    assert _common.atomic_slots(200, 32) > 1
    runs = _problems(device, dtype)
    first = []
    for fn in runs:
        first.append(fn())
        assert workspace.all_zero(), "a backward left its accumulators non-zero"
    for _ in range(2):  # repeated and interleaved launches reuse the one workspace
        for fn, want in zip(runs, first, strict=True):
            got = fn()
            assert workspace.all_zero()
            for g, w in zip(got, want, strict=True):
                if w is not None:
                    torch.testing.assert_close(g, w, rtol=1e-3, atol=ATOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(8192, 1024), (2048, 4096), (65536, 64)])
def test_default_configs_stay_right_over_repeated_launches(m, n):
    """The shipped multi-warp configs, whose reduced rows live in several threads at once: the
    last program's sums must be read by every replica before the accumulators are zeroed (a
    session-10 defect left the layer_norm weight gradient wrong on the next launch)."""
    dtype = torch.float16
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    b = torch.randn(n, device="cuda", dtype=dtype)
    w = 1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype)
    _, mean, rstd = layernorm.forward(x, (n,), w, b)
    ref_ln = layernorm.reference_backward(
        dy.float(), x.float(), (n,), w.float(), b.float(), mean, rstd, False
    )
    ref_db = bias_act.reference_backward(dy.float(), x.float(), b.float(), "silu")[1]
    for _ in range(3):
        for act in ("relu", "silu"):
            _, db = bias_act.backward(dy, x, b, act)
            assert workspace.all_zero()
        torch.testing.assert_close(db.float(), ref_db, rtol=2e-2, atol=0.5)
        _, dw, dbias = layernorm.backward(dy, x, (n,), w, b, mean, rstd)
        assert workspace.all_zero()
        torch.testing.assert_close(dw.float(), ref_ln[1], rtol=2e-2, atol=0.5)
        torch.testing.assert_close(dbias.float(), ref_ln[2], rtol=2e-2, atol=0.5)


def test_failed_launch_discards_the_workspace():
    cpu = torch.device("cpu")
    (acc,) = workspace.zeroed(cpu, (64,))
    with pytest.raises(RuntimeError, match="launch failed"), workspace.guarded(cpu):
        acc.fill_(1.0)  # a launch that dies halfway through its atomics
        raise RuntimeError("launch failed")
    (again,) = workspace.zeroed(cpu, (64,))
    assert not again.any()
    assert again.data_ptr() != acc.data_ptr()


def test_larger_request_grows_a_zeroed_buffer():
    cpu = torch.device("cpu")
    workspace.zeroed(cpu, (8, 8))
    (buf_small, _) = workspace._WORKSPACES[workspace._key(cpu)]
    small_size = buf_small.numel()
    big = workspace.zeroed(cpu, (small_size, 3))  # more than the buffer holds
    (buf_big, _) = workspace._WORKSPACES[workspace._key(cpu)]
    assert buf_big.data_ptr() != buf_small.data_ptr() and buf_big.numel() >= small_size + 3
    assert [v.numel() for v in big] == [small_size, 3]
    assert not any(v.any() for v in big)
    assert workspace.zeroed(cpu, (8, 8))[0].data_ptr() == buf_big.data_ptr()  # smaller: reused


@pytest.mark.gpu
def test_graph_capture_takes_its_own_workspace():
    dtype = torch.float16
    x = torch.randn(4096, 1024, device="cuda", dtype=dtype)
    b = torch.randn(1024, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    want_dx, want_db = bias_act.backward(dy, x, b, "relu")
    graph = torch.cuda.CUDAGraph()
    before = {k: buf.data_ptr() for k, (buf, _) in workspace._WORKSPACES.items()}
    with torch.cuda.graph(graph):
        dx, db = bias_act.backward(dy, x, b, "relu")
    # the capture took a fresh buffer: no workspace was cached for the capture stream, and the
    # eager ones were left alone
    assert {k: buf.data_ptr() for k, (buf, _) in workspace._WORKSPACES.items()} == before
    for _ in range(3):
        dx.fill_(float("nan"))
        graph.replay()
        eager_dx, eager_db = bias_act.backward(dy, x, b, "relu")  # shares nothing with the graph
        torch.cuda.synchronize()
        torch.testing.assert_close(dx, want_dx)
        torch.testing.assert_close(db, want_db, rtol=1e-3, atol=1e-2)
        torch.testing.assert_close(eager_db, want_db, rtol=1e-3, atol=1e-2)
    assert workspace.all_zero()


def test_atomic_slots_stay_few_for_wide_rows():
    """Copies of the accumulators: about one per 64 programs, a power of two up to 16, but few
    enough that the finishing program reads at most SLOT_VALUES values (wide rows: one copy)."""
    assert _common.atomic_slots(132, 4096) == 1
    assert _common.atomic_slots(528, 1024) == 4
    assert _common.atomic_slots(528, 64) == 16
    assert _common.atomic_slots(10, 64) == 1
    for programs in (1, 63, 65, 200, 5000):
        for width in (1, 48, 1000, 1024, 3000, 8192):
            k = _common.atomic_slots(programs, width)
            assert 1 <= k <= 16 and k & (k - 1) == 0
            assert k == 1 or k * width <= _common.SLOT_VALUES
