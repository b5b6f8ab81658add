"""Whole-step CUDA-graph capture (``tilewise.runtime.capture``): eager fallback on CPU, refusals,
and (GPU) replays against eager twins."""

import copy

import pytest
import torch
from torch import nn

import tilewise.nn as tnn
from tilewise.optim import FusedAdamW
from tilewise.runtime import CaptureError, capture_inference, capture_train_step


def _mlp(device="cpu", dtype=torch.float32):
    return nn.Sequential(
        tnn.Linear(12, 24, activation="relu"), nn.Linear(24, 16), tnn.Linear(16, 5)
    ).to(device, dtype)


# -- CPU: eager fallback and refusals ---------------------------------------------------------


def test_cpu_inference_runs_eagerly_and_matches():
    model = _mlp()
    x = torch.randn(7, 12)
    fn = capture_inference(model, x)
    assert fn.captured is False
    y = torch.randn(7, 12)
    with torch.no_grad():
        torch.testing.assert_close(fn(y), model(y))
        torch.testing.assert_close(fn(y, clone=True), model(y))


def test_shape_mismatch_names_the_argument():
    fn = capture_inference(lambda a, b: a + b, (torch.randn(3, 4), torch.randn(3, 4)))
    with pytest.raises(ValueError, match=r"argument 1: expected shape \(3, 4\), got \(5, 4\)"):
        fn(torch.randn(3, 4), torch.randn(5, 4))
    with pytest.raises(ValueError, match="expected 2 tensors"):
        fn(torch.randn(3, 4))
    with pytest.raises(ValueError, match="argument 0: expected torch.float32"):
        fn(torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4))


def test_cpu_train_step_runs_eagerly_and_matches_a_twin():
    model = _mlp()
    twin = copy.deepcopy(model)
    opt, opt2 = FusedAdamW(model.parameters(), lr=1e-2), FusedAdamW(twin.parameters(), lr=1e-2)
    loss_fn = nn.functional.mse_loss
    x, t = torch.randn(6, 12), torch.randn(6, 5)
    step = capture_train_step(model, loss_fn, opt, x, t)
    assert step.captured is False
    for _ in range(2):
        x, t = torch.randn(6, 12), torch.randn(6, 5)
        loss = step(x, t)
        opt2.zero_grad()
        ref = loss_fn(twin(x), t)
        ref.backward()
        opt2.step()
        torch.testing.assert_close(loss, ref.detach())
    with pytest.raises(ValueError, match="targets argument 0"):
        step(x, torch.randn(6, 4))


def test_grad_scaler_refused():
    model = _mlp()
    opt = FusedAdamW(model.parameters())
    x, t = torch.randn(2, 12), torch.randn(2, 5)
    with pytest.raises(ValueError, match="GradScaler"):
        capture_train_step(
            model, nn.functional.mse_loss, opt, x, t, scaler=torch.amp.GradScaler("cpu")
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        lambda ps: torch.optim.SGD(ps, lr=1e-3),
        lambda ps: torch.optim.Adam(ps, lr=1e-3, capturable=True),
    ],
)
def test_float_lr_torch_optimizer_refused(make):
    model = _mlp()
    x, t = torch.randn(2, 12), torch.randn(2, 5)
    with pytest.raises(ValueError, match="Python float lr.*capturable=True"):
        capture_train_step(model, nn.functional.mse_loss, make(model.parameters()), x, t)


def test_non_capturable_tensor_lr_refused():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3), foreach=False)
    with pytest.raises(ValueError, match="not capturable"):
        capture_train_step(
            model, nn.functional.mse_loss, opt, torch.randn(2, 12), torch.randn(2, 5)
        )


def test_bad_autocast_dtype_refused():
    with pytest.raises(ValueError, match="autocast_dtype"):
        capture_inference(_mlp(), torch.randn(2, 12), autocast_dtype=torch.float64)


# -- GPU: real capture ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_inference_replay_matches_eager(dtype):
    model = _mlp("cuda", dtype).eval()
    fn = capture_inference(model, torch.randn(64, 12, device="cuda", dtype=dtype))
    assert fn.captured
    for _ in range(3):
        x = torch.randn(64, 12, device="cuda", dtype=dtype)
        out = fn(x, clone=True)
        with torch.no_grad():
            torch.testing.assert_close(out, model(x))
    with pytest.raises(ValueError, match="capture again for this shape"):
        fn(torch.randn(32, 12, device="cuda", dtype=dtype))


@pytest.mark.gpu
def test_grouped_conv_inference_replay_matches_eager():
    model = nn.Sequential(
        tnn.GroupedConv2d(32, 32, 3, padding=1, groups=4), nn.ReLU(),
        tnn.GroupedConv2d(32, 32, 5, padding=2, groups=4),
    ).to("cuda", memory_format=torch.channels_last).eval()  # fmt: skip
    shape = (4, 32, 20, 20)

    def make():
        return torch.randn(shape, device="cuda").to(memory_format=torch.channels_last)

    fn = capture_inference(model, make())
    for _ in range(2):
        x = make()
        out = fn(x, clone=True)
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_train_step_matches_eager_adamw_with_scheduler():
    model = _mlp("cuda")
    twin = copy.deepcopy(model)
    opt = FusedAdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=3, gamma=0.5)
    loss_fn = nn.functional.mse_loss

    def batch():
        return torch.randn(32, 12, device="cuda"), torch.randn(32, 5, device="cuda")

    step = capture_train_step(model, loss_fn, opt, *batch())
    assert step.captured
    for _ in range(10):
        x, t = batch()
        loss = step(x, t).clone()
        ref.zero_grad()
        ref_loss = loss_fn(twin(x), t)
        ref_loss.backward()
        ref.step()
        sched.step()
        ref_sched.step()
        torch.testing.assert_close(loss, ref_loss.detach(), atol=1e-4, rtol=1e-3)
    assert opt.param_groups[0]["lr"] == pytest.approx(ref.param_groups[0]["lr"])
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
def test_item_inside_the_step_raises_capture_error():
    model = _mlp("cuda")
    opt = FusedAdamW(model.parameters())

    def loss_fn(out, t):
        loss = nn.functional.mse_loss(out, t)
        if loss.item() > 1e9:  # a host sync
            raise AssertionError
        return loss

    x, t = torch.randn(8, 12, device="cuda"), torch.randn(8, 5, device="cuda")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CaptureError, match="synchronises with the host"):
        capture_train_step(model, loss_fn, opt, x, t, warmup=1)
    torch.randn(4, device="cuda")  # CUDA and its RNG are still usable
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, q), "the refused step's warm-up was not undone"


@pytest.mark.gpu
def test_a_capture_failing_inside_cuda_leaves_cuda_and_the_rng_usable():
    """An explicit device sync passes the warm-up check but breaks the capture itself; the RNG
    must not stay in capture mode (before the fix the next torch.randn raised)."""
    model = _mlp("cuda")

    def forward(x):
        y = model(x)
        torch.cuda.synchronize()
        return y

    with pytest.raises(CaptureError):
        capture_inference(forward, torch.randn(8, 12, device="cuda"))
    a = torch.randn(1000, device="cuda")
    assert a.std().item() > 0.5


def test_torch_sgd_with_dampened_momentum_is_refused():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(
        model.parameters(), lr=torch.tensor(0.1), momentum=0.9, dampening=0.1, fused=True
    )
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    with pytest.raises(ValueError, match="dampening"):
        capture_train_step(model, torch.nn.functional.mse_loss, opt, x, y)
