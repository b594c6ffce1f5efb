"""Linear algebra that XLA provides natively: Cholesky and triangular solves.

``stablehlo.cholesky`` and ``stablehlo.triangular_solve`` (batched over leading
dimensions) carry ``cholesky``, ``linalg_cholesky_ex``, ``cholesky_solve``,
``cholesky_inverse``, ``triangular_solve`` and ``linalg_solve_triangular``;
their backward formulas are PyTorch's own, built from these same ops.
"""

from __future__ import annotations

import math

import torch

from ..runtime import cpu_kernels
from . import target
from .builder import Builder, Value
from .registry import LoweringContext, register

aten = torch.ops.aten


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def real_only(v: Value, what: str) -> None:
    """These factorizations are written for real matrices (no conjugates in their reflectors and
    updates): a complex one raises instead of returning a wrong factorization."""
    if v.dtype.is_complex:
        raise NotImplementedError(f"torchtpu: {what} of a complex matrix is not implemented")


def _mT(b: Builder, v: Value) -> Value:
    perm = list(range(v.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.transpose(v, perm)


def cholesky_lower(b: Builder, a: Value) -> Value:
    """Lower Cholesky factor of ``a``'s lower triangle; the strict upper triangle zeroed (XLA
    leaves it unspecified)."""
    return _cholesky_with_info(b, a)[0]


def _cholesky_with_info(b: Builder, a: Value) -> tuple[Value, Value]:
    """(lower Cholesky factor of ``a``'s lower triangle, LAPACK's info: see _info)."""
    *batch, n, _ = a.shape
    kernels = lapack_kernels(a.dtype)
    if kernels is not None and n:  # LAPACK's potrf itself, ~10x XLA's expansion at 512
        count = math.prod(batch)
        lfac, info = b.custom_call_results(kernels.cholesky, [b.reshape(a, (count, n, n))],
                                           [((count, n, n), a.dtype), ((count,), torch.int32)])
        return b.reshape(lfac, a.shape), b.reshape(info, tuple(batch))
    r = b.op1("stablehlo.cholesky", [a], a.shape, a.dtype, attrs="lower = true")
    rows = b.iota(a.shape, a.rank - 2, torch.int64)
    cols = b.iota(a.shape, a.rank - 1, torch.int64)
    lfac = b.select(b.compare(cols, rows, "LE"), r, b.constant(0, a.dtype, a.shape))
    return lfac, _info(b, lfac)


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
    # upper: A = U^T U from A's upper triangle, which is the lower one of A^T (as the CPU reads it)
    lfac, info = _cholesky_with_info(b, _mT(b, v) if upper else v)
    return b.convert(_mT(b, lfac) if upper else lfac, ctx.out_dtype(0)), info


@register(aten.cholesky.default)
def _cholesky(ctx: LoweringContext, a: Value, upper: bool = False) -> Value:
    b = ctx.b
    v = b.convert(a, _acc(a.dtype))
    lfac = cholesky_lower(b, _mT(b, v) if upper else v)
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


# -- LU with partial pivoting (a stablehlo.while over the columns) -------------------
def eye_like(b: Builder, shape: tuple[int, ...], dtype: torch.dtype) -> Value:
    """Identity matrices of ``shape`` (..., n, n)."""
    rows = b.iota(shape, len(shape) - 2, torch.int64)
    cols = b.iota(shape, len(shape) - 1, torch.int64)
    return b.convert(b.compare(rows, cols, "EQ"), dtype)


def lapack_kernels(dtype: torch.dtype) -> cpu_kernels.LinalgTargets | None:
    """The LAPACK custom calls for ``dtype`` on the CPU-emulated device (csrc/cpu_linalg.cpp), or
    None where the portable lowering must run (a TPU, f16/bf16, the kernels off)."""
    if dtype not in (torch.float32, torch.float64) or not target.xla_cpu():
        return None
    return cpu_kernels.linalg_targets()


def lu_factor(b: Builder, a: Value) -> tuple[Value, Value, Value]:
    """(LU packed, perm (..., m) int64 with A[perm] = L U, pivots (..., k) int64 1-based), as LAPACK getrf.

    Column j: the first row of largest magnitude at or below j is swapped up,
    the column below the pivot is scaled by it and the trailing block updated.
    A zero pivot leaves the column unscaled (LAPACK reports it in ``info``).
    """
    real_only(a, "LU factorization (det, slogdet, solve, inv, lu_factor)")
    *batch, m, n = a.shape
    k = min(m, n)
    kernels = lapack_kernels(a.dtype)
    if kernels is not None and m * n:
        # the CPU-emulated device: LAPACK's getrf (csrc/cpu_linalg.cpp), ~40x this loop at 512
        count = math.prod(batch)
        lu, perm, piv = b.custom_call_results(kernels.lu, [b.reshape(a, (count, m, n))], [
            ((count, m, n), a.dtype), ((count, m), torch.int64), ((count, k), torch.int32)])
        return (b.reshape(lu, a.shape), b.reshape(perm, (*batch, m)),
                b.reshape(b.convert(piv, torch.int64), (*batch, k)))
    shape = a.shape
    r = len(shape)
    bshape = tuple(batch)
    rows = b.iota(shape, r - 2, torch.int64)
    cols = b.iota(shape, r - 1, torch.int64)
    row_ids = b.iota((*batch, m), r - 2, torch.int64)
    perm0 = row_ids
    piv0 = b.constant(0, torch.int64, (*batch, k))
    types = [((), torch.int64), (shape, a.dtype), (shape, torch.int64), (shape, torch.int64),
             ((*batch, m), torch.int64), ((*batch, m), torch.int64), ((*batch, k), torch.int64)]

    def cond(bb: Builder, j: Value, *rest: Value) -> Value:
        return bb.compare(j, bb.constant(k, torch.int64), "LT")

    def body(bb: Builder, j: Value, av: Value, rw: Value, cl: Value, rid: Value, perm: Value, piv: Value
             ) -> list[Value]:
        zero = bb.constant(0, av.dtype, shape)
        jr = bb.broadcast_in_dim(j, shape, [])
        # column j as (..., m)
        col = bb.reduce(bb.select(bb.compare(cl, jr, "EQ"), av, zero), [r - 1], bb.constant(0, av.dtype),
                        "stablehlo.add")
        jm = bb.broadcast_in_dim(j, (*batch, m), [])
        cand = bb.select(bb.compare(rid, jm, "GE"), bb.unary("abs", col),
                         bb.constant(-1, av.dtype, (*batch, m)))
        from .reductions import arg_reduce

        _, p = arg_reduce(bb, cand, r - 2, True)  # (...,), first largest
        pr = bb.broadcast_in_dim(p, shape, list(range(len(batch))))
        row_j = bb.reduce(bb.select(bb.compare(rw, jr, "EQ"), av, zero), [r - 2], bb.constant(0, av.dtype),
                          "stablehlo.add")
        row_p = bb.reduce(bb.select(bb.compare(rw, pr, "EQ"), av, zero), [r - 2], bb.constant(0, av.dtype),
                          "stablehlo.add")
        bdims = [*range(len(batch)), r - 1]
        rj = bb.broadcast_in_dim(row_j, shape, bdims)
        rp = bb.broadcast_in_dim(row_p, shape, bdims)
        av = bb.select(bb.compare(rw, jr, "EQ"), rp, bb.select(bb.compare(rw, pr, "EQ"), rj, av))
        pm = bb.broadcast_in_dim(p, (*batch, m), list(range(len(batch))))
        perm_j = bb.reduce(bb.select(bb.compare(rid, jm, "EQ"), perm, bb.constant(0, torch.int64, (*batch, m))),
                           [r - 2], bb.constant(0, torch.int64), "stablehlo.add")
        perm_p = bb.reduce(bb.select(bb.compare(rid, pm, "EQ"), perm, bb.constant(0, torch.int64, (*batch, m))),
                           [r - 2], bb.constant(0, torch.int64), "stablehlo.add")
        perm = bb.select(bb.compare(rid, jm, "EQ"), bb.broadcast_in_dim(perm_p, (*batch, m), list(range(len(batch)))),
                         bb.select(bb.compare(rid, pm, "EQ"),
                                   bb.broadcast_in_dim(perm_j, (*batch, m), list(range(len(batch)))), perm))
        kk = bb.iota((*batch, k), r - 2, torch.int64)
        piv = bb.select(bb.compare(kk, bb.broadcast_in_dim(j, (*batch, k), []), "EQ"),
                        bb.broadcast_in_dim(bb.add(p, bb.constant(1, torch.int64, bshape)), (*batch, k),
                                            list(range(len(batch)))), piv)
        # elimination below the pivot
        pivot = bb.broadcast_in_dim(bb.reduce(bb.select(bb.binary("and", bb.compare(rw, jr, "EQ"),
                                                                  bb.compare(cl, jr, "EQ")), av, zero),
                                              [r - 2, r - 1], bb.constant(0, av.dtype), "stablehlo.add"),
                                    shape, list(range(len(batch))))
        nonzero = bb.compare(pivot, zero, "NE")
        below = bb.compare(rw, jr, "GT")
        colj = bb.reduce(bb.select(bb.compare(cl, jr, "EQ"), av, zero), [r - 1], bb.constant(0, av.dtype),
                         "stablehlo.add")
        colb = bb.broadcast_in_dim(colj, shape, list(range(r - 1)))
        safe = bb.select(nonzero, pivot, bb.constant(1, av.dtype, shape))
        mult = bb.select(bb.binary("and", below, nonzero), bb.div(colb, safe), zero)
        rowj = bb.reduce(bb.select(bb.compare(rw, jr, "EQ"), av, zero), [r - 2], bb.constant(0, av.dtype),
                         "stablehlo.add")
        rowb = bb.broadcast_in_dim(rowj, shape, bdims)
        right = bb.compare(cl, jr, "GT")
        upd = bb.sub(av, bb.mul(mult, rowb))
        av = bb.select(bb.binary("and", below, right), upd, av)
        av = bb.select(bb.binary("and", bb.binary("and", below, nonzero), bb.compare(cl, jr, "EQ")), mult, av)
        return [bb.add(j, bb.constant(1, torch.int64)), av, rw, cl, rid, perm, piv]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    outs = b.op("stablehlo.while", [b.constant(0, torch.int64), a, rows, cols, row_ids, perm0, piv0], types,
                region=regions)
    return outs[1], outs[5], outs[6]


def _lu_info(b: Builder, lu: Value) -> Value:
    """First zero on U's diagonal (1-based), 0 if none."""
    *batch, m, n = lu.shape
    k = min(m, n)
    diag = diagonal(b, lu, k)
    zero = b.compare(diag, b.constant(0, lu.dtype, diag.shape), "EQ")
    pos = b.iota(diag.shape, diag.rank - 1, torch.int64)
    first = b.reduce(b.select(zero, pos, b.constant(k, torch.int64, diag.shape)), [diag.rank - 1],
                     b.constant(k, torch.int64), "stablehlo.minimum")
    bs = tuple(batch)
    info = b.select(b.compare(first, b.constant(k, torch.int64, bs), "EQ"), b.constant(0, torch.int64, bs),
                    b.add(first, b.constant(1, torch.int64, bs)))
    return b.convert(info, torch.int32)


def diagonal(b: Builder, v: Value, k: int) -> Value:
    """The first k diagonal entries of each matrix of ``v`` (..., m, n)."""
    sq = b.slice(v, [0] * v.rank, [*v.shape[:-2], k, k])
    rows = b.iota(sq.shape, sq.rank - 2, torch.int64)
    cols = b.iota(sq.shape, sq.rank - 1, torch.int64)
    return b.reduce(b.select(b.compare(rows, cols, "EQ"), sq, b.constant(0, v.dtype, sq.shape)), [sq.rank - 1],
                    b.constant(0, v.dtype), "stablehlo.add")


@register(aten.linalg_lu_factor_ex.default)
def _lu_factor_ex(ctx: LoweringContext, a: Value, pivot: bool = True, check_errors: bool = False
                  ) -> tuple[Value, Value, Value]:
    if not pivot:
        raise NotImplementedError("torchtpu: linalg_lu_factor_ex without pivoting is not implemented")
    b = ctx.b
    lu, _, piv = lu_factor(b, b.convert(a, _acc(a.dtype)))
    return b.convert(lu, ctx.out_dtype(0)), b.convert(piv, torch.int32), _lu_info(b, lu)


def _unpack(b: Builder, lu: Value, perm: Value, dtype: torch.dtype) -> tuple[Value, Value, Value]:
    *batch, m, n = lu.shape
    k = min(m, n)
    lshape = (*batch, m, k)
    ushape = (*batch, k, n)
    lpart = b.slice(lu, [0] * lu.rank, [*batch, m, k])
    rows = b.iota(lshape, len(lshape) - 2, torch.int64)
    cols = b.iota(lshape, len(lshape) - 1, torch.int64)
    lmat = b.select(b.compare(rows, cols, "GT"), lpart, b.constant(0, lu.dtype, lshape))
    lmat = b.select(b.compare(rows, cols, "EQ"), b.constant(1, lu.dtype, lshape), lmat)
    upart = b.slice(lu, [0] * lu.rank, [*batch, k, n])
    rows = b.iota(ushape, len(ushape) - 2, torch.int64)
    cols = b.iota(ushape, len(ushape) - 1, torch.int64)
    umat = b.select(b.compare(rows, cols, "LE"), upart, b.constant(0, lu.dtype, ushape))
    pshape = (*batch, m, m)
    # P[perm[i], i] = 1, so that A = P L U
    prow = b.iota(pshape, len(pshape) - 2, torch.int64)
    pb = b.broadcast_in_dim(perm, pshape, [*range(len(batch)), len(pshape) - 1])
    pmat = b.convert(b.compare(prow, pb, "EQ"), dtype)
    return pmat, b.convert(lmat, dtype), b.convert(umat, dtype)


@register(aten.linalg_lu.default)
def _linalg_lu(ctx: LoweringContext, a: Value, pivot: bool = True) -> tuple[Value, Value, Value]:
    if not pivot:
        raise NotImplementedError("torchtpu: linalg_lu without pivoting is not implemented")
    b = ctx.b
    lu, perm, _ = lu_factor(b, b.convert(a, _acc(a.dtype)))
    return _unpack(b, lu, perm, ctx.out_dtype(0))


def _perm_from_pivots(b: Builder, piv: Value, m: int) -> Value:
    """Row order (..., m) from LAPACK's 1-based sequential swaps (unrolled: k is static)."""
    *batch, k = piv.shape
    p = b.convert(piv, torch.int64)
    rid = b.iota((*batch, m), len(batch), torch.int64)
    perm = rid
    bd = list(range(len(batch)))
    for j in range(k):
        pj = b.reshape(b.slice(p, [0] * p.rank, [*batch, j + 1]) if j == 0 else
                       b.slice(p, [0] * (p.rank - 1) + [j], [*batch, j + 1]), tuple(batch))
        pj = b.sub(pj, b.constant(1, torch.int64, tuple(batch)))
        pm = b.broadcast_in_dim(pj, (*batch, m), bd)
        jm = b.constant(j, torch.int64, (*batch, m))
        zero = b.constant(0, torch.int64, (*batch, m))
        at_j = b.reduce(b.select(b.compare(rid, jm, "EQ"), perm, zero), [len(batch)], b.constant(0, torch.int64),
                        "stablehlo.add")
        at_p = b.reduce(b.select(b.compare(rid, pm, "EQ"), perm, zero), [len(batch)], b.constant(0, torch.int64),
                        "stablehlo.add")
        perm = b.select(b.compare(rid, jm, "EQ"), b.broadcast_in_dim(at_p, (*batch, m), bd),
                        b.select(b.compare(rid, pm, "EQ"), b.broadcast_in_dim(at_j, (*batch, m), bd), perm))
    return perm


@register(aten.lu_unpack.default)
def _lu_unpack(ctx: LoweringContext, lu: Value, pivots: Value, unpack_data: bool = True,
               unpack_pivots: bool = True) -> tuple[Value, Value, Value]:
    b = ctx.b
    m = lu.shape[-2]
    perm = _perm_from_pivots(b, pivots, m)
    p, lmat, umat = _unpack(b, lu, perm, ctx.out_dtype(1))
    outs = []
    for i, v in enumerate((p, lmat, umat)):
        want = ctx.out_shape(i)
        outs.append(v if tuple(v.shape) == tuple(want) else b.constant(0, ctx.out_dtype(i), want))
    return tuple(outs)


def _apply_perm_rows(b: Builder, x: Value, perm: Value) -> Value:
    """x[..., perm, :] with a batched row order."""
    *batch, m, _ = x.shape
    shape3 = (*batch, m, m)
    sel = b.convert(b.compare(b.broadcast_in_dim(perm, shape3, [*range(len(batch)), len(batch)]),
                              b.iota(shape3, len(batch) + 1, torch.int64), "EQ"), x.dtype)
    # one-hot matrix product, exact: each output row picks one input row
    attrs_b = list(range(len(batch)))
    return b.dot_general(sel, x, (attrs_b, attrs_b), ([len(batch) + 1], [len(batch)]), x.dtype, precision="HIGHEST")


def _lu_solve(b: Builder, lu: Value, perm: Value, rhs: Value) -> Value:
    lu, rhs, perm = _broadcast3(b, lu, rhs, perm)
    y = tri_solve(b, lu, _apply_perm_rows(b, rhs, perm), True, True, True, False)
    return tri_solve(b, lu, y, True, False, False, False)


def _factor_transposed(ctx: LoweringContext) -> bool:
    """CPU factors A^T when A is row-major contiguous (LAPACK is column-major), and returns that LU;
    the backward formulas rely on it, so the tpu returns the same factorization."""
    meta = ctx.metas[0] if ctx.metas else None
    return isinstance(meta, torch.Tensor) and meta.is_contiguous() and not meta.is_complex()


@register(aten._linalg_solve_ex.default)
def _solve_ex(ctx: LoweringContext, a: Value, rhs: Value, left: bool = True, check_errors: bool = False
              ) -> tuple[Value, Value, Value, Value]:
    b = ctx.b
    acc = _acc(ctx.out_dtype(0))
    av = b.convert(a, acc)
    # unlike det/slogdet, CPU's solve returns the LU of A itself (checked against torch 2.13)
    use_t = False
    lu, perm, piv = lu_factor(b, av)
    out_shape = ctx.out_shape(0)
    vector = len(out_shape) == a.rank - 1
    x = b.convert(rhs, acc)
    if vector:
        x = b.reshape(b.broadcast_to(x, out_shape), (*out_shape, 1))
    if left:
        sol = _lu_solve_left(b, lu, perm, x, adjoint=use_t)
    else:
        # X A = B  <=>  A^T X^T = B^T
        sol = _mT(b, _lu_solve_left(b, lu, perm, _mT(b, x), adjoint=not use_t))
    if vector:
        sol = b.reshape(sol, out_shape)
    return (b.convert(b.broadcast_to(sol, out_shape), ctx.out_dtype(0)), b.convert(lu, ctx.out_dtype(1)),
            b.convert(piv, torch.int32), _lu_info(b, lu))


@register(aten.linalg_inv_ex.default)
def _inv_ex(ctx: LoweringContext, a: Value, check_errors: bool = False) -> tuple[Value, Value]:
    b = ctx.b
    acc = _acc(ctx.out_dtype(0))
    lu, perm, _ = lu_factor(b, b.convert(a, acc))
    inv = _lu_solve(b, lu, perm, eye_like(b, a.shape, acc))
    return b.convert(inv, ctx.out_dtype(0)), _lu_info(b, lu)


def _det_parts(b: Builder, lu: Value, piv: Value) -> tuple[Value, Value]:
    """(product of U's diagonal, permutation sign) of a square LU."""
    n = lu.shape[-1]
    diag = diagonal(b, lu, n)
    prod = b.reduce(diag, [diag.rank - 1], b.constant(1, lu.dtype), "stablehlo.multiply")
    swaps = b.compare(piv, b.add(b.iota(piv.shape, piv.rank - 1, torch.int64),
                                 b.constant(1, torch.int64, piv.shape)), "NE")
    nswap = b.reduce(b.convert(swaps, torch.int64), [piv.rank - 1], b.constant(0, torch.int64), "stablehlo.add")
    odd = b.compare(b.binary("remainder", nswap, b.constant(2, torch.int64, nswap.shape)),
                    b.constant(0, torch.int64, nswap.shape), "NE")
    sign = b.select(odd, b.constant(-1, lu.dtype, nswap.shape), b.constant(1, lu.dtype, nswap.shape))
    return prod, sign


@register(aten._linalg_det.default)
def _det(ctx: LoweringContext, a: Value) -> tuple[Value, Value, Value]:
    b = ctx.b
    acc = _acc(ctx.out_dtype(0))
    av = b.convert(a, acc)
    lu, _, piv = lu_factor(b, _mT(b, av) if _factor_transposed(ctx) else av)
    prod, sign = _det_parts(b, lu, piv)
    return b.convert(b.mul(prod, sign), ctx.out_dtype(0)), b.convert(lu, ctx.out_dtype(1)), b.convert(piv,
                                                                                                       torch.int32)


@register(aten._linalg_slogdet.default)
def _slogdet(ctx: LoweringContext, a: Value) -> tuple[Value, Value, Value, Value]:
    b = ctx.b
    acc = _acc(ctx.out_dtype(0))  # the sign's: the input's (logabsdet is real for a complex input)
    av = b.convert(a, acc)
    lu, _, piv = lu_factor(b, _mT(b, av) if _factor_transposed(ctx) else av)
    n = lu.shape[-1]
    diag = diagonal(b, lu, n)
    logabs = b.reduce(b.unary("log", b.unary("abs", diag)), [diag.rank - 1], b.constant(0, acc), "stablehlo.add")
    negs = b.reduce(b.convert(b.compare(diag, b.constant(0, acc, diag.shape), "LT"), torch.int64),
                    [diag.rank - 1], b.constant(0, torch.int64), "stablehlo.add")
    _, psign = _det_parts(b, lu, piv)
    odd = b.compare(b.binary("remainder", negs, b.constant(2, torch.int64, negs.shape)),
                    b.constant(0, torch.int64, negs.shape), "NE")
    sign = b.select(odd, b.neg(psign), psign)
    zero = b.reduce(b.convert(b.compare(diag, b.constant(0, acc, diag.shape), "EQ"), torch.int64),
                    [diag.rank - 1], b.constant(0, torch.int64), "stablehlo.add")
    sign = b.select(b.compare(zero, b.constant(0, torch.int64, zero.shape), "GT"), b.constant(0, acc, sign.shape),
                    sign)
    return (b.convert(sign, ctx.out_dtype(0)), b.convert(logabs, ctx.out_dtype(1)), b.convert(lu, ctx.out_dtype(2)),
            b.convert(piv, torch.int32))


@register(aten.linalg_lu_solve.default)
def _linalg_lu_solve(ctx: LoweringContext, lu: Value, pivots: Value, rhs: Value, left: bool = True,
                     adjoint: bool = False) -> Value:
    b = ctx.b
    real_only(lu, "linalg.lu_solve")
    acc = _acc(ctx.out_dtype())
    luv = b.convert(lu, acc)
    perm = _perm_from_pivots(b, pivots, lu.shape[-2])
    x = b.convert(rhs, acc)
    if left:
        sol = _lu_solve_left(b, luv, perm, x, adjoint)
    else:
        # X A = B  <=>  A^T X^T = B^T ; X A^T = B  <=>  A X^T = B^T
        sol = _mT(b, _lu_solve_left(b, luv, perm, _mT(b, x), not adjoint))
    return b.convert(b.broadcast_to(sol, ctx.out_shape()), ctx.out_dtype())


def _lu_solve_left(b: Builder, lu: Value, perm: Value, x: Value, adjoint: bool) -> Value:
    if not adjoint:
        return _lu_solve(b, lu, perm, x)
    # A^T X = B with A = P L U: U^T L^T P^T X = B
    lu, x, perm = _broadcast3(b, lu, x, perm)
    y = tri_solve(b, lu, x, True, False, False, True)
    z = tri_solve(b, lu, y, True, True, True, True)
    return _apply_perm_rows(b, z, _inverse_perm(b, perm))


def _inverse_perm(b: Builder, perm: Value) -> Value:
    *batch, m = perm.shape
    shape = (*batch, m, m)
    onehot = b.compare(b.broadcast_in_dim(perm, shape, [*range(len(batch)), len(batch)]),
                       b.iota(shape, len(batch) + 1, torch.int64), "EQ")
    idx = b.iota(shape, len(batch), torch.int64)
    return b.reduce(b.select(onehot, idx, b.constant(0, torch.int64, shape)), [len(batch)],
                    b.constant(0, torch.int64), "stablehlo.add")


def _broadcast3(b: Builder, lu: Value, rhs: Value, perm: Value) -> tuple[Value, Value, Value]:
    batch = torch.broadcast_shapes(tuple(lu.shape[:-2]), tuple(rhs.shape[:-2]), tuple(perm.shape[:-1]))
    return (b.broadcast_to(lu, (*batch, *lu.shape[-2:])), b.broadcast_to(rhs, (*batch, *rhs.shape[-2:])),
            b.broadcast_to(perm, (*batch, perm.shape[-1])))


# -- pairwise distances ------------------------------------------------------------
def _pair_diffs(b: Builder, x1: Value, x2: Value) -> Value:
    """(..., P, R, M) differences x1[..., p, :] - x2[..., r, :]."""
    *batch, p, m = x1.shape
    r = x2.shape[-2]
    nb = len(batch)
    full = (*batch, p, r, m)
    a = b.broadcast_in_dim(x1, full, [*range(nb), nb, nb + 2])
    c = b.broadcast_in_dim(x2, full, [*range(nb), nb + 1, nb + 2])
    return b.sub(a, c)


def _pnorm_last(b: Builder, d: Value, p: float | Value) -> Value:
    if isinstance(p, Value):
        # p is a runtime scalar: every case computed, the right one selected
        pv = b.convert(p, d.dtype)
        out_shape = d.shape[:-1]
        pb = b.broadcast_in_dim(pv, out_shape, [])
        general = _pnorm_general(b, d, b.broadcast_in_dim(pv, d.shape, []), pb)
        r = b.select(b.compare(pb, b.constant(math.inf, d.dtype, out_shape), "EQ"), _pnorm_last(b, d, math.inf),
                     general)
        return b.select(b.compare(pb, b.constant(0, d.dtype, out_shape), "EQ"), _pnorm_last(b, d, 0.0), r)
    ad = b.unary("abs", d)
    last = d.rank - 1
    zero = b.constant(0, d.dtype)
    if p == 0:
        return b.reduce(b.convert(b.compare(ad, b.constant(0, d.dtype, d.shape), "NE"), d.dtype), [last], zero,
                        "stablehlo.add")
    if p == math.inf:
        return b.reduce(ad, [last], zero, "stablehlo.maximum")
    if p == 1:
        return b.reduce(ad, [last], zero, "stablehlo.add")
    if p == 2:
        return b.unary("sqrt", b.reduce(b.mul(d, d), [last], zero, "stablehlo.add"))
    s = b.reduce(b.binary("power", ad, b.constant(p, d.dtype, d.shape)), [last], zero, "stablehlo.add")
    return b.binary("power", s, b.constant(1.0 / p, d.dtype, s.shape))


@register(aten._cdist_forward.default)
def _cdist_forward(ctx: LoweringContext, x1: Value, x2: Value, p: float, compute_mode: int | None = None) -> Value:
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    batch = torch.broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2]))
    a = b.broadcast_to(b.convert(x1, acc), (*batch, *x1.shape[-2:]))
    c = b.broadcast_to(b.convert(x2, acc), (*batch, *x2.shape[-2:]))
    return b.convert(_pnorm_last(b, _pair_diffs(b, a, c), p if isinstance(p, Value) else float(p)), ctx.out_dtype())


