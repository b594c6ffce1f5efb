"""grid_sampler_2d and _3d (bilinear/trilinear and nearest; zeros, border and reflection padding)
and their backward.

Source coordinates follow ATen's ``grid_sampler_compute_source_index`` (unnormalize,
then clip or reflect). The input is read as rows, one per (batch item, spatial point) holding
that point's channels: a tap gathers whole rows, and the backward scatters the weighted output
gradient back onto them, row by row. (Gathering one element at a time, with an int64
(n, c, point) coordinate per element, did not finish within 240 s on a TPU v5e for OpInfo's
(20, 21, 22, 23, 24) grid_sampler_3d sample; row indices are int32 where they fit.)
"""

from __future__ import annotations

import itertools
import math

import torch

from .builder import Builder, Value
from .indexing import scatter_add_rows, take_rows
from .registry import LoweringContext, register

aten = torch.ops.aten
_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _c(b: Builder, v: float, like: Value) -> Value:
    return b.constant(v, like.dtype, like.shape)


def _reflect(b: Builder, x: Value, twice_low: int, twice_high: int) -> tuple[Value, Value]:
    """(reflected coordinate, d reflected / d x)."""
    if twice_low == twice_high:
        return _c(b, 0.0, x), _c(b, 0.0, x)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    d = b.sub(x, _c(b, lo, x))
    sign_in = b.select(b.compare(d, _c(b, 0.0, x), "LT"), _c(b, -1.0, x), _c(b, 1.0, x))
    a = b.unary("abs", d)
    extra = b.binary("remainder", a, _c(b, span, x))
    flips = b.unary("floor", b.div(a, _c(b, span, x)))
    even = b.compare(b.binary("remainder", flips, _c(b, 2.0, x)), _c(b, 0.0, x), "EQ")
    r = b.select(even, b.add(extra, _c(b, lo, x)), b.add(b.sub(_c(b, span, x), extra), _c(b, lo, x)))
    g = b.select(even, sign_in, b.neg(sign_in))
    return r, g


def _clip(b: Builder, x: Value, size: int) -> tuple[Value, Value]:
    lo, hi = _c(b, 0.0, x), _c(b, float(size - 1), x)
    inside = b.binary("and", b.compare(x, lo, "GT"), b.compare(x, hi, "LT"))
    return b.minimum(b.maximum(x, lo), hi), b.select(inside, _c(b, 1.0, x), _c(b, 0.0, x))


def _source(b: Builder, coord: Value, size: int, padding: int, align: bool) -> tuple[Value, Value]:
    """(source index, d index / d grid coordinate)."""
    if align:
        x = b.mul(b.add(coord, _c(b, 1.0, coord)), _c(b, (size - 1) / 2, coord))
        g = _c(b, (size - 1) / 2, coord)
    else:
        x = b.div(b.sub(b.mul(b.add(coord, _c(b, 1.0, coord)), _c(b, float(size), coord)), _c(b, 1.0, coord)),
                  _c(b, 2.0, coord))
        g = _c(b, size / 2, coord)
    if padding == _BORDER:
        x, gc = _clip(b, x, size)
        g = b.mul(g, gc)
    elif padding == _REFLECTION:
        x, gr = _reflect(b, x, 0, 2 * (size - 1)) if align else _reflect(b, x, -1, 2 * size - 1)
        x, gc = _clip(b, x, size)
        g = b.mul(g, b.mul(gr, gc))
    return x, g


def _prep(ctx: LoweringContext, x: Value, grid: Value, padding: int, align: bool) -> tuple:
    """(accumulation dtype, per grid coordinate k: source index along spatial dim -1 - k, and
    d index / d coordinate). Coordinate 0 is x (width), 1 is y (height), 2 is z (depth)."""
    b = ctx.b
    acc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    spatial = x.shape[2:]
    out_shape = tuple(grid.shape[:-1])
    gd = b.convert(grid, acc)
    index, d_index = [], []
    for k in range(len(spatial)):
        start = [0] * grid.rank
        start[-1] = k
        coord = b.reshape(b.slice(gd, start, [*out_shape, k + 1]), out_shape)
        i, g = _source(b, coord, spatial[-1 - k], padding, align)
        index.append(i)
        d_index.append(g)
    return acc, index, d_index


def _taps(b: Builder, index: list[Value], mode: int) -> list[tuple[list[Value], Value, list[bool]]]:
    """Per tap: (index per coordinate, weight, which coordinates take the upper neighbour), as
    float tensors of the grid's shape. Corners run x fastest, as ATen sums them."""
    if mode == _NEAREST:
        return [([b.unary("round_nearest_even", i) for i in index], _c(b, 1.0, index[0]), [False] * len(index))]
    lows = [b.unary("floor", i) for i in index]
    taps = []
    for corner in itertools.product((False, True), repeat=len(index)):
        upper = list(reversed(corner))  # coordinate 0 (x) varies fastest
        at, weight = [], None
        for i, lo, up in zip(index, lows, upper):
            hi = b.add(lo, _c(b, 1.0, i))
            at.append(hi if up else lo)
            w = b.sub(i, lo) if up else b.sub(hi, i)
            weight = w if weight is None else b.mul(weight, w)
        taps.append((at, weight, upper))
    return taps


def _row_type(n: int, points: int) -> torch.dtype:
    return torch.int32 if n * points < 2**31 else torch.int64


