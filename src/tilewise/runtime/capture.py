"""Whole-step CUDA-graph capture: an inference forward or a training step, replayed as one graph.

``capture_inference(model, example_inputs)`` and ``capture_train_step(model, loss_fn, optimizer,
example_inputs, example_targets)`` copy the examples into static buffers, warm up on a side stream
(kernels compile, tilewise autotunes, lazy optimizer state appears), capture into a
``torch.cuda.CUDAGraph`` with a private memory pool, and return a callable that copies new inputs
into the static buffers and replays. Rules:

- Shapes, dtypes and devices are fixed at capture: another one is a ``ValueError`` naming the
  argument (capture again per shape). Results are static tensors, overwritten by the next call
  (``clone=True`` returns copies).
- Anything that synchronises with the host (``.item()``, ``.cpu()``, printing a tensor,
  data-dependent shapes such as ``nonzero``) cannot be captured: ``CaptureError``. The warmup runs
  may sync (autotune timing); one more run after them goes under
  ``torch.cuda.set_sync_debug_mode("error")``, so most syncs are refused before capture begins.
  Whatever fails, a training step's warmup is undone and CUDA and its RNG stay usable.
- Training: warmup steps are undone (parameters, buffers, optimizer state and the RNG are
  restored), so replay ``n`` equals eager step ``n``. Inside the graph: ``zero_grad`` (a memset;
  none with a fused optimizer, whose gradients tilewise's backward writes in place), forward,
  loss, backward, ``step``. Parameters outside the optimizer get a fresh gradient per
  replay. The optimizer must keep its learning rate on the device: ``tilewise.optim.FusedSGD`` /
  ``FusedAdamW`` (``sync_hyperparameters()`` runs before every replay, so ``group['lr'] = x`` and
  schedulers work), or a torch optimizer with ``capturable=True`` (Adam/AdamW; ``fused=True`` for
  SGD) and a tensor ``lr`` on the parameters' device (schedulers ``fill_`` it; a float or new tensor
  assigned to ``group['lr']`` is copied into the captured one). Other hyperparameters of a torch
  optimizer are baked in: changing them raises. ``GradScaler`` syncs the host (inf checks) and is
  refused; ``autocast_dtype=torch.bfloat16`` needs no scaler (fp16 runs unscaled).
- Dropout: torch registers the default CUDA generator with the graph, so each replay draws fresh
  random numbers. Inference captures the model in its current mode (call ``eval()`` first).
- CPU (or any non-CUDA device): the same API runs eagerly (``captured`` is False), logged once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree

from tilewise.optim import _FusedOptimizer
from tilewise.runtime.graph_state import repair_after_failed_capture

log = logging.getLogger("tilewise")

_SYNC_HINT = (
    "the captured function synchronises with the host (e.g. .item(), .cpu(), printing a tensor, "
    "data-dependent shapes); move that out of the step"
)
_SYNC_PATTERN = re.compile(r"captur|not permitted|cudaErrorStreamCapture", re.IGNORECASE)
_AUTOCAST = (None, torch.float16, torch.bfloat16)


class CaptureError(RuntimeError):
    """The function cannot be captured into a CUDA graph (see the message for the cause)."""


@functools.cache
def _log_once(msg: str) -> None:
    log.warning(msg)


def _as_tuple(name: str, x: Any) -> tuple[torch.Tensor, ...]:
    xs = (x,) if isinstance(x, torch.Tensor) else tuple(x)
    for i, t in enumerate(xs):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"argument '{name}[{i}]' must be a tensor, got {type(t).__name__}")
    return xs


def _device_of(*groups: Sequence[torch.Tensor]) -> torch.device:
    devices = {t.device for g in groups for t in g}
    if len(devices) != 1:
        raise ValueError(f"example tensors must share one device, got {sorted(map(str, devices))}")
    return devices.pop()


def _check(name: str, static: Sequence[torch.Tensor], given: Sequence[Any]) -> None:
    if len(given) != len(static):
        raise ValueError(f"'{name}': expected {len(static)} tensors, got {len(given)}")
    for i, (s, g) in enumerate(zip(static, given, strict=True)):
        if not isinstance(g, torch.Tensor):
            raise ValueError(f"{name} argument {i}: expected a tensor, got {type(g).__name__}")
        if g.shape != s.shape:
            raise ValueError(
                f"{name} argument {i}: expected shape {tuple(s.shape)}, got {tuple(g.shape)}; "
                "dynamic shapes cannot be replayed; capture again for this shape"
            )
        if g.dtype != s.dtype or g.device != s.device:
            raise ValueError(
                f"{name} argument {i}: expected {s.dtype} on {s.device}, got {g.dtype} on "
                f"{g.device}; capture again for this dtype/device"
            )


def _check_warmup(warmup: int) -> None:
    if not isinstance(warmup, int) or warmup < 1:  # kernels compile, lazy state appears
        raise ValueError(f"argument 'warmup' must be an int >= 1, got {warmup!r}")


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype not in _AUTOCAST:
        raise ValueError(f"argument 'autocast_dtype' must be one of {_AUTOCAST}, got {dtype}")
    # cache_enabled=False: cast weights would otherwise live outside the graph's pool.
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None, cache_enabled=False)


def _warmup(fn: Callable[[], Any], device: torch.device, n: int) -> None:
    """Run ``fn`` ``n`` times on a side stream, as CUDA-graph capture requires, then once more
    with host synchronisation turned into an error: a step that syncs is refused here, before
    capture, where refusing it leaves CUDA and the RNG untouched (a sync inside a capture
    invalidates it). The first runs may sync (kernel autotuning times candidates)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(side):
            for _ in range(n):
                fn()
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
            except RuntimeError as exc:
                if "synchroniz" not in str(exc):
                    raise
                raise CaptureError(
                    f"tilewise.capture: {_SYNC_HINT}. Cause: {type(exc).__name__}: {exc}"
                ) from exc
            finally:
                torch.cuda.set_sync_debug_mode(previous)
    finally:
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)


