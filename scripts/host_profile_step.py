"""Where the host time of an eager training step goes: tilewise's transformed stack vs PyTorch.

Session 6 measured the eager tilewise ConvFirst/MBConv training step at 0.50-0.89x eager
PyTorch, while the same step captured in a CUDA graph ran 1.04-3.60x faster than eager PyTorch:
the difference is host time. This script times both eager steps (wall clock, synchronised) and
prints cProfile's top functions by cumulative and by own time for the tilewise step, so the
Python launch paths that cost the most can be cut. "pyfunc" is the control: the grouped convs
as cuDNN behind a plain Python autograd Function; "kernels" is each step's summed kernel time
(wall above it is host time); "pyident" keeps cuDNN and adds a do-nothing Python autograd node
after each grouped conv; ``--single-thread-too`` runs each again with
``torch.autograd.set_multithreading_enabled(False)`` (the backward on the calling thread instead
of the device's autograd thread).

    python scripts/host_profile_step.py [--block mbconv] [--batch 32] [--steps 20] [--top 30]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

import tilewise
from tilewise.models import block_stack


class _CudnnConv(torch.autograd.Function):
    """cuDNN's grouped conv behind a Python autograd Function (the control: what any Python
    custom op costs in the step, whatever its kernels)."""

    @staticmethod
    def forward(ctx, x, w, padding, groups):
        ctx.save_for_backward(x, w)
        ctx.conf = (list(padding), groups)
        return torch.ops.aten.convolution(x, w, None, [1, 1], list(padding), [1, 1], False,
                                          [0, 0], groups)  # fmt: skip

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        padding, groups = ctx.conf
        dx, dw, _ = torch.ops.aten.convolution_backward(
            grad, x, w, None, [1, 1], padding, [1, 1], False, [0, 0], groups, [True, True, False]
        )
        return dx, dw, None, None


class PyFunctionConv(torch.nn.Conv2d):
    """An nn.Conv2d whose forward calls ``_CudnnConv`` (inputs cast as autocast would)."""

    def forward(self, x):
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
        with torch.autocast("cuda", enabled=False):
            return _CudnnConv.apply(x.to(dtype), self.weight.to(dtype), self.padding, self.groups)


def python_function_convs(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its grouped convs (groups > 1) as ``PyFunctionConv`` (parameters shared)."""
    for mod in list(model.modules()):
        for child_name, child in list(mod.named_children()):
            if type(child) is torch.nn.Conv2d and child.groups > 1:
                new = PyFunctionConv.__new__(PyFunctionConv)
                new.__dict__.update(child.__dict__)
                setattr(mod, child_name, new)
    return model


class IdentityFunction(torch.autograd.Function):
    """A Python autograd node that does nothing: what one such node costs a step."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _IdentityAfter(torch.nn.Module):
    def __init__(self, conv: torch.nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return IdentityFunction.apply(self.conv(x))


def identity_after_convs(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (cuDNN convs kept) with an ``IdentityFunction`` node after each grouped conv."""
    for mod in list(model.modules()):
        for child_name, child in list(mod.named_children()):
            if type(child) is torch.nn.Conv2d and child.groups > 1:
                setattr(mod, child_name, _IdentityAfter(child))
    return model


def device_busy_ms(step, dev: torch.device) -> float:
    """Summed kernel time of one step (torch.profiler): below the wall time, the host sets the
    pace."""
    if dev.type != "cuda":
        return float("nan")
    from tilewise.bench.timing import profile_kernels

    return profile_kernels(step, iters=5, warmup=1).per_call_s * 1e3


def make_step(model, opt, x, label, threads: bool = True):
    kind = x.device.type
    dtype = torch.float16 if kind == "cuda" else torch.bfloat16

    def step():
        with torch.autocast(kind, dtype=dtype):
            loss = F.cross_entropy(model(x), label)
        opt.zero_grad(set_to_none=True)
        with torch.autograd.set_multithreading_enabled(threads):
            loss.backward()
        opt.step()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(step, steps: int, device: torch.device) -> float:
    for _ in range(3):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--block", choices=["convfirst", "mbconv"], default="mbconv")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    ap.add_argument(
        "--single-thread-too",
        action="store_true",
        help="each variant again with the backward on the calling thread",
    )
    ap.add_argument("--no-profile", action="store_true", help="the step times only")
    ap.add_argument("--rounds", type=int, default=0, help="then every variant again, in turns")
    args = ap.parse_args()
    dev = torch.device(args.device)
    c, hw = (64, 64) if args.block == "convfirst" else (256, 16)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    base = block_stack(args.block, c, depth=4).to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, c, hw, hw, device=dev).contiguous(memory_format=torch.channels_last)
    label = torch.randint(0, c, (args.batch,), device=dev)
    tw = copy.deepcopy(base)
    print(tilewise.transform(tw))
    pyf = python_function_convs(copy.deepcopy(base))
    pyid = identity_after_convs(copy.deepcopy(base))
    steps = {}
    variants = [("eager", base), ("tilewise", tw), ("pyfunc", pyf), ("pyident", pyid)]
    for threads in (True, False) if args.single_thread_too else (True,):
        for name, model in variants:
            name = name if threads else name + "/1t"  # the backward on the calling thread
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            steps[name] = make_step(model, opt, x, label, threads)
    for name in steps:
        t0 = time.perf_counter()
        steps[name]()  # first use: cuDNN benchmark / tilewise autotuning (cached on disk)
        sync(dev)
        print(f"{name:9s} first step: {time.perf_counter() - t0:8.2f} s")
        ms = wall_ms(steps[name], args.steps, dev)
        print(f"{name:9s} eager step: {ms:8.2f} ms (wall, synced)")
        print(f"{name:9s} kernels:    {device_busy_ms(steps[name], dev):8.2f} ms a step (profiler)")
    if args.rounds:  # the variants in turns, so a host that drifts moves each one alike
        walls = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                walls[name].append(wall_ms(step, args.steps, dev))
        for name, ms in walls.items():
            ms.sort()
            print(f"{name:9s} in turns:   {ms[len(ms) // 2]:8.2f} ms median of {len(ms)} "
                  f"({ms[0]:.2f}-{ms[-1]:.2f})")  # fmt: skip
    if args.no_profile:
        return
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        steps["tilewise"]()
    sync(dev)
    prof.disable()
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
        print(f"--- tilewise step, {args.steps} steps, by {key} ---")
        print(buf.getvalue())


if __name__ == "__main__":
    main()
