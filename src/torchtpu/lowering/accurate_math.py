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

import torch

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


# digamma's asymptotic series from z = 4: -sum B_2k / (2k z^2k), k = 1..6 (the next term is < 4e-10)
_DIGAMMA_SERIES = (691.0 / 32760, -1.0 / 132, 1.0 / 240, -1.0 / 252, 1.0 / 120, -1.0 / 12)
_DIGAMMA_ASYMPTOTIC_FROM = 4.0
# psi's positive root 1.46163214496836234126... less 1, as an f32 and the f32 rest
_DIGAMMA_ROOT_HI = 0.4616321325302124
_DIGAMMA_ROOT_LO = 1.2438149938918909e-08
# psi(1 + s) / (s - root + 1) on 0 <= s <= 1 in powers of u = s - 1/2, highest first: a least-squares
# fit (relative weights) in float64 with numpy at 400 Chebyshev nodes of [0, 1], against mpmath's
# digamma at 40 digits: relative error 4.4e-9; psi(1 + s) evaluated so in f32 (numpy) is within 0.8 eps
_DIGAMMA_NEAR_ROOT = (
    0.010791888048180284, -0.016365294752141102, 0.01718367691296066, -0.025791539242115684,
    0.04083514044021078, -0.06205511425735366, 0.09498599787585726, -0.1483989208856611,
    0.2405424946894053, -0.4236274963775364, 0.9510558762283947)
# g(v) = sum_k>=1 1/(k(k + 1) + v) on 0 <= v <= 1/4, highest power first: pi cot(pi a) =
# 1/a - 1/(1 - a) + (1 - 2a) g(a(1 - a)). Least squares in float64 at 200 Chebyshev nodes of
# [0, 1/4] against mpmath's nsum at 40 digits; error 6.3e-10
_COT_REST = (-0.01094575615946713, 0.03015999278404502, -0.06317534436498316, 0.13038687143859312,
             -0.28986794954074013, 0.999999999367528)
# log(2) = _LN2_HI + _LN2_LO, _LN2_HI with 9 significant bits (k * _LN2_HI is exact for |k| < 2^15)
_LN2_HI = 0.693359375
_LN2_LO = -0.00021219444005469058
_SPLIT = 4097.0  # 2^12 + 1: Veltkamp's split of an f32 into two 12-bit halves


def _split(b: Builder, v: Value) -> tuple[Value, Value]:
    c = b.mul(v, _c(b, _SPLIT, v))
    hi = b.sub(c, b.sub(c, v))
    return hi, b.sub(v, hi)


def _reciprocal(b: Builder, d: Value) -> tuple[Value, Value]:
    """1/d as h + l, l = h (1 - h d) with 1 - h d exact (Dekker's product, the division's own
    rounding, even a TPU's ulp or two, is in l). d's 4097-fold must stay finite: |d| < 8e34."""
    h = b.div(_c(b, 1.0, d), d)
    p, e = _two_prod(b, h, d)
    return h, b.mul(h, b.sub(b.sub(_c(b, 1.0, d), p), e))


