"""Implicit reparameterization gradients: the backward of ``Gamma/Beta/Dirichlet.rsample``.

A sample x of Gamma(alpha) moves with alpha at fixed CDF: dx/dalpha = -(dCDF/dalpha) / pdf.
PyTorch evaluates it (and its Beta counterpart, from which Dirichlet's follows) with
series, saddle-point expansions and fitted rational corrections, per region
(aten/src/ATen/native/Distributions.h: standard_gamma_grad_one, dirichlet_grad_one). These
are the same approximations, in the precisions CPU's kernels use (double for most).
"""

from __future__ import annotations

import torch

from .builder import Builder, Value
from .registry import LoweringContext, register
from .special import _digamma

aten = torch.ops.aten


# The bivariate rational approximation of the reparameterized gradient that PyTorch uses for
# 0.8 <= x with alpha <= 8 (aten/src/ATen/native/Distributions.h, standard_gamma_grad_one):
# rows are the constant, linear and quadratic coefficients in u = log(x / alpha), columns
# p's then q's coefficients in v = log(alpha).
_GRAD_COEF_UV = (
    (0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084),
    (0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623),
    (0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367,
     -1.5247877e-07),
)


@register(aten._standard_gamma_grad.default)
def _standard_gamma_grad(ctx: LoweringContext, alpha: Value, x: Value) -> Value:
    """d sample / d alpha of a Gamma(alpha, 1) sample x at fixed CDF (the implicit
    reparameterization gradient behind Gamma/Beta/Dirichlet.rsample), by PyTorch's three
    approximations: a Taylor series for x < 0.8, Rice's saddle point for alpha > 8, and a
    rational fit elsewhere."""
    b = ctx.b
    out = ctx.out_dtype()
    acc = torch.float64  # as CPU's kernel (accscalar_t = double): the saddle point cancels in f32
    a, xv = b.convert(alpha, acc), b.convert(x, acc)
    shape = a.shape

    def c(v: float) -> Value:
        return b.constant(v, acc, shape)

    # Taylor series of the lower incomplete gamma function in x
    numer, denom = c(1.0), a
    series1, series2 = b.div(numer, denom), b.div(numer, b.mul(denom, denom))
    for i in range(1, 6):
        numer = b.mul(numer, b.div(b.neg(xv), c(float(i))))
        denom = b.add(denom, c(1.0))
        series1 = b.add(series1, b.div(numer, denom))
        series2 = b.add(series2, b.div(numer, b.mul(denom, denom)))
    pow_x_alpha = b.binary("power", xv, a)
    pdf = b.mul(b.binary("power", xv, b.sub(a, c(1.0))), b.unary("exponential", b.neg(xv)))
    cdf = b.mul(pow_x_alpha, series1)
    cdf_alpha = b.sub(b.mul(b.sub(b.unary("log", xv), _digamma(b, a)), cdf), b.mul(pow_x_alpha, series2))
    taylor = b.div(b.neg(cdf_alpha), pdf)
    taylor = b.select(b.compare(taylor, taylor, "NE"), c(0.0), taylor)  # NaN -> 0, as PyTorch
    # Rice's saddle point expansion, near the mode and away from it
    a2 = b.mul(a, a)
    near = b.div(b.mul(b.add(c(1.0), b.mul(b.mul(c(24.0), a), b.add(c(1.0), b.mul(c(12.0), a)))),
                       b.add(b.sub(b.add(b.mul(c(1440.0), a2), b.mul(b.mul(c(6.0), xv), b.sub(c(53.0), b.mul(c(120.0), xv)))),
                                   b.div(b.mul(b.mul(c(65.0), xv), xv), a)),
                             b.mul(a, b.add(c(107.0), b.mul(c(3600.0), xv))))),
                 b.mul(b.mul(c(1244160.0), a2), a2))
    sq = b.unary("sqrt", b.mul(c(8.0), a))
    log_ratio = b.unary("log", b.div(xv, a))
    term2 = b.div(sq, b.sub(a, xv))
    term3 = b.binary("power", b.sub(b.sub(xv, a), b.mul(a, log_ratio)), c(-1.5))
    term23 = b.select(b.compare(xv, a, "LT"), b.sub(term2, term3), b.add(term2, term3))
    diff = b.sub(a, xv)
    term1 = b.sub(b.mul(log_ratio, term23),
                  b.div(b.mul(b.unary("sqrt", b.div(c(2.0), a)), b.add(a, xv)), b.mul(diff, diff)))
    stirling = b.add(c(1.0), b.mul(b.div(c(1.0), b.mul(c(12.0), a)), b.add(c(1.0), b.div(c(1.0), b.mul(c(24.0), a)))))
    far = b.div(b.neg(b.mul(stirling, b.mul(xv, term1))), sq)
    in_band = b.binary("and", b.compare(b.mul(c(0.9), a), xv, "LE"), b.compare(xv, b.mul(c(1.1), a), "LE"))
    rice = b.select(in_band, near, far)
    # the rational fit
    u, v = log_ratio, b.unary("log", a)
    coef = [b.add(c(r0), b.mul(u, b.add(c(r1), b.mul(u, c(r2))))) for r0, r1, r2 in zip(*_GRAD_COEF_UV)]
    p_ = b.add(coef[0], b.mul(v, b.add(coef[1], b.mul(v, b.add(coef[2], b.mul(v, coef[3]))))))
    q_ = b.add(coef[4], b.mul(v, b.add(coef[5], b.mul(v, b.add(coef[6], b.mul(v, coef[7]))))))
    rational = b.unary("exponential", b.div(p_, q_))
    r = b.select(b.compare(xv, c(0.8), "LT"), taylor, b.select(b.compare(a, c(8.0), "GT"), rice, rational))
    return b.convert(r, out)


