"""Fused optimizers against torch.optim: fp32 master judged by the three-way rule against fp64."""

from __future__ import annotations

import copy

import pytest
import torch
from checks import ATOL, assert_three_way

from tilewise.ops import optim as optim_ops
from tilewise.optim import FusedAdamW, FusedSGD
from tilewise.runtime import dispatch

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
SHAPES = [(7,), (33, 5), (33,), (4, 3, 3, 3), (1,)]  # odd sizes, biases, a conv weight

# cpu bf16 runs the torch-ops reference (dispatch: the interpreter gets bf16 wrong)
CASES = [pytest.param("cpu", dt, id=f"cpu-{str(dt)[6:]}") for dt in (F32, F16, BF16)] + [
    pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}", marks=pytest.mark.gpu)
    for dt in (F32, F16, BF16)
]

SGD_CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening_wd": dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.05),
    "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
}
ADAMW_CONFIGS = {
    "default": dict(lr=1e-2),
    "custom": dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "beta1_zero_no_wd": dict(lr=1e-2, betas=(0.0, 0.9), weight_decay=0.0),
}
PAIRS = {"sgd": (FusedSGD, torch.optim.SGD), "adamw": (FusedAdamW, torch.optim.AdamW)}


@pytest.fixture
def small_blocks(monkeypatch):
    """32-element blocks: several programs, each looping over several blocks (counter logic)."""
    monkeypatch.setattr(optim_ops, "BLOCK", 32)


def _params(dtype, device, shapes=SHAPES):
    """Our params (model dtype), torch fp32 and fp64 copies, all from the same rounded values."""
    base = [torch.randn(s, dtype=torch.float64, device=device).to(dtype) for s in shapes]
    return [[torch.nn.Parameter(b.to(dt)) for b in base] for dt in (dtype, F32, torch.float64)]


def _set_grads(ours, t32, t64, dtype):
    for p, q, r in zip(ours, t32, t64, strict=True):
        g = torch.randn(p.shape, dtype=torch.float64, device=p.device).to(dtype)
        p.grad.copy_(g)  # in place: p.grad is the optimizer's flat-buffer view
        q.grad, r.grad = g.float(), g.double()


def _judge(opt, ours, t32, t64, o32, o64, seed):
    for i, (p, q, r) in enumerate(zip(ours, t32, t64, strict=True)):
        master = opt.state[p].get("master_param", p)
        assert master.dtype == F32
        assert_three_way(master, q, r, ATOL[F32], f"param {i}", seed)
        if p.dtype != F32:
            assert torch.equal(p, master.to(p.dtype)), f"param {i}: model != rounded master"
        for k in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
            if k in o64.state[r]:
                assert_three_way(opt.state[p][k], o32.state[q][k], o64.state[r][k], ATOL[F32], k)


def _compare(pair, kw, dtype, device, seed, steps=4, groups=None, lrs=None):
    fused, ref = PAIRS[pair]
    ours, t32, t64 = _params(dtype, device)
    wrap = groups or (lambda ps: ps)
    opt, o32, o64 = fused(wrap(ours), **kw), ref(wrap(t32), **kw), ref(wrap(t64), **kw)
    for s in range(steps):
        if lrs is not None:
            for o in (opt, o32, o64):
                o.param_groups[0]["lr"] = lrs[s]
        _set_grads(ours, t32, t64, dtype)
        for o in (opt, o32, o64):
            o.step()
    _judge(opt, ours, t32, t64, o32, o64, seed)
    assert all(int(st["step"]) == steps for st in opt.state_dict()["state"].values())
    assert not opt._counters[:, 1].any()  # every launch reset its arrival count
    return opt


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("config", list(SGD_CONFIGS))
def test_sgd_matches_torch(config, device, dtype, small_blocks, rng_seed):
    _compare("sgd", SGD_CONFIGS[config], dtype, device, rng_seed)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("config", list(ADAMW_CONFIGS))