def _capture(fn: Callable[[], Any], device: torch.device, pool: Any) -> tuple[Any, Any]:
    """Capture ``fn`` into a graph with a private pool; returns (graph, output).

    Begins and ends capture itself (not ``torch.cuda.graph``) so that a failed capture still
    restores the current stream.
    """
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    torch.cuda.synchronize(device)
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=torch.cuda.graph_pool_handle() if pool is None else pool)
        try:
            out = fn()
        except RuntimeError as exc:
            try:
                graph.capture_end()
                then = ""
            except RuntimeError as end:  # the capture was invalidated
                then = f" (capture then ended with: {end})"
            why = _SYNC_HINT if _SYNC_PATTERN.search(str(exc)) else "CUDA-graph capture failed"
            msg = f"tilewise.capture: {why}. Cause: {type(exc).__name__}: {exc}{then}"
            repair_after_failed_capture(device)
            raise CaptureError(msg) from exc
        except BaseException:
            with contextlib.suppress(RuntimeError):
                graph.capture_end()
            repair_after_failed_capture(device)
            raise
        try:
            graph.capture_end()
        except RuntimeError as exc:  # e.g. work left on a side stream that never joined
            repair_after_failed_capture(device)
            raise CaptureError(f"tilewise.capture: CUDA-graph capture failed: {exc}") from exc
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    return graph, out


class CapturedInference:
    """``model(*inputs)`` replayed from a CUDA graph (or run eagerly when ``captured`` is False)."""

    def __init__(self, model, example_inputs, *, warmup=3, autocast_dtype=None, pool=None):
        self.model, inputs = model, _as_tuple("example_inputs", example_inputs)
        self.device = _device_of(inputs)
        self.autocast_dtype, self.captured = autocast_dtype, self.device.type == "cuda"
        _autocast(self.device, autocast_dtype)  # validates the dtype
        _check_warmup(warmup)
        self.static_inputs = tuple(torch.empty_like(t).copy_(t) for t in inputs)
        self.graph, self.static_output = None, None
        if not self.captured:
            _log_once("tilewise.capture: CUDA graphs need a CUDA device; running eagerly")
            return
        _warmup(self._run, self.device, warmup)
        self.graph, self.static_output = _capture(self._run, self.device, pool)

    def _run(self, *inputs: torch.Tensor) -> Any:
        with torch.no_grad(), _autocast(self.device, self.autocast_dtype):
            return self.model(*(inputs or self.static_inputs))

    def __call__(self, *inputs: torch.Tensor, clone: bool = False) -> Any:
        """The output for ``inputs``; static (overwritten by the next call) unless ``clone``."""
        _check("inputs", self.static_inputs, inputs)
        if not self.captured:
            return self._run(*inputs)
        for s, x in zip(self.static_inputs, inputs, strict=True):
            s.copy_(x)
        self.graph.replay()
        if clone:
            return _pytree.tree_map_only(torch.Tensor, torch.clone, self.static_output)
        return self.static_output