def digamma(b: Builder, x: Value) -> Value:
    """psi(x) away from its poles (the caller sets those as PyTorch does), in f32 within 1.2 eps of
    float64 on XLA:CPU (absolute where |psi| < 1, relative elsewhere). The former form, upward
    recurrence psi(y) = psi(y + 1) - 1/y to 6, log(z) - 1/(2z) and the series there, and below 0
    psi(1 - x) - pi / tan(pi r), was 6 eps off (8 against CPU on a v5e): near psi's zeros (1.4616 and
    one between each pair of negative poles) its parts of size 2-3 cancelled, and each carried its
    roundings, tan's and log's. Here with y = |x| = n + s (s its exact fractional part) and w = x,
    or 1 - x below 0:
    - 1 <= w < 2: psi(1 + s) = (s - root + 1) R(s - 1/2), R a fitted polynomial, the root split into
      two f32 so that psi keeps its relative accuracy around its zero;
    - 2 <= w < 4: downward, psi(w) = psi(1 + s) + 1/(s + 1) [+ 1/(s + 2)], every term positive;
    - 0 <= x < 1: psi(1 + s) - 1/s, 1/s as two f32 (below);
    - w >= 4: log(w) - 1/(2w) and the asymptotic series, log(w) = k log(2) + log(m), m in
      [1/sqrt(2), sqrt(2)] (k log(2)'s leading part exact, |log m| small whatever log's ulp), with
      1 - x's rounding error d as log(w + d) ~ log(w) + d/w;
    - x < 0: reflection, psi(1 - x) - pi cot(pi r), r = x - round(x) exact, a = |r| <= 1/2:
      pi cot(pi a) = 1/a - 1/(1 - a) + (1 - 2a) g(a(1 - a)), g a fitted polynomial, each reciprocal
      as two f32 (no tan: its argument's rounding alone cost 1.6 ulp near a = 1/4).
    The leading parts (the recurrence's sum or k log(2)'s leading part, and the reciprocals) are
    summed exactly (Knuth's two-sum), the rest added after, so that where they cancel none of
    their roundings reaches the result. About 190 elementwise ops, no loop."""
    zero, one = _c(b, 0.0, x), _c(b, 1.0, x)
    negative = b.compare(x, zero, "LT")
    y = b.unary("abs", x)
    whole = b.unary("floor", y)
    s = b.sub(y, whole)  # exact
    n = b.select(negative, b.add(whole, one), whole)  # floor(w)
    below_one = b.compare(n, one, "LT")  # 0 <= x < 1
    # psi(w) = big + small: the recurrence's terms and psi(1 + s), or k log(2)'s leading part and the rest
    # s + 1 and s + 2 are exact where used: s is a multiple of y's ulp, and y < 3 there
    t2 = b.select(b.compare(n, _c(b, 2.0, x), "GT"), b.div(one, b.add(s, _c(b, 2.0, x))), zero)
    t1 = b.select(b.compare(n, one, "GT"), b.div(one, b.add(s, one)), zero)
    shift = b.add(t1, t2)
    shift_err = b.sub(t2, b.sub(shift, t1))  # t1 + t2 - shift, exact (t1 >= t2)
    u = b.sub(s, _c(b, 0.5, x))
    root_offset = b.sub(b.sub(s, _c(b, _DIGAMMA_ROOT_HI, x)), _c(b, _DIGAMMA_ROOT_LO, x))
    near_root = b.mul(root_offset, _horner(b, _DIGAMMA_NEAR_ROOT, u))  # psi(1 + s)
    z = b.select(negative, b.add(y, one), y)
    carried = b.select(negative, b.sub(one, b.sub(z, y)), zero)  # (1 + y) - z, exact where z >= 4
    bits = b.bitcast_convert(z, torch.int32, z.shape)
    k = b.convert(b.sub(b.binary("shift_right_logical", bits, _c(b, 23, bits)), _c(b, 127, bits)), x.dtype)
    m = b.bitcast_convert(b.binary("or", b.binary("and", bits, _c(b, 0x007FFFFF, bits)), _c(b, 0x3F800000, bits)),
                          x.dtype, x.shape)  # z / 2^k in [1, 2)
    halve = b.compare(m, _c(b, math.sqrt(2.0), x), "GT")  # then z / 2^(k + 1) in [1/sqrt(2), 1): |log m| < 0.35
    m = b.select(halve, b.mul(m, _c(b, 0.5, x)), m)
    k = b.select(halve, b.add(k, one), k)
    w = b.div(one, b.mul(z, z))
    series = b.add(b.div(b.sub(carried, _c(b, 0.5, x)), z), b.mul(_horner(b, _DIGAMMA_SERIES, w), w))
    series = b.add(b.add(b.unary("log", m), b.mul(k, _c(b, _LN2_LO, x))), series)
    asymptotic = b.compare(n, _c(b, _DIGAMMA_ASYMPTOTIC_FROM, x), "GE")
    big = b.select(asymptotic, b.mul(k, _c(b, _LN2_HI, x)), shift)
    big = b.select(b.compare(z, _c(b, math.inf, x), "EQ"), z, big)  # psi(inf) = inf (k would be 128)
    small = b.select(asymptotic, series, b.add(near_root, shift_err))
    # below 0, psi(1 - x) - pi cot(pi r) = big + small - sign(r) (h1 + l1 - h2 - l2 + rest); for 0 <= x < 1,
    # psi(1 + s) - (h1 + l1) with h1 + l1 = 1/s: the same terms with sign 1, h2 = l2 = rest = 0
    r = b.sub(x, b.unary("round_nearest_even", x))  # exact
    a = b.unary("abs", r)
    sign = b.select(negative, b.unary("sign", r), b.select(below_one, one, zero))
    p = b.select(negative, a, b.select(below_one, s, one))
    h1, l1 = _reciprocal(b, p)
    l1 = b.select(b.compare(p, _c(b, 2.0**-16, x), "GE"), l1, zero)  # below, l1 is negligible (and 4097/p may overflow)
    a1 = b.sub(one, a)
    da = b.sub(b.sub(one, a1), a)  # 1 - a = a1 + da exactly
    h2, l2 = _reciprocal(b, a1)
    l2 = b.sub(b.sub(l2, b.mul(da, b.mul(h2, h2))), b.mul(b.sub(one, b.add(a, a)), _horner(b, _COT_REST, b.mul(a, a1))))
    h2, l2 = b.select(negative, h2, zero), b.select(negative, l2, zero)
    # lead + err = big - sign (h1 - h2) exactly: h1 - h2 = d + dd (h1 >= h2), then Knuth's two-sum
    d = b.sub(h1, h2)
    dd = b.sub(b.sub(h1, d), h2)
    q = b.neg(b.mul(sign, d))
    lead = b.add(big, q)
    back = b.sub(lead, big)
    err = b.add(b.sub(big, b.sub(lead, back)), b.sub(q, back))
    result = b.add(lead, b.add(b.add(small, err), b.mul(sign, b.sub(b.sub(l2, l1), dd))))
    # where 1/s or 1/a overflowed (x within 3e-39 of 0), lead is infinite and the two-sum's err NaN
    return b.select(b.compare(b.unary("abs", lead), _c(b, math.inf, x), "EQ"), lead, result)


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


