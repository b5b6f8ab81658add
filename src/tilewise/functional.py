"""Public functional API: ``torch.library`` custom ops with autograd and fake-tensor support.

Each op is a custom op so that ``torch.compile(fullgraph=True)`` treats it as one opaque node, and
its backward is a custom op of its own so compiled backward graphs call the fused kernel too.
Kernel-or-reference dispatch happens inside the op implementations (``tilewise.runtime.dispatch``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd import forward_ad

from tilewise.ops import bias_act as _bias_act
from tilewise.ops import gconv as _gconv
from tilewise.ops import gconv_config as _gconv_config
from tilewise.ops import layernorm as _layernorm
from tilewise.ops import linear as _linear
from tilewise.runtime import dispatch, grad_slots, plans

__all__ = ["bias_act", "grouped_conv2d", "layer_norm", "linear"]


def _fresh(out: Tensor, *inputs: Tensor | None) -> Tensor:
    """Custom ops may not return an input: copy in the rare reference paths that would."""
    return out.clone() if any(out is t for t in inputs) else out


# --- the eager fast path ----------------------------------------------------------------------
#
# A Python custom op costs ~100 us of host time per call in eager mode (the dispatcher, schema
# defaults, the Python autograd wrapper), several times the device time of a small conv. In
# plain eager code the public functions therefore call the op bodies through a
# ``torch.autograd.Function`` instead; the custom ops (the same bodies) take over wherever the
# dispatcher matters: torch.compile, fake/meta tensors, dispatch or function modes, functorch
# transforms, tensor subclasses and tracing.

_PLAIN = (Tensor, torch.nn.Parameter)
_is_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)


def _eager(*tensors: Tensor | None) -> bool:
    """True when no tracer, mode, transform or tensor subclass needs the custom-op path."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN or t.is_meta:
            return False
        if _is_legacy_batched(t):  # the vmap of autograd.grad(..., is_grads_batched=True)
            return False
    return True


def _transforms() -> set:
    """The ``torch.func`` transforms active around this call (functorch ``TransformType``s);
    empty while torch.compile traces, where the interpreter stack cannot be read
    (``_forward_mode`` asks Dynamo whether any transform is active instead)."""
    if torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is None:
        return set()
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

    return {i.key() for i in retrieve_all_functorch_interpreters()}


def _forward_mode() -> bool:
    """Whether forward-mode AD or a ``torch.func`` derivative transform is active
    (``torch.func.jvp``/``jacfwd``/``grad``/``vjp``/``jacrev``, or a dual level of
    ``torch.autograd.forward_ad``). The custom ops have no forward-mode rule (``torch.func.jvp``
    gave zero tangents through them), and their registered autograd cannot run under
    ``torch.func.grad`` (PyTorch's generated autograd.Function has no ``setup_context``: a
    RuntimeError that named neither tilewise nor a fix), so the public functions then run the
    PyTorch reference. ``vmap`` alone keeps the kernels (PyTorch's batching fallback), except
    under torch.compile: Dynamo can tell only whether any transform is active, not which (it
    cannot read the interpreter stack), so there every transform takes the reference (compiled
    ``jvp`` gave zero tangents through the custom ops before)."""
    if torch.compiler.is_compiling():
        return forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()
    from torch._C._functorch import TransformType

    return forward_ad._current_level >= 0 or bool(
        _transforms() & {TransformType.Jvp, TransformType.Grad}
    )


def _untransformed() -> bool:
    """No forward-mode AD level, no ``torch.func`` transform and no torch.compile trace: the
    common eager call, told apart cheaply (``_forward_mode`` and ``_vmapped`` then say False)."""
    return (
        forward_ad._current_level < 0
        and torch._C._functorch.peek_interpreter_stack() is None
        and not torch.compiler.is_compiling()
    )


def _vmapped() -> bool:
    """Whether ``torch.func.vmap`` is active (the grouped conv's layout checks query
    ``is_contiguous(memory_format=...)``, which vmap does not implement)."""
    from torch._C._functorch import TransformType

    return TransformType.Vmap in _transforms()


_NO_AUTODIFF_RULE = (
    "forward-mode AD or a torch.func derivative transform, which the custom ops have no rule for"
    " (under torch.compile: any torch.func transform)"
)


