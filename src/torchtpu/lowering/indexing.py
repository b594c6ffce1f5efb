"""Indexing: gather/scatter family, embedding, advanced indexing.

XLA clamps out-of-range indices silently: each op's index ranges are checked as
lowering/index_bounds.py registers them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import target
from .builder import Builder, Value
from .registry import LoweringContext, register, register_argument_check

aten = torch.ops.aten


def _wrap(b: Builder, idx: Value, size: int, dtype: torch.dtype = torch.int64) -> Value:
    """Negative indices count from the end (in ``dtype``)."""
    idx = b.convert(idx, dtype)
    zero = b.constant(0, dtype, idx.shape)
    return b.select(b.compare(idx, zero, "LT"), b.add(idx, b.constant(size, dtype, idx.shape)), idx)


_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _wrap_rows(b: Builder, idx: Value, size: int) -> Value:
    """``_wrap`` for an index used alone as a gather's or scatter's rows: in int32 where 64-bit
    integers are emulated (``target.narrow_indices``). An index past int32's range stays out of
    range (clamped to it), so the result is what an out-of-range int64 index gives: the index
    checks raise, and XLA clamps the row meanwhile."""
    if not (target.narrow_indices() and size <= _INT32_MAX and idx.dtype in (torch.int64, torch.int32)):
        return _wrap(b, idx, size)
    if idx.dtype == torch.int64:
        idx = b.clamp(b.constant(_INT32_MIN, torch.int64, idx.shape), idx,
                      b.constant(_INT32_MAX, torch.int64, idx.shape))
    return _wrap(b, idx, size, torch.int32)


def take_rows(b: Builder, x: Value, idx: Value, dim: int, in_range: bool = False) -> Value:
    """x.index_select(dim, idx) for an n-d idx: result shape x.shape[:dim] + idx.shape + x.shape[dim+1:].
    ``in_range``: idx is known to lie in [0, size), so it is used as it is, in its own integer type
    (no int64 wrap of negative indices: 64-bit integers are emulated on a TPU)."""
    if not in_range:
        idx = _wrap_rows(b, idx, x.shape[dim])
    rank = idx.rank
    offset_dims = list(range(dim)) + list(range(dim + rank, x.rank - 1 + rank))
    slice_sizes = list(x.shape)
    slice_sizes[dim] = 1
    out_shape = list(x.shape[:dim]) + list(idx.shape) + list(x.shape[dim + 1:])
    if x.shape[dim] == 0:
        # No row to take: the result is empty when idx is (CPU's answer), and any index is out of
        # range otherwise, which the index checks report; a gather of 1-slices from 0 rows would
        # not even compile.
        return b.constant(0, x.dtype, out_shape)
    attrs = ("dimension_numbers = #stablehlo.gather<offset_dims = [" + ", ".join(map(str, offset_dims)) + "], "
             f"collapsed_slice_dims = [{dim}], start_index_map = [{dim}], index_vector_dim = {rank}>, "
             "slice_sizes = array<i64: " + ", ".join(map(str, slice_sizes)) + ">, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [x, idx], out_shape, x.dtype, attrs=attrs)


def take_per_batch(b: Builder, x: Value, idx: Value) -> Value:
    """x (N, C, P) gathered along its last dim per batch member: idx (N, *out) -> (N, C, *out),
    out[n, c, o] = x[n, c, idx[n, o]]."""
    n, c, _ = x.shape
    shape = (n, c, *idx.shape[1:])
    rank = len(shape)
    idx_n = b.iota(shape, 0, torch.int64)
    idx_c = b.iota(shape, 1, torch.int64)
    idx_p = b.broadcast_in_dim(idx, shape, [0, *range(2, rank)])
    coords = b.concatenate([b.reshape(v, (*shape, 1)) for v in (idx_n, idx_c, idx_p)], rank)
    attrs = ("dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1, 2], start_index_map = [0, 1, 2], "
             f"index_vector_dim = {rank}>, slice_sizes = array<i64: 1, 1, 1>, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [x, coords], shape, x.dtype, attrs=attrs)


@register(aten.index_select.default)
def _index_select(ctx: LoweringContext, x: Value, dim: int, index: Value) -> Value:
    if x.rank == 0:
        return x
    return take_rows(ctx.b, x, ctx.b.reshape(index, (index.numel,)), dim % x.rank)


@register(aten.embedding.default)
def _embedding(ctx: LoweringContext, weight: Value, indices: Value, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    return take_rows(ctx.b, weight, indices, 0)


def scatter_add_rows(b: Builder, base: Value, idx: Value, updates: Value, dim: int, in_range: bool = False) -> Value:
    """base.index_add(dim, idx, updates) for 1-d idx (``in_range`` as for take_rows)."""
    if not in_range:
        idx = _wrap_rows(b, idx, base.shape[dim])
    update_window_dims = [i for i in range(base.rank) if i != dim]
    region = b.region([((), base.dtype), ((), base.dtype)], lambda bb, a, c: bb.add(a, c))
    attrs = ("scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = ["
             + ", ".join(map(str, update_window_dims)) + f"], inserted_window_dims = [{dim}], "
             f"scatter_dims_to_operand_dims = [{dim}], index_vector_dim = 1>, "
             "indices_are_sorted = false, unique_indices = false")
    idx2 = b.reshape(idx, (idx.numel,))
    return b.op1("stablehlo.scatter", [base, idx2, updates], base.shape, base.dtype, attrs=attrs, region=region)


@register(aten.embedding_dense_backward.default)
def _embedding_backward(ctx: LoweringContext, grad: Value, indices: Value, num_weights: int, padding_idx: int,
                        scale_grad_by_freq: bool) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = torch.float32 if out in (torch.bfloat16, torch.float16) else out
    dim = grad.shape[-1]
    n = indices.numel
    flat_idx = b.reshape(b.convert(indices, torch.int64), (n,))
    g = b.convert(b.reshape(grad, (n, dim)), acc)
    if padding_idx >= 0:
        keep = b.compare(flat_idx, b.constant(padding_idx, torch.int64, (n,)), "NE")
        g = b.select(b.broadcast_in_dim(keep, (n, dim), [0]), g, b.constant(0, acc, (n, dim)))
    base = b.constant(0, acc, (num_weights, dim))
    return b.convert(scatter_add_rows(b, base, flat_idx, g, 0), out)


@register(aten.index_add.default)
def _index_add(ctx: LoweringContext, x: Value, dim: int, index: Value, source: Value, alpha: Any = 1) -> Value:
    b = ctx.b
    d = dim % max(x.rank, 1)
    src = b.convert(source, x.dtype)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        src = b.mul(src, ctx.scalar(alpha, x.dtype, src.shape))
    if x.rank == 0:
        return b.add(x, b.reshape(src, ()))
    return scatter_add_rows(b, x, b.reshape(index, (index.numel,)), src, d)


def _full_indices(b: Builder, index: Value, dim: int) -> Value:
    """Coordinates for gather/scatter along ``dim``: shape index.shape + [rank]."""
    parts = []
    for d in range(index.rank):
        coord = _wrap(b, index, 0) if d == dim else b.iota(index.shape, d, torch.int64)
        parts.append(b.reshape(coord, list(index.shape) + [1]))
    return b.concatenate(parts, index.rank)


@register(aten.gather.default)
def _gather(ctx: LoweringContext, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    b = ctx.b
    if index.numel == 0:
        return b.constant(0, x.dtype, index.shape)  # empty (its rank may even differ from x's)
    if x.rank == 0:
        return b.broadcast_to(x, index.shape)
    d = dim % x.rank
    if x.shape[d] == 0:
        return b.constant(0, x.dtype, index.shape)  # every index is out of range: the index checks report it
    idx = b.convert(index, torch.int64)
    zero = b.constant(0, torch.int64, idx.shape)
    idx = b.select(b.compare(idx, zero, "LT"), b.add(idx, b.constant(x.shape[d], torch.int64, idx.shape)), idx)
    coords = []
    for k in range(index.rank):
        c = idx if k == d else b.iota(index.shape, k, torch.int64)
        coords.append(b.reshape(c, list(index.shape) + [1]))
    full = b.concatenate(coords, index.rank)
    dims = ", ".join(map(str, range(x.rank)))
    attrs = (f"dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [{dims}], start_index_map = [{dims}], "
             f"index_vector_dim = {index.rank}>, slice_sizes = array<i64: {', '.join(['1'] * x.rank)}>, "
             "indices_are_sorted = false")
    return b.op1("stablehlo.gather", [x, full], index.shape, x.dtype, attrs=attrs)


def _scatter_elements(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value, combine: str | None
                      ) -> Value:
    b = ctx.b
    if index.numel == 0:
        return x
    if x.rank == 0:
        # 0-d: the one element, scattered through a 1-element view
        r = _scatter_elements(ctx, b.reshape(x, (1,)), 0, b.reshape(index, (index.numel,)),
                              b.reshape(src, (src.numel,)) if src.rank else b.reshape(src, (1,)), combine)
        return b.reshape(r, ())
    d = dim % max(x.rank, 1)
    idx = b.convert(index, torch.int64)
    zero = b.constant(0, torch.int64, idx.shape)
    idx = b.select(b.compare(idx, zero, "LT"), b.add(idx, b.constant(x.shape[d], torch.int64, idx.shape)), idx)
    coords = []
    for k in range(index.rank):
        c = idx if k == d else b.iota(index.shape, k, torch.int64)
        coords.append(b.reshape(c, list(index.shape) + [1]))
    full = b.concatenate(coords, index.rank)
    upd = b.convert(src, x.dtype)
    if upd.shape != index.shape:
        upd = b.slice(upd, [0] * upd.rank, list(index.shape))

    def body(bb: Builder, a: Value, c: Value) -> Value:
        if combine is None:
            return c
        if combine == "add":
            return bb.add(a, c) if a.dtype != torch.bool else bb.binary("or", a, c)
        if combine == "multiply":
            return bb.mul(a, c)
        if combine == "amax":
            return bb.maximum(a, c)
        if combine == "amin":
            return bb.minimum(a, c)
        raise NotImplementedError(f"scatter reduce '{combine}'")

    region = b.region([((), x.dtype), ((), x.dtype)], body)
    dims = ", ".join(map(str, range(x.rank)))
    attrs = (f"scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [{dims}], "
             f"scatter_dims_to_operand_dims = [{dims}], index_vector_dim = {index.rank}>, "
             "indices_are_sorted = false, unique_indices = false")
    return b.op1("stablehlo.scatter", [x, full, upd], x.shape, x.dtype, attrs=attrs, region=region)


@register(aten.scatter.src, aten.scatter.value)
def _scatter(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Any) -> Value:
    if not isinstance(src, Value) or src.shape != index.shape:
        src = ctx.scalar(src, x.dtype, index.shape) if not isinstance(src, Value) or src.rank == 0 else src
    return _scatter_elements(ctx, x, dim, index, src, None)


@register(aten.scatter_add.default)
def _scatter_add(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value) -> Value:
    return _scatter_elements(ctx, x, dim, index, src, "add")


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_legacy(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Any, reduce: str) -> Value:
    if not isinstance(src, Value) or src.rank == 0:
        src = ctx.scalar(src, x.dtype, index.shape)
    return _scatter_elements(ctx, x, dim, index, src, reduce)


@register(aten.index.Tensor)
def _index(ctx: LoweringContext, x: Value, indices: list[Value | None]) -> Value:
    """Advanced indexing with integer index tensors (boolean masks sync and are converted by PyTorch)."""
    b = ctx.b
    out_shape = ctx.out_shape()
    idx_pos = [i for i, t in enumerate(indices) if t is not None]
    if any(t.dtype == torch.bool for t in indices if t is not None):
        raise NotImplementedError("torchtpu: boolean mask indexing (data-dependent shape)")
    idx_vals = [indices[i] for i in idx_pos]
    if any(x.shape[i] == 0 for i in idx_pos):
        # an indexed dim without rows: empty result for empty indices (CPU's answer), and any index
        # out of range otherwise (the index checks report it); its gather would not compile
        return b.constant(0, x.dtype, out_shape)
    bshape = torch.broadcast_shapes(*[tuple(t.shape) for t in idx_vals])
    coords = []
    for i, t in zip(idx_pos, idx_vals):
        w = _wrap(b, b.broadcast_to(b.convert(t, torch.int64), bshape), x.shape[i])
        coords.append(b.reshape(w, list(bshape) + [1]))
    full = b.concatenate(coords, len(bshape))
    consecutive = idx_pos == list(range(idx_pos[0], idx_pos[-1] + 1))
    rest = [d for d in range(x.rank) if d not in idx_pos]
    slice_sizes = [1 if d in idx_pos else x.shape[d] for d in range(x.rank)]
    nb = len(bshape)
    if consecutive:
        first = idx_pos[0]
        offset_dims = [d for d in range(first)] + [d + nb - len(idx_pos) for d in rest if d > idx_pos[-1]]
        offset_dims = list(range(first)) + list(range(first + nb, first + nb + len([d for d in rest if d > first])))
    else:
        offset_dims = list(range(nb, nb + len(rest)))
    attrs = ("dimension_numbers = #stablehlo.gather<offset_dims = [" + ", ".join(map(str, offset_dims)) + "], "
             "collapsed_slice_dims = [" + ", ".join(map(str, idx_pos)) + "], start_index_map = ["
             + ", ".join(map(str, idx_pos)) + f"], index_vector_dim = {nb}>, slice_sizes = array<i64: "
             + ", ".join(map(str, slice_sizes)) + ">, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [x, full], out_shape, x.dtype, attrs=attrs)


@register(aten.index_put.default)
def _index_put(ctx: LoweringContext, x: Value, indices: list[Value | None], values: Value,
               accumulate: bool = False) -> Value:
    b = ctx.b
    idx_pos = [i for i, t in enumerate(indices) if t is not None]
    if any(t.dtype in (torch.bool, torch.uint8) for t in indices if t is not None):
        return _masked_put(b, x, indices, values, accumulate)
    idx_vals = [indices[i] for i in idx_pos]
    if any(x.shape[i] == 0 for i in idx_pos):
        # an indexed dim without rows: nothing to put for empty indices (CPU's answer), and any
        # index out of range otherwise (the index checks report it); its scatter would not compile
        return x
    bshape = torch.broadcast_shapes(*[tuple(t.shape) for t in idx_vals])
    if math.prod(bshape) == 1:
        return _put_one_position(b, x, idx_pos, idx_vals, bshape, values, accumulate)
    coords = []
    for i, t in zip(idx_pos, idx_vals):
        w = _wrap(b, b.broadcast_to(b.convert(t, torch.int64), bshape), x.shape[i])
        coords.append(b.reshape(w, list(bshape) + [1]))
    full = b.concatenate(coords, len(bshape))
    rest = [d for d in range(x.rank) if d not in idx_pos]
    nb = len(bshape)
    natural = _put_value_shape(x, idx_pos, bshape)
    v = b.broadcast_to(b.convert(values, x.dtype), natural)
    first = idx_pos[0]
    if idx_pos == list(range(first, idx_pos[-1] + 1)) and first > 0:
        # PyTorch places the indexed dims at the first indexed position; move them to the front
        perm = list(range(first, first + nb)) + list(range(first)) + list(range(first + nb, len(natural)))
        v = b.transpose(v, perm)

    def body(bb: Builder, a: Value, c: Value) -> Value:
        if accumulate:
            return bb.add(a, c) if a.dtype != torch.bool else bb.binary("or", a, c)
        return c

    region = b.region([((), x.dtype), ((), x.dtype)], body)
    attrs = ("scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = ["
             + ", ".join(map(str, range(nb, nb + len(rest)))) + "], inserted_window_dims = ["
             + ", ".join(map(str, idx_pos)) + "], scatter_dims_to_operand_dims = [" + ", ".join(map(str, idx_pos))
             + f"], index_vector_dim = {nb}>, indices_are_sorted = false, unique_indices = false")
    return b.op1("stablehlo.scatter", [x, full, v], x.shape, x.dtype, attrs=attrs, region=region)


def _put_value_shape(x: Value, idx_pos: list[int], bshape: Sequence[int]) -> list[int]:
    """The shape PyTorch gives ``x[indices]`` (and so the values ``index_put`` takes): the indices'
    broadcast shape in place of the indexed dims where those are adjacent, in front otherwise."""
    rest = [d for d in range(x.rank) if d not in idx_pos]
    first = idx_pos[0]
    if idx_pos == list(range(first, idx_pos[-1] + 1)):
        return list(x.shape[:first]) + list(bshape) + [x.shape[d] for d in rest if d > first]
    return list(bshape) + [x.shape[d] for d in rest]


def _put_one_position(b: Builder, x: Value, idx_pos: list[int], idx_vals: list[Value], bshape: Sequence[int],
                      values: Value, accumulate: bool) -> Value:
    """``x[..., i, ...] = v`` where every index holds one element (a KV cache written at one
    position per step): a ``dynamic_update_slice`` of that one position, as JAX writes a cache. As
    a scatter, XLA rewrites it into a dynamic_update_slice under a select over all of ``x`` (a
    scatter drops an out-of-range update, a dynamic_update_slice clamps it). Here ``x`` is not
    read at all (unless accumulating), so the update is the buffer's only use and may be done in
    place in a donated argument: on a v5e decode step with a second reader of each cache (a slice
    for the select) the compiler copied each whole cache into another memory space and back,
    where JAX's step, without one, updates in place (this form not yet measured there). Out of
    range, the write lands where the slice clamps to, as XLA's gathers clamp, and the index checks
    raise the CPU's IndexError at the next synchronization (engine/index_checks.py)."""
    slice_shape = [1 if d in idx_pos else n for d, n in enumerate(x.shape)]
    starts: list[Value | None] = [None] * x.rank
    for d, t in zip(idx_pos, idx_vals):
        starts[d] = b.reshape(_wrap_rows(b, t, x.shape[d]), ())
    index_dtype = next(w.dtype for w in starts if w is not None)
    starts = [b.constant(0, index_dtype) if w is None else b.convert(w, index_dtype) for w in starts]
    # the indexed dims have one element each, so the element order is the slice's
    v = b.reshape(b.broadcast_to(b.convert(values, x.dtype), _put_value_shape(x, idx_pos, bshape)), slice_shape)
    if accumulate:
        old = b.dynamic_slice(x, starts, slice_shape)
        v = b.binary("or", old, v) if x.dtype == torch.bool else b.add(old, v)
    return b.dynamic_update_slice(x, v, starts)


