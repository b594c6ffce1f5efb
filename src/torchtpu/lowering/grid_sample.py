"""grid_sampler_2d (bilinear and nearest; zeros, border and reflection padding) and its backward.

Source coordinates follow ATen's ``grid_sampler_compute_source_index`` (unnormalize,
then clip or reflect); taps are gathered per batch item, and the backward scatters
the weighted output gradient back onto the taps.
"""

from __future__ import annotations

import torch

from .builder import Builder, Value
from .indexing import _scatter_elements
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
    b = ctx.b
    acc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    n, _, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    gd = b.convert(grid, acc)
    gx = b.reshape(b.slice(gd, [0, 0, 0, 0], [n, ho, wo, 1]), (n, ho, wo))
    gy = b.reshape(b.slice(gd, [0, 0, 0, 1], [n, ho, wo, 2]), (n, ho, wo))
    ix, gix = _source(b, gx, w, padding, align)
    iy, giy = _source(b, gy, h, padding, align)
    return acc, ix, iy, gix, giy


def _taps(b: Builder, ix: Value, iy: Value, mode: int) -> list[tuple[Value, Value, Value]]:
    """(x index, y index, weight) per tap, as float tensors of grid shape."""
    if mode == _NEAREST:
        return [(b.unary("round_nearest_even", ix), b.unary("round_nearest_even", iy), _c(b, 1.0, ix))]
    x0, y0 = b.unary("floor", ix), b.unary("floor", iy)
    x1, y1 = b.add(x0, _c(b, 1.0, ix)), b.add(y0, _c(b, 1.0, iy))
    return [(x0, y0, b.mul(b.sub(x1, ix), b.sub(y1, iy))), (x1, y0, b.mul(b.sub(ix, x0), b.sub(y1, iy))),
            (x0, y1, b.mul(b.sub(x1, ix), b.sub(iy, y0))), (x1, y1, b.mul(b.sub(ix, x0), b.sub(iy, y0)))]


def _flat_index(b: Builder, tx: Value, ty: Value, h: int, w: int) -> tuple[Value, Value]:
    """(row-major plane index, clamped for gathering; in-bounds mask)."""
    inb = b.binary("and", b.binary("and", b.compare(tx, _c(b, 0.0, tx), "GE"), b.compare(tx, _c(b, w - 1.0, tx), "LE")),
                   b.binary("and", b.compare(ty, _c(b, 0.0, ty), "GE"), b.compare(ty, _c(b, h - 1.0, ty), "LE")))
    xi = b.convert(b.minimum(b.maximum(tx, _c(b, 0.0, tx)), _c(b, w - 1.0, tx)), torch.int64)
    yi = b.convert(b.minimum(b.maximum(ty, _c(b, 0.0, ty)), _c(b, h - 1.0, ty)), torch.int64)
    flat = b.add(b.mul(yi, b.constant(w, torch.int64, yi.shape)), xi)
    return flat, inb