def _pnorm_general(b: Builder, d: Value, p_full: Value, p_out: Value) -> Value:
    s = b.reduce(b.binary("power", b.unary("abs", d), p_full), [d.rank - 1], b.constant(0, d.dtype),
                 "stablehlo.add")
    return b.binary("power", s, b.div(b.constant(1.0, d.dtype, s.shape), p_out))


def _dist_grad(b: Builder, diff: Value, dist: Value, g: Value, p: float | Value) -> Value:
    """d(||diff||_p)/d(diff) * g, with PyTorch's conventions at zero distance."""
    shape = diff.shape
    if isinstance(p, Value):
        pv = b.broadcast_in_dim(b.convert(p, diff.dtype), shape, [])
        r = _dist_grad_general(b, diff, dist, g, pv)
        for special in (0.0, 1.0, math.inf):
            r = b.select(b.compare(pv, b.constant(special, diff.dtype, shape), "EQ"),
                         _dist_grad(b, diff, dist, g, special), r)
        return r
    nb = diff.rank - 1
    db = b.broadcast_in_dim(dist, shape, list(range(nb)))
    gb = b.broadcast_in_dim(g, shape, list(range(nb)))
    zero = b.constant(0, diff.dtype, shape)
    sign = b.unary("sign", diff)
    if p == 0:
        return zero
    if p == 1:
        return b.mul(gb, sign)
    if p == math.inf:
        hit = b.compare(b.unary("abs", diff), db, "EQ")
        return b.select(hit, b.mul(gb, sign), zero)
    if p == 2:
        nonzero = b.compare(db, zero, "NE")
        safe = b.select(nonzero, db, b.constant(1, diff.dtype, shape))
        return b.select(nonzero, b.div(b.mul(gb, diff), safe), zero)
    return _dist_grad_general(b, diff, dist, g, b.constant(p, diff.dtype, shape))