def _masked_put(b: Builder, x: Value, indices: list[Value | None], values: Value, accumulate: bool) -> Value:
    """``x[mask] = v`` in a compiled graph (eager mode expands a mask into coordinates first): with
    one mask and values that do not depend on how many elements it selects (a scalar, or one
    value per element of the dims after the mask), a select; no data-dependent shape arises."""
    pos = [i for i, t in enumerate(indices) if t is not None]
    p = pos[0]
    mask = indices[p]
    k = mask.rank
    rest = tuple(x.shape[p + k:])
    vshape = tuple(values.shape)
    while len(vshape) > len(rest) and vshape[0] == 1:
        vshape = vshape[1:]
    fits = len(vshape) <= len(rest) and all(v in (1, r) for v, r in zip(vshape, rest[len(rest) - len(vshape):]))
    if len(pos) != 1 or tuple(mask.shape) != tuple(x.shape[p:p + k]) or not fits:
        raise NotImplementedError("torchtpu: a boolean-mask index_put in a compiled graph whose values depend on "
                                  "the number of selected elements (data-dependent shape)")
    v = b.reshape(b.convert(values, x.dtype), vshape)
    v = b.broadcast_in_dim(v, x.shape, list(range(x.rank - len(vshape), x.rank)))
    if accumulate:
        v = b.binary("or", x, v) if x.dtype == torch.bool else b.add(x, v)
    selected = b.broadcast_in_dim(b.convert(mask, torch.bool), x.shape, list(range(p, p + k)))
    return b.select(selected, v, x)


