"""The grouped conv's per-problem launch plans: a problem seen before skips its checks and
choices and still gives the right answer on fresh tensors; anything the plan depends on
(shapes, strides, the switches, the autotuner's answers) makes a new one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checks import ATOL, CPU_DTYPES, assert_three_way

from tilewise.ops import gconv, gconv_cuda, gconv_plan
from tilewise.runtime import autotune, plans

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _heuristic_configs(monkeypatch):
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")


class CountChoices:
    """Wraps ``autotune.choose_config``: how many choices the full path made."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = autotune.choose_config

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(autotune, "choose_config", counted)


def inputs(dtype, n=2, c=16, h=5, w=6, r=3, bias=True, device=DEVICE):
    x = torch.randn(n, c, h, w, dtype=dtype, device=device).contiguous(
        memory_format=torch.channels_last
    )
    wt = torch.randn(c, 8, r, r, dtype=dtype, device=device) / (8 * r * r) ** 0.5
    b = torch.randn(c, dtype=dtype, device=device) if bias else None
    return x, wt, b


def judge_forward(y, x, wt, b, pad, dtype, seed):
    groups = x.shape[1] // 8
    ref = F.conv2d(x.double(), wt.double(), None if b is None else b.double(), padding=pad,
                   groups=groups)  # fmt: skip
    same = F.conv2d(x, wt, b, padding=pad, groups=groups)
    assert_three_way(y, same, ref, ATOL[dtype], "planned fprop", seed, ulps=1)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_a_second_call_runs_the_plan_on_fresh_tensors(dtype, monkeypatch, rng_seed):
    """The first call chooses (fprop, dgrad, wgrad); later calls of the same problem choose
    nothing and are right for new inputs (the plan keeps no tensor of the first call)."""
    count = CountChoices(monkeypatch)
    for i in range(3):
        x, wt, b = inputs(dtype)
        y = gconv.forward(x, wt, b, 1, 1)
        judge_forward(y, x, wt, b, 1, dtype, rng_seed)
        g = torch.randn_like(y)
        dx, dw, db = gconv.backward(g, x, wt, b, 1, 1, deterministic=True)
        ref = gconv.reference_backward(g.double(), x.double(), wt.double(), b.double(), (1, 1))
        same = gconv.reference_backward(g, x, wt, b, (1, 1))
        pixels = (x.shape[0] * x.shape[2] * x.shape[3]) ** 0.5
        for what, out, t, r, scale in zip(("dx", "dw", "db"), (dx, dw, db), same, ref,
                                          (1, pixels, pixels), strict=True):  # fmt: skip
            assert_three_way(out, t, r, ATOL[dtype] * scale, f"planned {what}", rng_seed, ulps=1)
        if i == 0:
            first = count.calls
            assert first == 3  # fprop, dgrad, wgrad
    assert count.calls == first


def test_what_the_plan_depends_on_makes_a_new_one(monkeypatch):
    """Another shape, other strides, another padding, a switch (cuDNN's flags, an environment
    variable the conv reads) or the autotuner's memory cleared: the full path runs again."""
    count = CountChoices(monkeypatch)
    x, wt, b = inputs(torch.float32)
    gconv.forward(x, wt, b, 1, 1)
    assert count.calls == 1
    gconv.forward(x, wt, b, 1, 1)
    assert count.calls == 1
    x2, _, _ = inputs(torch.float32, h=7)
    gconv.forward(x2, wt, b, 1, 1)  # another shape
    assert count.calls == 2
    gconv.forward(x, wt, b, 0, 1)  # another padding
    assert count.calls == 3
    gconv.forward(x, wt.contiguous(memory_format=torch.channels_last), b, 1, 1)  # strides
    assert count.calls == 4
    monkeypatch.setenv("TILEWISE_GCONV_LIBRARY", "0")
    gconv.forward(x, wt, b, 1, 1)
    assert count.calls == 5
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark)
    gconv.forward(x, wt, b, 1, 1)
    assert count.calls == 6
    gconv.forward(x, wt, b, 1, 1)
    assert count.calls == 6
    autotune.clear_memory_cache()
    gconv.forward(x, wt, b, 1, 1)
    assert count.calls == 7


