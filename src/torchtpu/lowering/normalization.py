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


def _statistics(ctx: LoweringContext, v: Value, axes: list[int], count: int, eps: Any
                ) -> tuple[Value, Value, Value]:
    """Mean over ``axes`` of ``count`` values, ``v`` centered on it, and 1 / sqrt(variance + eps)."""
    b = ctx.b
    red_shape = [s for i, s in enumerate(v.shape) if i not in axes]
    keep = [i for i in range(v.rank) if i not in axes]
    n = b.constant(float(count), v.dtype, red_shape)
    mean = b.div(reduce_sum(b, v, axes), n)
    centered = b.sub(v, b.broadcast_in_dim(mean, v.shape, keep))
    var = b.div(reduce_sum(b, b.mul(centered, centered), axes), n)
    return mean, centered, b.unary("rsqrt", b.add(var, ctx.scalar(eps, v.dtype, red_shape)))


@register(aten.native_layer_norm.default)
def _layer_norm(ctx: LoweringContext, x: Value, normalized_shape: list[int], weight: Value | None,
                bias: Value | None, eps: Any) -> tuple[Value, Value, Value]:
    b = ctx.b
    acc = opmath(x.dtype)
    axis = x.rank - len(normalized_shape)
    axes = list(range(axis, x.rank))
    n = math.prod(x.shape[axis:])
    red_shape = list(x.shape[:axis])
    mean, centered, rstd = _statistics(ctx, b.convert(x, acc), axes, n, eps)
    y = b.mul(centered, _bcast_keep(b, rstd, x.shape, axes))
    if weight is not None:
        y = b.mul(y, b.broadcast_to(b.convert(weight, acc), x.shape))
    if bias is not None:
        y = b.add(y, b.broadcast_to(b.convert(bias, acc), x.shape))
    stat_shape = red_shape + [1] * len(normalized_shape)
    return (b.convert(y, ctx.out_dtype(0)), b.convert(b.reshape(mean, stat_shape), ctx.out_dtype(1)),
            b.convert(b.reshape(rstd, stat_shape), ctx.out_dtype(2)))


@register(aten.native_group_norm.default)
def _group_norm(ctx: LoweringContext, x: Value, weight: Value | None, bias: Value | None, n: int, c: int,
                hxw: int, group: int, eps: Any) -> tuple[Value, Value, Value]:
    """One program, statistics and output in f32, rounded once to the input's dtype.

    ATen's composite kernel (``math_group_norm``: batch norm, then ``mul`` by the weight, then
    ``add`` of the bias as separate ops) rounded a bf16 output three times: 0.125 off CPU's
    fused kernel on values of O(10). The output is ``x * scale + shift`` with
    ``scale = rstd * weight`` and ``shift = bias - mean * scale`` per channel, as CPU's kernel
    computes it."""
    b = ctx.b
    acc = opmath(x.dtype)
    cpg = c // group if group else 0
    v = b.reshape(b.convert(x, acc), (n, group, cpg * hxw))
    mean, _, rstd = _statistics(ctx, v, [2], cpg * hxw, eps)
    per_channel = (n, group, cpg)
    scale = b.broadcast_in_dim(rstd, per_channel, [0, 1])
    if weight is not None:
        scale = b.mul(scale, b.broadcast_in_dim(b.reshape(b.convert(weight, acc), (group, cpg)), per_channel, [1, 2]))
    shift = b.neg(b.mul(b.broadcast_in_dim(mean, per_channel, [0, 1]), scale))
    if bias is not None:
        shift = b.add(shift, b.broadcast_in_dim(b.reshape(b.convert(bias, acc), (group, cpg)), per_channel, [1, 2]))
    full = (n, group, cpg, hxw)
    y = b.reshape(v, full)
    y = b.add(b.mul(y, b.broadcast_in_dim(scale, full, [0, 1, 2])), b.broadcast_in_dim(shift, full, [0, 1, 2]))
    return (b.convert(b.reshape(y, x.shape), ctx.out_dtype(0)), b.convert(mean, ctx.out_dtype(1)),
            b.convert(rstd, ctx.out_dtype(2)))


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
    if acc != x.dtype:
        # CPU's (and CUDA's) kernel computes (a - b) and its square in the 16-bit type itself,
        # rounding each: float16 losses two units in the last place from a single rounding
        d = b.convert(b.convert(d, x.dtype), acc)
    sq = b.mul(d, d)
    if acc != x.dtype:
        sq = b.convert(b.convert(sq, x.dtype), acc)
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