def _dist_grad_general(b: Builder, diff: Value, dist: Value, g: Value, p: Value) -> Value:
    """g * diff * |diff|^(p-2) / dist^(p-1), zero where dist or (for p < 2) diff is zero."""
    shape = diff.shape
    nb = diff.rank - 1
    db = b.broadcast_in_dim(dist, shape, list(range(nb)))
    gb = b.broadcast_in_dim(g, shape, list(range(nb)))
    zero = b.constant(0, diff.dtype, shape)
    one = b.constant(1, diff.dtype, shape)
    two = b.constant(2, diff.dtype, shape)
    nonzero = b.compare(db, zero, "NE")
    safe = b.select(nonzero, db, one)
    ad = b.unary("abs", diff)
    num = b.mul(b.mul(diff, b.binary("power", ad, b.sub(p, two))), gb)
    r = b.div(num, b.binary("power", safe, b.sub(p, one)))
    r = b.select(b.binary("and", b.compare(p, two, "LT"), b.compare(diff, zero, "EQ")), zero, r)
    return b.select(nonzero, r, zero)


@register(aten._cdist_backward.default)
def _cdist_backward(ctx: LoweringContext, grad: Value, x1: Value, x2: Value, p: float, dist: Value) -> Value:
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    shape = dist.shape
    a = b.broadcast_to(b.convert(x1, acc), (*shape[:-2], *x1.shape[-2:]))
    c = b.broadcast_to(b.convert(x2, acc), (*shape[:-2], *x2.shape[-2:]))
    diff = _pair_diffs(b, a, c)
    per = _dist_grad(b, diff, b.convert(dist, acc), b.convert(grad, acc), p if isinstance(p, Value) else float(p))
    r = b.reduce(per, [diff.rank - 2], b.constant(0, acc), "stablehlo.add")
    return b.convert(b.broadcast_to(r, ctx.out_shape()) if tuple(r.shape) != tuple(ctx.out_shape()) else r,
                     ctx.out_dtype())


