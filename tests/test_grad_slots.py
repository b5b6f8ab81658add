"""Gradient slots: tilewise's linear backward writes straight into a fused optimizer's flat
gradient buffer after ``zero_grad()``, and every case where it must not still gets its own,
correct gradient (``tilewise.runtime.grad_slots``)."""

from __future__ import annotations

import copy

import pytest
import torch

import tilewise.nn as tnn
from tilewise.optim import FusedAdamW, FusedSGD
from tilewise.runtime import dispatch, grad_slots

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
KERNEL_PATHS = ["kernel", "reference"]


def _mlp(device: str, dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    layers = [
        tnn.Linear(13, 24, activation="relu"),
        tnn.Linear(24, 9),
        tnn.Linear(9, 5, bias=False),
    ]
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype)


def _plain_copy(model: torch.nn.Sequential) -> torch.nn.Sequential:
    """The same weights in plain torch layers, fp64: the reference gradients."""
    ref = torch.nn.Sequential(
        torch.nn.Linear(13, 24),
        torch.nn.ReLU(),
        torch.nn.Linear(24, 9),
        torch.nn.Linear(9, 5, False),
    ).double()
    with torch.no_grad():
        for q, p in zip(ref.parameters(), model.parameters(), strict=True):
            q.copy_(p.detach().double().cpu())
    return ref


def _in_flat(opt, t: torch.Tensor) -> bool:
    flat = opt._flat_grad
    return flat.data_ptr() <= t.data_ptr() < flat.data_ptr() + flat.nbytes


@pytest.fixture(params=KERNEL_PATHS)
def path(request, monkeypatch):
    """Both sides of dispatch on the CPU: the interpreted kernels, and the torch reference."""
    if request.param == "reference":
        monkeypatch.setattr(dispatch, "INTERPRET", False)
    return request.param


@pytest.mark.parametrize("device", DEVICES)
def test_backward_writes_into_the_flat_buffer(device, path):
    model = _mlp(device)
    opt = FusedSGD(model.parameters(), lr=0.1)
    slots = [grad_slots.slot_of(p) for p in model.parameters()]
    for step in range(2):
        x = torch.randn(6, 13, device=device)
        ref = _plain_copy(model)
        opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
        opt._flat_grad.fill_(float("nan"))  # stale memory: every gradient must be overwritten
        model(x).square().sum().backward()
        ref(x.double().cpu()).square().sum().backward()
        for p, q, slot in zip(model.parameters(), ref.parameters(), slots, strict=True):
            assert _in_flat(opt, p.grad), "the gradient was not written in place"
            assert slot.claims == step + 1
            torch.testing.assert_close(p.grad.double().cpu(), q.grad, rtol=1e-5, atol=1e-5)
        opt.step()
        assert all(p.grad is v for p, v in zip(model.parameters(), opt._grads, strict=True))


def test_parameter_used_twice_gets_the_sum(path):
    """The second use must not overwrite the first use's gradient in the shared view."""
    lin = tnn.Linear(7, 7, activation="gelu")
    opt = FusedAdamW(lin.parameters(), lr=1e-2)
    ref = torch.nn.Linear(7, 7).double()
    with torch.no_grad():
        ref.weight.copy_(lin.weight.double())
        ref.bias.copy_(lin.bias.double())
    x = torch.randn(5, 7)
    opt.zero_grad()
    opt._flat_grad.fill_(float("nan"))
    lin(lin(x)).sum().backward()
    g = torch.nn.functional.gelu
    g(ref(g(ref(x.double())))).sum().backward()
    torch.testing.assert_close(lin.weight.grad.double(), ref.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin.bias.grad.double(), ref.bias.grad, rtol=1e-5, atol=1e-5)
    assert grad_slots.slot_of(lin.weight).claims == 1  # only the first backward wrote in place


def test_autograd_grad_gets_its_own_tensors(path):
    model = _mlp("cpu")
    opt = FusedSGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    opt._flat_grad.fill_(7.0)
    params = list(model.parameters())
    grads = torch.autograd.grad(model(torch.randn(4, 13)).sum(), params)
    assert not any(_in_flat(opt, g) for g in grads)
    assert all(p.grad is None for p in params) and bool((opt._flat_grad == 7.0).all())
    assert all(grad_slots.slot_of(p).claims == 0 for p in params)


def test_accumulation_and_set_to_none_false(path):
    """Two backward passes after one zero_grad sum up, with either zero_grad."""
    model = _mlp("cpu")
    opt = FusedSGD(model.parameters(), lr=0.1)
    ref = _plain_copy(model)
    x1, x2 = torch.randn(3, 13), torch.randn(5, 13)
    for set_to_none in (True, False):
        opt.zero_grad(set_to_none=set_to_none)
        ref.zero_grad()
        for x in (x1, x2):
            model(x).sum().backward()
            ref(x.double()).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert _in_flat(opt, p.grad)
            torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-5, atol=1e-5)
    assert all(p.grad is v for p, v in zip(model.parameters(), opt._grads, strict=True))


def test_unused_and_foreign_gradients_at_step(path):
    """A parameter that got no gradient counts as zero (stale buffer contents are not used); a
    gradient from a plain torch op is copied in."""
    used, unused = tnn.Linear(4, 3), tnn.Linear(4, 3)
    plain = torch.nn.Linear(3, 2)
    params = [*used.parameters(), *unused.parameters(), *plain.parameters()]
    before = [p.detach().clone() for p in params]
    opt = FusedSGD(params, lr=0.5)
    opt.zero_grad()
    opt._flat_grad.fill_(3.0)
    plain(used(torch.randn(2, 4))).sum().backward()
    ref = copy.deepcopy([p.grad for p in params])
    assert ref[2] is None and ref[4] is not None and not _in_flat(opt, params[4].grad)
    opt.step()
    for p, b, g in zip(params, before, ref, strict=True):
        expected = b if g is None else b - 0.5 * g
        torch.testing.assert_close(p.detach(), expected)


def test_hooked_parameters_keep_their_own_gradients(path):
    """A gradient hook may keep the tensor it is given: it must not be the flat-buffer view that
    the next backward overwrites."""
    lin = tnn.Linear(6, 4)
    opt = FusedSGD(lin.parameters(), lr=0.1)
    kept = []
    lin.weight.register_hook(lambda g: kept.append(g))
    opt.zero_grad()
    lin(torch.randn(3, 6)).sum().backward()
    first = kept[0].clone()
    assert not _in_flat(opt, kept[0]) and grad_slots.slot_of(lin.weight).claims == 0
    assert grad_slots.slot_of(lin.bias).claims == 1  # the unhooked bias still writes in place
    opt.step()
    opt.zero_grad()
    lin(torch.randn(3, 6)).sum().backward()
    assert torch.equal(kept[0], first)


def test_model_with_fused_optimizer_pickles(tmp_path):
    model = _mlp("cpu")
    FusedAdamW(model.parameters(), lr=1e-3)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    for p, q in zip(model.parameters(), loaded.parameters(), strict=True):
        assert torch.equal(p, q) and grad_slots.slot_of(q) is None
