"""Singular value decomposition (``_linalg_svd``: svd, svdvals, pinv, matrix_rank, norms)
by one-sided (Hestenes) Jacobi.

The columns of A (of A^T when A is wide) are rotated pairwise until they are mutually
orthogonal: the rotation of columns p, q is the two-sided Jacobi rotation of A^T A's
2x2 block (|a_p|^2, a_p . a_q, |a_q|^2), so A^T A is never formed and small singular
values keep their relative accuracy. The same rotations applied to I give V. The pairs
follow eigh's round-robin tournament, n/2 at a time, until a whole sweep meets no pair
whose cosine exceeds max(m, n) eps (at most _MAX_SWEEPS sweeps). Then sigma_j = |a_j|,
and U is the orthonormal factor of a QR of the columns a_j / sigma_j (with the signs
of R's diagonal taken out): that completes U where sigma_j = 0 and, with
``full_matrices``, to a square basis.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .builder import Builder, Value
from .eigh import _rotate, _take, _tournament
from .linalg import householder_q, householder_qr
from .registry import LoweringContext, register
from .sort import sort_with_indices

aten = torch.ops.aten

_MAX_SWEEPS = 30
_EPSILON = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def _sum_rows(b: Builder, x: Value) -> Value:
    return b.reduce(x, [1], b.constant(0.0, x.dtype), "stablehlo.add")


def _orthogonalize(b: Builder, x: Value) -> tuple[Value, Value]:
    """(x with mutually orthogonal columns, V: the rotations applied to I) for x (B, r, c), c even."""
    batch, rows, cols = x.shape
    dt = x.dtype
    h = cols // 2
    firsts, seconds, inverse = _tournament(cols)
    tables = [b.dense_constant(np.array(t, dtype=np.int64), torch.int64) for t in (firsts, seconds, inverse)]
    eye = b.convert(b.compare(b.iota((batch, cols, cols), 1, torch.int64),
                              b.iota((batch, cols, cols), 2, torch.int64), "EQ"), dt)
    tol = b.constant(max(rows, cols) * _EPSILON[dt], dt)
    scalar = ((), dt)
    types = [((), torch.int64), (x.shape, dt), (eye.shape, dt), scalar, scalar]

    def cond(bb: Builder, k: Value, xv: Value, v: Value, sweep_max: Value, last_sweep_max: Value) -> Value:
        running = bb.compare(k, bb.constant(_MAX_SWEEPS * (cols - 1), torch.int64), "LT")
        return bb.binary("and", running, bb.compare(last_sweep_max, tol, "GT"))

    def body(bb: Builder, k: Value, xv: Value, v: Value, sweep_max: Value, last_sweep_max: Value) -> list[Value]:
        r = bb.binary("remainder", k, bb.constant(cols - 1, torch.int64))
        zero = bb.constant(0, torch.int64)
        p, q, inv = (bb.reshape(bb.dynamic_slice(t, [r, zero], [1, t.shape[1]]), (t.shape[1],)) for t in tables)
        cp, cq = _take(bb, xv, p, 2), _take(bb, xv, q, 2)  # (B, rows, h)
        alpha, beta, gamma = _sum_rows(bb, bb.mul(cp, cp)), _sum_rows(bb, bb.mul(cq, cq)), _sum_rows(bb, bb.mul(cp, cq))

        def c_(val: float) -> Value:
            return bb.constant(val, dt, (batch, h))

        nonzero = bb.compare(gamma, c_(0.0), "NE")
        zeta = bb.div(bb.sub(beta, alpha), bb.mul(c_(2.0), bb.select(nonzero, gamma, c_(1.0))))
        sign = bb.select(bb.compare(zeta, c_(0.0), "LT"), c_(-1.0), c_(1.0))
        t = bb.div(sign, bb.add(bb.unary("abs", zeta), bb.unary("sqrt", bb.add(c_(1.0), bb.mul(zeta, zeta)))))
        t = bb.select(nonzero, t, c_(0.0))
        c = bb.unary("rsqrt", bb.add(c_(1.0), bb.mul(t, t)))
        s = bb.mul(t, c)
        # the pair's cosine before its rotation; 0 for a zero column
        norms = bb.unary("sqrt", bb.mul(alpha, beta))
        cosine = bb.select(bb.compare(norms, c_(0.0), "GT"),
                           bb.div(bb.unary("abs", gamma), bb.select(bb.compare(norms, c_(0.0), "GT"), norms, c_(1.0))),
                           c_(0.0))
        step_max = bb.reduce(cosine, [0, 1], bb.constant(0.0, dt), "stablehlo.maximum")
        sweep_max = bb.maximum(sweep_max, step_max)
        ends_sweep = bb.compare(r, bb.constant(cols - 2, torch.int64), "EQ")
        last_sweep_max = bb.select(ends_sweep, sweep_max, last_sweep_max)
        sweep_max = bb.select(ends_sweep, bb.constant(0.0, dt), sweep_max)
        xv = _rotate(bb, xv, 2, p, q, inv, c, s)
        v = _rotate(bb, v, 2, p, q, inv, c, s)
        return [bb.add(k, bb.constant(1, torch.int64)), xv, v, sweep_max, last_sweep_max]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    start = [b.constant(0, torch.int64), x, eye, b.constant(0.0, dt), b.constant(math.inf, dt)]
    _, x, v, _, _ = b.op("stablehlo.while", start, types, region=regions)
    return x, v


def _take_columns(b: Builder, x: Value, order: Value) -> Value:
    """x (B, r, c) with its columns in ``order`` (B, c) per batch member."""
    shape = x.shape
    coords = [b.iota(shape, 0, torch.int64), b.iota(shape, 1, torch.int64), b.broadcast_in_dim(order, shape, [0, 2])]
    coords = b.concatenate([b.reshape(c, (*shape, 1)) for c in coords], 3)
    attrs = ("dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1, 2], start_index_map = [0, 1, 2], "
             "index_vector_dim = 3>, slice_sizes = array<i64: 1, 1, 1>, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [x, coords], shape, x.dtype, attrs=attrs)


def _eye(b: Builder, batch: int, n: int, dtype: torch.dtype) -> Value:
    shape = (batch, n, n)
    return b.convert(b.compare(b.iota(shape, 1, torch.int64), b.iota(shape, 2, torch.int64), "EQ"), dtype)


def _orthonormal_basis(b: Builder, u: Value, ncols: int) -> Value:
    """The first ``ncols`` columns of Q of u = QR (B, r, k), Q's first k columns signed as u's."""
    batch, _, k = u.shape
    refl, tau = householder_qr(b, u)
    q = householder_q(b, refl, tau, ncols)
    rows_i, cols_i = b.iota(refl.shape, 1, torch.int64), b.iota(refl.shape, 2, torch.int64)
    diag = b.reduce(b.select(b.compare(rows_i, cols_i, "EQ"), refl, b.constant(0.0, u.dtype, refl.shape)), [1],
                    b.constant(0.0, u.dtype), "stablehlo.add")  # (B, k)
    sign = b.select(b.compare(diag, b.constant(0.0, u.dtype, diag.shape), "LT"),
                    b.constant(-1.0, u.dtype, diag.shape), b.constant(1.0, u.dtype, diag.shape))
    if ncols > k:
        sign = b.concatenate([sign, b.constant(1.0, u.dtype, (batch, ncols - k))], 1)
    return b.mul(q, b.broadcast_in_dim(sign, q.shape, [0, 2]))


@register(aten._linalg_svd.default)
def _linalg_svd(ctx: LoweringContext, a: Value, full_matrices: bool = True, compute_uv: bool = True,
                driver: str | None = None) -> tuple[Value, Value, Value]:
    if a.dtype.is_complex:
        raise NotImplementedError("torchtpu: linalg.svd of a complex matrix is not implemented")
    b = ctx.b
    *batch_shape, m, n = a.shape
    batch = math.prod(batch_shape)
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    k = min(m, n)
    outs = [(ctx.out_dtype(i), ctx.out_shape(i)) for i in range(3)]

    def out(i: int, v: Value) -> Value:
        return b.convert(b.reshape(v, outs[i][1]), outs[i][0])

    def empty(i: int) -> Value:
        return b.constant(0, outs[i][0], outs[i][1])

    if batch == 0 or k == 0:
        s = empty(1)
        if not compute_uv:
            return empty(0), s, empty(2)
        u = out(0, _eye(b, batch, m, acc)) if full_matrices and batch else empty(0)
        vh = out(2, _eye(b, batch, n, acc)) if full_matrices and batch else empty(2)
        return u, s, vh
    x = b.reshape(b.convert(a, acc), (batch, m, n))
    wide = m < n
    if wide:  # A = U S Vh  <=>  A^T = Vh^T S U^T
        x = b.transpose(x, [0, 2, 1])
    rows, cols = x.shape[1], x.shape[2]
    padded = cols + cols % 2
    if padded != cols:  # a zero column: no rotation involves it
        x = b.pad(x, b.constant(0.0, acc), [0, 0, 0], [0, 0, 1], [0, 0, 0])
    x, v = _orthogonalize(b, x)
    if padded != cols:
        x = b.slice(x, [0, 0, 0], [batch, rows, cols])
        v = b.slice(v, [0, 0, 0], [batch, cols, cols])
    sigma = b.unary("sqrt", _sum_rows(b, b.mul(x, x)))  # (B, cols)
    sigma, order = sort_with_indices(b, sigma, 1, descending=True)
    if not compute_uv:
        return empty(0), out(1, sigma), empty(2)
    x, v = _take_columns(b, x, order), _take_columns(b, v, order)
    positive = b.compare(sigma, b.constant(0.0, acc, sigma.shape), "GT")
    scale = b.select(positive, b.div(b.constant(1.0, acc, sigma.shape), b.select(positive, sigma, b.constant(
        1.0, acc, sigma.shape))), b.constant(0.0, acc, sigma.shape))
    u = b.mul(x, b.broadcast_in_dim(scale, x.shape, [0, 2]))
    u = _orthonormal_basis(b, u, rows if full_matrices else cols)
    # tall: U = u, Vh = v^T; wide: U = v, Vh = u^T
    left, right = (v, u) if wide else (u, v)
    return out(0, left), out(1, sigma), out(2, b.transpose(right, [0, 2, 1]))