def _upper_pairs(n: int) -> tuple[list[int], list[int]]:
    rows, cols = [], []
    for i in range(n):
        for j in range(i + 1, n):
            rows.append(i)
            cols.append(j)
    return rows, cols


@register(aten._pdist_forward.default)
def _pdist_forward(ctx: LoweringContext, x: Value, p: float = 2.0) -> Value:
    import numpy as np

    from .indexing import take_rows

    b = ctx.b
    acc = _acc(ctx.out_dtype())
    n = x.shape[0]
    rows, cols = _upper_pairs(n)
    if not rows:
        return b.constant(0, ctx.out_dtype(), ctx.out_shape())
    v = b.convert(x, acc)
    a = take_rows(b, v, b.dense_constant(np.array(rows, dtype=np.int64), torch.int64), 0)
    c = take_rows(b, v, b.dense_constant(np.array(cols, dtype=np.int64), torch.int64), 0)
    return b.convert(_pnorm_last(b, b.sub(a, c), p if isinstance(p, Value) else float(p)), ctx.out_dtype())


@register(aten._pdist_backward.default)
def _pdist_backward(ctx: LoweringContext, grad: Value, x: Value, p: float, dist: Value) -> Value:
    import numpy as np

    from .indexing import scatter_add_rows, take_rows

    b = ctx.b
    acc = _acc(ctx.out_dtype())
    n, m = x.shape
    rows, cols = _upper_pairs(n)
    if not rows:
        return b.constant(0, ctx.out_dtype(), x.shape)
    v = b.convert(x, acc)
    ri = b.dense_constant(np.array(rows, dtype=np.int64), torch.int64)
    ci = b.dense_constant(np.array(cols, dtype=np.int64), torch.int64)
    diff = b.sub(take_rows(b, v, ri, 0), take_rows(b, v, ci, 0))
    per = _dist_grad(b, diff, b.convert(dist, acc), b.convert(grad, acc), p if isinstance(p, Value) else float(p))
    base = b.constant(0, acc, (n, m))
    r = scatter_add_rows(b, base, ri, per, 0)
    r = scatter_add_rows(b, r, ci, b.neg(per), 0)
    return b.convert(r, ctx.out_dtype())