# PyTorch has no meta kernels for these; the engine needs their output metadata.
_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_standard_gamma_grad", lambda alpha, x: torch.empty_like(alpha), "Meta")
_meta_lib.impl("_dirichlet_grad", lambda x, alpha, total: torch.empty_like(x), "Meta")


# dirichlet_grad_one's rational correction: [p or q][power of u][power of a][power of b]
_DIRICHLET_COEF = (
    (((1.003668233, -0.01061107488, -0.0657888334, 0.01201642863),
      (0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033),
      (-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013)),
     ((0.221950385, -0.3187676331, 0.01799915743, 0.01074823814),
      (-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057),
      (0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05)),
     ((-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565),
      (0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181),
      (0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05))),
    (((1, -0.02924021934, -0.04438342661, 0.007285809825),
      (0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521),
      (-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149)),
     ((0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273),
      (0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956),
      (-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05)),
     ((0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05),
      (0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05),
      (-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06))),
)


class _Ops:
    """Scalar-style arithmetic on same-shaped values, to keep the formulas readable."""

    def __init__(self, b: Builder, like: Value) -> None:
        self.b, self.shape, self.dtype = b, like.shape, like.dtype

    def c(self, v: float) -> Value:
        return self.b.constant(v, self.dtype, self.shape)

    def pow(self, x: Value, e: float | Value) -> Value:
        return self.b.binary("power", x, e if isinstance(e, Value) else self.c(e))

    def nan_to_zero(self, x: Value) -> Value:
        return self.b.select(self.b.compare(x, x, "NE"), self.c(0.0), x)


def _beta_grad_alpha_small(o: _Ops, x: Value, alpha: Value, beta: Value) -> Value:
    """Taylor expansion in x near 0 (gradient with respect to alpha)."""
    b = o.b
    factor = b.sub(b.sub(_digamma(b, alpha), _digamma(b, b.add(alpha, beta))), b.unary("log", x))
    numer = o.c(1.0)
    series = b.mul(b.div(numer, alpha), b.add(factor, b.div(o.c(1.0), alpha)))
    for i in range(1, 11):
        numer = b.div(b.mul(b.mul(numer, b.sub(o.c(float(i)), beta)), x), o.c(float(i)))
        denom = b.add(alpha, o.c(float(i)))
        series = b.add(series, b.mul(b.div(numer, denom), b.add(factor, b.div(o.c(1.0), denom))))
    return o.nan_to_zero(b.mul(b.mul(x, o.pow(b.sub(o.c(1.0), x), b.neg(beta))), series))