# -- float32 power from float32 pairs ------------------------------------------------------------
# A TPU's f32 power composes its fast exp and log (3.1e-6 relative off on a v5e), and its f64 is
# emulated: a power there in f64 (this builder's former form) compiled for 1.3 s per scalar power
# on a v5e (tools/tpu_suite/probe_pow_compile.py: 29 of them 45.9 s; capturable AdamW holds two
# per parameter). This form uses only f32 adds, multiplies and one divide, carrying log(|x|) and
# y * log(|x|) as unevaluated f32 pairs (about 2^-40 relative): the result is rounded once from a
# value within about 2^-29 of |x| ** y, as near as a correctly rounded powf.

# log(2) = _LN2_HI15 + _LN2_LO15, the first with 15 significant bits: e * _LN2_HI15 is exact for the
# exponents of f32 (|e| < 2^8), and so is k * _LN2_HI15 in the reduction of exp's argument
_LN2_HI15 = 0.693145751953125
_LN2_LO15 = 1.428606765330187e-06
_TWO_THIRDS_HI = 0.6666666865348816
_TWO_THIRDS_LO = -1.9868215517249155e-08
_SIXTH_HI = 0.1666666716337204
_SIXTH_LO = -4.967053879312289e-09
# 2 atanh(u) = 2u + 2u^3/3 + u^5 * sum_k 2 w^k / (2k + 5), w = u^2 <= 0.0295 on the reduced range
_ATANH_REST = tuple(2.0 / (2 * k + 5) for k in range(7))[::-1]
# exp(q) = 1 + q + q^2/2 + q^3/6 + q^4 * sum_k q^k / (k + 4)!, |q| <= 0.35 (the first four terms in pairs)
_EXP_REST = tuple(1.0 / math.factorial(k + 4) for k in range(8))[::-1]
# past this |y log|x||, |x| ** y is inf or below f32's smallest subnormal: f32's own power says so
_POWER_ARG_LIMIT = 103.0


def _opaque_one(b: Builder, like: Value) -> Value:
    """1, behind an optimization barrier: XLA's simplifier folds (x + 1) - 1 to x (constants
    reassociated), which would zero the rounding errors the pair sums below recover."""
    one = b.op1("stablehlo.optimization_barrier", [b.constant(1.0, like.dtype)], (), like.dtype)
    return b.broadcast_to(one, like.shape)