# -- matrix exponential: scaling and squaring around a degree-18 Taylor polynomial ---------
def _bmm(b: Builder, x: Value, y: Value) -> Value:
    nb = x.rank - 2
    batch = list(range(nb))
    return b.dot_general(x, y, (batch, batch), ([nb + 1], [nb]), x.dtype, precision="HIGHEST")


# The 1-norm up to which degree-18 Taylor is accurate to the dtype's rounding (PyTorch's own
# thresholds for its degree-18 approximant, aten/src/ATen/native/LinearAlgebra.cpp)
_MATRIX_EXP_THETA = {torch.float32: 3.010066362817634, torch.float64: 1.090863719290036}


@register(aten.linalg_matrix_exp.default)
def _matrix_exp(ctx: LoweringContext, a: Value) -> Value:
    """exp(A): each matrix scaled by 2^-s so its 1-norm is at most theta (the largest at which
    degree-18 Taylor reaches the dtype's rounding), Taylor to order 18, then squared s times in a
    stablehlo.while (s from the data, per matrix: one large matrix of a batch does not make the
    others take its squarings, each of which doubles the relative error; a float32 sample was
    50x CPU's error with one s for the batch and norms scaled down to 1)."""
    real_only(a, "matrix_exp")
    b = ctx.b
    out = ctx.out_dtype()
    acc = torch.float64 if out == torch.float64 else torch.float32
    v = b.convert(a, acc)
    shape = v.shape
    r = v.rank
    batch = shape[:-2]
    colsum = b.reduce(b.unary("abs", v), [r - 2], b.constant(0, acc), "stablehlo.add")
    nrm = b.reduce(colsum, [r - 2], b.constant(0, acc), "stablehlo.maximum")  # per matrix
    log2 = b.div(b.unary("log", b.div(nrm, b.constant(_MATRIX_EXP_THETA[acc], acc, batch))),
                 b.constant(math.log(2.0), acc, batch))
    s = b.maximum(b.unary("ceil", log2), b.constant(0, acc, batch))
    s = b.select(b.op1("stablehlo.is_finite", [s], batch, torch.bool), s, b.constant(0, acc, batch))
    scale = b.binary("power", b.constant(2.0, acc, batch), b.neg(s))
    vs = b.mul(v, b.broadcast_in_dim(scale, shape, list(range(len(batch)))))
    eye = eye_like(b, shape, acc)
    e, term = eye, eye
    for k in range(1, 19):
        term = b.div(_bmm(b, term, vs), b.constant(float(k), acc, shape))
        e = b.add(e, term)
    steps = b.convert(s, torch.int64)
    types = [((), torch.int64), (batch, torch.int64), (shape, acc)]
    every = list(range(len(batch)))

    def cond(bb: Builder, i: Value, n: Value, m: Value) -> Value:  # while any matrix has squarings left
        most = bb.reduce(n, every, bb.constant(0, torch.int64), "stablehlo.maximum") if batch else n
        return bb.compare(i, most, "LT")

    def body(bb: Builder, i: Value, n: Value, m: Value) -> list[Value]:
        more = bb.compare(bb.broadcast_in_dim(i, batch, []), n, "LT")
        return [bb.add(i, bb.constant(1, torch.int64)), n,
                bb.select(bb.broadcast_in_dim(more, shape, every), _bmm(bb, m, m), m)]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    res = b.op("stablehlo.while", [b.constant(0, torch.int64), steps, e], types, region=regions)[2]
    return b.convert(res, out)


