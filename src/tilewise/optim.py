"""Fused optimizers: ``FusedSGD`` and ``FusedAdamW``, one kernel launch per param group per step.

At construction every parameter is packed into flat buffers, one segment per param group (each
tensor starts on a 64-element boundary; the padding stays zero). An fp32 model's parameters become
views of the flat fp32 buffer the kernel updates; with fp16/bf16 parameters the kernel updates a
flat fp32 master copy (``state[p]['master_param']``) and writes the rounded weights into a flat
fp16/bf16 buffer whose views are the parameters. Gradients live in a flat buffer too (model
dtype): after ``zero_grad()`` (``set_to_none=True``, the default) tilewise's backward kernels
write each gradient straight into its view (``tilewise.runtime.grad_slots``: no memset, no
accumulation pass) and other ops' gradients are copied in at ``step``; after
``zero_grad(set_to_none=False)`` the ``.grad``s are views of the buffer, zeroed by one memset,
and backward accumulates into them. The fp32 state (momentum buffer; exp_avg, exp_avg_sq) is
flat too, and ``state[p]`` holds views of it.

Rules (what differs from ``torch.optim``):

- Build the optimizer once the model has its final device and dtype; don't re-assign ``p.data``
  later (``step`` raises). All parameters share one CUDA or CPU device and one dtype of fp32,
  fp16, bf16. Several param groups work (one launch each).
- A ``.grad`` that is None at ``step`` counts as zero (weight decay and momentum still apply;
  torch would skip the parameter); a replaced ``.grad`` is copied in (logged once). After
  ``step`` every ``.grad`` is its view of the flat buffer.
- Hyperparameters live in a device tensor (fp64) and the step count in a device counter that the
  kernel advances itself, so a step captured in a CUDA graph stays correct across replays.
  Assigning one (``group['lr'] = x``, as LR schedulers do) writes the device copy at once with a
  tiny stream-ordered fill, which later graph replays see; do it outside capture (``step``
  re-checks the values, covering ``group.update``, and raises if they changed during capture).
  ``set_lr``/``sync_hyperparameters`` are the explicit forms. ``lr`` must be a Python float.
  ``FusedSGD``'s momentum may not switch between zero and non-zero (except by
  ``load_state_dict``); ``nesterov`` is baked into a captured graph.
- ``state_dict`` returns copies in ``torch.optim``'s format (plus ``step`` for SGD and
  ``master_param`` for fp16/bf16 models); ``load_state_dict`` also takes torch's SGD/AdamW ones.
"""

from __future__ import annotations

import functools
import logging
import math
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from tilewise.ops import optim as optim_ops
from tilewise.runtime import grad_slots

log = logging.getLogger("tilewise")

_ALIGN = 64
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _Group(dict):
    """A param group that tells its optimizer when a hyperparameter is assigned."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if getattr(self, "_notify", None) is not None:
            self._notify(key)


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s strides if they describe a dense layout (channels_last etc.), else contiguous."""
    dims = sorted(range(t.ndim), key=lambda d: t.stride(d))
    expected = 1
    for d in dims:
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return torch.empty(t.shape, device="meta").stride()
        expected *= t.shape[d]
    return t.stride()


@functools.cache
def _info_once(msg: str) -> None:
    log.info(msg)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


