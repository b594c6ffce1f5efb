"""Shape ops that compute (views are metadata-only and live in the C++ shim)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import target
from .builder import Builder, Value
from .registry import LoweringContext, register, register_host_kernel

aten = torch.ops.aten


@register_host_kernel(aten.narrow_copy.default)
def narrow_copy(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """A contiguous copy of ``x.narrow(dim, start, length)``.

    CPU's kernel checks a non-negative ``dim`` against the rank before wrapping it (a
    RuntimeError), where ``narrow`` raises IndexError; the same input gets CPU's error.
    """
    if x.dim() > 0 and dim >= x.dim():
        raise RuntimeError("Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false.  "
                           "(Could this error message be improved?  If so, please report an enhancement request "
                           "to PyTorch.)")
    return x.narrow(dim, start, length).clone(memory_format=torch.contiguous_format)


@register(aten.cat.default)
def _cat(ctx: LoweringContext, tensors: list[Value], dim: int = 0) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = ctx.out_shape()
    parts = [b.convert(t, out) for t in tensors if t.numel > 0 or t.shape == shape]
    parts = [p for p in parts if p.rank == len(shape)]
    if not parts:
        return b.constant(0, out, shape)
    d = dim % len(shape)
    return b.concatenate(parts, d)


@register(aten.constant_pad_nd.default)
def _pad(ctx: LoweringContext, x: Value, pad: list[int], value: Any = 0) -> Value:
    b = ctx.b
    low = [0] * x.rank
    high = [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        low[d], high[d] = pad[2 * i], pad[2 * i + 1]
    # negative padding crops
    start = [max(-lo, 0) for lo in low]
    limit = [s - max(-hi, 0) for s, hi in zip(x.shape, high)]
    v = b.slice(x, start, limit)
    if all(p <= 0 for p in low + high):
        # only crops: the value is not converted, as on CPU (F.pad(uint8, (0, 0), value=inf) is fine
        # there; a compiled graph's constant inf for uint8 raised OverflowError: regression)
        return v
    pv = ctx.scalar(value, x.dtype)
    return b.pad(v, pv, [max(lo, 0) for lo in low], [max(hi, 0) for hi in high])


@register(aten.flip.default)
def _flip(ctx: LoweringContext, x: Value, dims: list[int]) -> Value:
    if x.rank == 0:
        return x
    return ctx.b.reverse(x, sorted({d % x.rank for d in dims}))


@register(aten.roll.default)
def _roll(ctx: LoweringContext, x: Value, shifts: list[int], dims: list[int] = ()) -> Value:
    b = ctx.b
    if not dims:
        flat = b.reshape(x, (x.numel,))
        return b.reshape(_roll1(b, flat, shifts[0], 0), x.shape)
    v = x
    for s, d in zip(shifts, dims):
        v = _roll1(b, v, s, d % x.rank)
    return v


def _roll1(b, v: Value, shift: int, dim: int) -> Value:
    n = v.shape[dim]
    if n == 0:
        return v
    s = shift % n
    if s == 0:
        return v
    lim = list(v.shape)
    start = [0] * v.rank
    lim[dim] = n - s
    first = b.slice(v, start, lim)
    start2 = [0] * v.rank
    start2[dim] = n - s
    second = b.slice(v, start2, list(v.shape))
    return b.concatenate([second, first], dim)


@register(aten.repeat.default)
def _repeat(ctx: LoweringContext, x: Value, repeats: list[int]) -> Value:
    b = ctx.b
    n = len(repeats)
    shape = [1] * (n - x.rank) + list(x.shape)
    v = b.reshape(x, shape)
    # broadcast to [r0, s0, r1, s1, ...] then merge pairs
    big = []
    dims = []
    for i, (r, s) in enumerate(zip(repeats, shape)):
        big += [r, s]
        dims.append(2 * i + 1)
    v = b.broadcast_in_dim(v, big, dims)
    return b.reshape(v, [r * s for r, s in zip(repeats, shape)])


# Largest matrix whose triangle is emitted as a table (see _tri): 3 bytes of program text each.
_TRIANGLE_TABLE_MAX = 128 * 128


def _tri(ctx: LoweringContext, x: Value, diagonal: int, lower: bool) -> Value:
    b = ctx.b
    n_rows, n_cols = x.shape[-2], x.shape[-1]
    if target.xla_cpu() and n_rows * n_cols <= _TRIANGLE_TABLE_MAX:
        # XLA's CPU backend recomputes an iota-built mask inside every fusion that reads it,
        # and a softmax over a causal mask (the mask plus the row maximum, two broadcasts)
        # then runs unvectorized: 144 us against 68 us for the same fusion reading the mask
        # as a constant, over [8, 4, 64, 64]. A small triangle is therefore a table.
        offset = np.arange(n_cols)[None, :] - np.arange(n_rows)[:, None]
        table = (offset <= diagonal) if lower else (offset >= diagonal)
        flags = b.broadcast_in_dim(b.dense_constant(table.astype(np.uint8), torch.uint8), x.shape,
                                   [x.rank - 2, x.rank - 1])
        keep = b.compare(flags, b.constant(0, torch.uint8, x.shape), "NE")
    else:
        rows = b.iota(x.shape, x.rank - 2, torch.int64)
        cols = b.iota(x.shape, x.rank - 1, torch.int64)
        diff = b.sub(cols, rows)
        k = b.constant(diagonal, torch.int64, x.shape)
        keep = b.compare(diff, k, "LE" if lower else "GE")
    return b.select(keep, x, b.constant(0, x.dtype, x.shape))


@register(aten.tril.default)
def _tril(ctx: LoweringContext, x: Value, diagonal: int = 0) -> Value:
    return _tri(ctx, x, diagonal, True)


@register(aten.triu.default)
def _triu(ctx: LoweringContext, x: Value, diagonal: int = 0) -> Value:
    return _tri(ctx, x, diagonal, False)


@register(aten.arange.start_step)
def _arange(ctx: LoweringContext, start: Any, end: Any, step: Any = 1, *rest: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = ctx.out_shape()
    acc = torch.float64 if out == torch.float64 else (torch.float32 if out.is_floating_point else torch.int64)
    if out.is_floating_point and any(isinstance(v, Value) and v.dtype.is_floating_point for v in (start, step)):
        acc = torch.float64 if out == torch.float64 else torch.float32
    i = b.iota(shape, 0, acc)
    r = b.add(ctx.scalar(start, acc, shape), b.mul(i, ctx.scalar(step, acc, shape)))
    return b.convert(r, out)


@register(aten.scalar_tensor.default)
def _scalar_tensor(ctx: LoweringContext, value: Any, *rest: Any) -> Value:
    return ctx.scalar(value, ctx.out_dtype())


@register(aten.full.default)
def _full(ctx: LoweringContext, size: list[int], value: Any, *rest: Any) -> Value:
    return ctx.scalar(value, ctx.out_dtype(), ctx.out_shape())


@register(aten.stack.default)
def _stack(ctx: LoweringContext, tensors: list[Value], dim: int = 0) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    d = dim % len(shape)
    parts = []
    for t in tensors:
        s = list(t.shape)
        s.insert(d, 1)
        parts.append(b.reshape(b.convert(t, ctx.out_dtype()), s))
    return b.concatenate(parts, d)


@register(aten.arange.default)
def _arange_end(ctx: LoweringContext, end: Any, *kwargs: Any) -> Value:
    return _arange(ctx, 0, end, 1)


@register(aten.arange.start)
def _arange_start(ctx: LoweringContext, start: Any, end: Any, *kwargs: Any) -> Value:
    return _arange(ctx, start, end, 1)


@register(torch.ops.prims.iota.default)
def _prims_iota(ctx: LoweringContext, length: int, start: int, step: int, dtype: torch.dtype, device: Any,
                requires_grad: bool) -> Value:
    # Appears inside traced decompositions (e.g. adaptive pooling's index maps).
    b = ctx.b
    i = b.iota((length,), 0, torch.int64)
    if step != 1:
        i = b.mul(i, b.constant(step, torch.int64, (length,)))
    if start != 0:
        i = b.add(i, b.constant(start, torch.int64, (length,)))
    return b.convert(i, ctx.out_dtype())


def _linspace_values(ctx: LoweringContext, start: Any, end: Any, steps: int) -> tuple[Value, torch.dtype]:
    """CPU's linspace: start + step*i for the first half, end - step*(steps-1-i) for the rest."""
    b = ctx.b
    out = ctx.out_dtype()
    shape = (steps,)
    # integer outputs step in double (truncated at the end); floats step in their own precision
    acc = torch.float64 if not out.is_floating_point or out == torch.float64 else torch.float32
    low = out in (torch.bfloat16, torch.float16)

    def rnd(v: Value) -> Value:
        return b.convert(b.convert(v, out), acc) if low else v

    s = rnd(ctx.scalar(start, acc, shape))
    e = rnd(ctx.scalar(end, acc, shape))
    if not out.is_floating_point:
        # the scalars are converted to the integer dtype first
        s = b.convert(b.convert(s, out), acc)
        e = b.convert(b.convert(e, out), acc)
    step = rnd(b.div(b.sub(e, s), b.constant(float(max(steps - 1, 1)), acc, shape)))
    i = b.iota(shape, 0, acc)
    first = rnd(b.add(s, rnd(b.mul(step, i))))
    back = b.sub(b.constant(float(steps - 1), acc, shape), i)
    second = rnd(b.sub(e, rnd(b.mul(step, back))))
    half = b.compare(i, b.constant(float(steps // 2), acc, shape), "LT")
    return b.select(half, first, second), acc


@register(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
          aten.linspace.Scalar_Tensor)
def _linspace(ctx: LoweringContext, start: Any, end: Any, steps: int, *rest: Any) -> Value:
    b = ctx.b
    if steps == 0:
        return b.constant(0, ctx.out_dtype(), (0,))
    if steps == 1:
        return b.convert(ctx.scalar(start, torch.float64 if not ctx.out_dtype().is_floating_point
                                    else ctx.out_dtype(), (1,)), ctx.out_dtype())
    v, _ = _linspace_values(ctx, start, end, steps)
    return b.convert(v, ctx.out_dtype())


@register(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
          aten.logspace.Scalar_Tensor)
def _logspace(ctx: LoweringContext, start: Any, end: Any, steps: int, base: Any = 10.0, *rest: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    if steps == 0:
        return b.constant(0, out, (0,))
    if steps == 1:
        acc = torch.float64
        v = b.convert(ctx.scalar(start, acc, (1,)), acc)
    else:
        v, acc = _linspace_values(ctx, start, end, steps)
    r = b.binary("power", ctx.scalar(base, acc, v.shape), v)
    return b.convert(r, out)


@register(aten.eye.default, aten.eye.m)
def _eye(ctx: LoweringContext, n: int, *rest: Any) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    eq = b.compare(b.iota(shape, 0, torch.int64), b.iota(shape, 1, torch.int64), "EQ")
    return b.convert(eq, ctx.out_dtype())


# -- tril_indices / triu_indices ------------------------------------------------------------
# PyTorch's decomposition finds each element's row from a float64 square root; a TPU computes
# float64 as pairs of float32 with a float32 square root, so a floor landing on a whole number
# came out one row off (tril_indices on a v5e: 8 of 420 indices). Here the root only estimates
# the row, and exact integer arithmetic on the rows' start positions corrects the estimate.
def _trapezoid(b: Builder, n: int, m: int, grows: bool, idx: torch.dtype = torch.int64) -> tuple[Value, Value]:
    """Row and column, in row-major order, of the ``n`` elements of a trapezoid whose row ``i``
    holds ``m + i`` (``grows``) or ``m - i`` elements, in the integer type ``idx`` (int32 where
    :func:`_index_type` allows)."""
    f32, shape = torch.float32, (n,)
    x = b.iota(shape, 0, idx)
    xf = b.convert(x, f32)

    def c(v: float, dtype: torch.dtype = f32) -> Value:
        return b.constant(v, dtype, shape)

    # row i starts at S(i) = m i +- i (i - 1) / 2; the estimate solves S(i) = x in a form that does
    # not cancel for large m
    two_x = b.mul(c(2.0), xf)
    if grows and m == 0:
        est = b.sub(b.unary("sqrt", b.add(c(0.25), two_x)), c(0.5))
    elif grows:
        h = m - 0.5
        est = b.div(two_x, b.add(b.unary("sqrt", b.add(c(h * h), two_x)), c(h)))
    else:
        h = m + 0.5
        est = b.div(two_x, b.add(c(h), b.unary("sqrt", b.maximum(b.sub(c(h * h), two_x), c(0.0)))))
    row = b.maximum(b.convert(b.unary("floor", est), idx), c(0, idx))

    def start(r: Value) -> Value:
        # r (r - 1) >= 0 is even: halved by a shift (a TPU emulates 64-bit division at length)
        tri = b.binary("shift_right_arithmetic", b.mul(r, b.sub(r, c(1, idx))), c(1, idx))
        lin = b.mul(r, c(m, idx))
        return b.add(lin, tri) if grows else b.sub(lin, tri)

    for _ in range(2):  # the estimate is within a row; two rounds leave a margin
        row = b.select(b.compare(start(row), x, "GT"), b.sub(row, c(1, idx)), row)
        nxt = b.add(row, c(1, idx))
        row = b.select(b.compare(start(nxt), x, "LE"), nxt, row)
    return row, b.sub(x, start(row))


def _rectangle(b: Builder, n: int, cols: int, idx: torch.dtype = torch.int64) -> tuple[Value, Value]:
    x = b.iota((n,), 0, idx)
    w = b.constant(cols, idx, (n,))
    return b.div(x, w), b.binary("remainder", x, w)


def _shifted(b: Builder, v: Value, by: int) -> Value:
    return b.add(v, b.constant(by, v.dtype, v.shape)) if by else v


def _index_type(count: int, row: int, col: int) -> torch.dtype:
    """int32 where every intermediate of the index arithmetic fits (they stay below about
    4 (count + row + col)): a TPU has no 64-bit integer units, and its compiler writes each
    64-bit operation as several 32-bit ones, which took seconds per program to compile."""
    return torch.int32 if 4 * (count + row + col) + 16 < 2**31 else torch.int64


def _index_pairs(ctx: LoweringContext, parts: list[tuple[Value, Value]]) -> Value:
    b = ctx.b
    parts = [p for p in parts if p[0].shape[0] > 0]
    out, n = ctx.out_dtype(), ctx.out_shape()[1]
    if not parts:
        return b.constant(0, out, (2, n))
    rows = b.concatenate([r for r, _ in parts], 0)
    cols = b.concatenate([c for _, c in parts], 0)
    return b.convert(b.concatenate([b.reshape(rows, (1, n)), b.reshape(cols, (1, n))], 0), out)


@register(aten.tril_indices.default)
def _tril_indices(ctx: LoweringContext, row: int, col: int, offset: int = 0, *rest: Any) -> Value:
    """Row r holds columns 0 .. r + offset: rows of none, a trapezoid of growing rows, full rows."""
    b = ctx.b
    first = max(0, -offset)  # the first row with an element
    if first >= row or col == 0:
        return _index_pairs(ctx, [])
    m = min(col, first + offset + 1)
    growing = max(0, min(row, col - offset - 1) - first)  # rows shorter than col
    full = row - first - growing
    idx = _index_type(ctx.out_shape()[1], row, col)
    tr, tc = _trapezoid(b, growing * m + growing * (growing - 1) // 2, m, grows=True, idx=idx)
    rr, rc = _rectangle(b, full * col, col, idx)
    return _index_pairs(ctx, [(_shifted(b, tr, first), tc), (_shifted(b, rr, first + growing), rc)])


@register(aten.triu_indices.default)
def _triu_indices(ctx: LoweringContext, row: int, col: int, offset: int = 0, *rest: Any) -> Value:
    """Row r holds columns max(0, r + offset) .. col - 1: full rows, then a trapezoid of shrinking ones."""
    b = ctx.b
    if row == 0 or col == 0:
        return _index_pairs(ctx, [])
    full = min(row, max(0, 1 - offset))  # rows with r + offset <= 0
    m = col - (full + offset)  # the first shrinking row's length
    shrinking = max(0, min(row - full, m))
    idx = _index_type(ctx.out_shape()[1], row, col)
    rr, rc = _rectangle(b, full * col, col, idx)
    tr, tc = _trapezoid(b, shrinking * m - shrinking * (shrinking - 1) // 2, m, grows=False, idx=idx)
    # row full + i starts at column full + i + offset
    return _index_pairs(ctx, [(rr, rc), (_shifted(b, tr, full), _shifted(b, b.add(tc, tr), full + offset))])
