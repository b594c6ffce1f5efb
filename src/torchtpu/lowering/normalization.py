"""Normalization layers and losses."""

from __future__ import annotations

import math
from typing import Any

import torch

from .builder import Builder, Value
from .elementwise import opmath
from .reductions import reduce_sum
from .registry import LoweringContext, register

aten = torch.ops.aten


def _bcast_keep(b: Builder, v: Value, full: tuple[int, ...], axes: list[int]) -> Value:
    keep = [1 if i in axes else s for i, s in enumerate(full)]
    return b.broadcast_to(b.reshape(v, keep), full)


@register(aten.native_layer_norm.default)
def _layer_norm(ctx: LoweringContext, x: Value, normalized_shape: list[int], weight: Value | None,
                bias: Value | None, eps: Any) -> tuple[Value, Value, Value]:
    b = ctx.b
    acc = opmath(x.dtype)
    axis = x.rank - len(normalized_shape)
    axes = list(range(axis, x.rank))
    n = math.prod(x.shape[axis:])
    v = b.convert(x, acc)
    red_shape = list(x.shape[:axis])
    nc = b.constant(float(n), acc, red_shape)
    mean = b.div(reduce_sum(b, v, axes), nc)
    centered = b.sub(v, _bcast_keep(b, mean, x.shape, axes))
    var = b.div(reduce_sum(b, b.mul(centered, centered), axes), nc)
    rstd = b.unary("rsqrt", b.add(var, ctx.scalar(eps, acc, red_shape)))
    y = b.mul(centered, _bcast_keep(b, rstd, x.shape, axes))
    if weight is not None:
        y = b.mul(y, b.broadcast_to(b.convert(weight, acc), x.shape))
    if bias is not None:
        y = b.add(y, b.broadcast_to(b.convert(bias, acc), x.shape))
    stat_shape = red_shape + [1] * len(normalized_shape)
    return (b.convert(y, ctx.out_dtype(0)), b.convert(b.reshape(mean, stat_shape), ctx.out_dtype(1)),
            b.convert(b.reshape(rstd, stat_shape), ctx.out_dtype(2)))


@register(aten.native_layer_norm_backward.default)
def _layer_norm_backward(ctx: LoweringContext, grad: Value, x: Value, normalized_shape: list[int], mean: Value,
                         rstd: Value, weight: Value | None, bias: Value | None, output_mask: list[bool]) -> tuple:
    b = ctx.b
    acc = opmath(x.dtype)
    axis = x.rank - len(normalized_shape)
    axes = list(range(axis, x.rank))
    outer = list(range(axis))
    n = math.prod(x.shape[axis:])
    g = b.convert(grad, acc)
    v = b.convert(x, acc)
    m = b.broadcast_to(b.convert(mean, acc), x.shape)
    r = b.broadcast_to(b.convert(rstd, acc), x.shape)
    xhat = b.mul(b.sub(v, m), r)
    gw = g
    if weight is not None:
        gw = b.mul(g, b.broadcast_to(b.convert(weight, acc), x.shape))
    results: list[Value | None] = [None, None, None]
    if output_mask[0]:
        red_shape = list(x.shape[:axis])
        s1 = _bcast_keep(b, reduce_sum(b, gw, axes), x.shape, axes)
        s2 = _bcast_keep(b, reduce_sum(b, b.mul(gw, xhat), axes), x.shape, axes)
        nc = b.constant(float(n), acc, x.shape)
        inner = b.sub(b.sub(b.mul(gw, nc), s1), b.mul(xhat, s2))
        dx = b.mul(b.div(r, nc), inner)
        del red_shape
        results[0] = b.convert(dx, ctx.out_dtype(0))
    if output_mask[1] and weight is not None:
        results[1] = b.convert(reduce_sum(b, b.mul(g, xhat), outer), ctx.out_dtype(1))
    if output_mask[2] and bias is not None:
        results[2] = b.convert(reduce_sum(b, g, outer), ctx.out_dtype(2))
    return tuple(results)


# -- losses ------------------------------------------------------------------
_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _nll_pick(b: Builder, x: Value, target: Value) -> tuple[Value, Value]:
    """(-x[i, target[i]] per row, class ids) for x of shape (N, C) or (C,)."""
    n, c = (x.shape[0], x.shape[1]) if x.rank == 2 else (1, x.shape[0])
    x2 = b.reshape(x, (n, c))
    t = b.reshape(b.convert(target, torch.int64), (n,))
    cls = b.iota((n, c), 1, torch.int64)
    onehot = b.compare(cls, b.broadcast_in_dim(t, (n, c), [0]), "EQ")
    picked = reduce_sum(b, b.select(onehot, x2, b.constant(0, x.dtype, (n, c))), [1])
    return picked, t


