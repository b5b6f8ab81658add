"""CPU tests of the benchmark models and of the grouped-conv studies' CPU-side pieces.

Tiny shapes through the Triton interpreter (conftest sets TRITON_INTERPRET=1 on CPU). Nothing
here asserts on a timing: benchmarks are never timed tests.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from torch import nn

import tilewise
from tilewise import cli
from tilewise.bench import gconv as iso
from tilewise.bench import gconv_insitu as ins
from tilewise.bench.ceilings import Ceilings
from tilewise.bench.results import load_results, save_results
from tilewise.models import (
    ConvFirstBlock,
    MBConvBlock,
    MLPBlock,
    block_stack,
    grouped_channels,
    grouped_convs,
)
from tilewise.nn import GroupedConv2d
from tilewise.ops import gconv as gconv_ops
from tilewise.ops.gconv_config import PASSES, GConvProblem
from tilewise.runtime import dispatch

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _no_search(monkeypatch):
    monkeypatch.setenv("TILEWISE_AUTOTUNE", "0")


def _x(n=2, c=16, hw=6):
    return torch.randn(n, c, hw, hw).contiguous(memory_format=CL)


def _zero_last_bn(block: nn.Module) -> None:
    with torch.no_grad():
        block.project_bn.weight.zero_()
        block.project_bn.bias.zero_()


# --- the blocks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block,grouped_c",
    [(ConvFirstBlock(16, 3, 6), 16), (MBConvBlock(16, 3, 4), 64), (MBConvBlock(8, 5, 2), 16)],
    ids=["convfirst", "mbconv", "mbconv-k5"],
)
def test_block_shapes_and_residual(block, grouped_c):
    c = block.project_bn.num_features
    x = _x(2, c, 7)
    assert block(x).shape == x.shape
    (name, conv), *rest = grouped_convs(block)
    assert not rest and name == "conv" and conv.in_channels == grouped_c
    assert conv.groups == grouped_c // 8 and conv.padding == (conv.kernel_size[0] // 2,) * 2
    assert conv.bias is None
    _zero_last_bn(block)  # the branch now outputs 0: the block is the identity
    torch.testing.assert_close(block(x), x)


def test_mlp_block_and_stack_layout():
    _zero_last_bn(mlp := MLPBlock(16, 2))
    x = _x()
    torch.testing.assert_close(mlp(x), x)
    stack = block_stack("ConvFirst", 16, depth=3, expansion=2, extra=3)
    assert [len(stack.pre), len(stack.blocks), len(stack.post)] == [2, 3, 1]
    assert all(isinstance(b, ConvFirstBlock) for b in stack.blocks)
    assert stack(x).shape == (2, 16)
    assert len(grouped_convs(stack)) == 3
    flat = block_stack("mbconv", 16, depth=2, expansion=4, extra=0, pool=False)
    assert flat(x).shape == x.shape and len(grouped_convs(flat)) == 2
    assert grouped_channels("mbconv", 256) == 1024 and grouped_channels("convfirst", 64) == 64


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(kind="resnet", c=16, depth=1), "kind"),
        (dict(kind="convfirst", c=12, depth=1), "'c'"),
        (dict(kind="convfirst", c=16, depth=0), "depth"),
        (dict(kind="convfirst", c=16, depth=1, kernel=4), "kernel"),
        (dict(kind="mbconv", c=16, depth=1, extra=-1), "extra"),
    ],
)
def test_stack_rejects_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        block_stack(**kwargs)


# --- tilewise.transform on the stacks ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["convfirst", "mbconv"])
def test_transform_swaps_exactly_the_grouped_convs(kind, caplog, monkeypatch):
    launches = []
    launch = gconv_ops.launch_fprop
    monkeypatch.setattr(gconv_ops, "launch_fprop", lambda *a: launches.append(1) or launch(*a))
    dispatch._log_once.cache_clear()
    torch.manual_seed(0)
    ref = block_stack(kind, 16, depth=2, expansion=2, extra=2)
    model = copy.deepcopy(ref)
    names = [n for n, _ in grouped_convs(ref)]
    report = tilewise.transform(model)
    assert [n for n, _ in report.swapped] == names
    convs = [n for n, m in ref.named_modules() if isinstance(m, nn.Conv2d)]
    assert sorted(n for n, _ in report.left) == sorted(set(convs) - set(names))
    swapped = [m for m in model.modules() if isinstance(m, GroupedConv2d)]
    assert len(swapped) == 2 and all(m.weight.is_contiguous() for m in swapped)
    x = _x(2, 16, 6)
    with caplog.at_level("WARNING", logger="tilewise"):
        y, y_ref = model(x), ref(x)
    assert not [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(launches) == 2  # the two grouped convs ran the Triton kernel
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    if kind == "convfirst":
        y.square().sum().backward()
        y_ref.square().sum().backward()
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3, msg=n)


def test_prepare_makes_channels_last_models_take_the_kernels():
    """``model.to(channels_last)`` makes grouped-conv weights channels_last; the transformed copy
    must still run the Triton kernels (weights are made dense per call), not fall back."""
    base = block_stack("convfirst", 16, depth=2, expansion=2).to(memory_format=CL)
    assert not any(m.weight.is_contiguous() for _, m in grouped_convs(base))
    model = ins.prepare(base, "tilewise")
    convs = [m for _, m in grouped_convs(model)]
    assert convs and all(type(m) is GroupedConv2d for m in convs)
    with mock.patch.object(gconv_ops, "launch_fprop", wraps=gconv_ops.launch_fprop) as launch:
        x = torch.randn(1, 16, 6, 6).contiguous(memory_format=CL)
        torch.testing.assert_close(model(x), base(x), atol=1e-4, rtol=1e-4)
    assert launch.call_count >= len(convs)
    assert all(type(m) is nn.Conv2d for _, m in grouped_convs(base))
    assert type(ins.prepare(base, "eager")) is type(base)
    with pytest.raises(ValueError, match="impl"):
        ins.prepare(base, "jax")


# --- the isolated study's CPU side ---------------------------------------------------------------


def test_gconv_problem_grid():
    full = iso.GConvStudyConfig().problems()
    assert len(full) == 2 * (3 + 2) * 6
    assert {(p.c, p.h, p.r) for p in full} == {
        (64, 64, 3),
        (128, 32, 3),
        (256, 16, 3),
        (64, 64, 5),
        (64, 64, 7),
    }
    assert all(p.pad_h == p.pad_w == p.r // 2 and (p.p, p.q) == (p.h, p.w) for p in full)
    assert {p.dtype for p in full} == {"fp16", "bf16"} and not any(p.has_bias for p in full)
    quick = iso.GConvStudyConfig.quick().problems()
    assert [(p.n, p.c, p.h, p.r, p.dtype) for p in quick] == [
        (1, 64, 64, 3, "fp16"),
        (32, 64, 64, 3, "fp16"),
    ]


def test_measure_problem_on_cpu_checks_and_counts_bytes():
    problem = GConvProblem(1, 16, 6, 5, 3, 3, 1, 1, "fp32")
    config = iso.GConvStudyConfig.quick(warmup=1, reps=2)
    ceil = Ceilings(copy_bytes_per_s=1e10, device="cpu", method="cpu")
    recs = iso.measure_problem(problem, config, ceil, "cpu")
    assert len(recs) == len(PASSES) * 2
    for r in recs:
        assert r["error"] is None and r["checked"], r
        assert r["bytes"] == problem.bytes(r["pass"]) and r["flops"] == problem.flops(r["pass"])
        assert r["eff_bw"] == pytest.approx(r["bytes"] / r["median_s"])
        assert r["frac_copy"] == pytest.approx(r["eff_bw"] / 1e10)
        assert r["prof_s"] is None  # no profiler kernels on a CPU
        assert r["graph_s"] is None and r["l2_s"] is None  # nor CUDA graphs
        assert r["same_copy_s"] is None and r["graph_frac_same_copy"] is None
        if r["impl"] == "cudnn":  # no autotuned config behind PyTorch's rows
            assert r["configs"] == ()


def test_same_size_copy_fraction_compares_bandwidths():
    """``graph_frac_same_copy``: the pass's graph bandwidth over that of a copy of the input's
    bytes (read + write) timed the same way; nothing without both timings."""
    rec = {"bytes": 3 * 10**6, "graph_s": 2e-6}
    got = iso._same_copy_fields(rec, 1e-6, 2 * 10**6)  # 1.5 TB/s against 2 TB/s
    assert got == {"same_copy_s": 1e-6, "graph_frac_same_copy": pytest.approx(0.75)}
    assert iso._same_copy_fields(rec, None, 2 * 10**6) == {}
    assert iso._same_copy_fields({"bytes": 1, "graph_s": None}, 1e-6, 2) == {}
    headers, rows = iso.summary_table([dict(_iso_records()[0].to_dict(), **got)])
    assert rows[0][headers.index("tw graph / same-size copy")] == "0.750"


def _iso_records(copy_bw=3e12):
    recs = []
    for n in (1, 8, 32):
        p = GConvProblem(n, 64, 64, 64, 3, 3, 1, 1, "fp16")
        for pass_ in PASSES:
            for impl, t in (("tilewise", 1e-4), ("cudnn", 3e-4)):
                t = t * n
                rec = iso.Record(
                    pass_,
                    impl,
                    "fp16",
                    n,
                    64,
                    64,
                    64,
                    3,
                    p.bytes(pass_),
                    p.flops(pass_),
                    True,
                    rotation=3,
                    median_s=t,
                    p20_s=t,
                    p80_s=t,
                    eff_bw=p.bytes(pass_) / t,
                    frac_copy=p.bytes(pass_) / t / copy_bw,
                    timer="cuda-events",
                    prof_s=t,
                    prof_eff_bw=p.bytes(pass_) / t,
                    prof_frac_copy=p.bytes(pass_) / t / copy_bw,
                    graph_s=t / 2 if impl == "tilewise" else t,
                    graph_eff_bw=p.bytes(pass_) / t,
                    kernels=(("_gconv_fwd_kernel", 1.0, t),),
                )
                recs.append(rec)
    recs.append(iso.Record("fprop", "tilewise", "bf16", 2, 64, 64, 64, 3, 1, 1, False, error="x"))
    return recs


def test_gconv_records_round_trip_table_and_plot(tmp_path):
    recs = _iso_records()
    ceil = Ceilings(copy_bytes_per_s=3e12, device="NVIDIA H100", method="cuda-events")
    path = save_results("gconv", [r.to_dict() for r in recs], ceil, tmp_path)
    doc = load_results(path)
    assert [iso.Record.from_dict(d) for d in doc["records"]] == recs
    headers, rows = iso.summary_table(doc["records"])
    assert len(rows) == 3 * 3 + 1 and rows[0][headers.index("x cudnn")] == "3.00x"
    assert rows[0][headers.index("x cudnn graph")] == "6.00x"
    assert rows[0][headers.index("tw graph frac")] == "-"  # no graph_frac_copy in the record
    assert rows[0][headers.index("tw L2 frac")] == "-"
    assert rows[0][headers.index("tw graph / same-size copy")] == "-"  # no same-size copy timed
    assert iso.errors(doc["records"]) == ["C=64 64x64 3x3 N=2 bf16 fprop tilewise: x"]
    png = iso.plot_gconv(doc, tmp_path / "gconv.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        iso.plot_gconv([], tmp_path / "empty.png")


# --- the in-situ study's CPU side ----------------------------------------------------------------


def test_insitu_config_and_problems():
    cfg = ins.InSituConfig()
    assert cfg.batches == (32, 64, 96, 128, 160, 192, 224, 256) and cfg.depth == 4
    assert cfg.extra == 2 and cfg.rotating == 4 and cfg.dgrad_layers("convfirst") == 4
    assert ins.InSituConfig(extra=0).dgrad_layers("convfirst") == 3
    assert ins.BLOCKS["convfirst"].problem(32) == GConvProblem(32, 64, 64, 64, 3, 3, 1, 1)
    assert ins.BLOCKS["mbconv"].problem(64) == GConvProblem(64, 1024, 16, 16, 3, 3, 1, 1)
    assert len(ins.InSituConfig.quick().batches) == 2


def _insitu_records():
    recs = []
    for block, spec in ins.BLOCKS.items():
        for batch in (32, 64):
            p = spec.problem(batch)
            for impl, t in (("tilewise", 1e-4), ("eager", 2e-4)):
                for pass_ in PASSES:
                    recs.append(
                        ins.PassRecord(
                            block,
                            impl,
                            batch,
                            p.c,
                            p.h,
                            p.w,
                            p.r,
                            4,
                            pass_,
                            p.bytes(pass_),
                            4,
                            layer_s=t,
                            eff_bw=p.bytes(pass_) / t,
                            frac_copy=0.3,
                            kernels=(("k", 4.0, 4 * t),),
                        )
                    )
            steps = (("tilewise", 1e-3), ("eager", 2e-3), ("compile", 1.5e-3))
            for impl, t in (*steps, ("tilewise-compile", 1.2e-3)):
                recs.append(ins.StepRecord(block, impl, batch, 4, 2, step_s=t, device_s=t))
    recs.append(ins.StepRecord("mbconv", "compile", 96, 4, 2, error="boom"))
    return recs


def test_insitu_prepare_impls():
    """tilewise-compile transforms first (tilewise's grouped convs inside the compiled graph)."""
    base = block_stack("mbconv", 8, depth=1, expansion=2, extra=0)
    for impl, swapped, compiled in (
        ("eager", False, False),
        ("tilewise", True, False),
        ("compile", False, True),
        ("tilewise-compile", True, True),
    ):
        model = ins.prepare(base, impl)
        assert hasattr(model, "_orig_mod") == compiled, impl
        inner = model._orig_mod if compiled else model
        assert (
            bool(list(ins.grouped_convs(inner)))
            and any(isinstance(m, tilewise.nn.GroupedConv2d) for m in inner.modules()) == swapped
        ), impl
    with pytest.raises(ValueError, match="impl"):
        ins.prepare(base, "cudnn")


def test_insitu_records_round_trip_tables_and_plot(tmp_path):
    recs = [r.to_dict() for r in _insitu_records()]
    ceil = Ceilings(copy_bytes_per_s=3e12, device="NVIDIA H100", method="cuda-events")
    doc = load_results(save_results("gconv-insitu", recs, ceil, tmp_path))
    assert doc["records"] == recs
    (ph, prow), (sh, srow) = ins.summary_tables(doc["records"])
    assert len(prow) == 2 * 2 * 3 and all(r[ph.index("x eager")] == "2.00x" for r in prow)
    assert len(srow) == 2 * 2 + 1 and srow[0][sh.index("x compile")] == "1.50x"
    assert srow[0][sh.index("tw+compile x compile")] == "1.25x"
    assert ins.errors(doc["records"]) == ["mbconv batch 96 compile step: boom"]
    png = ins.plot_insitu(doc, tmp_path / "insitu.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _leaf_kernels(evt):
    """CPU stand-in for device kernels: the innermost conv op of a call, and copies, flips and
    zero fills, "launch" one kernel of their name."""
    name = evt.name
    if "conv" in name:
        inner = not any("conv" in ch.name for ch in evt.cpu_children)
        return [(name, 1e-6)] if inner and name not in ("aten::conv2d", "aten::convolution") else []
    return [(name, 1e-6)] if name in ("aten::copy_", "aten::flip", "aten::zero_") else []


def _leaf_convs_per_call(conv: nn.Conv2d) -> int:
    """How many innermost conv ops one call of ``conv`` makes under bf16 autocast on this CPU:
    one, or one a group where PyTorch's CPU path splits a grouped conv into ``thnn_conv2d`` calls
    (it did on session 47's machine, whose oneDNN took no bf16 grouped conv; its backward then has
    no ``convolution_backward``)."""
    x = torch.randn(1, conv.in_channels, 8, 8).to(memory_format=CL)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.profiler.profile() as prof:
        conv(x)
    return sum(1 for e in prof.events() if "conv" in e.name and _leaf_kernels(e))


def test_attribution_on_a_cpu_profile_of_the_eager_stack():
    depth, iters = 2, 2
    model = block_stack("convfirst", 16, depth=depth, expansion=2, extra=2).to(memory_format=CL)
    mods = [m for _, m in grouped_convs(model)]
    if _leaf_convs_per_call(mods[0]) != 1:  # the profile this test reads is another one here
        pytest.skip("this CPU's PyTorch splits a bf16 grouped conv into one conv per group")
    step = ins.fwd_bwd_step(model, amp=torch.bfloat16)  # autocast casts weights and inputs
    events = ins.profile_window(step, [(_x(1),)], mods, iters=iters, warmup=1)
    sig = {"aten::convolution_backward": 1.0}
    att = ins.attribute(events, {"fprop": {}, "dgrad": sig, "wgrad": sig}, _leaf_kernels)
    fwd_convs = sum(c for n, (c, _) in att.kernels["fprop"].items() if "conv" in n)
    assert fwd_convs == depth * iters  # the grouped convs only, not the 1x1 convs
    for pass_ in ("dgrad", "wgrad"):  # one convolution_backward per node, split by signature
        assert att.kernels[pass_]["aten::convolution_backward"][0] == depth * iters / 2
    assert att.launches["cast"] > 0 and att.seconds["unmatched"] >= 0
    assert att.window_s == 0.0  # no device events on a CPU
    assert not any("forward" in m.__dict__ for m in mods)  # tags removed


def test_attribution_by_name_where_the_isolated_signatures_miss():
    """cuDNN may pick another algorithm in the stack than alone: backward kernels the signatures
    do not know go to the pass their name says, others stay unmatched."""
    depth, iters = 2, 1
    model = block_stack("convfirst", 16, depth=depth, expansion=2, extra=0).to(memory_format=CL)
    mods = [m for _, m in grouped_convs(model)]
    events = ins.profile_window(ins.fwd_bwd_step(model, amp=None), [(_x(1),)], mods, iters, 1)

    def kernels(evt):
        if evt.name != "aten::convolution_backward":
            return []
        return [("sm90_xmma_dgrad_nhwc", 2e-6), ("cutlass_wgrad_kernel", 3e-6), ("helper", 1e-6)]

    att = ins.attribute(events, {"dgrad": {"other": 1.0}, "wgrad": {"other": 1.0}}, kernels)
    backward_nodes = att.launches["dgrad"]  # one of each kernel per grouped conv's backward
    assert backward_nodes == depth * iters  # the 1x1 convs' backward nodes are not booked
    assert att.seconds["dgrad"] == pytest.approx(backward_nodes * 2e-6)
    assert att.seconds["wgrad"] == pytest.approx(backward_nodes * 3e-6)
    assert att.launches["unmatched"] == backward_nodes
    assert ins.pass_by_name("xmma_dgrad_wgrad") is None and ins.pass_by_name("WGRAD") == "wgrad"


def test_attribution_on_a_cpu_profile_of_the_tilewise_stack():
    depth, iters = 2, 1
    model = ins.prepare(block_stack("mbconv", 8, depth=depth, expansion=2, extra=1), "tilewise")
    mods = [m for _, m in grouped_convs(model)]
    # one warm-up step: the wgrad's workspace is allocated (zero-filled) once, before the window
    events = ins.profile_window(ins.fwd_bwd_step(model, amp=None), [(_x(2, 8),)], mods, iters, 1)
    sigs = {"dgrad": {"aten::flip": 1.0}, "wgrad": {"aten::zero_": 1.0}}
    att = ins.attribute(events, sigs, _leaf_kernels)
    # dgrad reads the weights flipped in-kernel: no aten op (no flip, no copy) runs for it
    assert not any("aten::flip" in k for k in att.kernels.get("dgrad", {}))
    # the atomic wgrad is one launch (batch 2: several pixel chunks, summed in the self-cleaning
    # workspace): no zero fill before it, no permute-and-cast copy after it
    assert not any(k in ("aten::zero_", "aten::copy_") for k in att.kernels.get("wgrad", {}))
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in mods)
    assert att.launches["fprop"] > 0 and att.launches["cast"] == 0  # no autocast here


def _kernel_event(name: str, start: float, us: float):
    return SimpleNamespace(
        name=name,
        device_type=SimpleNamespace(name="CUDA"),
        time_range=SimpleNamespace(start=start),
        device_time_total=us,
    )


def test_name_split_uses_launch_order():
    depth, dgrad_layers, iters = 2, 2, 2
    events = []
    for i in range(iters):
        t = 100.0 * i
        events += [_kernel_event("_gconv_fwd_kernel", t + j, 1.0) for j in range(depth)]
        events += [_kernel_event("_gconv_fwd_kernel", t + 10 + j, 2.0) for j in range(2)]
        events += [_kernel_event("_gconv_wgrad_kernel", t + 20 + j, 3.0) for j in range(2)]
        events.append(_kernel_event("other", t + 30, 50.0))
    got = ins.name_split(events[::-1], depth, dgrad_layers, iters)
    assert got == pytest.approx({"fprop": 4e-6, "dgrad": 8e-6, "wgrad": 12e-6})
    assert ins.name_split(events, depth, dgrad_layers + 1, iters) is None


def test_pass_seconds_where_the_tree_miscounts():
    conv, fill = "sm90_xmma_fprop_implicit_gemm", "Memset (Device)"
    expected = {conv: 4.0, fill: 4.0}
    # the tree's figure where it booked what the stack makes
    fits = {conv: (4.0, 4e-4), fill: (4.0, 4e-6)}
    assert ins.pass_seconds(fits, expected, None, True) == (pytest.approx(4.04e-4), None)
    assert ins.pass_seconds({"tw_gconv": (4.0, 3e-4)}, {"tw_gconv": 4.0}, 2.9e-4, True)[1] is None
    # over-booked: each kernel scaled to the stack's launches by its own mean, so extra fills
    # take off a fill's time, not a conv's
    s, why = ins.pass_seconds({conv: (4.0, 4e-4), fill: (6.0, 6e-6)}, expected, None, True)
    assert s == pytest.approx(4.04e-4) and "Memset (Device) 6 against 4" in why and "scaled" in why
    s, why = ins.pass_seconds({conv: (5.0, 5e-4), fill: (4.0, 4e-6)}, expected, None, True)
    assert s == pytest.approx(4.04e-4) and f"{conv} 5 against 4" in why
    # tilewise takes the names' figure when the tree miscounts, either way
    s, why = ins.pass_seconds({"tw_gconv": (4.8, 3.5e-4)}, {"tw_gconv": 4.0}, 2.9e-4, True)
    assert s == 2.9e-4 and "4.8 against 4" in why and "names" in why
    s, why = ins.pass_seconds({"tw_gconv": (3.0, 2.2e-4)}, {"tw_gconv": 4.0}, 2.9e-4, True)
    assert s == 2.9e-4 and "3 against 4" in why
    # too few booked and no names: the tree's figure, with a note (it may be short)
    s, why = ins.pass_seconds({conv: (3.0, 3e-4)}, {conv: 4.0}, None, True)
    assert s == 3e-4 and "3 against 4" in why and "scaled" not in why
    s, why = ins.pass_seconds({}, {"tw_gconv": 4.0}, 2.9e-4, False)
    assert s == 2.9e-4 and "not linked" in why


# --- CLI -----------------------------------------------------------------------------------------


@no_cuda
@pytest.mark.parametrize("study", ["gconv", "gconv-insitu"])
def test_gconv_commands_need_cuda(study, tmp_path, capsys):
    assert cli.main(["bench", study, "--quick", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def capsys_err(parser, shape: str) -> str:
    """argparse's error text for ``--shapes SHAPE``."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        parser.parse_args(["bench", "gconv", "--shapes", shape])
    return err.getvalue()


def test_gconv_cli_options_build_configs():
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "gconv", "--quick", "--n", "4", "--extra-kernels"])
    cfg = cli.gconv_config(args)
    assert cfg.batches == (4,) and cfg.extra_kernels == () and cfg.dtypes == ("fp16",)
    args = parser.parse_args(["bench", "gconv", "--channels", "64", "--kernels", "5", "7"])
    cfg = cli.gconv_config(args)
    assert cfg.shapes == ((64, 64, 64),) and cfg.kernels == (5, 7)
    assert {(p.c, p.r) for p in cfg.problems()} == {(64, 5), (64, 7)}
    args = parser.parse_args(["bench", "gconv", "--channels", "256"])  # no C=64 5x5/7x7 then
    assert {(p.c, p.r) for p in cli.gconv_config(args).problems()} == {(256, 3)}
    with pytest.raises(SystemExit, match="--channels"):
        cli.gconv_config(parser.parse_args(["bench", "gconv", "--quick", "--channels", "128"]))
    args = parser.parse_args(["bench", "gconv", "--shapes", "1024:16x16", "64:64x64", "--n", "2"])
    cfg = cli.gconv_config(args)  # MBConv's grouped conv; C=64 64x64 keeps its 5x5/7x7
    assert cfg.shapes == ((1024, 16, 16), (64, 64, 64))
    assert {(p.c, p.h, p.r) for p in cfg.problems()} == {(1024, 16, 3), (64, 64, 3), (64, 64, 5),
                                                         (64, 64, 7)}  # fmt: skip
    args = parser.parse_args(["bench", "gconv", "--shapes", "1024:16x16"])
    assert {(p.c, p.r) for p in cli.gconv_config(args).problems()} == {(1024, 3)}
    for bad in ("1024:16", "12:16x16", "0:8x8", "64"):
        with pytest.raises(SystemExit):  # argparse: "argument --shapes: ..."
            parser.parse_args(["bench", "gconv", "--shapes", bad])
    assert "C must be a positive multiple of 8" in capsys_err(parser, "12:16x16")
    args = parser.parse_args(["bench", "gconv-insitu", "--blocks", "mbconv", "--batches", "32"])
    cfg = cli.insitu_config(args)
    assert cfg.blocks == ("mbconv",) and cfg.batches == (32,) and cfg.impls == ins.IMPLS
    assert args.study == "gconv-insitu"


# --- the GPU: the studies' CUDA paths on small problems (run by scripts/gpu_check.sh) ------------


@pytest.mark.gpu
class TestGPU:
    def test_isolated_problem_times_and_profiles_every_pass(self):
        problem = GConvProblem(4, 64, 16, 16, 3, 3, 1, 1, "fp16")
        config = iso.GConvStudyConfig.quick(warmup=2, reps=5, profile_iters=3)
        recs = iso.measure_problem(problem, config, None, "cuda")
        assert len(recs) == 6
        for r in recs:
            assert r["error"] is None and r["checked"], r
            assert r["median_s"] > 0 and r["prof_s"] > 0 and r["kernels"], r
            assert r["graph_s"] > 0 and r["graph_frac_copy"] is None, r  # no ceilings given
            assert r["l2_s"] > 0, r  # 4 x 64 x 16 x 16 fits in L2: timed from L2 as well
            assert r["same_copy_s"] > 0 and r["graph_frac_same_copy"] > 0, r
        tw = [r for r in recs if r["impl"] == "tilewise"]
        assert all(any("gconv" in k[0] for k in r["kernels"]) for r in tw)
        assert all(len(r["configs"]) == 1 for r in tw), [r["configs"] for r in tw]

    @pytest.mark.parametrize("kind", ["convfirst", "mbconv"])
    def test_insitu_attribution_finds_every_layer(self, kind):
        spec = ins.BlockSpec(kind, 32 if kind == "mbconv" else 64, 16, 3, 2)
        cfg = ins.InSituConfig(
            impls=("tilewise", "eager"), depth=2, iters=3, warmup=2, step_warmup=2, step_reps=3
        )
        recs = ins.measure_block(spec, 8, cfg, None, "cuda")
        passes = [r for r in recs if r["record"] == "pass"]
        assert len(passes) == 6 and not ins.errors(recs), ins.errors(recs)
        for r in passes:
            assert r["launches"] > 0 and r["layer_s"] > 0, r
            if r["impl"] == "tilewise" or r["pass"] == "fprop":
                assert r["launches"] == pytest.approx(r["expected_launches"]), r
            if r["impl"] == "tilewise":
                assert r["name_s"] is not None and r["name_s"] <= r["layer_s"] * 1.001, r
        steps = [r for r in recs if r["record"] == "step"]
        assert [r["impl"] for r in steps] == ["tilewise", "tilewise-graph", "eager"]
        assert all(r["step_s"] > 0 and r["device_s"] > 0 for r in steps)


def test_graphed_tilewise_step_record_wiring():
    """The ``tilewise-graph`` step record (capture_train_step + FusedSGD) and its table column;
    on a CPU the capture API runs eagerly, so this checks the wiring, not the graph."""
    torch.manual_seed(0)
    base = block_stack("convfirst", 16, depth=1, expansion=2, extra=0).to(memory_format=CL)
    model = ins.prepare(base, "tilewise")
    x = _x(1, 16)
    cfg = ins.InSituConfig(step_warmup=1, step_reps=2)
    case = {"args": [(x,)], "step_ident": dict(block="convfirst", batch=1, depth=1, extra=0)}
    rec = ins._graph_step_record(model, case, cfg)
    assert rec["impl"] == "tilewise-graph" and rec["error"] is None and rec["step_s"] > 0
    ((sh, srow),) = ins.summary_tables([rec])[1:]
    assert "tw graph ms" in sh and srow[0][sh.index("tw graph ms")] != "-"


def test_insitu_does_not_time_a_model_that_failed_its_check():
    """tilewise and tilewise-compile are checked against eager first; a failed check is recorded
    as an error and nothing of that model is timed."""
    cfg = ins.InSituConfig(impls=("tilewise", "tilewise-compile"), depth=1, extra=0, rotating=1)
    with mock.patch.object(ins, "forward_check", return_value=(False, "bad")) as check:
        recs = ins.measure_block(ins.BLOCKS["mbconv"], 1, cfg, device="cpu")
    check.assert_called_once()
    assert {(r["impl"], r["record"]) for r in recs} == {
        ("tilewise", "pass"),
        ("tilewise", "step"),
        ("tilewise-compile", "step"),
    }
    assert all(r["error"] == "check failed: bad" for r in recs)