class _FusedOptimizer(torch.optim.Optimizer):
    _HYPER: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self._built, self._name = False, f"tilewise.{type(self).__name__}"
        super().__init__(params, defaults)
        self._build()
        self._built = True

    # -- construction -----------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only at construction: the flat buffers are laid out once."""
        if getattr(self, "_built", False):
            raise RuntimeError(f"{self._name}: param groups can only be given at construction")
        super().add_param_group(param_group)
        self.param_groups[-1] = _Group(self.param_groups[-1])

    def _error(self, arg: str, msg: str) -> ValueError:
        return ValueError(f"{self._name}: argument '{arg}' {msg}")

    def _build(self) -> None:
        for g in self.param_groups:
            self._values(g)  # validate before touching the parameters
        params = [p for g in self.param_groups for p in g["params"]]
        if len(set(params)) != len(params):
            raise self._error("params", "contains a parameter twice")
        first = params[0]
        for p in params:
            if not p.requires_grad:  # it would still get weight decay / momentum every step
                raise self._error("params", "contains a parameter with requires_grad=False")
            if p.device != first.device or p.device.type not in ("cuda", "cpu"):
                raise self._error("params", f"must be on one CUDA or CPU device, got {p.device}")
            if p.dtype not in _DTYPES or p.dtype != first.dtype:
                raise self._error("params", f"must share one dtype of {_DTYPES}, got {p.dtype}")
        self._device, low = first.device, first.dtype != torch.float32
        self._layout, self._segments, total = {}, [], 0
        for g in self.param_groups:
            start = total
            for p in g["params"]:
                self._layout[p] = (total, _dense_strides(p))
                total += -(-p.numel() // _ALIGN) * _ALIGN
            self._segments.append((start, total))
        kw = {"device": self._device}
        self._flat_master = torch.zeros(total, dtype=torch.float32, **kw)
        self._flat_model = torch.zeros(total, dtype=first.dtype, **kw) if low else None
        self._flat_grad = torch.zeros(total, dtype=first.dtype, **kw)
        self._flat_state, self._params, self._grads = {}, params, []
        with torch.no_grad():
            for p in params:
                data, grad = self._view(self._flat_master, p), self._view(self._flat_grad, p)
                data.copy_(p)
                if p.grad is not None:
                    grad.copy_(p.grad)
                if low:
                    self.state[p]["master_param"] = data
                    data = self._view(self._flat_model, p).copy_(p)
                p.data, p.grad = data, grad
                self._grads.append(grad)
        self._slots = [grad_slots.install(p, g) for p, g in zip(params, self._grads, strict=True)]
        self._ptrs = [p.data_ptr() for p in params]
        self._versions = [p._version for p in params]  # the kernels' writes do not bump these
        groups = len(self.param_groups)
        self._hyper = torch.zeros(groups, len(self._HYPER), dtype=torch.float64, **kw)
        self._counters = torch.zeros(groups, 2, dtype=torch.int32, **kw)
        self._written: list[tuple[float, ...] | None] = [None] * groups
        self._structure: list[Any] = [None] * groups
        ref = weakref.ref(self)
        for i, g in enumerate(self.param_groups):
            self._restructure(i)
            self.sync_hyperparameters(i)
            g._notify = lambda key, ref=ref, i=i: ref() and ref()._assigned(i, key)

    def _view(self, flat: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        off, strides = self._layout[p]
        return flat.as_strided(p.shape, strides, off)

    def _restructure(self, index: int) -> None:
        """Give group ``index``'s parameters the state buffers its values now call for."""
        group = self.param_groups[index]
        keys = self._state_keys(group)
        for k in keys:
            self._flat_state.setdefault(k, torch.zeros_like(self._flat_master))
        for p in group["params"]:
            for k in [k for k in self.state[p] if k != "master_param" and k not in keys]:
                del self.state[p][k]
            self.state[p].update({k: self._view(self._flat_state[k], p) for k in keys})
        self._structure[index] = self._structure_of(group)

    # -- hyperparameters --------------------------------------------------------------------
    def _values(self, group: dict[str, Any]) -> tuple[float, ...]:
        """The group's values in ``_HYPER`` order, validated (``ValueError`` naming the key)."""
        raise NotImplementedError

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        """Names of the flat fp32 state buffers a group's parameters have."""
        raise NotImplementedError

    def _structure_of(self, group: dict[str, Any]) -> Any:
        """What may not change after construction (compared at every sync)."""
        return self._state_keys(group)

    def _float(self, group: dict[str, Any], key: str, lo: float, hi: float = math.inf) -> float:
        v = group[key]
        if isinstance(v, torch.Tensor) or not isinstance(v, (int, float)) or not lo <= v < hi:
            raise self._error(key, f"must be a Python float in [{lo}, {hi}), got {v!r}")
        return float(v)

    def _capturing(self) -> bool:
        return self._device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _assigned(self, index: int, key: str) -> None:
        if (key in self._HYPER or key == "betas") and not self._capturing():
            self.sync_hyperparameters(index)

    def sync_hyperparameters(self, index: int | None = None) -> None:
        """Write changed hyperparameters of group ``index`` (default: all) to the device copy.

        One tiny stream-ordered fill per changed value; call it outside CUDA-graph capture.
        """
        for i in range(len(self.param_groups)) if index is None else [index]:
            group = self.param_groups[i]
            values = self._values(group)
            if self._structure_of(group) != self._structure[i]:
                raise self._error("momentum", "may not switch between zero and non-zero")
            old = self._written[i]
            if values == old:
                continue
            if self._capturing():
                raise RuntimeError(
                    f"{self._name}: hyperparameters of group {i} changed during CUDA-graph "
                    "capture; assign them (or call sync_hyperparameters) before capturing"
                )
            for k, v in enumerate(values):
                if old is None or old[k] != v:
                    self._hyper[i, k].fill_(v)
            self._written[i] = values

    def set_lr(self, lr: float, index: int | None = None) -> None:
        """Set the learning rate of group ``index`` (default: all), host and device copies."""
        for i in range(len(self.param_groups)) if index is None else [index]:
            self.param_groups[i]["lr"] = lr
            self.sync_hyperparameters(i)

    # -- step -------------------------------------------------------------------------------
    @torch.no_grad()
    def refresh_masters(self) -> None:
        """Copy fp16/bf16 parameters written in place since the last step (``load_state_dict`` of
        the model, ``nn.init``, EMA, ...) into their fp32 masters, which the next update would
        otherwise write back over them. ``step()`` calls this; a captured step calls it before
        every replay."""
        if self._flat_model is None:
            return
        for i, p in enumerate(self._params):
            if p._version != self._versions[i]:
                self.state[p]["master_param"].copy_(p)
                self._versions[i] = p._version

    def _gather_grads(self) -> None:
        self.refresh_masters()
        for i, p in enumerate(self._params):
            if p.data_ptr() != self._ptrs[i]:
                raise RuntimeError(
                    f"{self._name}: parameter {i} was re-assigned (p.data) after the optimizer "
                    "was built; build the optimizer after moving or casting the model"
                )
            g, view = p.grad, self._grads[i]
            self._slots[i].armed = False
            if g is view:
                continue
            if g is not None and _same_memory(g, view):  # written in place through its slot
                p.grad = view
                continue
            if g is None:
                _info_once(
                    f"{self._name}: a parameter without a gradient at step counts as a zero "
                    "gradient (weight decay and momentum still apply; torch.optim skips it)"
                )
            else:
                _info_once(
                    f"{self._name}: gradients from ops that cannot write into the flat buffer "
                    "are copied in at step"
                )
            view.zero_() if g is None else view.copy_(g)
            p.grad = view

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One fused update of every parameter (one kernel launch per param group)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._gather_grads()
        for i, group in enumerate(self.param_groups):
            self.sync_hyperparameters(i)
            start, end = self._segments[i]
            self._launch(i, group, slice(start, end))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``set_to_none``: every ``.grad`` becomes None and tilewise backward kernels write the
        next gradients straight into the flat buffer (``runtime.grad_slots``); others are
        copied in at ``step``. Else one memset of the flat buffer, whose views the ``.grad``s
        stay, for backward to accumulate into."""
        if set_to_none:
            for p, slot in zip(self._params, self._slots, strict=True):
                p.grad, slot.armed = None, True
            return
        for p, view, slot in zip(self._params, self._grads, self._slots, strict=True):
            slot.armed = False
            if p.grad is not view:
                p.grad = view
        self._flat_grad.zero_()

    # -- checkpoints ------------------------------------------------------------------------
    def _state_of(self, p: torch.Tensor, group: dict[str, Any], steps: int) -> dict[str, Any]:
        st = {k: self.state[p][k].clone() for k in self._state_keys(group)}
        st["step"] = torch.tensor(float(steps))
        if "master_param" in self.state[p]:
            st["master_param"] = self.state[p]["master_param"].clone()
        return st

    def state_dict(self) -> dict[str, Any]:
        """Copies of the state in ``torch.optim``'s format (params numbered in group order)."""
        state, groups, idx = {}, [], 0
        for group, steps in zip(self.param_groups, self._counters[:, 0].tolist(), strict=True):
            ids = list(range(idx, idx + len(group["params"])))
            for i, p in zip(ids, group["params"], strict=True):
                state[i] = self._state_of(p, group, steps)
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
            idx += len(ids)
        return {"state": state, "param_groups": groups}

    def _loaded_steps(self, st: dict[str, Any]) -> int:
        return int(st["step"]) if "step" in st else 0

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict()`` output (or a torch.optim.SGD/AdamW one) into the flat buffers."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
            len(s["params"]) != len(g["params"])
            for s, g in zip(saved, self.param_groups, strict=True)
        ):
            raise self._error("state_dict", "has param groups of other sizes than this optimizer")
        for s, group in zip(saved, self.param_groups, strict=True):  # check all before changing
            if s.get("maximize") or s.get("amsgrad"):
                raise self._error("state_dict", "uses maximize/amsgrad, which this optimizer lacks")
            self._values({**group, **{k: v for k, v in s.items() if k != "params"}})
        for i, (s, group) in enumerate(zip(saved, self.param_groups, strict=True)):
            for k, v in s.items():
                if k != "params":
                    dict.__setitem__(group, k, v)
            self._restructure(i)
            self.sync_hyperparameters(i)
            steps = 0
            for sid, p in zip(s["params"], group["params"], strict=True):
                st = state_dict["state"].get(sid, {})
                for k in self._state_keys(group):
                    v = st.get(k)
                    self.state[p][k].zero_() if v is None else self.state[p][k].copy_(v)
                if "master_param" in self.state[p]:
                    self.state[p]["master_param"].copy_(st.get("master_param", p))
                steps = max(steps, self._loaded_steps(st))
            self._counters[i, 0].fill_(steps)
            self._counters[i, 1].fill_(0)
        self._versions = [p._version for p in self._params]  # a loaded master is the truth


class FusedSGD(_FusedOptimizer):
    """``torch.optim.SGD`` (momentum, dampening, Nesterov, weight decay) as one fused kernel."""

    _HYPER = optim_ops.SGD_HYPER

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening)
        super().__init__(params, {**defaults, "weight_decay": weight_decay, "nesterov": nesterov})

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _values(self, group: dict[str, Any]) -> tuple[float, ...]:
        values = (
            self._float(group, "lr", 0.0),
            self._float(group, "weight_decay", 0.0),
            self._float(group, "momentum", 0.0),
            self._float(group, "dampening", -math.inf),
        )
        if group["nesterov"] and (values[2] <= 0 or values[3] != 0):
            raise self._error("nesterov", "requires momentum > 0 and dampening == 0")
        return values

    def _launch(self, index: int, group: dict[str, Any], sl: slice) -> None:
        buf = self._flat_state.get("momentum_buffer") if group["momentum"] != 0 else None
        optim_ops.sgd_step(
            self._flat_master[sl],
            self._flat_grad[sl],
            None if buf is None else buf[sl],
            None if self._flat_model is None else self._flat_model[sl],
            self._hyper[index],
            self._counters[index],
            nesterov=bool(group["nesterov"]),
        )

    def _state_of(self, p: torch.Tensor, group: dict[str, Any], steps: int) -> dict[str, Any]:
        st = super()._state_of(p, group, steps)
        if steps == 0:
            st.pop("momentum_buffer", None)  # torch creates it at the first step
        return st

    def _loaded_steps(self, st: dict[str, Any]) -> int:
        if "step" in st:
            return int(st["step"])
        return 1 if st.get("momentum_buffer") is not None else 0


class FusedAdamW(_FusedOptimizer):
    """``torch.optim.AdamW`` (decoupled weight decay, bias correction) as one fused kernel."""

    _HYPER = optim_ops.ADAMW_HYPER

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _values(self, group: dict[str, Any]) -> tuple[float, ...]:
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise self._error("betas", f"must be a pair of floats, got {betas!r}")
        b = {"beta1": betas[0], "beta2": betas[1]}
        return (
            self._float(group, "lr", 0.0),
            self._float(group, "weight_decay", 0.0),
            self._float(b, "beta1", 0.0, 1.0),
            self._float(b, "beta2", 0.0, 1.0),
            self._float(group, "eps", 0.0),
        )

    def _launch(self, index: int, group: dict[str, Any], sl: slice) -> None:
        optim_ops.adamw_step(
            self._flat_master[sl],
            self._flat_grad[sl],
            self._flat_state["exp_avg"][sl],
            self._flat_state["exp_avg_sq"][sl],
            None if self._flat_model is None else self._flat_model[sl],
            self._hyper[index],
            self._counters[index],
        )