# -- Householder QR (LAPACK geqrf / orgqr conventions), a stablehlo.while over the columns -----
def _col(b: Builder, a: Value, cols: Value, j: Value) -> Value:
    """Column j of a batch of matrices: (..., m)."""
    r = a.rank
    sel = b.select(b.compare(cols, b.broadcast_in_dim(j, a.shape, []), "EQ"), a, b.constant(0, a.dtype, a.shape))
    return b.reduce(sel, [r - 1], b.constant(0, a.dtype), "stablehlo.add")


def householder_qr(b: Builder, a: Value) -> tuple[Value, Value]:
    """(packed R and reflectors, tau) of ``a`` (..., m, n), as LAPACK's geqrf computes them."""
    real_only(a, "QR (geqrf, qr)")
    *batch, m, n = a.shape
    k = min(m, n)
    kernels = lapack_kernels(a.dtype)
    if kernels is not None and k:  # LAPACK's geqrf itself, ~10x this loop at 512
        count = math.prod(batch)
        packed, tau = b.custom_call_results(kernels.geqrf, [b.reshape(a, (count, m, n))],
                                            [((count, m, n), a.dtype), ((count, k), a.dtype)])
        return b.reshape(packed, a.shape), b.reshape(tau, (*batch, k))
    shape = a.shape
    r = a.rank
    nb = len(batch)
    bshape = tuple(batch)
    rows = b.iota(shape, r - 2, torch.int64)
    cols = b.iota(shape, r - 1, torch.int64)
    types = [((), torch.int64), (shape, a.dtype), (shape, torch.int64), (shape, torch.int64),
             ((*batch, k), a.dtype)]

    def cond(bb: Builder, j: Value, *rest: Value) -> Value:
        return bb.compare(j, bb.constant(k, torch.int64), "LT")

    def body(bb: Builder, j: Value, av: Value, rw: Value, cl: Value, tau: Value) -> list[Value]:
        jr = bb.broadcast_in_dim(j, shape, [])
        col = _col(bb, av, cl, j)  # (..., m)
        rid = bb.iota((*batch, m), nb, torch.int64)
        jm = bb.broadcast_in_dim(j, (*batch, m), [])
        zm = bb.constant(0, av.dtype, (*batch, m))
        alpha = bb.reduce(bb.select(bb.compare(rid, jm, "EQ"), col, zm), [nb], bb.constant(0, av.dtype),
                          "stablehlo.add")
        tail = bb.select(bb.compare(rid, jm, "GT"), col, zm)
        xnorm = bb.unary("sqrt", bb.reduce(bb.mul(tail, tail), [nb], bb.constant(0, av.dtype), "stablehlo.add"))
        zb = bb.constant(0, av.dtype, bshape)
        trivial = bb.compare(xnorm, zb, "EQ")
        norm = bb.unary("sqrt", bb.add(bb.mul(alpha, alpha), bb.mul(xnorm, xnorm)))
        neg_alpha = bb.compare(alpha, zb, "LT")
        beta = bb.select(neg_alpha, norm, bb.neg(norm))  # -sign(alpha) * norm
        beta = bb.select(trivial, alpha, beta)
        one_b = bb.constant(1, av.dtype, bshape)
        safe_beta = bb.select(trivial, one_b, beta)
        t = bb.select(trivial, zb, bb.div(bb.sub(beta, alpha), safe_beta))
        denom = bb.select(trivial, one_b, bb.sub(alpha, beta))
        v = bb.div(tail, bb.broadcast_in_dim(denom, (*batch, m), list(range(nb))))
        v = bb.select(bb.compare(rid, jm, "EQ"), bb.constant(1, av.dtype, (*batch, m)), v)  # v_j = 1, v_<j = 0
        v = bb.select(bb.compare(rid, jm, "LT"), zm, v)
        vb = bb.broadcast_in_dim(v, shape, list(range(nb + 1)))
        w = bb.reduce(bb.mul(vb, av), [r - 2], bb.constant(0, av.dtype), "stablehlo.add")  # (..., n)
        tb = bb.broadcast_in_dim(t, shape, list(range(nb)))
        upd = bb.sub(av, bb.mul(tb, bb.mul(vb, bb.broadcast_in_dim(w, shape, [*range(nb), r - 1]))))
        right = bb.compare(cl, jr, "GT")
        av = bb.select(right, upd, av)
        at_j = bb.compare(cl, jr, "EQ")
        newcol = bb.select(bb.compare(rw, jr, "EQ"), bb.broadcast_in_dim(beta, shape, list(range(nb))),
                           bb.select(bb.compare(rw, jr, "GT"), vb, av))
        av = bb.select(at_j, newcol, av)
        kk = bb.iota((*batch, k), nb, torch.int64)
        tau = bb.select(bb.compare(kk, bb.broadcast_in_dim(j, (*batch, k), []), "EQ"),
                        bb.broadcast_in_dim(t, (*batch, k), list(range(nb))), tau)
        return [bb.add(j, bb.constant(1, torch.int64)), av, rw, cl, tau]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    outs = b.op("stablehlo.while", [b.constant(0, torch.int64), a, rows, cols, b.constant(0, a.dtype, (*batch, k))],
                types, region=regions)
    return outs[1], outs[4]