def test_adamw_matches_torch(config, device, dtype, small_blocks, rng_seed):
    _compare("adamw", ADAMW_CONFIGS[config], dtype, device, rng_seed)


@pytest.mark.parametrize("pair", ["sgd", "adamw"])
def test_reference_path_matches_torch(pair, monkeypatch, rng_seed):
    """The torch-ops fallback (CPU without the interpreter, TILEWISE_FORCE_REFERENCE=1)."""
    monkeypatch.setattr(dispatch, "_force_reference", True)
    kw = SGD_CONFIGS["dampening_wd"] if pair == "sgd" else ADAMW_CONFIGS["custom"]
    _compare(pair, kw, F32, "cpu", rng_seed)


@pytest.mark.parametrize("pair", ["sgd", "adamw"])
def test_lr_schedule_and_groups(pair, rng_seed):
    """Two groups with their own lr/weight decay, and an lr that changes every step."""
    kw = SGD_CONFIGS["nesterov"] if pair == "sgd" else ADAMW_CONFIGS["default"]
    groups = lambda ps: [{"params": ps[::2], "weight_decay": 0.0}, {"params": ps[1::2], "lr": 0.02}]
    lrs = [kw["lr"] * 0.5**s for s in range(4)]
    opt = _compare(pair, kw, F32, "cpu", rng_seed, groups=groups, lrs=lrs)
    assert opt._hyper[0, 0].item() == lrs[-1] and opt._hyper[1, 0].item() == 0.02