@register(aten.nll_loss_forward.default)
def _nll_loss(ctx: LoweringContext, x: Value, target: Value, weight: Value | None, reduction: int,
              ignore_index: int) -> tuple[Value, Value]:
    b = ctx.b
    acc = opmath(x.dtype)
    picked, t = _nll_pick(b, b.convert(x, acc), target)
    n = picked.shape[0]
    valid = b.compare(t, b.constant(ignore_index, torch.int64, (n,)), "NE")
    safe_t = b.select(valid, t, b.constant(0, torch.int64, (n,)))
    if weight is not None:
        w = _take1(b, b.convert(weight, acc), safe_t)
    else:
        w = b.constant(1.0, acc, (n,))
    w = b.select(valid, w, b.constant(0.0, acc, (n,)))
    losses = b.neg(b.mul(picked, w))
    total = reduce_sum(b, w, [0])
    if reduction == _REDUCTION_NONE:
        out = losses if x.rank == 2 else b.reshape(losses, ())
        return b.convert(out, ctx.out_dtype(0)), b.convert(total, ctx.out_dtype(1))
    s = reduce_sum(b, losses, [0])
    if reduction == _REDUCTION_MEAN:
        s = b.div(s, total)
    return b.convert(s, ctx.out_dtype(0)), b.convert(total, ctx.out_dtype(1))


def _take1(b: Builder, w: Value, idx: Value) -> Value:
    from .indexing import take_rows

    return take_rows(b, w, idx, 0)


@register(aten.nll_loss_backward.default)
def _nll_loss_backward(ctx: LoweringContext, grad: Value, x: Value, target: Value, weight: Value | None,
                       reduction: int, ignore_index: int, total_weight: Value) -> Value:
    b = ctx.b
    acc = opmath(x.dtype)
    n, c = (x.shape[0], x.shape[1]) if x.rank == 2 else (1, x.shape[0])
    t = b.reshape(b.convert(target, torch.int64), (n,))
    valid = b.compare(t, b.constant(ignore_index, torch.int64, (n,)), "NE")
    safe_t = b.select(valid, t, b.constant(0, torch.int64, (n,)))
    if weight is not None:
        w = _take1(b, b.convert(weight, acc), safe_t)
    else:
        w = b.constant(1.0, acc, (n,))
    w = b.select(valid, w, b.constant(0.0, acc, (n,)))
    g = b.convert(grad, acc)
    if reduction == _REDUCTION_NONE:
        gv = b.reshape(g, (n,))
    else:
        gv = b.broadcast_to(b.reshape(g, ()), (n,))
        if reduction == _REDUCTION_MEAN:
            gv = b.div(gv, b.broadcast_to(b.reshape(b.convert(total_weight, acc), ()), (n,)))
    per_row = b.neg(b.mul(gv, w))
    cls = b.iota((n, c), 1, torch.int64)
    onehot = b.compare(cls, b.broadcast_in_dim(safe_t, (n, c), [0]), "EQ")
    dx = b.select(onehot, b.broadcast_in_dim(per_row, (n, c), [0]), b.constant(0.0, acc, (n, c)))
    return b.convert(b.reshape(dx, x.shape), ctx.out_dtype())


@register(aten.mse_loss.default)
def _mse_loss(ctx: LoweringContext, x: Value, target: Value, reduction: int = 1) -> Value:
    b = ctx.b
    acc = opmath(x.dtype)
    shape = torch.broadcast_shapes(x.shape, target.shape)
    d = b.sub(b.broadcast_to(b.convert(x, acc), shape), b.broadcast_to(b.convert(target, acc), shape))
    sq = b.mul(d, d)
    if reduction == _REDUCTION_NONE:
        return b.convert(sq, ctx.out_dtype())
    s = reduce_sum(b, sq, list(range(len(shape))))
    if reduction == _REDUCTION_MEAN:
        s = b.div(s, b.constant(float(math.prod(shape)), acc))
    return b.convert(s, ctx.out_dtype())


@register(aten.mse_loss_backward.default)
def _mse_loss_backward(ctx: LoweringContext, grad: Value, x: Value, target: Value, reduction: int) -> Value:
    b = ctx.b
    acc = opmath(x.dtype)
    shape = x.shape
    d = b.sub(b.convert(x, acc), b.broadcast_to(b.convert(target, acc), shape))
    g = b.broadcast_to(b.convert(grad, acc), shape)
    scale = 2.0 / math.prod(shape) if reduction == _REDUCTION_MEAN else 2.0
    return b.convert(b.mul(b.mul(g, d), b.constant(scale, acc, shape)), ctx.out_dtype())