def _flat_index(b: Builder, at: list[Value], spatial: tuple[int, ...]) -> tuple[Value, Value]:
    """(row of the input's rows (``_rows``) each tap reads, clamped into its batch item's rows;
    in-bounds mask), both of the grid's shape (N, *out)."""
    n, points = at[0].shape[0], math.prod(spatial)
    itype = _row_type(n, points)
    flat = b.mul(b.iota(at[0].shape, 0, itype), b.constant(points, itype, at[0].shape))  # the batch item's rows
    inb = None
    stride = 1
    for k, t in enumerate(at):
        size = spatial[-1 - k]
        ok = b.binary("and", b.compare(t, _c(b, 0.0, t), "GE"), b.compare(t, _c(b, size - 1.0, t), "LE"))
        inb = ok if inb is None else b.binary("and", inb, ok)
        i = b.convert(b.minimum(b.maximum(t, _c(b, 0.0, t)), _c(b, size - 1.0, t)), itype)
        flat = b.add(flat, b.mul(i, b.constant(stride, itype, i.shape)) if stride != 1 else i)
        stride *= size
    return flat, inb


def _rows(b: Builder, v: Value, acc: torch.dtype) -> Value:
    """v (N, C, *spatial) as rows (N * points, C), in ``acc``: row n * points + p holds v[n, :, p]."""
    n, c, *spatial = v.shape
    points = math.prod(spatial)
    return b.reshape(b.transpose(b.reshape(b.convert(v, acc), (n, c, points)), [0, 2, 1]), (n * points, c))


def _channels_first(b: Builder, v: Value) -> Value:
    """(N, *out, C) -> (N, C, *out)."""
    return b.transpose(v, [0, v.rank - 1, *range(1, v.rank - 1)])


def _over_channels(b: Builder, v: Value, shape: tuple[int, ...]) -> Value:
    """A (N, *out) value broadcast over the channels of (N, *out, C)."""
    return b.broadcast_in_dim(v, shape, list(range(len(shape) - 1)))


def _grid_sampler(ctx: LoweringContext, x: Value, grid: Value, mode: int, padding: int, align: bool) -> Value:
    if mode not in (_BILINEAR, _NEAREST):
        raise NotImplementedError("torchtpu: grid_sampler with bicubic interpolation is not implemented")
    b = ctx.b
    acc, index, _ = _prep(ctx, x, grid, padding, align)
    spatial = tuple(x.shape[2:])
    rows = _rows(b, x, acc)
    out = None
    for at, wt, _ in _taps(b, index, mode):
        flat, inb = _flat_index(b, at, spatial)
        vals = take_rows(b, rows, flat, 0, in_range=True)  # (N, *out, C)
        wt = b.select(inb, wt, _c(b, 0.0, wt))
        term = b.mul(vals, _over_channels(b, wt, vals.shape))
        out = term if out is None else b.add(out, term)
    return b.convert(_channels_first(b, out), ctx.out_dtype())


def _grid_sampler_backward(ctx: LoweringContext, grad: Value, x: Value, grid: Value, mode: int, padding: int,
                           align: bool, output_mask: list[bool]) -> tuple[Value | None, Value | None]:
    if mode not in (_BILINEAR, _NEAREST):
        raise NotImplementedError("torchtpu: grid_sampler backward with bicubic interpolation is not implemented")
    b = ctx.b
    acc, index, d_index = _prep(ctx, x, grid, padding, align)
    n, c, *spatial = x.shape
    out_shape = tuple(grid.shape[:-1])
    g = b.transpose(b.convert(grad, acc), [0, *range(2, grad.rank), 1])  # (N, *out, C), as the rows
    taps = _taps(b, index, mode)
    rows_read = [_flat_index(b, at, tuple(spatial)) for at, _, _ in taps]  # (row, in bounds) per tap
    gin = None
    if output_mask[0]:
        base = b.constant(0.0, acc, (n * math.prod(spatial), c))
        for (_, wt, _), (flat, inb) in zip(taps, rows_read):
            # an out-of-bounds tap adds an exact zero to its clamped row (0 * inf would be NaN)
            upd = b.mul(g, _over_channels(b, wt, g.shape))
            upd = b.select(_over_channels(b, inb, g.shape), upd, _c(b, 0.0, upd))
            base = scatter_add_rows(b, base, b.reshape(flat, (flat.numel,)), b.reshape(upd, (flat.numel, c)), 0,
                                    in_range=True)
        gin = b.reshape(b.transpose(b.reshape(base, (n, math.prod(spatial), c)), [0, 2, 1]), x.shape)
        gin = b.convert(gin, ctx.out_dtype(0))
    ggrid = None
    if output_mask[1]:
        if mode == _NEAREST:
            ggrid = b.constant(0, ctx.out_dtype(1), ctx.out_shape(1))
        else:
            rows = _rows(b, x, acc)
            lows = [b.unary("floor", i) for i in index]
            sums: list[Value | None] = [None] * len(index)
            for (_, _, upper), (flat, inb) in zip(taps, rows_read):
                vals = b.mul(take_rows(b, rows, flat, 0, in_range=True), g)
                s = b.reduce(vals, [vals.rank - 1], b.constant(0.0, acc), "stablehlo.add")  # (N, *out)
                s = b.select(inb, s, _c(b, 0.0, s))
                for k in range(len(index)):
                    # d weight / d index k: the other coordinates' factors, signed by the side
                    d = _c(b, 1.0 if upper[k] else -1.0, s)
                    for j, (i, lo, up) in enumerate(zip(index, lows, upper)):
                        if j != k:
                            d = b.mul(d, b.sub(i, lo) if up else b.sub(b.add(lo, _c(b, 1.0, i)), i))
                    term = b.mul(s, d)
                    sums[k] = term if sums[k] is None else b.add(sums[k], term)
            parts = [b.reshape(b.mul(sk, gk), (*out_shape, 1)) for sk, gk in zip(sums, d_index)]
            ggrid = b.convert(b.concatenate(parts, len(out_shape)), ctx.out_dtype(1))
    return gin, ggrid


register(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)(_grid_sampler)
register(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)(_grid_sampler_backward)