def test_scheduler_update_and_set_lr_reach_the_device():
    p = torch.nn.Parameter(torch.randn(5))
    opt = FusedAdamW([p], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()
    sched.step()
    assert opt._hyper[0, 0].item() == 0.05  # assignment by the scheduler: written at once
    opt.param_groups[0].update(lr=0.25, betas=(0.5, 0.75))  # bypasses __setitem__ ...
    opt.step()  # ... so step re-checks
    assert opt._hyper[0].tolist() == [0.25, 0.01, 0.5, 0.75, 1e-8]
    opt.set_lr(0.125)
    assert opt.param_groups[0]["lr"] == 0.125 and opt._hyper[0, 0].item() == 0.125


def test_model_backward_accumulates_into_flat_grads(rng_seed):
    """A real backward (channels_last conv, odd Linear sizes: torch ops) ends in the flat buffer."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.Flatten(),
        torch.nn.Linear(36, 33),
        torch.nn.Linear(33, 7),
    ).to(memory_format=torch.channels_last)
    m32, m64 = copy.deepcopy(model), copy.deepcopy(model).double()
    kw = dict(lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt = FusedSGD(model.parameters(), **kw)
    o32, o64 = torch.optim.SGD(m32.parameters(), **kw), torch.optim.SGD(m64.parameters(), **kw)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)  # layout kept
    flat = opt._flat_grad
    views = [p.grad for p in model.parameters()]
    for _ in range(3):
        x = torch.randn(2, 3, 5, 5)
        for m, o, xx in ((model, opt, x), (m32, o32, x), (m64, o64, x.double())):
            o.zero_grad()
            m(xx).square().mean().backward()
            m(xx).sum().backward()  # accumulates
            o.step()
        for p, v in zip(model.parameters(), views, strict=True):
            assert p.grad is v
            assert flat.data_ptr() <= p.grad.data_ptr() < flat.data_ptr() + flat.nbytes
    _judge(opt, list(model.parameters()), list(m32.parameters()), list(m64.parameters()), o32, o64,
           rng_seed)  # fmt: skip
    opt.zero_grad()  # set_to_none (the default): grads None, the buffer left for the next backward
    assert all(p.grad is None for p in model.parameters())
    opt.zero_grad(set_to_none=False)
    assert not flat.any() and all(
        p.grad is v for p, v in zip(model.parameters(), views, strict=True)
    )


def test_none_and_replaced_grads():
    a, b = torch.nn.Parameter(torch.randn(7)), torch.nn.Parameter(torch.randn(3, 5))
    opt = FusedSGD([a, b], lr=0.5)
    a0, b0 = a.detach().clone(), b.detach().clone()
    a.grad.fill_(1.0)
    a.grad = None  # as model.zero_grad() does: counts as zero (the stale 1.0 must not be used)
    g = torch.randn(3, 5)
    b.grad = g.clone()  # a replaced tensor: copied into the flat buffer
    opt.step()
    assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0 - 0.5 * g)
    assert torch.equal(a.grad, torch.zeros(7)) and torch.equal(b.grad, g)
    assert a.grad.data_ptr() == opt._grads[0].data_ptr() and b.grad is opt._grads[1]


@pytest.mark.parametrize("pair", ["sgd", "adamw"])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_state_dict_round_trip(pair, dtype):
    fused = PAIRS[pair][0]
    kw = SGD_CONFIGS["momentum"] if pair == "sgd" else ADAMW_CONFIGS["custom"]
    ours, _, _ = _params(dtype, "cpu", SHAPES[:3])
    opt = fused(ours, **kw)
    grads = [[torch.randn(p.shape).to(dtype) for p in ours] for _ in range(5)]
    for s in range(3):
        for p, g in zip(ours, grads[s], strict=True):
            p.grad.copy_(g)
        opt.step()
    sd = opt.state_dict()
    assert int(sd["state"][0]["step"]) == 3 and ("master_param" in sd["state"][0]) == (dtype == F16)
    other = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt2 = fused(other, lr=0.5)  # hyperparameters come from the state dict
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == kw["lr"]
    for s in range(3, 5):
        for o, ps in ((opt, ours), (opt2, other)):
            for p, g in zip(ps, grads[s], strict=True):
                p.grad.copy_(g)
            o.step()
    for p, q in zip(ours, other, strict=True):
        assert torch.equal(p, q)
        assert torch.equal(
            opt.state[p].get("master_param", p), opt2.state[q].get("master_param", q)
        )
    sd["state"][0][next(iter(sd["state"][0]))].add_(1.0)  # a copy: the optimizer is untouched
    assert torch.equal(ours[0], other[0])


@pytest.mark.parametrize("pair", ["sgd", "adamw"])
def test_state_dict_interchange_with_torch(pair, rng_seed):
    """torch -> fused -> torch: the state dict formats agree."""
    fused, ref = PAIRS[pair]
    kw = SGD_CONFIGS["momentum"] if pair == "sgd" else ADAMW_CONFIGS["custom"]
    ours, t32, t64 = _params(F32, "cpu")
    o32, o64 = ref(t32, **kw), ref(t64, **kw)
    for _ in range(2):
        for q, r in zip(t32, t64, strict=True):
            g = torch.randn(q.shape)
            q.grad, r.grad = g, g.double()
        o32.step()
        o64.step()
    with torch.no_grad():
        for p, q in zip(ours, t32, strict=True):
            p.copy_(q)
    opt = fused(ours, lr=1.0)
    opt.load_state_dict(o32.state_dict())
    back = ref([torch.nn.Parameter(q.detach().clone()) for q in t32], **kw)
    back.load_state_dict(opt.state_dict())
    for q, b in zip(t32, back.param_groups[0]["params"], strict=True):
        for k, v in o32.state[q].items():
            assert torch.equal(back.state[b][k].float(), v.float()), k
    for _ in range(2):
        _set_grads(ours, t32, t64, F32)
        for o in (opt, o32, o64):
            o.step()
    _judge(opt, ours, t32, t64, o32, o64, rng_seed)


def test_bad_inputs_raise_naming_the_argument():
    p = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match="'lr'"):
        FusedAdamW([p], lr=-1.0)
    with pytest.raises(ValueError, match="'lr'"):
        FusedSGD([p], lr=torch.tensor(0.1))
    with pytest.raises(ValueError, match="'beta1'"):
        FusedAdamW([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="'eps'"):
        FusedAdamW([p], eps=-1e-8)
    with pytest.raises(ValueError, match="'nesterov'"):
        FusedSGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="'params'"):
        FusedSGD([torch.nn.Parameter(torch.randn(3, dtype=torch.float64))], lr=0.1)
    with pytest.raises(ValueError, match="'params'"):
        FusedSGD([p, torch.nn.Parameter(torch.randn(3).half())], lr=0.1)
    with pytest.raises(ValueError, match="'params'"):
        FusedSGD([p, torch.nn.Parameter(torch.randn(3, device="meta"))], lr=0.1)
    assert p.grad is None  # validation happens before the parameters are re-pointed
    opt = FusedSGD([p], lr=0.1)
    with pytest.raises(RuntimeError, match="construction"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(2))]})
    with pytest.raises(ValueError, match="'momentum'"):  # would need a buffer it lacks
        opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(ValueError, match="'momentum'"):
        opt.step()
    opt.param_groups[0]["momentum"] = 0.0
    with pytest.raises(ValueError, match="'state_dict'"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": [0, 1]}]})
    p.data = torch.randn(3)
    with pytest.raises(RuntimeError, match="re-assigned"):
        opt.step()


# -- GPU only: CUDA-graph capture ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("pair", ["sgd", "adamw"])
def test_cuda_graph_replays_follow_lr_and_step(pair, dtype, rng_seed):
    """Capture step() once, replay 5 times with a new lr before each: matches eager torch."""
    fused, ref = PAIRS[pair]
    kw = SGD_CONFIGS["nesterov"] if pair == "sgd" else ADAMW_CONFIGS["custom"]
    ours, t32, t64 = _params(dtype, "cuda")
    opt, o32, o64 = fused(ours, **kw), ref(t32, **kw), ref(t64, **kw)
    for _ in range(2):  # warm-up: compiles the kernel; the momentum buffer exists afterwards
        _set_grads(ours, t32, t64, dtype)
        for o in (opt, o32, o64):
            o.step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for i in range(5):
        for o in (opt, o32, o64):
            o.param_groups[0]["lr"] = kw["lr"] * 0.7**i
        _set_grads(ours, t32, t64, dtype)
        graph.replay()
        o32.step()
        o64.step()
    torch.cuda.synchronize()
    _judge(opt, ours, t32, t64, o32, o64, rng_seed)
    assert int(opt._counters[0, 0]) == 7 and int(opt._counters[0, 1]) == 0


@pytest.mark.gpu
def test_lr_change_during_capture_raises():
    p = torch.nn.Parameter(torch.randn(5, device="cuda"))
    opt = FusedAdamW([p], lr=0.1)
    opt.step()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capture"):
        with torch.cuda.graph(graph):
            opt.param_groups[0]["lr"] = 0.2
            opt.step()


def test_in_place_writes_to_half_params_reach_the_master():
    """Loading model weights (or nn.init, EMA) after building the optimizer must not be undone by
    the next step writing the stale fp32 master back over the fp16 weights."""
    model = torch.nn.Linear(4, 4).half()
    opt = FusedSGD(model.parameters(), lr=0.0)
    with torch.no_grad():
        model.weight.fill_(0.5)
    model.load_state_dict({"weight": model.weight.detach().clone(), "bias": torch.ones(4).half()})
    opt.zero_grad()
    model(torch.randn(2, 4).half()).float().sum().backward()
    opt.step()
    assert torch.all(model.weight == 0.5) and torch.all(model.bias == 1.0)


def test_frozen_params_are_refused():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    with pytest.raises(ValueError, match="'params'.*requires_grad=False"):
        FusedAdamW(model.parameters())


def test_a_refused_state_dict_changes_nothing():
    model = torch.nn.Linear(4, 2)
    opt = FusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    bad = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=torch.tensor(0.5), momentum=0.9)
    with pytest.raises(ValueError, match="'lr'"):
        opt.load_state_dict(bad.state_dict())
    assert opt.param_groups[0]["lr"] == 0.1
    maximize = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.5, maximize=True)
    with pytest.raises(ValueError, match="maximize"):
        opt.load_state_dict(maximize.state_dict())
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # still usable