def _reference_for_forward_mode(op: str) -> bool:
    """True (and says so once, outside torch.compile: Dynamo refuses logger calls under
    ``fullgraph=True``) when ``op`` must run its PyTorch reference for forward-mode AD."""
    if not _forward_mode():
        return False
    if not torch.compiler.is_compiling():
        dispatch.fallback(op, _NO_AUTODIFF_RULE)
    return True


def _eager_function(name: str, forward, setup, backward, backward_impl):
    """An autograd.Function running ``forward``, with the custom op's setup and backward
    (``backward`` called with ``bwd=backward_impl``, the backward op's body)."""

    # forward takes ctx itself: with a separate setup_context, Function.apply binds the
    # arguments through inspect.signature on every call (~10 us).
    def fwd(ctx, *args):
        # the extra outputs (LayerNorm's mean/rstd, Linear's pre-activation) never get a
        # gradient; materialized, each is a zero-fill launch per backward (session 10: the
        # LayerNorm backward called directly read 0.850 of copy at 64 MB, through autograd 0.813)
        ctx.set_materialize_grads(False)
        out = forward(*args)
        setup(ctx, args, out)
        ctx.n_inputs = len(args)
        return out

    def bwd(ctx, *grads):
        if grads[0] is None:  # no gradient reached the main output
            return (None,) * ctx.n_inputs
        # the backward op's body only for plain grads; batched grads (is_grads_batched, vmapped
        # jacobians) need the dispatcher's batching fallback, i.e. the backward custom op
        if _eager(*(g for g in grads if isinstance(g, Tensor))):
            return backward(ctx, *grads, bwd=backward_impl)
        return backward(ctx, *grads)

    def guarded_backward(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph=True: a graph of the gradient is wanted
            raise RuntimeError(
                f"tilewise.{name}: the backward is not differentiable (create_graph=True, "
                "e.g. a gradient penalty or double backward); without this error the graph of "
                "the gradient would silently miss this op's second-order terms. Use the "
                "PyTorch op for such models."
            )
        # grad mode is off here (checked above), so this is once_differentiable's whole effect
        # without its no_grad context (host time on every backward)
        return bwd(ctx, *grads)

    fn = type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(fwd), "backward": staticmethod(guarded_backward)},
    )
    return fn.apply


# --- bias + activation ------------------------------------------------------------------------


def _bias_act_impl(x: Tensor, bias: Tensor | None, activation: str, dim: int) -> Tensor:
    return _fresh(_bias_act.forward(x, bias, activation, dim), x)


_bias_act_op = torch.library.custom_op("tilewise::bias_act", mutates_args=())(_bias_act_impl)


@_bias_act_op.register_fake
def _(x, bias, activation, dim):
    _bias_act.validate(x, bias, activation, dim)
    return torch.empty_like(x)


def _bias_act_backward_impl(
    grad: Tensor, x: Tensor, bias: Tensor | None, activation: str, dim: int
) -> tuple[Tensor, Tensor]:
    dx, db = _bias_act.backward(grad, x, bias, activation, dim)
    return _fresh(dx, grad, x), (db if db is not None else x.new_empty(0))


_bias_act_backward_op = torch.library.custom_op("tilewise::bias_act_backward", mutates_args=())(
    _bias_act_backward_impl
)


@_bias_act_backward_op.register_fake
def _(grad, x, bias, activation, dim):
    db = torch.empty_like(bias) if bias is not None else x.new_empty(0)
    return torch.empty_like(x), db


def _bias_act_setup(ctx, inputs, output):
    x, bias, activation, dim = inputs
    ctx.save_for_backward(x, bias)
    ctx.activation, ctx.dim = activation, dim


def _bias_act_backward(ctx, grad, bwd=_bias_act_backward_op):
    x, bias = ctx.saved_tensors
    dx, db = bwd(grad, x, bias, ctx.activation, ctx.dim)
    return dx, (db if bias is not None else None), None, None


_bias_act_op.register_autograd(_bias_act_backward, setup_context=_bias_act_setup)
_bias_act_eager = _eager_function(
    "BiasAct", _bias_act_impl, _bias_act_setup, _bias_act_backward, _bias_act_backward_impl
)