def test_a_gradient_of_another_dtype_or_layout_is_cast_by_the_plan(monkeypatch, rng_seed):
    """The backward plan of a problem whose gradient arrives in fp32 for an fp16 input, or not
    channels_last, copies it as the full path does, call after call."""
    x, wt, b = inputs(torch.float16, bias=True)
    for make in (lambda y: torch.randn(y.shape, dtype=torch.float32, device=y.device),
                 lambda y: torch.randn_like(y).contiguous()):  # fmt: skip
        for _ in range(2):
            y = gconv.forward(x, wt, b, 1, 1)
            g = make(y)
            dx, dw, db = gconv.backward(g, x, wt, b, 1, 1, deterministic=True)
            g16 = g.to(torch.float16)
            ref = gconv.reference_backward(g16.double(), x.double(), wt.double(), b.double(),
                                           (1, 1))  # fmt: skip
            same = gconv.reference_backward(g16, x, wt, b, (1, 1))
            assert dx.is_contiguous(memory_format=torch.channels_last)
            assert db.dtype == b.dtype
            for out, t, r in zip((dx, dw, db), same, ref, strict=True):
                assert_three_way(out, t, r, ATOL[torch.float16] * 10, "cast grad", rng_seed, ulps=1)


def test_only_the_passes_asked_for_are_planned_and_run(monkeypatch):
    """``need`` is part of the key: a dx-only backward after a full one returns dx only."""
    x, wt, b = inputs(torch.float32)
    y = gconv.forward(x, wt, b, 1, 1)
    g = torch.randn_like(y)
    full = gconv.backward(g, x, wt, b, 1, 1, deterministic=True)
    assert all(t is not None for t in full)
    for _ in range(2):
        dx, dw, db = gconv.backward(g, x, wt, b, 1, 1, need=(True, False, False))
        assert dw is None and db is None
        torch.testing.assert_close(dx, full[0])


def test_bad_input_still_raises_after_a_plan_exists():
    """A plan is only found for the key of a call that passed the checks: a wrong weight, a
    wrong gradient shape or mixed dtypes still get the ValueError naming the argument."""
    x, wt, b = inputs(torch.float32)
    y = gconv.forward(x, wt, b, 1, 1)
    gconv.backward(torch.randn_like(y), x, wt, b, 1, 1)
    with pytest.raises(ValueError, match="'weight'"):
        gconv.forward(x, wt[:, :4], b, 1, 1)
    with pytest.raises(ValueError, match="'grad'"):
        gconv.backward(torch.randn_like(y)[:, :, :-1], x, wt, b, 1, 1)
    with pytest.raises(ValueError, match="'weight'"):
        gconv.forward(x, wt.half(), b, 1, 1)


def test_tensors_without_storage_get_no_plan():
    """Meta tensors have no address: no key, so the full path (and its checks) runs."""
    x, wt, b = inputs(torch.float32, device="meta")
    assert gconv_plan.forward_key(x, wt, b, 1, 1) is None
    assert gconv_plan.backward_key(x, x, wt, b, 1, 1, (True, True, True), True) is None


