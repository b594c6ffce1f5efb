"""Symmetric eigendecomposition (``_linalg_eigh``: eigh, eigvalsh) by parallel cyclic Jacobi.

StableHLO has no eigensolver, and XLA's CPU plugin none as a custom call, so this is built
from gathers and elementwise ops, the way XLA's own TPU eigh began: each step rotates n/2
disjoint index pairs (p, q) at once, by the Jacobi rotation that zeroes A[p, q], applied to
the rows and columns of A and to the columns of V. The pairs follow a round-robin
tournament (n - 1 rounds per sweep, every pair once), and sweeps run until one meets no
pair with |A[p, q]| above n eps sqrt|A[p, p] A[q, q]| (at most _MAX_SWEEPS sweeps).
Jacobi is accurate to the matrix's rounding level (often better than LAPACK's
tridiagonal methods for small eigenvalues). An odd n is padded by one decoupled row and
column, which no rotation touches.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .builder import Builder, Value
from .registry import LoweringContext, register
from .sort import sort_with_indices

aten = torch.ops.aten

_MAX_SWEEPS = 30
_EPSILON = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def _tournament(m: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Per round of a round-robin over m (even) indices: the pairs' first and second
    indices, and where each index lands in the round's order (firsts, then seconds)."""
    others = list(range(1, m))
    firsts, seconds, inverse = [], [], []
    for r in range(m - 1):
        order = [0, *others[r:], *others[:r]]
        p = [order[i] for i in range(m // 2)]
        q = [order[m - 1 - i] for i in range(m // 2)]
        position = [0] * m
        for k, i in enumerate(p + q):
            position[i] = k
        firsts.append(p)
        seconds.append(q)
        inverse.append(position)
    return firsts, seconds, inverse


def _take(b: Builder, x: Value, idx: Value, dim: int) -> Value:
    """x (B, m, m) or (B, m) indexed along ``dim`` (1 or 2) by the 1-D ``idx``."""
    slice_sizes = list(x.shape)
    slice_sizes[dim] = 1
    offset_dims = [d for d in range(x.rank) if d != dim]
    shape = list(x.shape)
    shape[dim] = idx.shape[0]
    attrs = (f"dimension_numbers = #stablehlo.gather<offset_dims = {offset_dims}, collapsed_slice_dims = [{dim}], "
             f"start_index_map = [{dim}], index_vector_dim = 1>, "
             f"slice_sizes = array<i64: {', '.join(map(str, slice_sizes))}>, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [x, b.reshape(idx, (idx.shape[0], 1))], shape, x.dtype, attrs=attrs)


def _rotate(b: Builder, x: Value, dim: int, p: Value, q: Value, inv: Value, c: Value, s: Value) -> Value:
    """Rotate the index pairs (p, q) of x along ``dim`` (rows 1, columns 2):
    x_p <- c x_p - s x_q, x_q <- s x_p + c x_q, with c, s of shape (B, h)."""
    xp, xq = _take(b, x, p, dim), _take(b, x, q, dim)
    cb = b.broadcast_in_dim(c, xp.shape, [0, dim])
    sb = b.broadcast_in_dim(s, xp.shape, [0, dim])
    new_p = b.sub(b.mul(cb, xp), b.mul(sb, xq))
    new_q = b.add(b.mul(sb, xp), b.mul(cb, xq))
    return _take(b, b.concatenate([new_p, new_q], dim), inv, dim)


def _jacobi(b: Builder, a: Value) -> tuple[Value, Value]:
    """(A rotated to diagonal, V with A = V diag V^T) for symmetric a (B, m, m), m even."""
    batch, m, _ = a.shape
    h = m // 2
    dt = a.dtype
    firsts, seconds, inverse = _tournament(m)
    tables = [b.dense_constant(np.array(t, dtype=np.int64), torch.int64) for t in (firsts, seconds, inverse)]
    eye = b.convert(b.compare(b.iota((batch, m, m), 1, torch.int64), b.iota((batch, m, m), 2, torch.int64), "EQ"), dt)
    diag_mask = b.compare(b.iota((batch, m, m), 1, torch.int64), b.iota((batch, m, m), 2, torch.int64), "EQ")
    tol = b.constant(m * _EPSILON[dt], dt)
    scalar = ((), dt)
    types = [((), torch.int64), ((batch, m, m), dt), ((batch, m, m), dt), scalar, scalar]

    def cond(bb: Builder, k: Value, x: Value, v: Value, sweep_max: Value, last_sweep_max: Value) -> Value:
        running = bb.compare(k, bb.constant(_MAX_SWEEPS * (m - 1), torch.int64), "LT")
        return bb.binary("and", running, bb.compare(last_sweep_max, tol, "GT"))

    def body(bb: Builder, k: Value, x: Value, v: Value, sweep_max: Value, last_sweep_max: Value) -> list[Value]:
        r = bb.binary("remainder", k, bb.constant(m - 1, torch.int64))
        zero = bb.constant(0, torch.int64)
        p, q, inv = (bb.reshape(bb.dynamic_slice(t, [r, zero], [1, t.shape[1]]), (t.shape[1],)) for t in tables)
        rows_p = _take(bb, x, p, 1)  # (B, h, m)
        diag = bb.reduce(bb.mul(x, eye), [2], bb.constant(0.0, dt), "stablehlo.add")  # (B, m)
        app, aqq = _take(bb, diag, p, 1), _take(bb, diag, q, 1)
        q_mask = bb.convert(bb.compare(bb.iota((batch, h, m), 2, torch.int64),
                                       bb.broadcast_in_dim(q, (batch, h, m), [1]), "EQ"), dt)
        apq = bb.reduce(bb.mul(rows_p, q_mask), [2], bb.constant(0.0, dt), "stablehlo.add")  # (B, h)

        def c_(val: float) -> Value:
            return bb.constant(val, dt, (batch, h))

        nonzero = bb.compare(apq, c_(0.0), "NE")
        tau = bb.div(bb.sub(aqq, app), bb.mul(c_(2.0), bb.select(nonzero, apq, c_(1.0))))
        sign = bb.select(bb.compare(tau, c_(0.0), "LT"), c_(-1.0), c_(1.0))
        t = bb.div(sign, bb.add(bb.unary("abs", tau), bb.unary("sqrt", bb.add(c_(1.0), bb.mul(tau, tau)))))
        t = bb.select(nonzero, t, c_(0.0))
        c = bb.unary("rsqrt", bb.add(c_(1.0), bb.mul(t, t)))
        s = bb.mul(t, c)
        # |A[p, q]| against its diagonal before the rotation: 0 when already zero, inf when
        # the diagonal is (the pair still needs its rotation)
        scale = bb.unary("sqrt", bb.unary("abs", bb.mul(app, aqq)))
        big = bb.select(bb.compare(scale, c_(0.0), "GT"), bb.div(bb.unary("abs", apq), bb.select(
            bb.compare(scale, c_(0.0), "GT"), scale, c_(1.0))), c_(math.inf))
        ratio = bb.select(nonzero, big, c_(0.0))
        step_max = bb.reduce(ratio, [0, 1], bb.constant(0.0, dt), "stablehlo.maximum")
        sweep_max = bb.maximum(sweep_max, step_max)
        ends_sweep = bb.compare(r, bb.constant(m - 2, torch.int64), "EQ")
        last_sweep_max = bb.select(ends_sweep, sweep_max, last_sweep_max)
        sweep_max = bb.select(ends_sweep, bb.constant(0.0, dt), sweep_max)
        x = _rotate(bb, _rotate(bb, x, 1, p, q, inv, c, s), 2, p, q, inv, c, s)
        # the rotated 2x2 blocks exactly: A[p, q] = 0, A[p, p] - t A[p, q] and A[q, q] + t A[p, q]
        # (the rotations above leave a rounding residue there, which adds up over the sweeps)
        shift = bb.mul(t, apq)
        new_diag = _take(bb, bb.concatenate([bb.sub(app, shift), bb.add(aqq, shift)], 1), inv, 1)  # (B, m)
        x = bb.select(diag_mask, bb.broadcast_in_dim(new_diag, (batch, m, m), [0, 2]), x)
        partner = _take(bb, bb.concatenate([q, p], 0), inv, 0)  # each index's pair partner, (m,)
        pair_mask = bb.compare(bb.iota((batch, m, m), 2, torch.int64), bb.broadcast_in_dim(partner, (batch, m, m), [1]),
                               "EQ")
        x = bb.select(pair_mask, bb.constant(0.0, dt, (batch, m, m)), x)
        v = _rotate(bb, v, 2, p, q, inv, c, s)
        return [bb.add(k, bb.constant(1, torch.int64)), x, v, sweep_max, last_sweep_max]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    start = [b.constant(0, torch.int64), a, eye, b.constant(0.0, dt), b.constant(math.inf, dt)]
    _, x, v, _, _ = b.op("stablehlo.while", start, types, region=regions)
    return x, v


@register(aten._linalg_eigh.default)
def _linalg_eigh(ctx: LoweringContext, a: Value, uplo: str = "L", compute_v: bool = True) -> tuple[Value, Value]:
    if a.dtype.is_complex:
        raise NotImplementedError("torchtpu: linalg.eigh of a complex (Hermitian) matrix is not implemented")
    b = ctx.b
    *batch_shape, n, _ = a.shape
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    w_dtype, w_shape = ctx.out_dtype(0), ctx.out_shape(0)
    v_dtype, v_shape = ctx.out_dtype(1), ctx.out_shape(1)
    batch = math.prod(batch_shape)
    if n == 0 or batch == 0:
        return b.constant(0, w_dtype, w_shape), b.constant(0, v_dtype, v_shape)
    x = b.reshape(b.convert(a, acc), (batch, n, n))
    # the triangle named by UPLO, mirrored
    rows, cols = b.iota((batch, n, n), 1, torch.int64), b.iota((batch, n, n), 2, torch.int64)
    keep = b.compare(rows, cols, "GE" if uplo.upper() == "L" else "LE")
    x = b.select(keep, x, b.transpose(x, [0, 2, 1]))
    m = n + n % 2
    if m != n:  # pad: a zero row and column, and a zero diagonal entry no rotation involves
        x = b.pad(x, b.constant(0.0, acc), [0, 0, 0], [0, 1, 1], [0, 0, 0])
    d, v = _jacobi(b, x)
    eye = b.convert(b.compare(b.iota((batch, m, m), 1, torch.int64), b.iota((batch, m, m), 2, torch.int64), "EQ"), acc)
    w = b.reduce(b.mul(d, eye), [2], b.constant(0.0, acc), "stablehlo.add")
    if m != n:
        w = b.slice(w, [0, 0], [batch, n])
        v = b.slice(v, [0, 0, 0], [batch, n, n])
    w, order = sort_with_indices(b, w, 1, descending=False)
    w = b.convert(b.reshape(w, w_shape), w_dtype)
    if not compute_v:
        return w, b.constant(0, v_dtype, v_shape)
    shape = (batch, n, n)
    coords = [b.iota(shape, 0, torch.int64), b.iota(shape, 1, torch.int64), b.broadcast_in_dim(order, shape, [0, 2])]
    coords = b.concatenate([b.reshape(c, (*shape, 1)) for c in coords], 3)
    attrs = ("dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1, 2], start_index_map = [0, 1, 2], "
             "index_vector_dim = 3>, slice_sizes = array<i64: 1, 1, 1>, indices_are_sorted = false")
    v = b.op1("stablehlo.gather", [v, coords], shape, acc, attrs=attrs)
    return w, b.convert(b.reshape(v, v_shape), v_dtype)
