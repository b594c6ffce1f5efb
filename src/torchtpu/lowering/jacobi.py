"""Parallel cyclic Jacobi: the sweep loop shared by eigh (two-sided) and svd (one-sided).

Each step of a ``stablehlo.while`` treats n/2 disjoint index pairs (p, q) at once. The
pairs follow a round-robin tournament, n - 1 rounds per sweep, so every pair meets once a
sweep; rows and columns are moved by gathers (indexing.take_rows) with the round's indices.
A step reports
the largest off-diagonal measure it met before rotating, and sweeps end after one whose
largest is at most the tolerance (or after MAX_SWEEPS).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from . import target
from .builder import Builder, Value
from .indexing import take_rows

MAX_SWEEPS = 30


def unit_roundoff(dtype: torch.dtype) -> float:
    return target.unit_roundoff(dtype)


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


def in_index_order(b: Builder, firsts: Value, seconds: Value, inv: Value, dim: int) -> Value:
    """Values of the pairs' firsts and seconds (along ``dim``) put back in index order."""
    return take_rows(b, b.concatenate([firsts, seconds], dim), inv, dim)


def rotate(b: Builder, x: Value, dim: int, p: Value, q: Value, inv: Value, c: Value, s: Value) -> Value:
    """Rotate the index pairs (p, q) of x (B, m, m) along ``dim`` (rows 1, columns 2):
    x_p <- c x_p - s x_q, x_q <- s x_p + c x_q, with c, s of shape (B, h)."""
    xp, xq = take_rows(b, x, p, dim), take_rows(b, x, q, dim)
    cb = b.broadcast_in_dim(c, xp.shape, [0, dim])
    sb = b.broadcast_in_dim(s, xp.shape, [0, dim])
    return in_index_order(b, b.sub(b.mul(cb, xp), b.mul(sb, xq)), b.add(b.mul(sb, xp), b.mul(cb, xq)), inv, dim)


def rotation(b: Builder, app: Value, aqq: Value, apq: Value) -> tuple[Value, Value, Value]:
    """(t, c, s) of the Jacobi rotation zeroing the symmetric 2x2 block [[app, apq], [apq, aqq]]:
    t = tan(theta), the smaller root of t^2 + 2 tau t - 1 = 0 with tau = (aqq - app) / (2 apq).

    Computed as sign(tau) |q| / (|d| + hypot(d, q)) with d = aqq - app and q = 2 apq both divided
    by max(|d|, |q|), never through tau itself: once apq is a rounding residue, tau^2 overflows
    (near 1e19 in a float32 exponent range), which gave t = 0 in float32 and NaN in a TPU's
    emulated float64, where an overflow does not stay inf.
    """
    def c_(v: float) -> Value:
        return b.constant(v, app.dtype, app.shape)

    zero = c_(0.0)
    d, q = b.sub(aqq, app), b.mul(c_(2.0), apq)
    scale = b.maximum(b.unary("abs", d), b.unary("abs", q))
    nonzero = b.compare(apq, zero, "NE")
    scale = b.select(nonzero, scale, c_(1.0))
    dn, qn = b.div(d, scale), b.div(q, scale)
    # tau < 0 exactly where d and apq have strictly opposite signs (tau = +-0 counts as positive)
    negative_tau = b.binary("or", b.binary("and", b.compare(d, zero, "LT"), b.compare(apq, zero, "GT")),
                            b.binary("and", b.compare(d, zero, "GT"), b.compare(apq, zero, "LT")))
    sign = b.select(negative_tau, c_(-1.0), c_(1.0))
    hyp = b.unary("sqrt", b.add(b.mul(dn, dn), b.mul(qn, qn)))
    t = b.div(b.mul(sign, b.unary("abs", qn)), b.add(b.unary("abs", dn), hyp))
    t = b.select(nonzero, t, zero)
    c = b.unary("rsqrt", b.add(c_(1.0), b.mul(t, t)))
    return t, c, b.mul(t, c)


def geometric_mean(b: Builder, x: Value, y: Value) -> Value:
    """sqrt(x) sqrt(y) of non-negative x, y: their product would underflow (a rank-deficient
    column's squared norm times another) or overflow where the means do not."""
    return b.mul(b.unary("sqrt", x), b.unary("sqrt", y))


def relative_max(b: Builder, off: Value, scale: Value) -> Value:
    """max |off| / scale over all pairs: 0 where off is 0, inf where only scale is."""
    zero = b.constant(0.0, off.dtype, off.shape)
    positive = b.compare(scale, zero, "GT")
    ratio = b.select(positive, b.div(b.unary("abs", off), b.select(positive, scale, b.constant(1.0, off.dtype,
                                                                                               off.shape))),
                     b.constant(math.inf, off.dtype, off.shape))
    ratio = b.select(b.compare(off, zero, "NE"), ratio, zero)
    return b.reduce(ratio, list(range(off.rank)), b.constant(0.0, off.dtype), "stablehlo.maximum")


StepFn = Callable[..., tuple[list[Value], Value]]


def sweeps(b: Builder, m: int, state: Sequence[Value], tolerance: float, step: StepFn) -> list[Value]:
    """Run ``state, step_max = step(bb, p, q, inv, *state)`` until a sweep's largest step_max
    is at most ``tolerance``; m is the (even) number of indices paired."""
    firsts, seconds, inverse = _tournament(m)
    tables = [b.dense_constant(np.array(t, dtype=np.int64), torch.int64) for t in (firsts, seconds, inverse)]
    dt = state[0].dtype
    scalar = ((), dt)
    types = [((), torch.int64), scalar, scalar] + [(v.shape, v.dtype) for v in state]
    tol = b.constant(tolerance, dt)

    def cond(bb: Builder, k: Value, sweep_max: Value, last_sweep_max: Value, *values: Value) -> Value:
        running = bb.compare(k, bb.constant(MAX_SWEEPS * (m - 1), torch.int64), "LT")
        return bb.binary("and", running, bb.compare(last_sweep_max, tol, "GT"))

    def body(bb: Builder, k: Value, sweep_max: Value, last_sweep_max: Value, *values: Value) -> list[Value]:
        r = bb.binary("remainder", k, bb.constant(m - 1, torch.int64))
        zero = bb.constant(0, torch.int64)
        p, q, inv = (bb.reshape(bb.dynamic_slice(t, [r, zero], [1, t.shape[1]]), (t.shape[1],)) for t in tables)
        new, step_max = step(bb, p, q, inv, *values)
        sweep_max = bb.maximum(sweep_max, step_max)
        ends_sweep = bb.compare(r, bb.constant(m - 2, torch.int64), "EQ")
        last_sweep_max = bb.select(ends_sweep, sweep_max, last_sweep_max)
        sweep_max = bb.select(ends_sweep, bb.constant(0.0, dt), sweep_max)
        return [bb.add(k, bb.constant(1, torch.int64)), sweep_max, last_sweep_max, *new]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    start = [b.constant(0, torch.int64), b.constant(0.0, dt), b.constant(math.inf, dt), *state]
    return b.op("stablehlo.while", start, types, region=regions)[3:]