def test_the_plan_cache_starts_again_past_its_size_and_keeps_no_plan_of_a_capture(monkeypatch):
    cache = plans.PlanCache(lambda: (), size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert (cache.get("a"), cache.get("b")) == (1, 2)
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("c"), len(cache)) == (None, 3, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    cache.put("d", 4)
    assert cache.get("d") is None
    plans.clear_all()
    assert len(cache) == 0 and len(gconv_plan.PLANS) == 0


def _forcing(monkeypatch, pick):
    """``autotune.choose_config`` answering ``pick(candidates, default)`` (tests force a tile)."""

    def choose(op, problem, candidates, run_fn, **kw):
        return pick(tuple(candidates), kw["default"])

    monkeypatch.setattr(autotune, "choose_config", choose)


def _nth_cuda_tile(which: str, i: int):
    """The i-th NVRTC tile of the candidates (by kind: "tma", "plain", "cluster"), else default."""

    def pick(candidates, default):
        tiles = [c for c in candidates if isinstance(c, gconv_cuda.CudaTile)]
        kinds = {
            "tma": [t for t in tiles if t.tma],
            "plain": [t for t in tiles if not t.tma and not t.cluster],
            "cluster": [t for t in tiles if t.cluster],
        }[which]
        return kinds[i % len(kinds)] if kinds else default

    return pick


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["tma", "plain", "cluster"])
@pytest.mark.parametrize("shape", [(2, 64, 13, 17, 3), (1, 128, 8, 8, 5), (3, 32, 9, 33, 1)],
                         ids=lambda s: "n{}c{}_{}x{}_k{}".format(*s))  # fmt: skip
def test_planned_nvrtc_launches_on_the_gpu(shape, kind, dtype, monkeypatch, rng_seed):
    """The NVRTC tiles through their plans (scalars written once, pointers and tensor maps per
    call): three calls per problem with fresh inputs and a bias (the first builds the plans, the
    others run them), every pass judged three-way against fp64."""
    _forcing(monkeypatch, _nth_cuda_tile(kind, rng_seed))
    n, c, h, w, k = shape
    pad = k // 2
    for i in range(3):
        x, wt, b = inputs(dtype, n, c, h, w, k, bias=True, device="cuda")
        y = gconv.forward(x, wt, b, pad, pad)
        judge_forward(y, x, wt, b, pad, dtype, rng_seed)
        g = torch.randn_like(y)
        dx, dw, db = gconv.backward(g, x, wt, b, pad, pad, deterministic=False)
        ref = gconv.reference_backward(g.double(), x.double(), wt.double(), b.double(), (pad, pad))
        same = gconv.reference_backward(g, x, wt, b, (pad, pad))
        pixels = (n * h * w) ** 0.5
        for what, out, t, r, scale in zip(("dx", "dw", "db"), (dx, dw, db), same, ref,
                                          (1, pixels, pixels), strict=True):  # fmt: skip
            assert_three_way(out, t, r, ATOL[dtype] * scale, f"{kind} {what} call {i}", rng_seed,
                             ulps=1)  # fmt: skip
    assert len(gconv_plan.PLANS) == 2  # one forward and one backward plan