def _rows(b: Builder, x: Value) -> tuple[Value, int, int]:
    n, c = (x.shape[0], x.shape[1]) if x.rank == 2 else ((1, x.shape[0]) if x.rank == 1 else (1, 1))
    return b.reshape(x, (n, c)), n, c


def _per_sample_grad(b: Builder, g: Value, n: int, reduction: int, acc: torch.dtype) -> Value:
    gv = b.convert(g, acc)
    if reduction == _REDUCTION_NONE:
        return b.reshape(gv, (n,))
    gv = b.broadcast_to(b.reshape(gv, ()), (n,))
    if reduction == _REDUCTION_MEAN:
        gv = b.div(gv, b.constant(float(n), acc, (n,)))
    return gv


@register(aten.multi_margin_loss_backward.default)
def _multi_margin_loss_backward(ctx: LoweringContext, grad: Value, x: Value, target: Value, p: Any, margin: Any,
                                weight: Value | None = None, reduction: int = 1) -> Value:
    """d/dx of sum_{j != y} w_y max(0, margin - x_y + x_j)^p / C."""
    b = ctx.b
    acc = opmath(x.dtype)
    xv, n, c = _rows(b, b.convert(x, acc))
    t = b.reshape(b.convert(target, torch.int64), (n,))
    cls = b.iota((n, c), 1, torch.int64)
    is_y = b.compare(cls, b.broadcast_in_dim(t, (n, c), [0]), "EQ")
    zero = b.constant(0.0, acc, (n, c))
    xy = b.broadcast_in_dim(reduce_sum(b, b.select(is_y, xv, zero), [1]), (n, c), [0])
    z = b.add(b.sub(ctx.scalar(margin, acc, (n, c)), xy), xv)
    active = b.binary("and", b.compare(z, zero, "GT"), b.unary("not", is_y))
    pv = ctx.scalar(p, acc, (n, c))
    # p * z^(p-1): 1 for p == 1, 2z for p == 2
    dz = b.select(b.compare(pv, b.constant(1.0, acc, (n, c)), "EQ"), b.constant(1.0, acc, (n, c)),
                  b.mul(pv, b.binary("power", b.maximum(z, zero), b.sub(pv, b.constant(1.0, acc, (n, c))))))
    gj = b.select(active, dz, zero)
    if weight is not None:
        from .indexing import take_rows

        wy = take_rows(b, b.convert(weight, acc), t, 0)
        gj = b.mul(gj, b.broadcast_in_dim(wy, (n, c), [0]))
    gj = b.div(gj, b.constant(float(c), acc, (n, c)))
    gy = b.neg(reduce_sum(b, gj, [1]))
    gx = b.select(is_y, b.broadcast_in_dim(gy, (n, c), [0]), gj)
    gs = _per_sample_grad(b, grad, n, reduction, acc)
    r = b.mul(gx, b.broadcast_in_dim(gs, (n, c), [0]))
    return b.convert(b.reshape(r, x.shape), ctx.out_dtype())