def householder_q(b: Builder, refl: Value, tau: Value, ncols: int) -> Value:
    """The first ``ncols`` columns of H_0 H_1 ... H_{k-1} (LAPACK orgqr), applied right to left to I."""
    real_only(refl, "householder_product")
    *batch, m, n = refl.shape
    k = tau.shape[-1]
    kernels = lapack_kernels(refl.dtype)
    # LAPACK's orgqr itself, where it applies: k reflectors building 0 < ncols <= m columns
    if kernels is not None and k <= min(n, ncols) and 0 < ncols <= m and tuple(tau.shape[:-1]) == tuple(batch):
        count = math.prod(batch)
        q = b.custom_call_results(kernels.orgqr, [b.reshape(refl, (count, m, n)), b.reshape(tau, (count, k))],
                                  [((count, m, ncols), refl.dtype)])[0]
        return b.reshape(q, (*batch, m, ncols))
    nb = len(batch)
    qshape = (*batch, m, ncols)
    r = len(qshape)
    q = b.convert(b.compare(b.iota(qshape, r - 2, torch.int64), b.iota(qshape, r - 1, torch.int64), "EQ"),
                  refl.dtype)
    rshape = refl.shape
    rcols = b.iota(rshape, r - 1, torch.int64)
    types = [((), torch.int64), (qshape, refl.dtype), (rshape, refl.dtype), (rshape, torch.int64),
             ((*batch, k), refl.dtype)]

    def cond(bb: Builder, j: Value, *rest: Value) -> Value:
        return bb.compare(j, bb.constant(0, torch.int64), "GE")

    def body(bb: Builder, j: Value, qv: Value, rf: Value, rc: Value, tv: Value) -> list[Value]:
        col = _col(bb, rf, rc, j)
        rid = bb.iota((*batch, m), nb, torch.int64)
        jm = bb.broadcast_in_dim(j, (*batch, m), [])
        zm = bb.constant(0, refl.dtype, (*batch, m))
        v = bb.select(bb.compare(rid, jm, "GT"), col, zm)
        v = bb.select(bb.compare(rid, jm, "EQ"), bb.constant(1, refl.dtype, (*batch, m)), v)
        kk = bb.iota((*batch, k), nb, torch.int64)
        t = bb.reduce(bb.select(bb.compare(kk, bb.broadcast_in_dim(j, (*batch, k), []), "EQ"), tv,
                                bb.constant(0, refl.dtype, (*batch, k))), [nb], bb.constant(0, refl.dtype),
                      "stablehlo.add")
        vb = bb.broadcast_in_dim(v, qshape, list(range(nb + 1)))
        w = bb.reduce(bb.mul(vb, qv), [r - 2], bb.constant(0, refl.dtype), "stablehlo.add")
        tb = bb.broadcast_in_dim(t, qshape, list(range(nb)))
        qv = bb.sub(qv, bb.mul(tb, bb.mul(vb, bb.broadcast_in_dim(w, qshape, [*range(nb), r - 1]))))
        return [bb.sub(j, bb.constant(1, torch.int64)), qv, rf, rc, tv]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    return b.op("stablehlo.while", [b.constant(k - 1, torch.int64), q, refl, rcols, tau], types, region=regions)[1]