def _beta_grad_beta_small(o: _Ops, x: Value, alpha: Value, beta: Value) -> Value:
    """Taylor expansion in x near 0 (gradient with respect to beta)."""
    b = o.b
    factor = b.sub(_digamma(b, b.add(alpha, beta)), _digamma(b, beta))
    numer, betas, dbetas, series = o.c(1.0), o.c(1.0), o.c(0.0), b.div(factor, alpha)
    for i in range(1, 9):
        fi = o.c(float(i))
        numer = b.div(b.mul(numer, b.neg(x)), fi)
        dbetas = b.add(b.mul(dbetas, b.sub(beta, fi)), betas)
        betas = b.mul(betas, b.sub(beta, fi))
        series = b.add(series, b.mul(b.div(numer, b.add(alpha, fi)), b.add(dbetas, b.mul(factor, betas))))
    return o.nan_to_zero(b.neg(b.mul(o.pow(b.sub(o.c(1.0), x), b.sub(o.c(1.0), beta)), series)))


def _beta_grad_alpha_mid(o: _Ops, x: Value, alpha: Value, beta: Value) -> Value:
    """Rice saddle-point expansion for large alpha and beta."""
    b, c = o.b, o.c
    total = b.add(alpha, beta)
    mean = b.div(alpha, total)
    std = b.div(b.unary("sqrt", b.div(b.mul(alpha, beta), b.add(total, c(1.0)))), total)
    one_x = b.sub(c(1.0), x)
    beta2 = b.mul(beta, beta)
    # near the mean (the expansion's singularity)
    inner = b.mul(b.mul(c(8.0), one_x), b.sub(b.mul(c(135.0), beta), c(11.0)))
    inner = b.add(b.mul(b.sub(b.add(c(453.0), b.mul(b.mul(c(1620.0), beta), one_x)), b.mul(c(455.0), x)), beta),
                  b.mul(alpha, inner))
    inner = b.add(b.mul(b.mul(c(3.0), b.sub(b.add(c(59.0), b.mul(c(180.0), beta)), b.mul(c(90.0), x))), beta2),
                  b.mul(alpha, inner))
    inner = b.add(b.mul(b.mul(b.add(c(43.0), b.mul(b.mul(c(20.0), b.add(c(16.0), b.mul(c(27.0), beta))), x)), beta2),
                        beta), b.mul(alpha, inner))
    poly = b.add(b.mul(b.mul(b.mul(c(47.0), x), beta2), beta2), b.mul(alpha, inner))
    pre_num = b.div(b.mul(b.add(c(1.0), b.mul(c(12.0), alpha)), b.add(c(1.0), b.mul(c(12.0), beta))),
                    b.mul(total, total))
    pre_den = b.mul(b.mul(b.mul(b.mul(c(12960.0), alpha), b.mul(alpha, alpha)), beta2),
                    b.add(c(1.0), b.mul(c(12.0), total)))
    near = b.div(b.mul(b.div(pre_num, one_x), poly), pre_den)
    # away from it
    prefactor = b.div(b.neg(x), b.unary("sqrt", b.div(b.mul(b.mul(c(2.0), alpha), beta), total)))

    def stirling_factor(v: Value) -> Value:
        return b.add(b.add(c(1.0), b.div(c(1.0), b.mul(c(12.0), v))), b.div(c(1.0), b.mul(c(288.0), b.mul(v, v))))

    stirling = b.div(b.mul(stirling_factor(alpha), stirling_factor(beta)), stirling_factor(total))
    xm1 = b.sub(x, c(1.0))
    term1_num = b.sub(b.add(b.mul(b.mul(c(2.0), b.mul(alpha, alpha)), xm1), b.mul(b.mul(alpha, beta), xm1)),
                      b.mul(x, beta2))
    axbx = b.add(b.mul(alpha, xm1), b.mul(beta, x))
    term1_den = b.mul(b.mul(b.unary("sqrt", b.div(b.mul(c(2.0), alpha), beta)), o.pow(total, 1.5)), b.mul(axbx, axbx))
    term1 = b.div(term1_num, term1_den)
    term2 = b.mul(c(0.5), b.unary("log", b.div(alpha, b.mul(total, x))))
    term3 = b.div(b.unary("sqrt", b.div(b.mul(b.mul(c(8.0), alpha), beta), total)), axbx)
    term4_base = b.add(b.mul(beta, b.unary("log", b.div(beta, b.mul(total, one_x)))),
                       b.mul(alpha, b.unary("log", b.div(alpha, b.mul(total, x)))))
    term4 = o.pow(term4_base, -1.5)
    signed4 = b.select(b.compare(x, mean, "LT"), term4, b.neg(term4))
    far = b.mul(b.mul(stirling, prefactor), b.add(term1, b.mul(term2, b.add(term3, signed4))))
    in_band = b.binary("and", b.compare(b.sub(mean, b.mul(c(0.1), std)), x, "LE"),
                       b.compare(x, b.add(mean, b.mul(c(0.1), std)), "LE"))
    return b.select(in_band, near, far)


