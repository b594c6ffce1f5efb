"""Linear algebra that XLA provides natively: Cholesky and triangular solves.

``stablehlo.cholesky`` and ``stablehlo.triangular_solve`` (batched over leading
dimensions) carry ``cholesky``, ``linalg_cholesky_ex``, ``cholesky_solve``,
``cholesky_inverse``, ``triangular_solve`` and ``linalg_solve_triangular``;
their backward formulas are PyTorch's own, built from these same ops.
"""

from __future__ import annotations

import torch

from .builder import Builder, Value
from .registry import LoweringContext, register

aten = torch.ops.aten


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _mT(b: Builder, v: Value) -> Value:
    perm = list(range(v.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.transpose(v, perm)


def cholesky_lower(b: Builder, a: Value) -> Value:
    """Lower Cholesky factor; the strict upper triangle zeroed (XLA leaves it unspecified)."""
    r = b.op1("stablehlo.cholesky", [a], a.shape, a.dtype, attrs="lower = true")
    rows = b.iota(a.shape, a.rank - 2, torch.int64)
    cols = b.iota(a.shape, a.rank - 1, torch.int64)
    return b.select(b.compare(cols, rows, "LE"), r, b.constant(0, a.dtype, a.shape))


def _broadcast_batch(b: Builder, a: Value, x: Value) -> tuple[Value, Value]:
    batch = torch.broadcast_shapes(tuple(a.shape[:-2]), tuple(x.shape[:-2]))
    return (b.broadcast_to(a, (*batch, *a.shape[-2:])), b.broadcast_to(x, (*batch, *x.shape[-2:])))


def tri_solve(b: Builder, a: Value, rhs: Value, left: bool, lower: bool, unit: bool, transpose: bool) -> Value:
    """Solve op(A) X = B (left) or X op(A) = B (right) with A triangular."""
    a, rhs = _broadcast_batch(b, a, rhs)
    attrs = (f"left_side = {str(left).lower()}, lower = {str(lower).lower()}, "
             f"unit_diagonal = {str(unit).lower()}, "
             f"transpose_a = #stablehlo<transpose {'TRANSPOSE' if transpose else 'NO_TRANSPOSE'}>")
    return b.op1("stablehlo.triangular_solve", [a, rhs], rhs.shape, rhs.dtype, attrs=attrs)


def _info(b: Builder, lfac: Value) -> Value:
    """LAPACK-style info: 0, or the 1-based order of the first leading minor that is not positive definite."""
    n = lfac.shape[-1]
    batch = lfac.shape[:-2]
    rows = b.iota(lfac.shape, lfac.rank - 2, torch.int64)
    cols = b.iota(lfac.shape, lfac.rank - 1, torch.int64)
    on_diag = b.compare(rows, cols, "EQ")
    zero = b.constant(0, lfac.dtype, lfac.shape)
    diag = b.reduce(b.select(on_diag, lfac, zero), [lfac.rank - 1], b.constant(0, lfac.dtype), "stablehlo.add")
    bad = b.unary("not", b.compare(diag, b.constant(0, lfac.dtype, diag.shape), "GT"))  # NaN counts as bad
    pos = b.iota(diag.shape, diag.rank - 1, torch.int64)
    big = b.constant(n, torch.int64, diag.shape)
    first = b.reduce(b.select(bad, pos, big), [diag.rank - 1], b.constant(n, torch.int64), "stablehlo.minimum")
    info = b.select(b.compare(first, b.constant(n, torch.int64, batch), "EQ"), b.constant(0, torch.int64, batch),
                    b.add(first, b.constant(1, torch.int64, batch)))
    return b.convert(info, torch.int32)


@register(aten.linalg_cholesky_ex.default)
def _cholesky_ex(ctx: LoweringContext, a: Value, upper: bool = False, check_errors: bool = False
                 ) -> tuple[Value, Value]:
    b = ctx.b
    v = b.convert(a, _acc(a.dtype))
    lfac = cholesky_lower(b, v)
    info = _info(b, lfac)
    if upper:
        lfac = _mT(b, lfac)
    return b.convert(lfac, ctx.out_dtype(0)), info


@register(aten.cholesky.default)
def _cholesky(ctx: LoweringContext, a: Value, upper: bool = False) -> Value:
    b = ctx.b
    lfac = cholesky_lower(b, b.convert(a, _acc(a.dtype)))
    return b.convert(_mT(b, lfac) if upper else lfac, ctx.out_dtype())


@register(aten.triangular_solve.default)
def _triangular_solve(ctx: LoweringContext, rhs: Value, a: Value, upper: bool = True, transpose: bool = False,
                      unitriangular: bool = False) -> tuple[Value, Value]:
    b = ctx.b
    acc = _acc(ctx.out_dtype(0))
    x = tri_solve(b, b.convert(a, acc), b.convert(rhs, acc), True, not upper, unitriangular, transpose)
    coef = b.broadcast_to(b.convert(a, ctx.out_dtype(1)), ctx.out_shape(1))
    return b.convert(x, ctx.out_dtype(0)), coef


@register(aten.linalg_solve_triangular.default)
def _solve_triangular(ctx: LoweringContext, a: Value, rhs: Value, upper: bool, left: bool = True,
                      unitriangular: bool = False) -> Value:
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    x = tri_solve(b, b.convert(a, acc), b.convert(rhs, acc), left, not upper, unitriangular, False)
    return b.convert(x, ctx.out_dtype())


@register(aten.cholesky_solve.default)
def _cholesky_solve(ctx: LoweringContext, rhs: Value, lfac: Value, upper: bool = False) -> Value:
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    lv, bv = b.convert(lfac, acc), b.convert(rhs, acc)
    if upper:
        # A = U^T U: solve U^T y = B, then U x = y
        y = tri_solve(b, lv, bv, True, False, False, True)
        x = tri_solve(b, lv, y, True, False, False, False)
    else:
        # A = L L^T: solve L y = B, then L^T x = y
        y = tri_solve(b, lv, bv, True, True, False, False)
        x = tri_solve(b, lv, y, True, True, False, True)
    return b.convert(x, ctx.out_dtype())


@register(aten.cholesky_inverse.default)
def _cholesky_inverse(ctx: LoweringContext, lfac: Value, upper: bool = False) -> Value:
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    rows = b.iota(lfac.shape, lfac.rank - 2, torch.int64)
    cols = b.iota(lfac.shape, lfac.rank - 1, torch.int64)
    eye = b.convert(b.compare(rows, cols, "EQ"), acc)
    return _cholesky_solve(ctx, eye, lfac, upper)


@register(aten.linalg_cross.default)
def _cross(ctx: LoweringContext, a: Value, c: Value, dim: int = -1) -> Value:
    """a x c along ``dim`` (size 3); each product rounded to the dtype, as CPU's kernel does."""
    b = ctx.b
    out = ctx.out_dtype()
    shape = ctx.out_shape()
    d = dim % len(shape)
    acc = _acc(out)
    av, cv = b.convert(b.broadcast_to(a, shape), out), b.convert(b.broadcast_to(c, shape), out)

    def comp(v: Value, i: int) -> Value:
        lo = [0] * len(shape)
        hi = list(shape)
        lo[d], hi[d] = i, i + 1
        return b.convert(b.slice(v, lo, hi), acc)

    def rnd(v: Value) -> Value:
        return b.convert(b.convert(v, out), acc)

    parts = []
    for i, j in ((1, 2), (2, 0), (0, 1)):
        p1 = rnd(b.mul(comp(av, i), comp(cv, j)))
        p2 = rnd(b.mul(comp(av, j), comp(cv, i)))
        parts.append(b.convert(b.sub(p1, p2), out))
    return b.concatenate(parts, d)