@register(aten.multilabel_margin_loss_backward.default)
def _multilabel_margin_loss_backward(ctx: LoweringContext, grad: Value, x: Value, target: Value, reduction: int,
                                     is_target: Value) -> Value:
    """d/dx of sum_{j target} sum_{k not target} max(0, 1 - (x_j - x_k)) / C."""
    b = ctx.b
    acc = opmath(x.dtype)
    xv, n, c = _rows(b, b.convert(x, acc))
    tgt = b.compare(b.reshape(b.convert(is_target, acc), (n, c)), b.constant(0.0, acc, (n, c)), "NE")
    full = (n, c, c)  # [i, j, k]
    xj = b.broadcast_in_dim(xv, full, [0, 1])
    xk = b.broadcast_in_dim(xv, full, [0, 2])
    z = b.sub(b.constant(1.0, acc, full), b.sub(xj, xk))
    pair = b.binary("and", b.broadcast_in_dim(tgt, full, [0, 1]),
                    b.unary("not", b.broadcast_in_dim(tgt, full, [0, 2])))
    act = b.convert(b.binary("and", pair, b.compare(z, b.constant(0.0, acc, full), "GT")), acc)
    # CPU walks the target list up to the first -1, duplicates included: weight each class by its count
    t = b.reshape(b.convert(target, torch.int64), (n, c))
    ok = b.convert(b.compare(t, b.constant(-1, torch.int64, (n, c)), "NE"), torch.int32)
    from .reductions import _scan

    prefix = _scan(b, ok, 1, "stablehlo.minimum", 1)  # 1 until the first -1
    hits = b.binary("and", b.compare(b.broadcast_in_dim(t, full, [0, 1]), b.iota(full, 2, torch.int64), "EQ"),
                    b.compare(b.broadcast_in_dim(prefix, full, [0, 1]), b.constant(1, torch.int32, full), "EQ"))
    mult = reduce_sum(b, b.convert(hits, acc), [1])  # (n, c): occurrences of class c in the list
    act = b.mul(act, b.broadcast_in_dim(mult, full, [0, 1]))
    scale = b.constant(1.0 / c, acc, (n, c))
    gk = b.mul(reduce_sum(b, act, [1]), scale)
    gj = b.mul(reduce_sum(b, act, [2]), scale)
    gx = b.sub(gk, gj)
    gs = _per_sample_grad(b, grad, n, reduction, acc)
    r = b.mul(gx, b.broadcast_in_dim(gs, (n, c), [0]))
    return b.convert(b.reshape(r, x.shape), ctx.out_dtype())


@register(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(ctx: LoweringContext, grad_w: Value, v: Value, g: Value, norms: Value,
                                    dim: int) -> tuple[Value, Value]:
    """w = v * g / ||v|| (norm over every dim but ``dim``):
    grad_g = sum(grad_w * v) / ||v||;  grad_v = g / ||v|| * (grad_w - v * grad_g / ||v||)."""
    b = ctx.b
    acc = torch.float64 if v.dtype == torch.float64 else torch.float32
    gw, vv = b.convert(grad_w, acc), b.convert(v, acc)
    gg, nn = b.convert(g, acc), b.convert(norms, acc)
    dim = dim % v.rank if v.rank else 0
    others = [d for d in range(v.rank) if d != dim]
    per_dim = reduce_sum(b, b.mul(gw, vv), others)  # shape (v.shape[dim],)
    keep = b.reshape(per_dim, nn.shape)
    grad_g = b.div(keep, nn)
    scale = b.broadcast_to(b.div(gg, nn), v.shape)
    correction = b.mul(vv, b.broadcast_to(b.div(grad_g, nn), v.shape))
    grad_v = b.mul(scale, b.sub(gw, correction))
    return b.convert(grad_v, v.dtype), b.convert(b.reshape(grad_g, g.shape), g.dtype)


# PyTorch has no meta kernels for these backwards; the engine needs output metadata.
_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_weight_norm_interface_backward",
               lambda grad_w, v, g, norms, dim: (torch.empty_like(v), torch.empty_like(g)), "Meta")
_meta_lib.impl("multi_margin_loss_backward",
               lambda grad, x, target, p, margin, weight=None, reduction=1: torch.empty_like(x), "Meta")
_meta_lib.impl("multilabel_margin_loss_backward",
               lambda grad, x, target, reduction, is_target: torch.empty_like(x), "Meta")