def _reduce_identity(dtype: torch.dtype, reduce: str) -> float | int | bool:
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype == torch.bool:
        return reduce == "amin"
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@register(aten.scatter_reduce.two)
def _scatter_reduce(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value, reduce: str,
                    include_self: bool = True) -> Value:
    b = ctx.b
    combine = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "amax", "amin": "amin"}[reduce]
    base = x
    if not include_self:
        # Targets start from the reduction's identity, so x itself does not take part.
        base = _scatter_elements(ctx, x, dim, index, b.constant(_reduce_identity(x.dtype, reduce), x.dtype,
                                                                 index.shape), None)
    r = _scatter_elements(ctx, base, dim, index, src, combine)
    if reduce != "mean":
        return r
    cnt_t = torch.int64
    start = b.constant(1 if include_self else 0, cnt_t, x.shape)
    counts = _scatter_elements(ctx, start, dim, index, b.constant(1, cnt_t, index.shape), "add")
    counts = b.maximum(counts, b.constant(1, cnt_t, x.shape))
    if x.dtype.is_floating_point:
        return b.div(r, b.convert(counts, x.dtype))
    # integer mean rounds down, as the CPU kernel's floor division does
    q = b.div(r, b.convert(counts, x.dtype))
    rem = b.binary("remainder", r, b.convert(counts, x.dtype))
    neg = b.binary("and", b.compare(rem, b.constant(0, x.dtype, x.shape), "NE"),
                   b.compare(r, b.constant(0, x.dtype, x.shape), "LT"))
    return b.select(neg, b.sub(q, b.constant(1, x.dtype, x.shape)), q)