def _two_sum(b: Builder, x: Value, y: Value) -> tuple[Value, Value]:
    """x + y as s + e exactly (Knuth's sum: no ordering of |x| and |y| needed)."""
    s = b.add(x, y)
    yv = b.sub(s, x)
    return s, b.add(b.sub(x, b.sub(s, yv)), b.sub(y, yv))


def _fast_two_sum(b: Builder, x: Value, y: Value) -> tuple[Value, Value]:
    """x + y as s + e exactly where |x| >= |y| (or x is 0)."""
    s = b.add(x, y)
    return s, b.sub(y, b.sub(s, x))


def _two_prod(b: Builder, x: Value, y: Value) -> tuple[Value, Value]:
    """x * y as p + e exactly (Dekker's product through Veltkamp's split; |x|, |y| < 8e34)."""
    p = b.mul(x, y)
    x1, x2 = _split(b, x)
    y1, y2 = _split(b, y)
    e = b.add(b.add(b.add(b.sub(b.mul(x1, y1), p), b.mul(x1, y2)), b.mul(x2, y1)), b.mul(x2, y2))
    return p, e


def _log_pair(b: Builder, a: Value) -> tuple[Value, Value]:
    """log(a) as an f32 pair, for finite a > 0: a = m 2^e with m in [sqrt(1/2), sqrt(2)), then
    log(m) = 2 atanh(u), u = (m - 1) / (m + 1), its first two terms in pairs."""
    i32 = torch.int32
    shape = a.shape

    def ci(v: int) -> Value:
        return b.constant(v, i32, shape)

    tiny = b.compare(a, _c(b, 2.0 ** -126, a), "LT")  # subnormal: scaled up to read its exponent
    scaled = b.select(tiny, b.mul(a, _c(b, 2.0 ** 24, a)), a)
    bits = b.bitcast_convert(scaled, i32, shape)
    e = b.sub(b.binary("shift_right_arithmetic", bits, ci(23)), b.select(tiny, ci(127 + 24), ci(127)))
    m = b.bitcast_convert(b.binary("or", b.binary("and", bits, ci(0x7FFFFF)), ci(0x3F800000)), a.dtype, shape)
    high = b.compare(m, _c(b, math.sqrt(2.0), a), "GT")
    m = b.select(high, b.mul(m, _c(b, 0.5, a)), m)
    e = b.convert(b.add(e, b.select(high, ci(1), ci(0))), a.dtype)
    one = _opaque_one(b, a)
    f = b.sub(m, one)  # exact (Sterbenz)
    s_hi = b.add(m, one)
    s_lo = b.sub(m, b.sub(s_hi, one))  # both subtractions exact: m + 1 = s_hi + s_lo
    u_hi = b.div(f, s_hi)
    p, pe = _two_prod(b, u_hi, s_hi)
    u_lo = b.div(b.sub(b.sub(b.sub(f, p), pe), b.mul(u_hi, s_lo)), s_hi)  # the division's residual
    w_hi, w_lo = _two_prod(b, u_hi, u_hi)
    w_lo = b.add(w_lo, b.mul(b.mul(_c(b, 2.0, a), u_hi), u_lo))
    c_hi, c_lo = _two_prod(b, u_hi, w_hi)  # u^3
    c_lo = b.add(c_lo, b.add(b.mul(u_hi, w_lo), b.mul(u_lo, w_hi)))
    d_hi, d_lo = _two_prod(b, _c(b, _TWO_THIRDS_HI, a), c_hi)  # 2u^3/3
    d_lo = b.add(d_lo, b.add(b.mul(_c(b, _TWO_THIRDS_HI, a), c_lo), b.mul(_c(b, _TWO_THIRDS_LO, a), c_hi)))
    rest = b.mul(b.mul(c_hi, w_hi), _horner(b, _ATANH_REST, w_hi))
    two = _c(b, 2.0, a)
    l_hi, l_lo = _two_sum(b, b.mul(two, u_hi), d_hi)
    l_lo = b.add(l_lo, b.add(b.add(b.mul(two, u_lo), d_lo), rest))
    g_hi, g_lo = _two_sum(b, b.mul(e, _c(b, _LN2_HI15, a)), l_hi)
    g_lo = b.add(g_lo, b.add(l_lo, b.mul(e, _c(b, _LN2_LO15, a))))
    return _fast_two_sum(b, g_hi, g_lo)


