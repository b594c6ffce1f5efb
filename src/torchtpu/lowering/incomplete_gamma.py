"""The regularized incomplete gamma functions: igamma = P(a, x) and igammac = Q(a, x) = 1 - P.

As Cephes (igam.c), which PyTorch's CPU kernels follow: P by its power series where x <= 1
or x <= a, Q by its continued fraction elsewhere, and each from the other as 1 - it. Both
iterate per element in a ``stablehlo.while`` until every element has converged.

Both are scaled by the prefactor x^a e^-x / Gamma(a). Computed directly, its logarithm
a log x - x - lgamma(a) cancels terms of size a log a, which in f32 leaves an error of
about 1e-7 a log a (5e-4 at a = 1000). For a > 10 it is computed instead from Stirling's
series as -a (t - log1p(t)) + log(a) / 2 - log(2 pi) / 2 - S(a), t = (x - a) / a, whose
terms are all small where the result matters. PyTorch's kernels use Temme's uniform
expansion where a and x are both large and close; the series and the fraction need more
iterations there (about sqrt(a)), up to _MAX_ITERATIONS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .builder import Builder, Value
from .elementwise import _binary_operands
from .registry import LoweringContext, register
from .special import lgamma_value

aten = torch.ops.aten

_MAX_ITERATIONS = 2000
# The continued fraction's numerators and denominators grow; both are rescaled past _BIG.
_BIG, _BIG_INVERSE = 2.0 ** 52, 2.0 ** -52
_STIRLING_FROM = 10.0
# lgamma(a) - ((a - 1/2) log a - a + log(2 pi) / 2) = sum of these / a^(2k - 1), a > 10
_STIRLING_SERIES = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680)


def _until_converged(b: Builder, done: Value, state: Sequence[Value],
                     step: Callable[..., tuple[list[Value], Value]]) -> list[Value]:
    """Iterate ``state, converged = step(b, *state)`` per element of 1-D values until every
    element has converged (at most _MAX_ITERATIONS times). An element that starts ``done``
    or has converged keeps its state from then on."""
    types = [((), torch.int64), (done.shape, torch.bool)] + [(v.shape, v.dtype) for v in state]

    def cond(bb: Builder, i: Value, finished: Value, *values: Value) -> Value:
        open_ = bb.convert(bb.unary("not", finished), torch.int32)
        any_open = bb.compare(bb.reduce(open_, [0], bb.constant(0, torch.int32), "stablehlo.maximum"),
                              bb.constant(0, torch.int32), "GT")
        return bb.binary("and", bb.compare(i, bb.constant(_MAX_ITERATIONS, torch.int64), "LT"), any_open)

    def body(bb: Builder, i: Value, finished: Value, *values: Value) -> list[Value]:
        new, converged = step(bb, *values)
        kept = [bb.select(finished, old, v) for old, v in zip(values, new)]
        return [bb.add(i, bb.constant(1, torch.int64)), bb.binary("or", finished, converged), *kept]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    outs = b.op("stablehlo.while", [b.constant(0, torch.int64), done, *state], types, region=regions)
    return outs[2:]


def _log_prefactor(b: Builder, a: Value, x: Value) -> Value:
    """log(x^a e^-x / Gamma(a)) for a > 0, x > 0."""
    def c(v: float) -> Value:
        return b.constant(v, a.dtype, a.shape)

    direct = b.sub(b.sub(b.mul(a, b.unary("log", x)), x), lgamma_value(b, a))
    big = b.compare(a, c(_STIRLING_FROM), "GT")
    ab = b.select(big, a, c(_STIRLING_FROM + 1))  # the Stirling form's a, kept in its range
    t = b.div(b.sub(x, ab), ab)
    inv = b.div(c(1.0), ab)
    inv2 = b.mul(inv, inv)
    s = c(_STIRLING_SERIES[-1])
    for k in reversed(_STIRLING_SERIES[:-1]):
        s = b.add(b.mul(s, inv2), c(k))
    s = b.mul(s, inv)
    stirling = b.neg(b.mul(ab, b.sub(t, b.unary("log_plus_one", t))))
    stirling = b.add(stirling, b.mul(c(0.5), b.unary("log", ab)))
    stirling = b.sub(b.sub(stirling, c(0.5 * math.log(2 * math.pi))), s)
    return b.select(big, stirling, direct)


def _lower_series(b: Builder, a: Value, x: Value, done: Value) -> Value:
    """P(a, x) by its power series: prefactor / a * sum_k x^k / ((a + 1) ... (a + k))."""
    eps = b.constant(torch.finfo(a.dtype).eps / 2, a.dtype, a.shape)
    one = b.constant(1.0, a.dtype, a.shape)

    def step(bb: Builder, r: Value, term: Value, total: Value) -> tuple[list[Value], Value]:
        r = bb.add(r, one)
        term = bb.mul(term, bb.div(x, r))
        total = bb.add(total, term)
        # "not greater": an element gone NaN counts as converged instead of running on
        return [r, term, total], bb.unary("not", bb.compare(term, bb.mul(total, eps), "GT"))

    _, _, total = _until_converged(b, done, [a, one, one], step)
    return b.div(b.mul(total, b.unary("exponential", _log_prefactor(b, a, x))), a)


def _upper_fraction(b: Builder, a: Value, x: Value, done: Value) -> Value:
    """Q(a, x) by its continued fraction (Cephes igamc), times the prefactor."""
    def c(v: float) -> Value:
        return b.constant(v, a.dtype, a.shape)

    y = b.sub(c(1.0), a)
    z = b.add(b.add(x, y), c(1.0))
    p2, q2, p1, q1 = c(1.0), x, b.add(x, c(1.0)), b.mul(z, x)
    ans = b.div(p1, q1)

    def step(bb: Builder, n: Value, y: Value, z: Value, p2: Value, q2: Value, p1: Value, q1: Value,
             ans: Value) -> tuple[list[Value], Value]:
        n, y, z = bb.add(n, c(1.0)), bb.add(y, c(1.0)), bb.add(z, c(2.0))
        yn = bb.mul(y, n)
        pk = bb.sub(bb.mul(p1, z), bb.mul(p2, yn))
        qk = bb.sub(bb.mul(q1, z), bb.mul(q2, yn))
        nonzero = bb.compare(qk, c(0.0), "NE")
        r = bb.div(pk, bb.select(nonzero, qk, c(1.0)))
        change = bb.select(nonzero, bb.unary("abs", bb.div(bb.sub(ans, r), r)), c(1.0))
        ans = bb.select(nonzero, r, ans)
        scale = bb.select(bb.compare(bb.unary("abs", pk), c(_BIG), "GT"), c(_BIG_INVERSE), c(1.0))
        p2, p1, q2, q1 = bb.mul(p1, scale), bb.mul(pk, scale), bb.mul(q1, scale), bb.mul(qk, scale)
        converged = bb.unary("not", bb.compare(change, c(torch.finfo(a.dtype).eps / 2), "GT"))
        return [n, y, z, p2, q2, p1, q1, ans], converged

    *_, ans = _until_converged(b, done, [c(0.0), y, z, p2, q2, p1, q1, ans], step)
    return b.mul(ans, b.unary("exponential", _log_prefactor(b, a, x)))


def _incomplete_gamma(ctx: LoweringContext, a_arg: Any, x_arg: Any, upper: bool) -> Value:
    a, x, out = _binary_operands(ctx, a_arg, x_arg)
    b = ctx.b
    shape = a.shape
    n = math.prod(shape)
    a, x = b.reshape(a, [n]), b.reshape(x, [n])

    def c(v: float) -> Value:
        return b.constant(v, a.dtype, [n])

    zero, one = c(0.0), c(1.0)
    a_inf, x_inf = b.compare(a, c(math.inf), "EQ"), b.compare(x, c(math.inf), "EQ")
    nan_in = b.binary("or", b.compare(a, a, "NE"), b.compare(x, x, "NE"))
    # PyTorch's special cases (calc_igamma / calc_igammac), in its order of precedence
    cases = [
        (b.binary("or", b.compare(x, zero, "LT"), b.compare(a, zero, "LT")), c(math.nan)),
        (b.compare(a, zero, "EQ"), b.select(b.compare(x, zero, "GT"), c(0.0 if upper else 1.0), c(math.nan))),
        (b.compare(x, zero, "EQ"), c(1.0 if upper else 0.0)),
        (a_inf, b.select(x_inf, c(math.nan), c(1.0 if upper else 0.0))),
        (x_inf, c(0.0 if upper else 1.0)),
        (nan_in, c(math.nan)),
    ]
    special = cases[0][0]
    for pred, _ in cases[1:]:
        special = b.binary("or", special, pred)
    # the regular elements run with a = x = 1 in the method they do not use, and special ones in both
    use_fraction = b.binary("and", b.compare(x, one, "GT"), b.compare(x, a, "GT"))
    fraction_done = b.binary("or", special, b.unary("not", use_fraction))
    series_done = b.binary("or", special, use_fraction)
    lower = _lower_series(b, b.select(series_done, one, a), b.select(series_done, one, x), series_done)
    upper_ = _upper_fraction(b, b.select(fraction_done, one, a), b.select(fraction_done, one, x), fraction_done)
    if upper:
        r = b.select(use_fraction, upper_, b.sub(one, lower))
    else:
        r = b.select(use_fraction, b.sub(one, upper_), lower)
    for pred, value in reversed(cases):
        r = b.select(pred, value, r)
    return b.convert(b.reshape(r, list(shape)), out)


@register(aten.igamma.default)
def _igamma(ctx: LoweringContext, a: Any, x: Any) -> Value:
    return _incomplete_gamma(ctx, a, x, upper=False)


@register(aten.igammac.default)
def _igammac(ctx: LoweringContext, a: Any, x: Any) -> Value:
    return _incomplete_gamma(ctx, a, x, upper=True)