@register(aten.index_reduce.default)
def _index_reduce(ctx: LoweringContext, x: Value, dim: int, index: Value, source: Value, reduce: str,
                  include_self: bool = True) -> Value:
    """index_reduce is scatter_reduce with the 1-d index broadcast over the source's other dims."""
    b = ctx.b
    if x.rank == 0:
        return _scatter_reduce(ctx, x, 0, b.reshape(index, ()), b.reshape(source, ()), reduce, include_self)
    d = dim % x.rank
    full = b.broadcast_in_dim(b.convert(index, torch.int64), source.shape, [d])
    return _scatter_reduce(ctx, x, d, full, source, reduce, include_self)


@register(aten.put.default)
def _put(ctx: LoweringContext, x: Value, index: Value, source: Value, accumulate: bool = False) -> Value:
    """put on the flattened tensor: a 1-d scatter (add when accumulating)."""
    b = ctx.b
    n = x.numel
    flat = b.reshape(x, (n,))
    if index.numel == 0:
        return x
    idx = b.reshape(index, (index.numel,))
    src = b.reshape(b.convert(source, x.dtype), (source.numel,))
    r = _scatter_elements(ctx, flat, 0, idx, src, "add" if accumulate else None)
    return b.reshape(r, x.shape)


@register(aten.take.default)
def _take(ctx: LoweringContext, x: Value, index: Value) -> Value:
    b = ctx.b
    if index.numel == 0 or x.numel == 0:
        return b.constant(0, x.dtype, index.shape)
    flat = b.reshape(x, (x.numel,))
    return take_rows(b, flat, b.convert(index, torch.int64), 0)