def _exp_of_pair(b: Builder, t: Value, t_lo: Value) -> Value:
    """exp(t + t_lo) rounded once, for |t| <= _POWER_ARG_LIMIT: t = k log(2) + q, |q| <= 0.35,
    exp(q) with its first terms in pairs, then 2^k in two exact steps (k reaches -149)."""
    i32 = torch.int32
    k = b.unary("round_nearest_even", b.mul(t, _c(b, 1.0 / math.log(2.0), t)))
    q_hi = b.sub(t, b.mul(k, _c(b, _LN2_HI15, t)))  # exact (Cody and Waite)
    q, q_lo = _fast_two_sum(b, q_hi, b.sub(t_lo, b.mul(k, _c(b, _LN2_LO15, t))))
    one = _opaque_one(b, t)
    sq_hi, sq_lo = _two_prod(b, q, q)
    half = _c(b, 0.5, t)
    a_hi, a_lo = _two_sum(b, one, q)
    s_hi, s_lo = _two_sum(b, a_hi, b.mul(sq_hi, half))
    c_hi, c_lo = _two_prod(b, q, sq_hi)  # q^3, then q^3 / 6 as pairs
    c_lo = b.add(c_lo, b.mul(q, sq_lo))
    d_hi, d_lo = _two_prod(b, _c(b, _SIXTH_HI, t), c_hi)
    d_lo = b.add(d_lo, b.add(b.mul(_c(b, _SIXTH_HI, t), c_lo), b.mul(_c(b, _SIXTH_LO, t), c_hi)))
    s_hi, s_lo2 = _two_sum(b, s_hi, d_hi)
    small = b.add(b.mul(b.mul(sq_hi, sq_hi), _horner(b, _EXP_REST, q)),
                  b.mul(q_lo, b.add(one, q)))  # exp(q + q_lo) ~ exp(q) (1 + q_lo)
    lows = b.add(b.add(a_lo, s_lo), b.add(s_lo2, d_lo))
    m = b.add(s_hi, b.add(lows, b.add(b.mul(sq_lo, half), small)))
    k_int = b.convert(k, i32)
    k1 = b.binary("shift_right_arithmetic", k_int, b.constant(1, i32, t.shape))
    k2 = b.sub(k_int, k1)

    def two_to(n: Value) -> Value:  # 2^n for |n| <= 126, built from its exponent bits
        biased = b.binary("shift_left", b.add(n, b.constant(127, i32, t.shape)), b.constant(23, i32, t.shape))
        return b.bitcast_convert(biased, t.dtype, t.shape)

    return b.mul(b.mul(m, two_to(k1)), two_to(k2))


def power(b: Builder, a: Value, y: Value) -> Value:
    """|a| ** y in f32 (the caller puts the sign back): exp(y log|a|) with log|a| and the product
    carried as f32 pairs. Zeros, infinities, NaNs and results past f32's range take f32's own
    power, which gives them as IEEE's pow does."""
    magnitude = b.unary("abs", a)
    h, l = _log_pair(b, b.select(b.compare(magnitude, _c(b, 0.0, a), "GT"), magnitude, _c(b, 1.0, a)))
    finite_y = b.op1("stablehlo.is_finite", [y], y.shape, torch.bool)
    y_safe = b.select(finite_y, y, _c(b, 0.0, y))
    t_hi, t_lo = _two_prod(b, b.clamp(_c(b, -1e30, y), y_safe, _c(b, 1e30, y)), h)
    t, t_lo = _fast_two_sum(b, t_hi, b.add(t_lo, b.mul(y_safe, l)))
    in_range = b.compare(b.unary("abs", t), _c(b, _POWER_ARG_LIMIT, t), "LE")
    usable = b.binary("and", b.binary("and", finite_y, in_range),
                      b.binary("and", b.compare(magnitude, _c(b, 0.0, a), "GT"),
                               b.op1("stablehlo.is_finite", [magnitude], a.shape, torch.bool)))
    t_safe = b.select(usable, t, _c(b, 0.0, t))
    ours = _exp_of_pair(b, t_safe, b.select(usable, t_lo, _c(b, 0.0, t)))
    own = b.op1("stablehlo.power", [magnitude, y], a.shape, a.dtype)
    return b.select(usable, ours, own)