@pytest.mark.gpu
def test_plans_inside_a_cuda_graph(monkeypatch, rng_seed):
    """A plan built eagerly runs inside a capture (the kernels launch on the capturing stream,
    the tensor maps of the static buffers are the graph's), and a capture of a problem without a
    plan stores none; replays with new data give the right answers."""
    _forcing(monkeypatch, _nth_cuda_tile("tma", 0))
    x, wt, b = inputs(torch.float16, 2, 64, 12, 12, 3, device="cuda")
    gconv.forward(x, wt, b, 1, 1)  # the plan, eagerly
    assert len(gconv_plan.PLANS) == 1
    x2, wt2, _ = inputs(torch.float16, 1, 64, 7, 9, 3, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gconv.forward(x2, wt2, None, 1, 1)  # warm (its own plan, eagerly)
    torch.cuda.current_stream().wait_stream(stream)
    gconv_plan.PLANS.clear()
    gconv.forward(x, wt, b, 1, 1)  # rebuild the first plan only
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gconv.forward(x, wt, b, 1, 1)  # runs the plan
        y2 = gconv.forward(x2, wt2, None, 1, 1)  # full path: no plan stored while capturing
    assert len(gconv_plan.PLANS) == 1
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        x2.copy_(torch.randn_like(x2))
        graph.replay()
        torch.cuda.synchronize()
        judge_forward(y, x, wt, b, 1, torch.float16, rng_seed)
        judge_forward(y2, x2, wt2, None, 1, torch.float16, rng_seed)


def test_the_functional_checks_are_memoized_by_metadata_and_arguments(monkeypatch):
    """``grouped_conv2d``'s argument checks run once per (metadata, arguments): a repeat call
    skips them, a list and a tuple of the same padding share the entry, and arguments that the
    checks reject (a bool padding, a wrong group count) still raise after a valid call."""
    import tilewise
    from tilewise import functional

    x, wt, b = inputs(torch.float32)
    calls = []
    real = functional._gconv.check_conv_args
    monkeypatch.setattr(functional._gconv, "check_conv_args",
                        lambda *a: calls.append(1) or real(*a))  # fmt: skip
    functional._GCONV_CHECKS.clear()
    y = tilewise.grouped_conv2d(x, wt, b, padding=1)
    tilewise.grouped_conv2d(x, wt, b, padding=[1, 1])
    tilewise.grouped_conv2d(x, wt, b, padding=(1, 1))
    assert len(calls) == 2  # padding=1, then the pair (list and tuple share one entry)
    torch.testing.assert_close(tilewise.grouped_conv2d(x, wt, b, padding=1), y)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="padding"):
        tilewise.grouped_conv2d(x, wt, b, padding=True)
    with pytest.raises(ValueError, match="groups"):
        tilewise.grouped_conv2d(x, wt, b, padding=1, groups=3)


def test_a_call_that_fails_leaves_no_plan_and_odd_paddings_get_none(monkeypatch):
    """A plan is stored only after its first run succeeded, so a failing launch leaves nothing
    behind for the next call of that problem; paddings that are not plain ints (1.0, True)
    get no key (an int's plan would run for them)."""
    x, wt, b = inputs(torch.float32)
    real = gconv._launch

    def failing(*args, **kwargs):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(gconv, "_launch", failing)
    with pytest.raises(RuntimeError, match="launch failed"):
        gconv.forward(x, wt, b, 1, 1)
    assert len(gconv_plan.PLANS) == 0
    monkeypatch.setattr(gconv, "_launch", real)
    y = gconv.forward(x, wt, b, 1, 1)
    torch.testing.assert_close(y, F.conv2d(x, wt, b, padding=1, groups=x.shape[1] // 8))
    assert len(gconv_plan.PLANS) == 1
    assert gconv_plan.forward_key(x, wt, b, 1.0, 1) is None
    assert gconv_plan.backward_key(y, x, wt, b, True, 1, (True,) * 3, True) is None


def test_a_planned_launch_is_dependent_only_where_the_lean_launcher_is(monkeypatch):
    """A driver without cuLaunchKernelEx gives a plain lean launcher for a dependent kernel:
    the plan's own launcher must then be plain too (it would raise looking the call up)."""
    import types

    from tilewise.runtime import cuda_launch

    made = []
    plain = types.SimpleNamespace(dependent=False)  # what lean_launcher gives such a driver
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, sig, dependent=False: plain)
    monkeypatch.setattr(cuda_launch, "PlannedLaunch", lambda *args: made.append(args) or args)
    bound = gconv_cuda.BoundLaunch(object(), "pi", (1, 1, 1), (32, 1, 1), 0, 0, [3], 1, [],
                                   dependent=True, planned=True)  # fmt: skip
    assert bound.planned is not None and made[0][-1] is False
    monkeypatch.setattr(gconv_cuda, "_launcher", lambda kernel, sig, dependent=False: None)
    unplanned = gconv_cuda.BoundLaunch(object(), "pi", (1, 1, 1), (32, 1, 1), 0, 0, [3], 1, [],
                                       dependent=True, planned=True)  # fmt: skip
    assert unplanned.planned is None