def _check_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    if isinstance(optimizer, torch.amp.GradScaler) or not isinstance(
        optimizer, torch.optim.Optimizer
    ):
        raise ValueError(f"argument 'optimizer' must be a torch.optim.Optimizer, got {optimizer!r}")
    if isinstance(optimizer, _FusedOptimizer):
        return
    for i, g in enumerate(optimizer.param_groups):
        name = f"{type(optimizer).__name__} param group {i}"
        lr = g.get("lr")
        if not isinstance(lr, torch.Tensor):
            raise ValueError(
                f"argument 'optimizer': {name} has a Python float lr, which a CUDA graph bakes in "
                "(later lr changes would be ignored); use tilewise.optim.FusedAdamW/FusedSGD, or "
                "a torch optimizer with capturable=True and lr=torch.tensor(lr, device=...)"
            )
        if not (g.get("capturable") or ("capturable" not in g and g.get("fused"))):
            raise ValueError(
                f"argument 'optimizer': {name} is not capturable; construct it with "
                "capturable=True (fused=True for SGD), or use tilewise.optim.Fused*"
            )
        if device.type == "cuda" and lr.device != device:
            raise ValueError(f"argument 'optimizer': {name}'s lr tensor must be on {device}")
        if g.get("momentum", 0) and g.get("dampening", 0):
            # warm-up creates the momentum buffers and the restore can only zero them, after
            # which torch's first update is (1 - dampening) * g instead of g
            raise ValueError(
                f"argument 'optimizer': {name} has momentum with dampening != 0, whose first "
                "step a capture cannot reproduce; use tilewise.optim.FusedSGD"
            )