@register(aten.embedding_renorm.default)
def _embedding_renorm(ctx: LoweringContext, weight: Value, indices: Value, max_norm: Any, norm_type: Any) -> Value:
    """Rows referenced by ``indices`` whose p-norm exceeds max_norm are scaled down to it."""
    b = ctx.b
    acc = torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else weight.dtype
    w = b.convert(weight, acc)
    n = weight.shape[0]
    p = ctx.scalar(norm_type, acc, weight.shape)
    norms = b.binary("power", b.reduce(b.binary("power", b.unary("abs", w), p), [1], b.constant(0, acc),
                                       "stablehlo.add"),
                     b.div(b.constant(1.0, acc, (n,)), ctx.scalar(norm_type, acc, (n,))))
    flat = b.reshape(b.convert(indices, torch.int64), (indices.numel,))
    used = _scatter_elements(ctx, b.constant(0, torch.int32, (n,)), 0, flat,
                             b.constant(1, torch.int32, (indices.numel,)), None)
    mx = ctx.scalar(max_norm, acc, (n,))
    scale = b.div(mx, b.add(norms, b.constant(1e-7, acc, (n,))))
    hit = b.binary("and", b.compare(used, b.constant(0, torch.int32, (n,)), "NE"), b.compare(norms, mx, "GT"))
    scale = b.select(hit, scale, b.constant(1.0, acc, (n,)))
    return b.convert(b.mul(w, b.broadcast_in_dim(scale, weight.shape, [0])), weight.dtype)


@register_argument_check(aten.histc.default)
def _check_histc(x: Any, bins: int = 100, low: Any = 0, high: Any = 0) -> None:
    """CPU's argument errors (the edges are runtime scalars, so this runs on every call). With
    min == max the range is the data's: CPU and CUDA read its min and max then, and so does an
    eager call here, to refuse a range that is not finite (an inf or NaN element)."""
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if low > high:
        raise RuntimeError("torch.histc: max must be larger than min")
    if low == high and isinstance(x, torch.Tensor) and x.numel() and x.device.type != "meta":
        # (a compiled graph's check sees its tensors' metadata only: decompose.check_arguments)
        low, high = torch.stack([x.detach().min(), x.detach().max()]).tolist()
    if not (math.isfinite(low) and math.isfinite(high)):
        raise RuntimeError(f"torch.histc: range of [{low:g}, {high:g}] is not finite")


