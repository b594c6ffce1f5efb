"""Symmetric eigendecomposition (``_linalg_eigh``: eigh, eigvalsh) by parallel cyclic Jacobi.

(On the CPU-emulated device, where XLA:CPU runs these sweeps ~1000x slower than LAPACK, the
lowering calls LAPACK's syevd instead: csrc/cpu_linalg.cpp.)

StableHLO has no eigensolver, and XLA's CPU plugin none as a custom call, so this is built
from gathers and elementwise ops, the way XLA's own TPU eigh began: each step rotates n/2
disjoint index pairs (p, q) at once (see jacobi.py) by the Jacobi rotation that zeroes
A[p, q], applied to the rows and columns of A and to the columns of V, then sets the
rotated 2x2 blocks exactly (A[p, q] = 0, A[p, p] - t A[p, q], A[q, q] + t A[p, q]: the
rotations leave a rounding residue there, which would add up over the sweeps). Sweeps
run until one meets no pair with |A[p, q]| above n eps sqrt|A[p, p] A[q, q]|. An odd n
is padded by one decoupled row and column, which no rotation touches.
"""

from __future__ import annotations

import math

import torch

from . import jacobi
from .builder import Builder, Value
from .indexing import take_per_batch, take_rows
from .linalg import diagonal, eye_like, lapack_kernels
from .registry import LoweringContext, register
from .sort import sort_with_indices

aten = torch.ops.aten


def _diagonalize(b: Builder, a: Value) -> tuple[Value, Value]:
    """(A rotated to diagonal, V with A = V diag V^T) for symmetric a (B, m, m), m even."""
    batch, m, _ = a.shape
    h = m // 2
    dt = a.dtype
    eye = eye_like(b, (batch, m, m), dt)
    diag_mask = b.compare(b.iota((batch, m, m), 1, torch.int64), b.iota((batch, m, m), 2, torch.int64), "EQ")

    def step(bb: Builder, p: Value, q: Value, inv: Value, x: Value, v: Value) -> tuple[list[Value], Value]:
        diag = diagonal(bb, x, m)  # (B, m)
        app, aqq = take_rows(bb, diag, p, 1), take_rows(bb, diag, q, 1)
        q_mask = bb.convert(bb.compare(bb.iota((batch, h, m), 2, torch.int64),
                                       bb.broadcast_in_dim(q, (batch, h, m), [1]), "EQ"), dt)
        apq = bb.reduce(bb.mul(take_rows(bb, x, p, 1), q_mask), [2], bb.constant(0.0, dt), "stablehlo.add")
        t, c, s = jacobi.rotation(bb, app, aqq, apq)
        step_max = jacobi.relative_max(bb, apq, jacobi.geometric_mean(bb, bb.unary("abs", app), bb.unary("abs", aqq)))
        x = jacobi.rotate(bb, jacobi.rotate(bb, x, 1, p, q, inv, c, s), 2, p, q, inv, c, s)
        shift = bb.mul(t, apq)
        new_diag = jacobi.in_index_order(bb, bb.sub(app, shift), bb.add(aqq, shift), inv, 1)  # (B, m)
        x = bb.select(diag_mask, bb.broadcast_in_dim(new_diag, (batch, m, m), [0, 2]), x)
        partner = jacobi.in_index_order(bb, q, p, inv, 0)  # each index's pair partner, (m,)
        pair_mask = bb.compare(bb.iota((batch, m, m), 2, torch.int64), bb.broadcast_in_dim(partner, (batch, m, m), [1]),
                               "EQ")
        x = bb.select(pair_mask, bb.constant(0.0, dt, (batch, m, m)), x)
        return [x, jacobi.rotate(bb, v, 2, p, q, inv, c, s)], step_max

    x, v = jacobi.sweeps(b, m, [a, eye], m * jacobi.unit_roundoff(dt), step)
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
    kernels = lapack_kernels(acc)
    if kernels is not None:  # the CPU-emulated device: LAPACK's syevd (csrc/cpu_linalg.cpp)
        upper = b.constant(int(uplo.upper() == "U"), torch.int32)  # the triangle LAPACK reads: eigenvector signs
        w, v = b.custom_call_results(kernels.eigh, [x, upper], [((batch, n), acc), ((batch, n, n), acc)])
        w = b.convert(b.reshape(w, w_shape), w_dtype)
        if not compute_v:
            return w, b.constant(0, v_dtype, v_shape)
        return w, b.convert(b.reshape(v, v_shape), v_dtype)
    m = n + n % 2
    if m != n:  # pad: a zero row and column, and a zero diagonal entry no rotation involves
        x = b.pad(x, b.constant(0.0, acc), [0, 0, 0], [0, 1, 1], [0, 0, 0])
    d, v = _diagonalize(b, x)
    w = diagonal(b, d, m)
    if m != n:
        w = b.slice(w, [0, 0], [batch, n])
        v = b.slice(v, [0, 0, 0], [batch, n, n])
    w, order = sort_with_indices(b, w, 1, descending=False)
    w = b.convert(b.reshape(w, w_shape), w_dtype)
    if not compute_v:
        return w, b.constant(0, v_dtype, v_shape)
    return w, b.convert(b.reshape(take_per_batch(b, v, order), v_shape), v_dtype)