class CapturedTrainStep:
    """One training step (zero_grad, forward, loss, backward, step) replayed from a CUDA graph."""

    def __init__(
        self, model, loss_fn, optimizer, example_inputs, example_targets, *,
        warmup=3, autocast_dtype=None, scaler=None, pool=None,
    ):  # fmt: skip
        if scaler is not None or isinstance(loss_fn, torch.amp.GradScaler):
            raise ValueError(
                "argument 'scaler': GradScaler checks for infs on the host, which a CUDA graph "
                "cannot replay; use autocast_dtype=torch.bfloat16 (no scaler needed)"
            )
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        inputs = _as_tuple("example_inputs", example_inputs)
        targets = _as_tuple("example_targets", example_targets)
        self.device = _device_of(inputs, targets)
        _check_optimizer(optimizer, self.device)
        _autocast(self.device, autocast_dtype)
        _check_warmup(warmup)
        self.autocast_dtype, self.captured = autocast_dtype, self.device.type == "cuda"
        self.static_inputs = tuple(torch.empty_like(t).copy_(t) for t in inputs)
        self.static_targets = tuple(torch.empty_like(t).copy_(t) for t in targets)
        self.graph, self.static_loss, self.static_output = None, None, None
        if not self.captured:
            _log_once("tilewise.capture: CUDA graphs need a CUDA device; running eagerly")
            return
        with torch.random.fork_rng(devices=[self.device]):  # warmup draws no random numbers
            snapshot = self._snapshot()
            try:
                _warmup(self._run, self.device, warmup)
            finally:  # also when the step is refused: the caller gets its model back untouched
                self._restore(snapshot)
        owned = {p for g in optimizer.param_groups for p in g["params"]}
        for p in model.parameters():
            if p not in owned:
                p.grad = None  # assigned, not accumulated, by the captured backward
        self._frozen = self._hyperparameters()
        self.graph, (self.static_loss, self.static_output) = _capture(self._run, self.device, pool)

    def _run(self, inputs=None, targets=None) -> tuple[torch.Tensor, Any]:
        inputs, targets = inputs or self.static_inputs, targets or self.static_targets
        # a fused optimizer's None grads let tilewise's backward write into its flat buffer
        self.optimizer.zero_grad(set_to_none=isinstance(self.optimizer, _FusedOptimizer))
        with _autocast(self.device, self.autocast_dtype):
            out = self.model(*inputs)
            loss = self.loss_fn(out, *targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), _pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out)

    # -- warmup leaves no trace -------------------------------------------------------------
    def _tensors(self) -> list[torch.Tensor]:
        ts = [*self.model.parameters(), *self.model.buffers()]
        if not isinstance(self.optimizer, _FusedOptimizer):
            ts += [v for st in self.optimizer.state.values() for v in st.values()]
        return [t for t in ts if isinstance(t, torch.Tensor)]

    @torch.no_grad()
    def _snapshot(self) -> tuple[dict[int, torch.Tensor], Any]:
        fused = isinstance(self.optimizer, _FusedOptimizer)
        return {id(t): t.clone() for t in self._tensors()}, fused and self.optimizer.state_dict()

    @torch.no_grad()
    def _restore(self, snapshot: tuple[dict[int, torch.Tensor], Any]) -> None:
        saved, fused_state = snapshot
        if fused_state:
            self.optimizer.load_state_dict(fused_state)
        for t in self._tensors():  # state created by warmup (Adam moments, step) starts at zero
            t.copy_(saved[id(t)]) if id(t) in saved else t.zero_()

    # -- hyperparameters between replays ----------------------------------------------------
    def _hyperparameters(self) -> list[dict[str, Any]]:
        """Values a replay cannot follow (all but the fused optimizers' device-side ones)."""
        skip = {"params", "initial_lr"}
        if isinstance(self.optimizer, _FusedOptimizer):
            skip |= {*self.optimizer._HYPER, "betas"}
        return [{k: v for k, v in g.items() if k not in skip} for g in self.optimizer.param_groups]

    @torch.no_grad()
    def _sync(self) -> None:
        if isinstance(self.optimizer, _FusedOptimizer):
            self.optimizer.sync_hyperparameters()
            self.optimizer.refresh_masters()
        for i, (g, frozen) in enumerate(
            zip(self.optimizer.param_groups, self._frozen, strict=True)
        ):
            for k, v in frozen.items():
                now = g.get(k)
                if isinstance(v, torch.Tensor):
                    if now is not v:  # a new value: copy it into the tensor the graph reads
                        v.copy_(now) if isinstance(now, torch.Tensor) else v.fill_(float(now))
                        g[k] = v
                elif now != v:
                    raise ValueError(
                        f"optimizer param group {i}: '{k}' changed from {v!r} to {now!r} after "
                        "capture; it is baked into the graph (make it a tensor, or capture again)"
                    )

    def __call__(self, inputs: Any, targets: Any) -> torch.Tensor:
        """One step on ``inputs``/``targets``; returns the loss (a static device tensor)."""
        inputs, targets = _as_tuple("inputs", inputs), _as_tuple("targets", targets)
        _check("inputs", self.static_inputs, inputs)
        _check("targets", self.static_targets, targets)
        if not self.captured:
            return self._run(inputs, targets)[0]
        for s, x in zip(self.static_inputs + self.static_targets, inputs + targets, strict=True):
            s.copy_(x)
        self._sync()
        self.graph.replay()
        return self.static_loss


def capture_inference(model, example_inputs, *, warmup=3, autocast_dtype=None, pool=None):
    """Capture ``model(*example_inputs)`` under ``no_grad``; see the module docstring."""
    return CapturedInference(
        model, example_inputs, warmup=warmup, autocast_dtype=autocast_dtype, pool=pool
    )


def capture_train_step(
    model, loss_fn, optimizer, example_inputs, example_targets, *,
    warmup=3, autocast_dtype=None, scaler=None, pool=None,
):  # fmt: skip
    """Capture one training step ``loss_fn(model(*inputs), *targets)``; see the module docstring."""
    return CapturedTrainStep(
        model, loss_fn, optimizer, example_inputs, example_targets,
        warmup=warmup, autocast_dtype=autocast_dtype, scaler=scaler, pool=pool,
    )  # fmt: skip