@register(aten.histc.default)
def _histc(ctx: LoweringContext, x: Value, bins: int = 100, lo: Any = 0, hi: Any = 0) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    n = x.numel
    v = b.reshape(b.convert(x, acc), (n,))
    lov, hiv = ctx.scalar(lo, acc), ctx.scalar(hi, acc)
    if n:
        # min == max: the data's range; still equal: widened by one on each side
        dmin = b.reduce(v, [0], b.constant(math.inf, acc), "stablehlo.minimum")
        dmax = b.reduce(v, [0], b.constant(-math.inf, acc), "stablehlo.maximum")
        same = b.compare(lov, hiv, "EQ")
        lov, hiv = b.select(same, dmin, lov), b.select(same, dmax, hiv)
    same = b.compare(lov, hiv, "EQ")
    one = b.constant(1.0, acc)
    lov, hiv = b.select(same, b.sub(lov, one), lov), b.select(same, b.add(hiv, one), hiv)
    if n == 0:
        return b.constant(0, out, (bins,))
    lo_b, hi_b = b.broadcast_in_dim(lov, (n,), []), b.broadcast_in_dim(hiv, (n,), [])
    pos = b.unary("floor", b.mul(b.div(b.sub(v, lo_b), b.sub(hi_b, lo_b)), b.constant(float(bins), acc, (n,))))
    pos = b.convert(pos, torch.int64)
    pos = b.select(b.compare(pos, b.constant(bins, torch.int64, (n,)), "EQ"),
                   b.constant(bins - 1, torch.int64, (n,)), pos)
    inside = b.binary("and", b.compare(v, lo_b, "GE"), b.compare(v, hi_b, "LE"))
    pos = b.select(inside, pos, b.constant(bins, torch.int64, (n,)))  # out of range: dropped by the scatter
    counts = _scatter_elements(ctx, b.constant(0, acc, (bins,)), 0, pos, b.constant(1, acc, (n,)), "add")
    return b.convert(counts, out)


# -- embedding_bag: gathers + segment reductions over the bags ----------------------
def _bag_ids(b: Builder, n: int, offsets: Value, include_last: bool) -> tuple[Value, int]:
    """Bag of each index position (nb for positions outside every bag) and the bag count."""
    nb = offsets.numel - (1 if include_last else 0)
    off = b.convert(b.reshape(offsets, (offsets.numel,)), torch.int64)
    pos = b.iota((n, offsets.numel), 0, torch.int64)
    offb = b.broadcast_in_dim(off, (n, offsets.numel), [1])
    started = b.convert(b.compare(offb, pos, "LE"), torch.int64)
    bag = b.sub(b.reduce(started, [1], b.constant(0, torch.int64), "stablehlo.add"),
                b.constant(1, torch.int64, (n,)))
    if include_last:
        bag = b.select(b.compare(bag, b.constant(nb, torch.int64, (n,)), "GE"), b.constant(nb, torch.int64, (n,)),
                       bag)
    return bag, nb