@register(aten.geqrf.default)
def _geqrf(ctx: LoweringContext, a: Value) -> tuple[Value, Value]:
    b = ctx.b
    refl, tau = householder_qr(b, b.convert(a, _acc(a.dtype)))
    return b.convert(refl, ctx.out_dtype(0)), b.convert(tau, ctx.out_dtype(1))


@register(aten.linalg_householder_product.default)
def _householder_product(ctx: LoweringContext, refl: Value, tau: Value) -> Value:
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    q = householder_q(b, b.convert(refl, acc), b.convert(tau, acc), refl.shape[-1])
    return b.convert(q, ctx.out_dtype())


@register(aten.linalg_qr.default)
def _linalg_qr(ctx: LoweringContext, a: Value, mode: str = "reduced") -> tuple[Value, Value]:
    b = ctx.b
    acc = _acc(ctx.out_dtype(1))
    *batch, m, n = a.shape
    k = min(m, n)
    refl, tau = householder_qr(b, b.convert(a, acc))
    rows_r = k if mode in ("reduced", "r") else m
    rpart = b.slice(refl, [0] * refl.rank, [*batch, rows_r, n])
    rr = b.iota(rpart.shape, rpart.rank - 2, torch.int64)
    rc = b.iota(rpart.shape, rpart.rank - 1, torch.int64)
    rmat = b.select(b.compare(rc, rr, "GE"), rpart, b.constant(0, acc, rpart.shape))
    if mode == "r":
        qmat = b.constant(0, ctx.out_dtype(0), ctx.out_shape(0))
    else:
        qmat = householder_q(b, refl, tau, k if mode == "reduced" else m)
    return b.convert(qmat, ctx.out_dtype(0)), b.convert(rmat, ctx.out_dtype(1))


@register(aten.ormqr.default)
def _ormqr(ctx: LoweringContext, refl: Value, tau: Value, other: Value, left: bool = True,
           transpose: bool = False) -> Value:
    """op(Q) @ other or other @ op(Q), with Q the full (m x m) product of the reflectors."""
    b = ctx.b
    acc = _acc(ctx.out_dtype())
    m = refl.shape[-2]
    q = householder_q(b, b.convert(refl, acc), b.convert(tau, acc), m)
    if transpose:
        q = _mT(b, q)
    c = b.convert(other, acc)
    q, c = _broadcast_batch(b, q, c)
    r = _bmm(b, q, c) if left else _bmm(b, c, q)
    return b.convert(r, ctx.out_dtype())


# geqrf has no meta kernel in PyTorch; the engine needs one for the output metadata.
_meta_lib = torch.library.Library("aten", "IMPL")


def _geqrf_meta(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *batch, m, n = a.shape
    # column-major matrices (LAPACK's layout), batches contiguous
    bstrides = [math.prod(batch[i + 1:]) * m * n for i in range(len(batch))]
    refl = torch.empty_strided(a.shape, (*bstrides, 1, m), dtype=a.dtype, device="meta")
    return refl, torch.empty((*batch, min(m, n)), dtype=a.dtype, device="meta")


_meta_lib.impl("geqrf", _geqrf_meta, "Meta")