def _gather_plane(b: Builder, planes: Value, flat: Value) -> Value:
    """planes (N, C, H*W), flat (N, Ho, Wo) -> (N, C, Ho, Wo)."""
    n, c, _ = planes.shape
    ho, wo = flat.shape[1], flat.shape[2]
    shape = (n, c, ho, wo)
    idx_n = b.iota(shape, 0, torch.int64)
    idx_c = b.iota(shape, 1, torch.int64)
    idx_p = b.broadcast_in_dim(flat, shape, [0, 2, 3])
    coords = b.concatenate([b.reshape(v, (*shape, 1)) for v in (idx_n, idx_c, idx_p)], 4)
    attrs = ("dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1, 2], start_index_map = [0, 1, 2], "
             "index_vector_dim = 4>, slice_sizes = array<i64: 1, 1, 1>, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [planes, coords], shape, planes.dtype, attrs=attrs)


@register(aten.grid_sampler_2d.default)
def _grid_sampler_2d(ctx: LoweringContext, x: Value, grid: Value, mode: int, padding: int, align: bool) -> Value:
    if mode not in (_BILINEAR, _NEAREST):
        raise NotImplementedError("torchtpu: grid_sampler_2d with bicubic interpolation is not implemented")
    b = ctx.b
    acc, ix, iy, _, _ = _prep(ctx, x, grid, padding, align)
    n, c, h, w = x.shape
    planes = b.reshape(b.convert(x, acc), (n, c, h * w))
    out = None
    for tx, ty, wt in _taps(b, ix, iy, mode):
        flat, inb = _flat_index(b, tx, ty, h, w)
        vals = _gather_plane(b, planes, flat)
        wt = b.select(inb, wt, _c(b, 0.0, wt))
        term = b.mul(vals, b.broadcast_in_dim(wt, vals.shape, [0, 2, 3]))
        out = term if out is None else b.add(out, term)
    return b.convert(out, ctx.out_dtype())


@register(aten.grid_sampler_2d_backward.default)
def _grid_sampler_2d_backward(ctx: LoweringContext, grad: Value, x: Value, grid: Value, mode: int, padding: int,
                              align: bool, output_mask: list[bool]) -> tuple[Value | None, Value | None]:
    if mode not in (_BILINEAR, _NEAREST):
        raise NotImplementedError("torchtpu: grid_sampler_2d_backward with bicubic interpolation is not implemented")
    b = ctx.b
    acc, ix, iy, gix, giy = _prep(ctx, x, grid, padding, align)
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    g = b.convert(grad, acc)
    planes = b.reshape(b.convert(x, acc), (n, c, h * w))
    taps = _taps(b, ix, iy, mode)
    gin = None
    if output_mask[0]:
        base = b.constant(0.0, acc, (n, c, h * w))
        gflat = b.reshape(g, (n, c, ho * wo))
        for tx, ty, wt in taps:
            flat, inb = _flat_index(b, tx, ty, h, w)
            tgt = b.select(inb, flat, b.constant(h * w, torch.int64, flat.shape))  # out of bounds: dropped
            tgt = b.broadcast_in_dim(b.reshape(tgt, (n, ho * wo)), (n, c, ho * wo), [0, 2])
            upd = b.mul(gflat, b.broadcast_in_dim(b.reshape(wt, (n, ho * wo)), (n, c, ho * wo), [0, 2]))
            base = _scatter_elements(ctx, base, 2, tgt, upd, "add")
        gin = b.convert(b.reshape(base, x.shape), ctx.out_dtype(0))
    ggrid = None
    if output_mask[1]:
        if mode == _NEAREST:
            ggrid = b.constant(0, ctx.out_dtype(1), ctx.out_shape(1))
        else:
            x0, y0 = b.unary("floor", ix), b.unary("floor", iy)
            x1, y1 = b.add(x0, _c(b, 1.0, ix)), b.add(y0, _c(b, 1.0, iy))
            # d weight / d ix and d iy for nw, ne, sw, se
            dws = [(b.neg(b.sub(y1, iy)), b.neg(b.sub(x1, ix))), (b.sub(y1, iy), b.neg(b.sub(ix, x0))),
                   (b.neg(b.sub(iy, y0)), b.sub(x1, ix)), (b.sub(iy, y0), b.sub(ix, x0))]
            gx_sum = gy_sum = None
            for (tx, ty, _), (dx, dy) in zip(taps, dws):
                flat, inb = _flat_index(b, tx, ty, h, w)
                vals = b.mul(_gather_plane(b, planes, flat), g)
                s = b.reduce(vals, [1], b.constant(0.0, acc), "stablehlo.add")  # (n, ho, wo)
                s = b.select(inb, s, _c(b, 0.0, s))
                tx_, ty_ = b.mul(s, dx), b.mul(s, dy)
                gx_sum = tx_ if gx_sum is None else b.add(gx_sum, tx_)
                gy_sum = ty_ if gy_sum is None else b.add(gy_sum, ty_)
            gx_sum, gy_sum = b.mul(gx_sum, gix), b.mul(gy_sum, giy)
            ggrid = b.concatenate([b.reshape(gx_sum, (n, ho, wo, 1)), b.reshape(gy_sum, (n, ho, wo, 1))], 3)
            ggrid = b.convert(ggrid, ctx.out_dtype(1))
    return gin, ggrid