@register(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(ctx: LoweringContext, weight: Value, indices: Value, offsets: Value,
                   scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                   per_sample_weights: Value | None = None, include_last_offset: bool = False,
                   padding_idx: int = -1) -> tuple[Value, Value, Value, Value]:
    b = ctx.b
    n = indices.numel
    dim = weight.shape[1]
    acc = torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else weight.dtype
    idx = b.convert(b.reshape(indices, (n,)), torch.int64)
    bag, nb = _bag_ids(b, n, offsets, include_last_offset)
    valid = b.compare(bag, b.constant(nb, torch.int64, (n,)), "LT")
    if padding_idx >= 0:
        valid = b.binary("and", valid, b.compare(idx, b.constant(padding_idx, torch.int64, (n,)), "NE"))
    target = b.select(valid, bag, b.constant(nb, torch.int64, (n,)))
    rows = b.convert(take_rows(b, weight, idx, 0), acc) if n else b.constant(0, acc, (0, dim))
    counts = _scatter_elements(ctx, b.constant(0, torch.int64, (nb,)), 0, target,
                               b.constant(1, torch.int64, (n,)), "add")
    max_idx = b.constant(0, torch.int64, ctx.out_shape(3))
    if mode in (0, 1):
        if per_sample_weights is not None:
            rows = b.mul(rows, b.broadcast_in_dim(b.convert(per_sample_weights, acc), (n, dim), [0]))
        full_t = b.broadcast_in_dim(target, (n, dim), [0])
        out = _scatter_elements(ctx, b.constant(0, acc, (nb, dim)), 0, full_t, rows, "add")
        if mode == 1:
            denom = b.convert(b.maximum(counts, b.constant(1, torch.int64, (nb,))), acc)
            out = b.div(out, b.broadcast_in_dim(denom, (nb, dim), [0]))
    else:
        member = b.compare(b.broadcast_in_dim(target, (nb, n), [1]), b.iota((nb, n), 0, torch.int64), "EQ")
        vals = b.select(b.broadcast_in_dim(member, (nb, n, dim), [0, 1]),
                        b.broadcast_in_dim(rows, (nb, n, dim), [1, 2]),
                        b.constant(-math.inf, acc, (nb, n, dim)))
        from .reductions import arg_reduce

        best, where = arg_reduce(b, vals, 1, True)
        empty = b.broadcast_in_dim(b.compare(counts, b.constant(0, torch.int64, (nb,)), "EQ"), (nb, dim), [0])
        out = b.select(empty, b.constant(0, acc, (nb, dim)), best)
        which = take_rows(b, idx, b.reshape(where, (nb * dim,)), 0)
        max_idx = b.select(empty, b.constant(-1, torch.int64, (nb, dim)), b.reshape(which, (nb, dim)))
    return (b.convert(out, ctx.out_dtype(0)), b.broadcast_to(bag, ctx.out_shape(1)) if n else
            b.constant(0, torch.int64, ctx.out_shape(1)), counts, max_idx)


@register(aten._embedding_bag_dense_backward.default)
def _embedding_bag_backward(ctx: LoweringContext, grad: Value, indices: Value, offset2bag: Value, bag_size: Value,
                            max_indices: Value, num_weights: int, scale_grad_by_freq: bool, mode: int,
                            per_sample_weights: Value | None, padding_idx: int = -1) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = torch.float32 if out in (torch.bfloat16, torch.float16) else out
    nb, dim = grad.shape
    n = indices.numel
    g = b.convert(grad, acc)
    base = b.constant(0, acc, (num_weights, dim))
    if mode == 2:
        mi = b.convert(max_indices, torch.int64)
        mi = b.select(b.compare(mi, b.constant(0, torch.int64, mi.shape), "LT"),
                      b.constant(num_weights, torch.int64, mi.shape), mi)
        return b.convert(_scatter_elements(ctx, base, 0, mi, g, "add"), out)
    if n == 0:
        return b.convert(base, out)
    idx = b.convert(b.reshape(indices, (n,)), torch.int64)
    bag = b.convert(offset2bag, torch.int64)
    in_bag = b.compare(bag, b.constant(nb, torch.int64, (n,)), "LT")
    safe_bag = b.select(in_bag, bag, b.constant(0, torch.int64, (n,)))
    rows = take_rows(b, g, safe_bag, 0)
    if mode == 1:
        size = b.convert(b.maximum(take_rows(b, b.convert(bag_size, torch.int64), safe_bag, 0),
                                   b.constant(1, torch.int64, (n,))), acc)
        rows = b.div(rows, b.broadcast_in_dim(size, (n, dim), [0]))
    if per_sample_weights is not None:
        rows = b.mul(rows, b.broadcast_in_dim(b.convert(per_sample_weights, acc), (n, dim), [0]))
    keep = in_bag
    if padding_idx >= 0:
        keep = b.binary("and", keep, b.compare(idx, b.constant(padding_idx, torch.int64, (n,)), "NE"))
    if scale_grad_by_freq:
        freq = _scatter_elements(ctx, b.constant(0, acc, (num_weights,)), 0, idx, b.constant(1, acc, (n,)), "add")
        rows = b.div(rows, b.broadcast_in_dim(take_rows(b, freq, idx, 0), (n, dim), [0]))
    target = b.select(keep, idx, b.constant(num_weights, torch.int64, (n,)))
    return b.convert(_scatter_elements(ctx, base, 0, b.broadcast_in_dim(target, (n, dim), [0]), rows, "add"), out)


@register(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_psw_backward(ctx: LoweringContext, grad: Value, weight: Value, indices: Value, offsets: Value,
                                offset2bag: Value, mode: int, padding_idx: int = -1) -> Value:
    b = ctx.b
    n = indices.numel
    acc = torch.float32 if grad.dtype in (torch.bfloat16, torch.float16) else grad.dtype
    if n == 0:
        return b.constant(0, ctx.out_dtype(), ctx.out_shape())
    idx = b.convert(b.reshape(indices, (n,)), torch.int64)
    nb = grad.shape[0]
    bag = b.convert(offset2bag, torch.int64)
    in_bag = b.compare(bag, b.constant(nb, torch.int64, (n,)), "LT")
    g = take_rows(b, b.convert(grad, acc), b.select(in_bag, bag, b.constant(0, torch.int64, (n,))), 0)
    w = b.convert(take_rows(b, weight, idx, 0), acc)
    r = b.reduce(b.mul(g, w), [1], b.constant(0, acc), "stablehlo.add")
    keep = in_bag
    if padding_idx >= 0:
        keep = b.binary("and", keep, b.compare(idx, b.constant(padding_idx, torch.int64, (n,)), "NE"))
    return b.convert(b.select(keep, r, b.constant(0, acc, (n,))), ctx.out_dtype())


@register(aten._embedding_bag_backward.default)
def _embedding_bag_backward_full(ctx: LoweringContext, grad: Value, indices: Value, offsets: Value,
                                 offset2bag: Value, bag_size: Value, max_indices: Value, num_weights: int,
                                 scale_grad_by_freq: bool, mode: int, sparse: bool,
                                 per_sample_weights: Value | None, padding_idx: int = -1) -> Value:
    if sparse:
        raise NotImplementedError("torchtpu: sparse embedding_bag gradients are not supported")
    return _embedding_bag_backward(ctx, grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                   scale_grad_by_freq, mode, per_sample_weights, padding_idx)


# -- segment_reduce: segment ids from lengths/offsets, then scatter reductions ------------
def _segment_ids(b: Builder, data: Value, lengths: Value | None, offsets: Value | None, axis: int
                 ) -> tuple[Value, int]:
    """Segment of every data position along ``axis`` (S where a position is in no segment), shape data[:axis+1]."""
    lead = list(data.shape[:axis])
    n = data.shape[axis]
    if offsets is not None:
        off = b.convert(offsets, torch.int64)
        s = off.shape[-1] - 1
        starts = b.slice(off, [0] * off.rank, [*off.shape[:-1], s])
        ends = b.slice(off, [0] * (off.rank - 1) + [1], list(off.shape))
    else:
        ln = b.convert(lengths, torch.int64)
        s = ln.shape[-1]
        from .reductions import _scan

        ends = _scan(b, ln, ln.rank - 1, "stablehlo.add", 0) if s else ln
        starts = b.sub(ends, ln)
    full = (*lead, n, s)
    pos = b.iota(full, len(lead), torch.int64)
    bd = [*range(len(lead)), len(lead) + 1]
    inside = b.binary("and", b.compare(b.broadcast_in_dim(starts, full, bd), pos, "LE"),
                      b.compare(pos, b.broadcast_in_dim(ends, full, bd), "LT"))
    segs = b.iota(full, len(lead) + 1, torch.int64)
    seg = b.reduce(b.select(inside, segs, b.constant(s, torch.int64, full)), [len(lead) + 1],
                   b.constant(s, torch.int64), "stablehlo.minimum")
    return seg, s


def _identity(reduce: str, dtype: torch.dtype) -> float:
    return {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}[reduce]


@register(aten.segment_reduce.default)
def _segment_reduce(ctx: LoweringContext, data: Value, reduce: str, lengths: Value | None = None,
                    indices: Value | None = None, offsets: Value | None = None, axis: int = 0,
                    unsafe: bool = False, initial: Any = None) -> Value:
    b = ctx.b
    out_shape = ctx.out_shape()
    acc = torch.float32 if data.dtype in (torch.bfloat16, torch.float16) else data.dtype
    ax = axis % data.rank
    v = b.convert(data, acc)
    seg, _ = _segment_ids(b, data, lengths, offsets, ax)
    idx = b.broadcast_in_dim(seg, data.shape, list(range(ax + 1)))
    shape = tuple(out_shape)
    if initial is not None:
        base = ctx.scalar(initial, acc, shape)
    else:
        base = b.constant(_identity(reduce, acc), acc, shape)
    comb = {"sum": "add", "mean": "add", "prod": "multiply", "max": "amax", "min": "amin"}[reduce]
    r = _scatter_elements(ctx, base, ax, idx, v, comb)
    if reduce == "mean":
        # CPU: (initial + sum) / count, the count not including initial; an empty segment keeps initial
        cnt = _scatter_elements(ctx, b.constant(0.0, acc, shape), ax, idx, b.constant(1.0, acc, data.shape), "add")
        mean = b.div(r, cnt)
        if initial is not None:
            mean = b.select(b.compare(cnt, b.constant(0.0, acc, shape), "EQ"), base, mean)
        r = mean
    return b.convert(r, ctx.out_dtype())


@register(aten._segment_reduce_backward.default)
def _segment_reduce_backward(ctx: LoweringContext, grad: Value, output: Value, data: Value, reduce: str,
                             lengths: Value | None = None, offsets: Value | None = None, axis: int = 0,
                             initial: Any = None) -> Value:
    b = ctx.b
    acc = torch.float32 if data.dtype in (torch.bfloat16, torch.float16) else data.dtype
    ax = axis % data.rank
    v = b.convert(data, acc)
    seg, s = _segment_ids(b, data, lengths, offsets, ax)
    valid = b.broadcast_in_dim(b.compare(seg, b.constant(s, torch.int64, seg.shape), "LT"), data.shape,
                               list(range(ax + 1)))
    idx = b.broadcast_in_dim(b.minimum(seg, b.constant(max(s - 1, 0), torch.int64, seg.shape)), data.shape,
                             list(range(ax + 1)))
    g, o = b.convert(grad, acc), b.convert(output, acc)
    gi = _gather(ctx, g, ax, idx) if s else b.constant(0, acc, data.shape)
    oi = _gather(ctx, o, ax, idx) if s else b.constant(0, acc, data.shape)
    zero = b.constant(0, acc, data.shape)
    seg_shape = tuple(grad.shape)
    if reduce == "sum":
        r = gi
    elif reduce == "mean":
        cnt = _scatter_elements(ctx, b.constant(0.0, acc, seg_shape), ax, idx,
                                b.select(valid, b.constant(1.0, acc, data.shape), zero), "add")
        r = b.div(gi, _gather(ctx, cnt, ax, idx))
    elif reduce in ("max", "min"):
        hit = b.binary("and", b.compare(v, oi, "EQ"), valid)
        ties = _scatter_elements(ctx, b.constant(0.0, acc, seg_shape), ax, idx,
                                 b.select(hit, b.constant(1.0, acc, data.shape), zero), "add")
        r = b.select(hit, b.div(gi, _gather(ctx, ties, ax, idx)), zero)
    else:
        is_zero = b.compare(v, zero, "EQ")
        zeros = _scatter_elements(ctx, b.constant(0.0, acc, seg_shape), ax, idx,
                                  b.select(b.binary("and", is_zero, valid), b.constant(1.0, acc, data.shape), zero),
                                  "add")
        start = ctx.scalar(initial, acc, seg_shape) if initial is not None else b.constant(1.0, acc, seg_shape)
        nz_prod = _scatter_elements(ctx, start, ax, idx,
                                    b.select(b.binary("and", b.unary("not", is_zero), valid), v,
                                             b.constant(1.0, acc, data.shape)), "multiply")
        zc, npd = _gather(ctx, zeros, ax, idx), _gather(ctx, nz_prod, ax, idx)
        one = b.constant(1.0, acc, data.shape)
        safe = b.select(is_zero, one, v)
        r = b.select(is_zero, b.select(b.compare(zc, one, "EQ"), b.mul(gi, npd), zero),
                     b.select(b.compare(zc, zero, "EQ"), b.div(b.mul(gi, oi), safe), zero))
    return b.convert(b.select(valid, r, zero), ctx.out_dtype())