def bias_act(
    x: Tensor, bias: Tensor | None = None, activation: str = "relu", dim: int = -1
) -> Tensor:
    """``act(x + bias)`` with ``bias`` broadcast along ``dim``, in one pass over memory.

    ``activation`` is one of "none", "relu", "gelu" (erf form), "silu". ``bias`` may be fp32 with
    a half-precision ``x`` (mixed precision); math is fp32, the output has ``x``'s dtype.
    """
    if _reference_for_forward_mode(_bias_act.OP):
        _bias_act.validate(x, bias, activation, dim)
        return _bias_act.reference(x, bias, activation, dim)
    op = _bias_act_eager if _eager(x, bias) else _bias_act_op
    return op(x, bias, activation, dim)


# --- layer norm -------------------------------------------------------------------------------


def _layer_norm_impl(
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    relu: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return _layernorm.forward(x, normalized_shape, weight, bias, eps, relu)


_layer_norm_op = torch.library.custom_op("tilewise::layer_norm", mutates_args=())(_layer_norm_impl)


@_layer_norm_op.register_fake
def _(x, normalized_shape, weight, bias, eps, relu):
    _layernorm.validate(x, normalized_shape, weight, bias)
    rows = x.numel() // max(1, _layernorm.row_size(normalized_shape))
    stats = x.new_empty((rows,), dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats, stats.clone()


def _layer_norm_backward_impl(
    grad: Tensor,
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    relu: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = _layernorm.backward(grad, x, normalized_shape, weight, bias, mean, rstd, relu)
    empty = x.new_empty(0)
    return dx, (dw if dw is not None else empty), (db if db is not None else empty.clone())


_layer_norm_backward_op = torch.library.custom_op("tilewise::layer_norm_backward", mutates_args=())(
    _layer_norm_backward_impl
)


@_layer_norm_backward_op.register_fake
def _(grad, x, normalized_shape, weight, bias, mean, rstd, relu):
    dw = torch.empty_like(weight) if weight is not None else x.new_empty(0)
    db = torch.empty_like(bias) if bias is not None else x.new_empty(0)
    return torch.empty_like(x, memory_format=torch.contiguous_format), dw, db


def _layer_norm_setup(ctx, inputs, output):
    x, normalized_shape, weight, bias, eps, relu = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.normalized_shape, ctx.relu = list(normalized_shape), relu
    ctx.mark_non_differentiable(mean, rstd)


def _layer_norm_backward(ctx, grad, _grad_mean, _grad_rstd, bwd=_layer_norm_backward_op):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = bwd(grad, x, ctx.normalized_shape, weight, bias, mean, rstd, ctx.relu)
    return (
        dx,
        None,
        dw if weight is not None else None,
        db if bias is not None else None,
        None,
        None,
    )


_layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)
_layer_norm_eager = _eager_function(
    "LayerNorm",
    _layer_norm_impl,
    _layer_norm_setup,
    _layer_norm_backward,
    _layer_norm_backward_impl,
)


def layer_norm(
    x: Tensor,
    normalized_shape: Sequence[int] | int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    relu: bool = False,
) -> Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims, optionally followed by a fused ReLU.

    Statistics and math are fp32; ``weight``/``bias`` may be fp32 with a half-precision ``x``.
    """
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if _reference_for_forward_mode(_layernorm.OP):
        _layernorm.validate(x, normalized_shape, weight, bias)
        return _layernorm.reference(x, normalized_shape, weight, bias, float(eps), bool(relu))[0]
    op = _layer_norm_eager if _eager(x, weight, bias) else _layer_norm_op
    y, _, _ = op(x, list(normalized_shape), weight, bias, float(eps), bool(relu))
    return y


# --- grouped conv2d, group width 8 ------------------------------------------------------------


def _grouped_conv2d_impl(
    x: Tensor, weight: Tensor, bias: Tensor | None, pad_h: int, pad_w: int, deterministic: bool
) -> Tensor:
    return _fresh(_gconv.forward(x, weight, bias, pad_h, pad_w), x)


_grouped_conv2d_op = torch.library.custom_op("tilewise::grouped_conv2d", mutates_args=())(
    _grouped_conv2d_impl
)


@_grouped_conv2d_op.register_fake
def _(x, weight, bias, pad_h, pad_w, deterministic):
    _gconv.validate(x, weight, bias, pad_h, pad_w)
    return _gconv.empty_output(x, weight, pad_h, pad_w)


def _grouped_conv2d_backward_impl(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    pad_h: int,
    pad_w: int,
    need_dx: bool,
    need_dw: bool,
    need_db: bool,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    need = (need_dx, need_dw, need_db and bias is not None)
    dx, dw, db = _gconv.backward(grad, x, weight, bias, pad_h, pad_w, need, deterministic)
    empty = x.new_empty(0)
    return (
        _fresh(dx, grad, x) if dx is not None else empty,
        dw if dw is not None else empty.clone(),
        db if db is not None else empty.clone(),
    )


_grouped_conv2d_backward_op = torch.library.custom_op(
    "tilewise::grouped_conv2d_backward", mutates_args=()
)(_grouped_conv2d_backward_impl)


@_grouped_conv2d_backward_op.register_fake
def _(grad, x, weight, bias, pad_h, pad_w, need_dx, need_dw, need_db, deterministic):
    _gconv.validate(x, weight, bias, pad_h, pad_w)
    empty = x.new_empty(0)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return (
        dx if need_dx else empty,
        _gconv.empty_weight_grad(weight, x.dtype) if need_dw else empty.clone(),
        torch.empty_like(bias) if need_db and bias is not None else empty.clone(),
    )


def _grouped_conv2d_setup(ctx, inputs, output):
    x, weight, bias, pad_h, pad_w, deterministic = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.pad, ctx.deterministic = (pad_h, pad_w), deterministic


def _grouped_conv2d_backward(ctx, grad, bwd=_grouped_conv2d_backward_op):
    x, weight, bias = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    need_db = need_db and bias is not None
    dx, dw, db = bwd(grad, x, weight, bias, *ctx.pad, need_dx, need_dw, need_db, ctx.deterministic)
    return (
        dx if need_dx else None,
        dw if need_dw else None,
        db if need_db else None,
        None,
        None,
        None,
    )


_grouped_conv2d_op.register_autograd(_grouped_conv2d_backward, setup_context=_grouped_conv2d_setup)


def _grouped_conv2d_backward_eager(
    grad, x, weight, bias, pad_h, pad_w, need_dx, need_dw, need_db, deterministic
):
    """The backward op's body for the eager Function: None for the gradients not asked for
    (the op's schema needs tensors there; allocating them costs host time on every call)."""
    need = (need_dx, need_dw, need_db and bias is not None)
    return _gconv.backward(grad, x, weight, bias, pad_h, pad_w, need, deterministic)


_grouped_conv2d_eager = _eager_function(
    "GroupedConv2d",
    _grouped_conv2d_impl,
    _grouped_conv2d_setup,
    _grouped_conv2d_backward,
    _grouped_conv2d_backward_eager,
)


def _autocast(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Cast like autocast does for a lower-precision op: floating tensors except fp64."""
    if t is None or not t.is_floating_point() or t.dtype in (dtype, torch.float64):
        return t
    return t.to(dtype)


def _autocast_inputs(x: Tensor, *others: Tensor | None) -> tuple[Tensor | None, ...]:
    """``(x, *others)`` cast to the autocast dtype of ``x``'s device when autocast is on there
    (as ``F.conv2d``/``F.linear`` get them), else unchanged."""
    if not torch.is_autocast_enabled(x.device.type):
        return (x, *others)
    dtype = torch.get_autocast_dtype(x.device.type)
    return tuple(_autocast(t, dtype) for t in (x, *others))


#: ``_gconv_checks``'s answers by the tensors' metadata and the conv's arguments (they depend on
#: nothing else: no switches)
_GCONV_CHECKS = plans.PlanCache(lambda: ())


def _hashable(arg):
    """``arg`` as part of a memo key: ints, strings and sequences of ints only (a bool, which
    ``check_conv_args`` rejects, must not hit an int's entry); TypeError for anything else."""
    if type(arg) is int or type(arg) is str:
        return arg
    if isinstance(arg, (tuple, list)) and all(type(v) is int for v in arg):
        return tuple(arg)
    raise TypeError(f"no memo key for {arg!r}")


def _gconv_checks(x, weight, bias, stride, padding, dilation, groups) -> tuple:
    """(groups, why the kernels cannot take this call or None, the padding (pad_h, pad_w) where
    they can): ``check_conv_args`` (which raises for bad input), the hyper-parameters, the layout
    and ``resolve_padding``. These read only metadata, so a
    call like one seen before skips them (~10 us of host time per call); not while
    torch.compile traces (its guards do that job)."""
    key = found = None
    if not torch.compiler.is_compiling():
        try:
            key = (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(),
                   weight.dtype, weight.device,
                   None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
                   _hashable(stride), _hashable(padding), _hashable(dilation),
                   None if groups is None else _hashable(groups))  # fmt: skip
            found = _GCONV_CHECKS.get(key)
        except (RuntimeError, TypeError):  # a tensor without strides, an unhashable argument
            key = found = None
    if found is not None:
        return found
    groups = _gconv.check_conv_args(x, weight, bias, groups)
    r, s = weight.shape[2], weight.shape[3]
    reason = _gconv_config.unsupported_reason(
        x.shape[1], weight.shape[0], (r, s), stride, padding, dilation, groups
    ) or _gconv.layout_reason(x, weight, bias)
    pads = _gconv_config.resolve_padding(padding, r, s) if reason is None else None
    if key is not None:
        _GCONV_CHECKS.put(key, (groups, reason, pads))
    return groups, reason, pads


def grouped_conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int | None = None,
    *,
    deterministic: bool | None = None,
) -> Tensor:
    """``torch.nn.functional.conv2d`` (same argument order) with tilewise kernels for group width 8.

    The kernel path needs C_in == C_out == C, ``weight`` [C, 8, R, S] with R, S <= 7, stride 1,
    dilation 1, zero padding and a channels_last ``x`` (parameters of any layout); its output is
    channels_last. Anything else runs ``F.conv2d`` and logs why, once. ``groups`` defaults to
    ``C // weight.shape[1]``. Under autocast, inputs are cast to the autocast dtype as for
    F.conv2d. ``deterministic`` (default: ``torch.are_deterministic_algorithms_enabled()``)
    selects the weight-gradient reduction: per-chunk partials summed in a fixed order (True) or
    fp32 atomics (False, faster, bitwise run-to-run variation on the GPU).
    """
    if x.ndim == 3:  # unbatched [C, H, W], as F.conv2d takes it
        y = grouped_conv2d(
            x.unsqueeze(0), weight, bias, stride, padding, dilation, groups,
            deterministic=deterministic,
        )  # fmt: skip
        return y.squeeze(0)
    x, weight, bias = _autocast_inputs(x, weight, bias)
    if _untransformed():
        groups, reason, pads = _gconv_checks(x, weight, bias, stride, padding, dilation, groups)
    elif _forward_mode():  # first: under torch.compile it also covers vmap
        groups = _gconv.check_conv_args(x, weight, bias, groups)
        reason = _NO_AUTODIFF_RULE
    elif _vmapped():
        groups = _gconv.check_conv_args(x, weight, bias, groups)
        reason = "torch.func.vmap, under which the layout checks cannot run"
    else:
        groups, reason, pads = _gconv_checks(x, weight, bias, stride, padding, dilation, groups)
    if reason is not None:
        if not torch.compiler.is_compiling():
            dispatch.fallback(_gconv.OP, reason)
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    pad_h, pad_w = pads
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    op = _grouped_conv2d_eager if _eager(x, weight, bias) else _grouped_conv2d_op
    return op(x, weight, bias, pad_h, pad_w, bool(deterministic))


# --- linear + bias + activation ---------------------------------------------------------------


def _linear_impl(
    x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, allow_tf32: bool
) -> tuple[Tensor, Tensor]:
    y, saved = _linear.forward(x, weight, bias, activation, allow_tf32)
    # The second output is the pre-activation the backward needs (gelu/silu), else empty: for
    # relu the backward uses y itself, which an op may not return twice.
    pre = saved if activation in _linear.SAVES_PRE_ACTIVATION else x.new_empty(0)
    return _fresh(y, x), pre


_linear_op = torch.library.custom_op("tilewise::linear", mutates_args=())(_linear_impl)


@_linear_op.register_fake
def _(x, weight, bias, activation, allow_tf32):
    _linear.validate(x, weight, bias, activation)
    y = x.new_empty(_linear.output_shape(x, weight))
    pre = torch.empty_like(y) if activation in _linear.SAVES_PRE_ACTIVATION else x.new_empty(0)
    return y, pre


def _linear_backward_impl(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    saved: Tensor | None,
    activation: str,
    allow_tf32: bool,
    need_dx: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = _linear.backward(grad, x, weight, bias, saved, activation, allow_tf32, need_dx)
    dx = dx if dx is not None else x.new_empty(0)  # not needed: x does not require grad
    return dx, dw, (db if db is not None else x.new_empty(0))


_linear_backward_op = torch.library.custom_op("tilewise::linear_backward", mutates_args=())(
    _linear_backward_impl
)


@_linear_backward_op.register_fake
def _(grad, x, weight, bias, saved, activation, allow_tf32, need_dx=True):
    _linear.validate(x, weight, bias, activation)
    dx = torch.empty(x.shape if need_dx else (0,), dtype=x.dtype, device=x.device)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    db = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if bias is not None else None
    return dx, dw, (db if db is not None else x.new_empty(0))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation, allow_tf32 = inputs
    y, pre = output
    saved = pre if activation in _linear.SAVES_PRE_ACTIVATION else None
    if activation == "relu":
        saved = y
    ctx.save_for_backward(x, weight, bias, saved)
    ctx.activation, ctx.allow_tf32 = activation, allow_tf32
    ctx.slots = (grad_slots.slot_of(weight), grad_slots.slot_of(bias))
    ctx.mark_non_differentiable(pre)


def _linear_backward(ctx, grad, _grad_pre, bwd=_linear_backward_op):
    x, weight, bias, saved = ctx.saved_tensors
    need_dx = bool(ctx.needs_input_grad[0])
    args = (grad, x, weight, bias, saved, ctx.activation, ctx.allow_tf32, need_dx)
    if bwd is _linear_backward_impl and ctx.slots != (None, None):
        # eager: the gradients go straight into a fused optimizer's flat buffer when it allows
        nodes = [f for f, _ in ctx.next_functions]  # one per tensor input: x, weight (, bias)
        w_node, b_node = nodes[1], (nodes[2] if bias is not None else None)
        dw_out = grad_slots.claim(ctx.slots[0], w_node, weight.shape, weight.dtype)
        db_out = None
        if bias is not None:
            db_out = grad_slots.claim(ctx.slots[1], b_node, bias.shape, bias.dtype)
        dx, dw, db = _linear.backward(*args, dw_out=dw_out, db_out=db_out)
    else:
        dx, dw, db = bwd(*args)
    return (dx if need_dx else None), dw, (db if bias is not None else None), None, None


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)
_linear_eager = _eager_function(
    "Linear", _linear_impl, _linear_setup, _linear_backward, _linear_backward_impl
)


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str = "none",
    allow_tf32: bool = False,
) -> Tensor:
    """``act(x @ weight^T + bias)``: ``F.linear`` with the bias and activation fused in its GEMM.

    ``x`` is [..., K], ``weight`` [N, K] (``nn.Linear``'s layout), ``bias`` [N] or None;
    ``activation`` is one of "none", "relu", "gelu" (erf form), "silu". ``x`` and ``weight``
    share a dtype (fp32, fp16 or bf16; fp32 accumulation); ``bias`` may be fp32 with a
    half-precision ``x``. fp32 products are true fp32 unless ``allow_tf32=True`` (TF32 tensor
    cores on the GPU). Strided ``x``/``weight`` (e.g. transposed views) are read in place.
    Under autocast, inputs are cast to the autocast dtype as for ``F.linear``.
    """
    x, weight, bias = _autocast_inputs(x, weight, bias)  # as F.linear under autocast
    if _reference_for_forward_mode(_linear.OP):
        _linear.validate(x, weight, bias, activation)
        return _linear.reference(x, weight, bias, activation)
    op = _linear_eager if _eager(x, weight, bias) else _linear_op
    y, _ = op(x, weight, bias, activation, bool(allow_tf32))
    return y
