"""Accurate forms of the functions XLA expands itself (CHLO), for a TPU.

XLA writes ``chlo.sinh``, ``asinh``, ``erf_inv``... in terms of its own exp and log, which on a
TPU are fast approximations that take no accuracy setting there (measured on a v5e: asinh and
acosh off by 1.1e-4, atanh by 6.5e-5, erfinv by 2.5e-5). Written here with StableHLO's exp,
expm1, log, log1p and sqrt, which the builder asks for at their highest accuracy on a TPU
(``target.accurate_transcendentals``), they keep the CPU's few-ulp accuracy. They serve f32
(and the low-precision floats, computed in f32; f64 keeps XLA's forms); signs, zeros,
infinities and NaNs as PyTorch's CPU kernels give them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .builder import Builder, Value

_LN2 = math.log(2.0)
# Above this |x|, x*x overflows in f32: asinh(x) and acosh(x) are then log(|x|) + log(2).
_HUGE = 1e18


def _c(b: Builder, value: float, like: Value) -> Value:
    return b.constant(value, like.dtype, like.shape)


def _with_sign_of(b: Builder, magnitude: Value, x: Value) -> Value:
    """magnitude * sign(x): keeps -0 for x = -0 and NaN for NaN."""
    return b.mul(magnitude, b.unary("sign", x))


# Below this |x|, e^|x| is finite in f32: sinh and cosh take it whole; above, e^(|x|/2) squared.
_EXP_FINITE = 88.0


def _exp_parts(b: Builder, a: Value) -> tuple[Value, Value]:
    """(e^a / 2, e^-a / 2) for a >= 1, each from one accurate exp: below 88 from e^a (one rounding
    of the exp, where squaring e^(a/2) doubled it: cosh was 1.4e-6 relative off on a v5e), above
    from h = e^(a/2) as h * (h / 2), which stays finite while sinh and cosh do."""
    near = b.compare(a, _c(b, _EXP_FINITE, a), "LT")
    e = b.unary("exponential", b.select(near, a, _c(b, 0.0, a)))
    h = b.unary("exponential", b.mul(a, _c(b, 0.5, a)))
    big = b.select(near, b.mul(e, _c(b, 0.5, a)), b.mul(h, b.mul(h, _c(b, 0.5, a))))
    small = b.select(near, b.div(_c(b, 0.5, a), e), _c(b, 0.0, a))
    return big, small


def sinh(b: Builder, x: Value) -> Value:
    a = b.unary("abs", x)
    s = b.unary("exponential_minus_one", a)
    small = b.mul(_c(b, 0.5, a), b.add(s, b.div(s, b.add(s, _c(b, 1.0, a)))))  # (e^a - e^-a)/2 from expm1
    up, down = _exp_parts(b, a)
    r = b.select(b.compare(a, _c(b, 1.0, a), "LT"), small, b.sub(up, down))
    return _with_sign_of(b, r, x)


def cosh(b: Builder, x: Value) -> Value:
    a = b.unary("abs", x)
    s = b.unary("exponential_minus_one", a)
    one = _c(b, 1.0, a)
    small = b.add(one, b.div(b.mul(s, s), b.mul(_c(b, 2.0, a), b.add(one, s))))  # 1 + (e^a - 1)^2 / (2 e^a)
    up, down = _exp_parts(b, a)
    return b.select(b.compare(a, one, "LT"), small, b.add(up, down))


def asinh(b: Builder, x: Value) -> Value:
    a = b.unary("abs", x)
    one = _c(b, 1.0, a)
    sq = b.mul(a, a)
    r = b.unary("log_plus_one", b.add(a, b.div(sq, b.add(one, b.unary("sqrt", b.add(one, sq))))))
    huge = b.add(b.unary("log", a), _c(b, _LN2, a))
    return _with_sign_of(b, b.select(b.compare(a, _c(b, _HUGE, a), "GT"), huge, r), x)


def acosh(b: Builder, x: Value) -> Value:
    t = b.sub(x, _c(b, 1.0, x))
    r = b.unary("log_plus_one", b.add(t, b.unary("sqrt", b.add(b.add(t, t), b.mul(t, t)))))
    huge = b.add(b.unary("log", x), _c(b, _LN2, x))
    return b.select(b.compare(x, _c(b, _HUGE, x), "GT"), huge, r)  # x < 1: sqrt of a negative, NaN


def atanh(b: Builder, x: Value) -> Value:
    a = b.unary("abs", x)
    r = b.mul(_c(b, 0.5, a), b.unary("log_plus_one", b.div(b.add(a, a), b.sub(_c(b, 1.0, a), a))))
    return _with_sign_of(b, r, x)


# Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing Gems, 2010):
# polynomials in w = -log(1 - x^2), one below w = 5 and one above.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(b: Builder, coefficients: tuple[float, ...], w: Value) -> Value:
    p = _c(b, coefficients[0], w)
    for k in coefficients[1:]:
        p = b.add(b.mul(p, w), _c(b, k, w))
    return p


def erfinv(b: Builder, x: Value) -> Value:
    one = _c(b, 1.0, x)
    w = b.neg(b.unary("log_plus_one", b.neg(b.mul(x, x))))
    central = _horner(b, _ERFINV_CENTRAL, b.sub(w, _c(b, 2.5, x)))
    tail = _horner(b, _ERFINV_TAIL, b.sub(b.unary("sqrt", w), _c(b, 3.0, x)))
    r = b.mul(b.select(b.compare(w, _c(b, 5.0, x), "LT"), central, tail), x)
    edge = b.compare(b.unary("abs", x), one, "EQ")  # erfinv(+-1) = +-inf
    return b.select(edge, b.mul(x, _c(b, math.inf, x)), r)


# digamma's asymptotic series past z = 6: -sum B_2k / (2k z^2k), k = 1..5 (the next term is < 1e-11)
_DIGAMMA_SERIES = (-1.0 / 132, 1.0 / 240, -1.0 / 252, 1.0 / 120, -1.0 / 12)
_DIGAMMA_SHIFT = 6


def digamma(b: Builder, x: Value) -> Value:
    """psi(x) away from its poles (the caller sets those as PyTorch does): below 0 by reflection,
    psi(1 - x) - pi / tan(pi * r) with r = x - round(x) in [-1/2, 1/2] (tan's period 1 in r keeps
    the argument small, so near the poles it keeps its relative accuracy, as PyTorch's double tan
    does); psi(y + 1) = psi(y) + 1/y up to 6, then log(z) - 1/(2z) and the series there."""
    zero, one = _c(b, 0.0, x), _c(b, 1.0, x)
    negative = b.compare(x, zero, "LT")
    y = b.select(negative, b.sub(one, x), x)
    z, shift = y, zero
    for _ in range(_DIGAMMA_SHIFT):
        below = b.compare(z, _c(b, float(_DIGAMMA_SHIFT), x), "LT")
        shift = b.select(below, b.add(shift, b.div(one, z)), shift)
        z = b.select(below, b.add(z, one), z)
    w = b.div(one, b.mul(z, z))
    series = b.mul(_horner(b, _DIGAMMA_SERIES, w), w)
    psi = b.sub(b.add(b.sub(b.unary("log", z), b.div(_c(b, 0.5, x), z)), series), shift)
    r = b.sub(x, b.unary("round_nearest_even", x))  # exact
    reflected = b.sub(psi, b.div(_c(b, math.pi, x), b.unary("tan", b.mul(r, _c(b, math.pi, x)))))
    return b.select(negative, reflected, psi)


# lgamma's Stirling series: 1/(12z) - 1/(360z^3) + 1/(1260z^5) - 1/(1680z^7) in powers of w = 1/z^2
_STIRLING_SERIES = (-1.0 / 1680, 1.0 / 1260, -1.0 / 360, 1.0 / 12)
_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


def lgamma_stirling(b: Builder, z: Value) -> Value:
    """lgamma(z) for z >= 16 (finite): (z - 1/2) log z - z + log(2 pi)/2 and Stirling's series,
    whose next term is below 1e-12 there; z (log z - 1) overflows to inf where lgamma does."""
    log_z = b.unary("log", z)
    w = b.div(_c(b, 1.0, z), b.mul(z, z))
    series = b.div(_horner(b, _STIRLING_SERIES, w), z)
    head = b.sub(b.mul(z, b.sub(log_z, _c(b, 1.0, z))), b.mul(_c(b, 0.5, z), log_z))
    return b.add(head, b.add(_c(b, _HALF_LOG_TWO_PI, z), series))


def lgamma_reflected(b: Builder, x: Value, lgamma_of_one_minus_x: Value) -> Value:
    """lgamma(x) for a negative non-integer x from lgamma(1 - x):
    log(pi) - log|sin(pi r)| - lgamma(1 - x), r = x - round(x) (exact, so sin keeps its accuracy)."""
    r = b.sub(x, b.unary("round_nearest_even", x))
    sine = b.unary("abs", b.unary("sine", b.mul(r, _c(b, math.pi, x))))
    return b.sub(b.sub(_c(b, math.log(math.pi), x), b.unary("log", sine)), lgamma_of_one_minus_x)


def _complex(b: Builder, re: Value, im: Value, like: Value) -> Value:
    return b.op1("stablehlo.complex", [re, im], like.shape, like.dtype)


def complex_exp(b: Builder, z: Value) -> Value:
    """e^z = e^a (cos b + i sin b) for z = a + ib, from the real exp, cos and sin (which take
    result_accuracy on a TPU; XLA's complex exp uses the fast ones there). A zero imaginary part
    stays exactly zero, so e^(inf + 0i) = inf + 0i (not inf * 0 = NaN), as on CPU."""
    re, im = b.real(z), b.imag(z)
    e = b.unary("exponential", re)
    zero = _c(b, 0.0, im)
    sin = b.select(b.compare(im, zero, "EQ"), im, b.mul(e, b.unary("sine", im)))
    return _complex(b, b.mul(e, b.unary("cosine", im)), sin, z)


def complex_log(b: Builder, z: Value) -> Value:
    """log z = log|z| + i atan2(b, a), with log|z| = log m + log1p((n/m)^2)/2 for m = max(|a|, |b|)
    and n = min(|a|, |b|): no square overflows or underflows, and the real log and log1p take
    result_accuracy on a TPU (XLA's complex log uses the fast ones there). log 0 = -inf and any
    infinite part gives +inf, as on CPU."""
    re, im = b.real(z), b.imag(z)
    ar, ai = b.unary("abs", re), b.unary("abs", im)
    m, n = b.maximum(ar, ai), b.minimum(ar, ai)
    q = b.div(n, m)
    magnitude = b.add(b.unary("log", m), b.mul(_c(b, 0.5, m), b.unary("log_plus_one", b.mul(q, q))))
    inf = _c(b, math.inf, m)
    infinite = b.binary("or", b.compare(ar, inf, "EQ"), b.compare(ai, inf, "EQ"))
    magnitude = b.select(b.compare(m, _c(b, 0.0, m), "EQ"), b.neg(inf), magnitude)
    magnitude = b.select(infinite, inf, magnitude)
    return _complex(b, magnitude, b.binary("atan2", im, re), z)


COMPLEX_FORMS: dict[str, Callable[[Builder, Value], Value]] = {
    "stablehlo.exponential": complex_exp, "stablehlo.log": complex_log,
}


FORMS: dict[str, Callable[[Builder, Value], Value]] = {
    "chlo.sinh": sinh, "chlo.cosh": cosh, "chlo.asinh": asinh, "chlo.acosh": acosh, "chlo.atanh": atanh,
    "chlo.erf_inv": erfinv,
}
