"""Fused optimizer steps: ``torch.optim.Adam/AdamW/SGD/Adagrad(..., fused=True)``.

Each call updates every parameter of a group in one program, as CUDA's fused kernels do,
with the math of CPU's kernels (aten/src/ATen/native/cpu/Fused{Adam,SGD,Adagrad}Kernel.cpp) in
the op math type: the optional ``grad_scale`` unscales the gradients (written back, as
CPU does), and a ``found_inf`` of 1.0 leaves every tensor as it was (GradScaler's
skipped step). The scalar hyper-parameters are runtime values, so one program serves
every step of a learning-rate schedule. Step counts live on the device (the optimizer
keeps ``state_steps`` there for fused steps) and the bias corrections are computed
from them in f32 (CPU takes them in double: differences stay at f32 rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .builder import Builder, Value
from .elementwise import opmath
from .registry import LoweringContext, register

aten = torch.ops.aten


def _skip_if_found_inf(ctx: LoweringContext, found_inf: Value | None, old: list[Value], new: list[Value]) -> list:
    """``new``, or ``old`` where found_inf is 1.0 (CPU's kernels then return before any write)."""
    if found_inf is None:
        return new
    b = ctx.b
    out = []
    for o, n in zip(old, new):
        skip = b.compare(ctx.scalar(found_inf, torch.float32, o.shape), b.constant(1.0, torch.float32, o.shape), "EQ")
        out.append(b.select(skip, o, n))
    return out


def _unscaled(ctx: LoweringContext, grad: Value, grad_scale: Value | None, acc: torch.dtype) -> tuple[Value, Value]:
    """(the gradient in op math, the gradient tensor's new value)."""
    b = ctx.b
    g = b.convert(grad, acc)
    if grad_scale is None:
        return g, grad
    g = b.div(g, ctx.scalar(grad_scale, acc, g.shape))
    return g, b.convert(g, grad.dtype)


def _per_parameter(ctx: LoweringContext, params: list[Value]) -> Iterator[tuple[int, Value, torch.dtype, tuple,
                                                                                Callable[[Any], Value]]]:
    """Each parameter of a group: (position, value, op-math dtype, shape, ``s``), where ``s(x)`` is a
    scalar hyper-parameter broadcast to the parameter in op math."""
    for i, p in enumerate(params):
        acc = opmath(p.dtype)
        yield i, p, acc, p.shape, functools.partial(_broadcast_scalar, ctx, acc=acc, shape=p.shape)


def _broadcast_scalar(ctx: LoweringContext, x: Any, acc: torch.dtype, shape: tuple) -> Value:
    return ctx.scalar(x, acc, shape)


def _nonzero(b: Builder, x: Value) -> Value:
    return b.compare(x, b.constant(0.0, x.dtype, x.shape), "NE")


def _decayed_gradient(ctx: LoweringContext, p: Value, grad: Value, grad_scale: Value | None, maximize: bool,
                      weight_decay: Any, acc: torch.dtype) -> tuple[Value, Value, Value]:
    """(the parameter in op math, its gradient unscaled, negated when maximizing and with L2 weight
    decay added, the gradient tensor's new value): the first steps of SGD's and Adagrad's kernels."""
    b = ctx.b
    g, grad_out = _unscaled(ctx, grad, grad_scale, acc)
    if maximize:
        g = b.unary("negate", g)
    param = b.convert(p, acc)
    decay = ctx.scalar(weight_decay, acc, p.shape)
    return param, b.select(_nonzero(b, decay), b.add(g, b.mul(param, decay)), g), grad_out


def _adam(ctx: LoweringContext, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, max_exp_avg_sqs: list,
          state_steps: list, lr: Any, beta1: Any, beta2: Any, weight_decay: Any, eps: Any, amsgrad: bool,
          maximize: bool, grad_scale: Value | None, found_inf: Value | None, decoupled: bool) -> tuple:
    b = ctx.b
    outs: list[list[Value]] = [[], [], [], [], []]
    for i, p, acc, shape, s in _per_parameter(ctx, params):
        one = b.constant(1.0, acc, shape)
        step = s(state_steps[i])
        bias_correction1 = b.sub(one, b.binary("power", s(beta1), step))
        bias_correction2_sqrt = b.unary("sqrt", b.sub(one, b.binary("power", s(beta2), step)))
        step_size = b.div(s(lr), bias_correction1)
        g, grad_out = _unscaled(ctx, grads[i], grad_scale, acc)
        if maximize:
            g = b.unary("negate", g)
        param = b.convert(p, acc)
        decay = _nonzero(b, s(weight_decay))
        if decoupled:  # AdamW
            param = b.select(decay, b.mul(param, b.sub(one, b.mul(s(lr), s(weight_decay)))), param)
        else:
            g = b.select(decay, b.add(g, b.mul(param, s(weight_decay))), g)
        # exp_avg.lerp_(grad, 1 - beta1), in lerp's two numerically stable forms
        m = b.convert(exp_avgs[i], acc)
        w = b.sub(one, s(beta1))
        small = b.compare(b.unary("abs", w), b.constant(0.5, acc, shape), "LT")
        m = b.select(small, b.add(m, b.mul(w, b.sub(g, m))), b.sub(g, b.mul(b.sub(g, m), b.sub(one, w))))
        v = b.convert(exp_avg_sqs[i], acc)
        v = b.add(b.mul(v, s(beta2)), b.mul(b.mul(b.sub(one, s(beta2)), g), g))
        second = v
        if amsgrad:
            second = b.binary("maximum", b.convert(max_exp_avg_sqs[i], acc), v)
            outs[4].append(b.convert(second, p.dtype))
        denom = b.add(b.div(b.unary("sqrt", second), bias_correction2_sqrt), s(eps))
        param = b.add(param, b.div(b.mul(b.unary("negate", step_size), m), denom))
        outs[0].append(b.convert(param, p.dtype))
        outs[1].append(grad_out)
        outs[2].append(b.convert(m, p.dtype))
        outs[3].append(b.convert(v, p.dtype))
    olds = [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else []]
    return tuple(_skip_if_found_inf(ctx, found_inf, old, new) for old, new in zip(olds, outs))


@register(aten._fused_adam.default, aten._fused_adam.tensor_lr)
def _fused_adam(ctx: LoweringContext, *args: Any) -> tuple:
    return _adam(ctx, *args, decoupled=False)


@register(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)
def _fused_adamw(ctx: LoweringContext, *args: Any) -> tuple:
    return _adam(ctx, *args, decoupled=True)


@register(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def _fused_sgd(ctx: LoweringContext, params: list, grads: list, momentum_buffers: list, weight_decay: Any,
               momentum: Any, lr: Any, dampening: Any, nesterov: bool, maximize: bool, is_first_step: bool,
               grad_scale: Value | None = None, found_inf: Value | None = None) -> tuple:
    b = ctx.b
    outs: list[list[Value]] = [[], [], []]
    for i, p, acc, shape, s in _per_parameter(ctx, params):
        param, g, grad_out = _decayed_gradient(ctx, p, grads[i], grad_scale, maximize, weight_decay, acc)
        if momentum_buffers:  # the optimizer passes none when momentum is 0
            if is_first_step:
                buf = g
            else:
                one = b.constant(1.0, acc, shape)
                buf = b.add(b.mul(b.convert(momentum_buffers[i], acc), s(momentum)),
                            b.mul(g, b.sub(one, s(dampening))))
            outs[2].append(b.convert(buf, p.dtype))
            g = b.add(g, b.mul(buf, s(momentum))) if nesterov else buf
        outs[0].append(b.convert(b.sub(param, b.mul(g, s(lr))), p.dtype))
        outs[1].append(grad_out)
    return tuple(_skip_if_found_inf(ctx, found_inf, old, new)
                 for old, new in zip([params, grads, momentum_buffers], outs))


@register(aten._fused_adagrad.default, aten._fused_adagrad.tensor_lr)
def _fused_adagrad(ctx: LoweringContext, params: list, grads: list, state_sums: list, state_steps: list, lr: Any,
                   lr_decay: Any, weight_decay: Any, eps: Any, maximize: bool, grad_scale: Value | None = None,
                   found_inf: Value | None = None) -> tuple:
    """CPU's FusedAdagradKernel: the optimizer has counted the step already; the learning rate
    decays to lr / (1 + (step - 1) * lr_decay)."""
    b = ctx.b
    outs: list[list[Value]] = [[], [], []]
    for i, p, acc, shape, s in _per_parameter(ctx, params):
        one = b.constant(1.0, acc, shape)
        clr = b.div(s(lr), b.add(one, b.mul(b.sub(s(state_steps[i]), one), s(lr_decay))))
        param, g, grad_out = _decayed_gradient(ctx, p, grads[i], grad_scale, maximize, weight_decay, acc)
        total = b.add(b.convert(state_sums[i], acc), b.mul(g, g))
        std = b.add(b.unary("sqrt", total), s(eps))
        outs[0].append(b.convert(b.sub(param, b.div(b.mul(clr, g), std)), p.dtype))
        outs[1].append(grad_out)
        outs[2].append(b.convert(total, p.dtype))
    result = [_skip_if_found_inf(ctx, found_inf, old, new) for old, new in zip([params, grads, state_sums], outs)]
    if ctx.op is aten._fused_adagrad.default:  # its state_steps are written (unchanged) too
        result.append(list(state_steps))
    return tuple(result)


# PyTorch has a meta kernel for _fused_adam_ only; the engine runs every op on meta
# tensors first (shapes of what it writes). In-place steps write nothing new.
def _writes_in_place(*args: Any, **kwargs: Any) -> None:
    return None


_meta_lib = torch.library.Library("aten", "IMPL")
for _name in ("_fused_adam_.tensor_lr", "_fused_adamw_", "_fused_adamw_.tensor_lr", "_fused_sgd_",
              "_fused_sgd_.tensor_lr", "_fused_adagrad_", "_fused_adagrad_.tensor_lr"):
    _meta_lib.impl(_name, _writes_in_place, "Meta")
