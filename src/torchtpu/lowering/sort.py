"""Sorting and order statistics: sort, topk, kthvalue, median, nanmedian.

All of them are one stable ``stablehlo.sort`` of (values, indices) along the
dimension. NaN sorts as the largest value, as in PyTorch, so ascending sorts
put NaNs last and descending sorts put them first.
"""

from __future__ import annotations

from typing import Any

import torch

from .builder import Builder, Value
from .registry import LoweringContext, register

aten = torch.ops.aten


def _comparator(descending: bool, floating: bool):
    def body(bb: Builder, a: Value, c: Value, ia: Value, ic: Value) -> Value:
        if descending:
            r = bb.compare(a, c, "GT")
            if floating:
                r = bb.binary("or", r, bb.binary("and", bb.compare(a, a, "NE"), bb.compare(c, c, "EQ")))
        else:
            r = bb.compare(a, c, "LT")
            if floating:
                r = bb.binary("or", r, bb.binary("and", bb.compare(a, a, "EQ"), bb.compare(c, c, "NE")))
        return r

    return body


def sort_with_indices(b: Builder, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    """Stable sort along ``dim``: (sorted values, int64 source indices)."""
    idx = b.iota(x.shape, dim, torch.int64)
    region = b.region([((), x.dtype), ((), x.dtype), ((), torch.int64), ((), torch.int64)],
                      _comparator(descending, x.dtype.is_floating_point))
    vals, inds = b.op("stablehlo.sort", [x, idx], [(x.shape, x.dtype), (x.shape, torch.int64)],
                      attrs=f"dimension = {dim} : i64, is_stable = true", region=region)
    return vals, inds


def _norm_dim(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


@register(aten.sort.default)
def _sort(ctx: LoweringContext, x: Value, dim: int = -1, descending: bool = False) -> tuple[Value, Value]:
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    return sort_with_indices(b, x, _norm_dim(dim, x.rank), descending)


@register(aten.sort.stable)
def _sort_stable(ctx: LoweringContext, x: Value, stable: bool | None = None, dim: int = -1,
                 descending: bool = False) -> tuple[Value, Value]:
    # The sort is always stable; an unstable sort may return any tie order, so this is one of them.
    return _sort(ctx, x, dim, descending)


@register(aten.topk.default)
def _topk(ctx: LoweringContext, x: Value, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
          ) -> tuple[Value, Value]:
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = _norm_dim(dim, x.rank)
    vals, inds = sort_with_indices(b, x, d, descending=largest)
    limit = list(x.shape)
    limit[d] = k
    return b.slice(vals, [0] * x.rank, limit), b.slice(inds, [0] * x.rank, limit)


def _pick(b: Builder, v: Value, dim: int, pos: Value) -> Value:
    """v[..., pos, ...] along ``dim`` where ``pos`` has v's shape without ``dim``."""
    mask = b.compare(b.iota(v.shape, dim, torch.int64),
                     b.broadcast_in_dim(pos, v.shape, [i for i in range(v.rank) if i != dim]), "EQ")
    if v.dtype == torch.bool:
        return b.reduce(b.binary("and", mask, v), [dim], b.constant(False, torch.bool), "stablehlo.or")
    zero = b.constant(0, v.dtype, v.shape)
    if v.dtype.is_floating_point:
        # max of (selected, -inf elsewhere) keeps -0.0 and NaN exactly
        from .reductions import reduce_max_nan

        return reduce_max_nan(b, b.select(mask, v, b.constant(float("-inf"), v.dtype, v.shape)), [dim])
    return b.reduce(b.select(mask, v, zero), [dim], b.constant(0, v.dtype), "stablehlo.add")


def _keep(b: Builder, v: Value, shape: tuple[int, ...], dim: int, keepdim: bool) -> Value:
    if keepdim:
        return b.reshape(v, [1 if i == dim else s for i, s in enumerate(shape)])
    return v


@register(aten.kthvalue.default)
def _kthvalue(ctx: LoweringContext, x: Value, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = _norm_dim(dim, x.rank)
    vals, inds = sort_with_indices(b, x, d, descending=False)
    start = [0] * x.rank
    start[d] = k - 1
    limit = list(x.shape)
    limit[d] = k
    v = b.reshape(b.slice(vals, start, limit), [s for i, s in enumerate(x.shape) if i != d])
    i = b.reshape(b.slice(inds, start, limit), [s for i, s in enumerate(x.shape) if i != d])
    return _keep(b, v, x.shape, d, keepdim), _keep(b, i, x.shape, d, keepdim)


def _median_along(ctx: LoweringContext, x: Value, d: int, ignore_nan: bool) -> tuple[Value, Value]:
    b = ctx.b
    n = x.shape[d]
    vals, inds = sort_with_indices(b, x, d, descending=False)
    red_shape = [s for i, s in enumerate(x.shape) if i != d]
    if x.dtype.is_floating_point:
        notnan = b.convert(b.compare(x, x, "EQ"), torch.int64)
        count = b.reduce(notnan, [d], b.constant(0, torch.int64), "stablehlo.add")
        one = b.constant(1, torch.int64, red_shape)
        two = b.constant(2, torch.int64, red_shape)
        if ignore_nan:
            # lower median of the non-NaN values; all-NaN rows give the first NaN
            pos = b.maximum(b.div(b.sub(count, one), two), b.constant(0, torch.int64, red_shape))
        else:
            # any NaN: the result is NaN (the first one, which a stable sort puts right after the numbers)
            has_nan = b.compare(count, b.constant(n, torch.int64, red_shape), "LT")
            pos = b.select(has_nan, count, b.constant((n - 1) // 2, torch.int64, red_shape))
    else:
        pos = b.constant((n - 1) // 2, torch.int64, red_shape)
    return _pick(b, vals, d, pos), _pick(b, inds, d, pos)


# CPU's median of an empty tensor is NaN converted to the dtype, which x86 makes the lowest value
# of int32/int64, 0 of the narrower integers and True for bool (floats: NaN)
_EMPTY_MEDIAN = {torch.bool: True, torch.int32: -(2**31), torch.int64: -(2**63), torch.uint8: 0, torch.int8: 0,
                 torch.int16: 0}


@register(aten.median.default, aten.nanmedian.default)
def _median_all(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    if x.numel == 0:
        return b.constant(_EMPTY_MEDIAN.get(x.dtype, float("nan")), x.dtype)
    flat = b.reshape(x, (x.numel,))
    v, _ = _median_along(ctx, flat, 0, ctx.op is aten.nanmedian.default)
    return v


@register(aten.median.dim, aten.nanmedian.dim)
def _median_dim(ctx: LoweringContext, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = _norm_dim(dim, x.rank)
    v, i = _median_along(ctx, x, d, ctx.op is aten.nanmedian.dim)
    return _keep(b, v, x.shape, d, keepdim), _keep(b, i, x.shape, d, keepdim)


@register(aten.msort.default)
def _msort(ctx: LoweringContext, x: Value) -> Value:
    return _sort(ctx, x, 0, False)[0]


def _searchsorted(ctx: LoweringContext, seq: Value, v: Value, right: bool, sorter: Value | None) -> Value:
    """Insertion points by counting: left = #(not seq >= v), right = #(not seq > v).

    Counting with negated comparisons reproduces a binary search's answer for NaN
    values (the end), and costs O(N*M) compares, which XLA vectorizes.
    """
    b = ctx.b
    if seq.numel == 0:
        return b.constant(0, ctx.out_dtype(), ctx.out_shape())
    if sorter is not None:
        from .indexing import _gather

        seq = _gather(ctx, seq, seq.rank - 1, sorter)
    m = seq.shape[-1]
    common = torch.promote_types(seq.dtype, v.dtype)
    seq, v = b.convert(seq, common), b.convert(v, common)
    if seq.rank == 1:
        full = (*v.shape, m)
        sb = b.broadcast_in_dim(seq, full, [v.rank])
        vb = b.broadcast_in_dim(v, full, list(range(v.rank)))
    else:
        lead = seq.rank - 1
        full = (*v.shape, m)
        sb = b.broadcast_in_dim(seq, full, [*range(lead), lead + 1])
        vb = b.broadcast_in_dim(v, full, list(range(v.rank)))
    hit = b.compare(sb, vb, "GT" if right else "GE")
    cnt = b.convert(b.unary("not", hit), torch.int64)
    r = b.reduce(cnt, [len(full) - 1], b.constant(0, torch.int64), "stablehlo.add")
    return b.convert(r, ctx.out_dtype())


@register(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted_lower(ctx: LoweringContext, seq: Value, x: Any, out_int32: bool = False, right: bool = False,
                        side: str | None = None, sorter: Value | None = None) -> Value:
    if side is not None:
        right = side == "right"
    v = x if isinstance(x, Value) else ctx.scalar(x, seq.dtype)
    return _searchsorted(ctx, seq, v, right, sorter)


@register(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(ctx: LoweringContext, x: Any, boundaries: Value, out_int32: bool = False, right: bool = False
               ) -> Value:
    if boundaries.rank != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.rank})")
    v = x if isinstance(x, Value) else ctx.scalar(x, boundaries.dtype)
    return _searchsorted(ctx, boundaries, v, right, None)


@register(aten.mode.default)
def _mode(ctx: LoweringContext, x: Value, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    """Most frequent value along ``dim`` (the smallest among equally frequent ones), as CPU picks it.

    Sort, then measure each run of equal values at its last element; the first
    longest run wins. The index is a position of that value in the input.
    """
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = _norm_dim(dim, x.rank)
    n = x.shape[d]
    if n == 0 or x.numel == 0:
        return (b.constant(0, x.dtype, ctx.out_shape(0)), b.constant(0, torch.int64, ctx.out_shape(1)))
    vals, inds = sort_with_indices(b, x, d, descending=False)
    pos = b.iota(x.shape, d, torch.int64)
    # run starts: position 0 or value differs from the previous one
    lo = [0] * x.rank
    hi = list(x.shape)
    hi[d] = n - 1
    prev = b.slice(vals, lo, hi)
    lo2 = [0] * x.rank
    lo2[d] = 1
    cur = b.slice(vals, lo2, list(x.shape))
    differs = b.compare(cur, prev, "NE")
    first_col = [1 if i == d else s for i, s in enumerate(x.shape)]
    starts = b.concatenate([b.constant(True, torch.bool, first_col), differs], d)
    ends = b.concatenate([differs, b.constant(True, torch.bool, first_col)], d)
    start_pos = b.select(starts, pos, b.constant(0, torch.int64, x.shape))
    window = [1] * x.rank
    window[d] = n
    pads = [(0, 0)] * x.rank
    pads[d] = (n - 1, 0)
    run_start = b.reduce_window(start_pos, b.constant(0, torch.int64), "stablehlo.maximum", window,
                                [1] * x.rank, pads)
    length = b.add(b.sub(pos, run_start), b.constant(1, torch.int64, x.shape))
    score = b.select(ends, length, b.constant(-1, torch.int64, x.shape))
    from .reductions import arg_reduce

    _, best = arg_reduce(b, score, d, True)  # first maximum: the smallest value among ties
    v, i = _pick(b, vals, d, best), _pick(b, inds, d, best)
    return _keep(b, v, x.shape, d, keepdim), _keep(b, i, x.shape, d, keepdim)
