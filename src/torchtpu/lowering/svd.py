"""Singular value decomposition (``_linalg_svd``: svd, svdvals, pinv, matrix_rank, norms)
by one-sided (Hestenes) Jacobi. (On the CPU-emulated device: LAPACK's gesdd, see eigh.py.)

The columns of A (of A^T when A is wide) are rotated pairwise until they are mutually
orthogonal: the rotation of columns p, q is the two-sided Jacobi rotation of A^T A's
2x2 block (|a_p|^2, a_p . a_q, |a_q|^2), so A^T A is never formed and small singular
values keep their relative accuracy. The same rotations applied to I give V. The pairs
follow a round-robin tournament, n/2 at a time (see jacobi.py), until a whole sweep meets
no pair whose cosine exceeds max(m, n) eps. Then sigma_j = |a_j|,
and U is the orthonormal factor of a QR of the columns a_j / sigma_j (with the signs
of R's diagonal taken out): that completes U where sigma_j = 0 and, with
``full_matrices``, to a square basis.
"""

from __future__ import annotations

import math

import torch

from . import jacobi
from .builder import Builder, Value
from .indexing import take_per_batch, take_rows
from .linalg import diagonal, eye_like, householder_q, householder_qr, lapack_kernels
from .registry import LoweringContext, register
from .sort import sort_with_indices

aten = torch.ops.aten

def _sum_rows(b: Builder, x: Value) -> Value:
    return b.reduce(x, [1], b.constant(0.0, x.dtype), "stablehlo.add")


def _orthogonalize(b: Builder, x: Value) -> tuple[Value, Value]:
    """(x with mutually orthogonal columns, V: the rotations applied to I) for x (B, r, c), c even."""
    batch, rows, cols = x.shape

    def step(bb: Builder, p: Value, q: Value, inv: Value, xv: Value, v: Value) -> tuple[list[Value], Value]:
        cp, cq = take_rows(bb, xv, p, 2), take_rows(bb, xv, q, 2)  # (B, rows, h)
        alpha, beta, gamma = _sum_rows(bb, bb.mul(cp, cp)), _sum_rows(bb, bb.mul(cq, cq)), _sum_rows(bb, bb.mul(cp, cq))
        _, c, s = jacobi.rotation(bb, alpha, beta, gamma)
        cosine = jacobi.relative_max(bb, gamma, jacobi.geometric_mean(bb, alpha, beta))
        return [jacobi.rotate(bb, xv, 2, p, q, inv, c, s), jacobi.rotate(bb, v, 2, p, q, inv, c, s)], cosine

    tolerance = max(rows, cols) * jacobi.unit_roundoff(x.dtype)
    x, v = jacobi.sweeps(b, cols, [x, eye_like(b, (batch, cols, cols), x.dtype)], tolerance, step)
    return x, v


def _orthonormal_basis(b: Builder, u: Value, ncols: int) -> Value:
    """The first ``ncols`` columns of Q of u = QR (B, r, k), Q's first k columns signed as u's."""
    batch, _, k = u.shape
    refl, tau = householder_qr(b, u)
    q = householder_q(b, refl, tau, ncols)
    diag = diagonal(b, refl, k)  # R's, (B, k)
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
        u = out(0, eye_like(b, (batch, m, m), acc)) if full_matrices and batch else empty(0)
        vh = out(2, eye_like(b, (batch, n, n), acc)) if full_matrices and batch else empty(2)
        return u, s, vh
    x = b.reshape(b.convert(a, acc), (batch, m, n))
    kernels = lapack_kernels(acc)
    if kernels is not None:  # the CPU-emulated device: LAPACK's gesdd (csrc/cpu_linalg.cpp)
        if not compute_uv:
            return empty(0), out(1, b.custom_call_results(kernels.svd, [x], [((batch, k), acc)])[0]), empty(2)
        j_u, j_v = (m, n) if full_matrices else (k, k)
        u, s, vh = b.custom_call_results(kernels.svd, [x], [((batch, m, j_u), acc), ((batch, k), acc),
                                                            ((batch, j_v, n), acc)])
        return out(0, u), out(1, s), out(2, vh)
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
    x, v = take_per_batch(b, x, order), take_per_batch(b, v, order)
    positive = b.compare(sigma, b.constant(0.0, acc, sigma.shape), "GT")
    scale = b.select(positive, b.div(b.constant(1.0, acc, sigma.shape), b.select(positive, sigma, b.constant(
        1.0, acc, sigma.shape))), b.constant(0.0, acc, sigma.shape))
    u = b.mul(x, b.broadcast_in_dim(scale, x.shape, [0, 2]))
    u = _orthonormal_basis(b, u, rows if full_matrices else cols)
    # tall: U = u, Vh = v^T; wide: U = v, Vh = u^T
    left, right = (v, u) if wide else (u, v)
    return out(0, left), out(1, sigma), out(2, b.transpose(right, [0, 2, 1]))