@register(aten._dirichlet_grad.default)
def _dirichlet_grad(ctx: LoweringContext, x: Value, alpha: Value, total: Value) -> Value:
    """d x / d alpha of a Beta(alpha, total - alpha) sample x, scaled by 1 / (1 - x) (Dirichlet's
    gradient is built from these), by PyTorch's four regions."""
    b = ctx.b
    out = ctx.out_dtype()
    shape = ctx.out_shape()
    # CPU's kernel takes the Taylor branches in the input's precision and the saddle-point and
    # rational branches in double (the saddle point cancels badly in f32 near the mean)
    low = torch.float64 if out == torch.float64 else torch.float32
    xs, as_, ts = (b.broadcast_to(b.convert(v, low), shape) for v in (x, alpha, total))
    ol = _Ops(b, xs)
    beta_low = b.sub(ts, as_)
    small_x = b.convert(_beta_grad_alpha_small(ol, xs, as_, beta_low), torch.float64)
    large_x = b.convert(b.neg(_beta_grad_beta_small(ol, b.sub(ol.c(1.0), xs), beta_low, as_)), torch.float64)
    xv, a, t = (b.convert(v, torch.float64) for v in (xs, as_, ts))
    o = _Ops(b, xv)
    c = o.c
    beta = b.sub(t, a)
    boundary = b.mul(b.mul(t, xv), b.sub(c(1.0), xv))
    mid = _beta_grad_alpha_mid(o, xv, a, beta)
    # the rational correction to an analytic approximation
    u = b.unary("log", xv)
    la = b.sub(b.unary("log", a), u)
    lb = b.sub(b.unary("log", t), la)
    pow_u, pow_a = (c(1.0), u, b.mul(u, u)), (c(1.0), la, b.mul(la, la))
    pq = []
    for table in _DIRICHLET_COEF:
        acc_v = c(0.0)
        for i in range(3):
            for j in range(3):
                k0, k1, k2, k3 = table[i][j]
                poly = b.add(c(k0), b.mul(lb, b.add(c(k1), b.mul(lb, b.add(c(k2), b.mul(lb, c(k3)))))))
                acc_v = b.add(acc_v, b.mul(b.mul(pow_u[i], pow_a[j]), poly))
        pq.append(acc_v)
    approx = b.div(b.mul(xv, b.sub(_digamma(b, t), _digamma(b, a))), beta)
    rational = b.mul(b.div(pq[0], pq[1]), approx)
    r = b.select(b.binary("and", b.compare(a, c(6.0), "GT"), b.compare(beta, c(6.0), "GT")), mid, rational)
    r = b.select(b.binary("and", b.compare(xv, c(0.5), "GE"), b.compare(boundary, c(0.75), "LT")), large_x, r)
    r = b.select(b.binary("and", b.compare(xv, c(0.5), "LE"), b.compare(boundary, c(2.5), "LT")), small_x, r)
    return b.convert(r, out)
