"""View ops as they appear inside graphs (torch.compile, decompositions).

In eager mode views are metadata on the C++ side; inside a lowered graph a
view is just a new dense value, so each becomes a reshape, transpose,
broadcast or slice. Registered graph-only.
"""

from __future__ import annotations

from typing import Any

import torch

from .builder import Value
from .registry import LoweringContext, register_graph_only
from .views import ViewSpec, contiguous_strides, read_view

aten = torch.ops.aten


@register_graph_only(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
                     aten._reshape_alias.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
                     aten.unsqueeze.default, aten.flatten.using_ints, aten.view.dtype)
def _reshape(ctx: LoweringContext, x: Value, *rest: Any) -> Value:
    if ctx.op is aten.view.dtype:
        dtype = rest[0]
        if dtype.itemsize == x.dtype.itemsize:
            return ctx.b.bitcast_convert(x, dtype, x.shape) if dtype != torch.bool else ctx.b.convert(x, dtype)
        raise NotImplementedError("torchtpu: view(dtype) with another element size inside a graph")
    return ctx.b.reshape(x, ctx.out_shape())


@register_graph_only(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _identity(ctx: LoweringContext, x: Value, *rest: Any) -> Value:
    return x


@register_graph_only(aten.t.default, aten.transpose.int, aten.permute.default, aten.numpy_T.default)
def _transpose(ctx: LoweringContext, x: Value, *rest: Any) -> Value:
    b = ctx.b
    if x.rank < 2:
        return x
    if ctx.op is aten.permute.default:
        perm = [d % x.rank for d in rest[0]]
    elif ctx.op in (aten.t.default, aten.numpy_T.default):
        perm = list(reversed(range(x.rank)))
    else:
        d0, d1 = rest[0] % x.rank, rest[1] % x.rank
        perm = list(range(x.rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.transpose(x, perm)


@register_graph_only(aten.expand.default, aten.expand_copy.default)
def _expand(ctx: LoweringContext, x: Value, size: list[int], implicit: bool = False) -> Value:
    return ctx.b.broadcast_to(x, ctx.out_shape())


@register_graph_only(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(ctx: LoweringContext, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
           ) -> Value:
    d = dim % x.rank
    n = x.shape[d]
    s = 0 if start is None else (start + n if start < 0 else start)
    e = n if end is None else (end + n if end < 0 else end)
    s, e = max(0, min(s, n)), max(0, min(e, n))
    e = max(e, s)
    starts = [0] * x.rank
    limits = list(x.shape)
    steps = [1] * x.rank
    starts[d], limits[d], steps[d] = s, e, step
    return ctx.b.slice(x, starts, limits, steps)


@register_graph_only(aten.select.int, aten.select_copy.int)
def _select(ctx: LoweringContext, x: Value, dim: int, index: int) -> Value:
    d = dim % x.rank
    i = index + x.shape[d] if index < 0 else index
    starts = [0] * x.rank
    limits = list(x.shape)
    starts[d], limits[d] = i, i + 1
    return ctx.b.reshape(ctx.b.slice(x, starts, limits), ctx.out_shape())


@register_graph_only(aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int, aten.split_with_sizes_copy.default)
def _split(ctx: LoweringContext, x: Value, *rest: Any) -> list[Value]:
    b = ctx.b
    dim = 0
    if ctx.op is aten.unbind.int:
        dim = rest[0] if rest else 0
    elif len(rest) > 1:
        dim = rest[1]
    d = dim % x.rank
    outs = []
    offset = 0
    for meta in ctx.out:
        shape = list(meta.shape)
        size = 1 if ctx.op is aten.unbind.int else shape[d]
        starts = [0] * x.rank
        limits = list(x.shape)
        starts[d], limits[d] = offset, offset + size
        outs.append(b.reshape(b.slice(x, starts, limits), meta.shape))
        offset += size
    return outs


@register_graph_only(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(ctx: LoweringContext, x: Value, size: list[int], stride: list[int], offset: int | None = None
                ) -> Value:
    # Functionalized graphs apply as_strided to a dense (contiguous) base.
    flat = ctx.b.reshape(x, (x.numel,))
    return read_view(ctx.b, flat, ViewSpec(x.dtype, tuple(size), tuple(stride), offset or 0))


@register_graph_only(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(ctx: LoweringContext, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    b = ctx.b
    d1, d2 = dim1 % x.rank, dim2 % x.rank
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    v = b.transpose(x, rest + [d1, d2])
    strides = list(contiguous_strides(v.shape))
    n = ctx.out_shape()[-1]
    start = offset * strides[-1] if offset >= 0 else -offset * strides[-2]
    size = [v.shape[i] for i in range(len(rest))] + [n]
    stride = strides[: len(rest)] + [strides[-2] + strides[-1]]
    flat = b.reshape(v, (v.numel,))
    return read_view(b, flat, ViewSpec(x.dtype, tuple(size), tuple(stride), start))


@register_graph_only(aten.unfold.default)
def _unfold(ctx: LoweringContext, x: Value, dimension: int, size: int, step: int) -> Value:
    b = ctx.b
    d = dimension % max(x.rank, 1)
    strides = list(contiguous_strides(x.shape))
    out_shape = ctx.out_shape()
    out_stride = [strides[i] * (step if i == d else 1) for i in range(x.rank)] + [strides[d] if x.rank else 1]
    flat = b.reshape(x, (x.numel,))
    return read_view(b, flat, ViewSpec(x.dtype, tuple(out_shape), tuple(out_stride), 0))


# -- factories and copies as they appear in graphs -------------------------------
@register_graph_only(aten.full_like.default, aten.new_full.default)
def _full_like(ctx: LoweringContext, x: Value, *rest: Any) -> Value:
    value = rest[0] if ctx.op is aten.full_like.default else rest[1]
    return ctx.scalar(value, ctx.out_dtype(), ctx.out_shape())


@register_graph_only(aten.zeros_like.default, aten.new_zeros.default, aten.empty_like.default,
                     aten.new_empty.default, aten.empty.memory_format, aten.empty_strided.default,
                     aten.zeros.default, aten.new_empty_strided.default)
def _zeros_like(ctx: LoweringContext, *args: Any) -> Value:
    # empty* inside a functional graph: every element is written before it is read.
    return ctx.b.constant(0, ctx.out_dtype(), ctx.out_shape())


@register_graph_only(aten.ones_like.default, aten.new_ones.default, aten.ones.default)
def _ones_like(ctx: LoweringContext, *args: Any) -> Value:
    return ctx.b.constant(1, ctx.out_dtype(), ctx.out_shape())


@register_graph_only(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default)
def _to_copy(ctx: LoweringContext, x: Value, *rest: Any) -> Value:
    return ctx.b.convert(x, ctx.out_dtype())
