"""Samplers that draw until they accept: Gamma, Dirichlet (and so Beta), Poisson.

``torch.distributions.Gamma/Beta/Dirichlet/Poisson(...).sample()`` call ``_standard_gamma``,
``_sample_dirichlet`` and ``poisson``. Each follows PyTorch's own method
(aten/src/ATen/native/Distributions.{h,cpp}):

- Gamma: Marsaglia and Tsang's rejection method; shape parameters below 1 are boosted by
  one and the sample scaled by U^(1/alpha). A round accepts with probability > 95%.
- Poisson: for rates of 10 or more Hoermann's transformed rejection (PTRS, ~90% per
  round); below that, uniforms are multiplied until the product falls under e^-rate
  (about rate + 1 rounds).

On the device every element draws one candidate per round of a ``stablehlo.while``, and
rounds go on until every element has accepted. Each round's random bits come from the
op's seed advanced by the round number, so a result depends only on the seed, as for
every random op here. Invalid parameters give what CPU's kernels give (the smallest
normal number for Gamma); a negative or NaN Poisson rate raises CPU's error at the next read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .builder import Builder, Value
from .index_bounds import Bound
from .random_ops import _seed, normal01, uniform01
from .registry import LoweringContext, register, register_index_bounds
from .special import lgamma_value

aten = torch.ops.aten

# An element that has not accepted after this many rounds stays NaN. No valid parameter
# gets near it: Gamma and large-rate Poisson rounds accept with probability > 90%, and the
# small-rate Poisson method needs about rate + 1 < 11 rounds.
_MAX_ROUNDS = 1024
_ROUND_STEP = 0xD1B54A32D192ED03  # added to the seed per round (odd: every round differs)
_BOOST_SALT = 0x94D049BB133111EB
_SECOND_SALT = 0xBF58476D1CE4E5B9

# step(bb, key, *state) -> (new state, accepted): one round's candidates for every element
RoundStep = Callable[..., tuple[list[Value], Value]]


def _until_accepted(b: Builder, seed: Value, shape: tuple[int, ...], init: list[Value], step: RoundStep) -> list[Value]:
    """Run rounds of ``step`` until every element has accepted; an element keeps the state of
    the round it accepted in. ``key`` is the round's seed."""
    types = [((), torch.int64), (shape, torch.bool)] + [(v.shape, v.dtype) for v in init]
    dims = list(range(len(shape)))

    def cond(bb: Builder, i: Value, done: Value, *state: Value) -> Value:
        open_ = bb.convert(bb.unary("not", done), torch.int32)
        any_open = bb.compare(bb.reduce(open_, dims, bb.constant(0, torch.int32), "stablehlo.maximum"),
                              bb.constant(0, torch.int32), "GT")
        return bb.binary("and", bb.compare(i, bb.constant(_MAX_ROUNDS, torch.int64), "LT"), any_open)

    def body(bb: Builder, i: Value, done: Value, *state: Value) -> list[Value]:
        step_no = bb.mul(bb.convert(bb.add(i, bb.constant(1, torch.int64)), torch.uint64),
                         bb.constant(_ROUND_STEP, torch.uint64))
        key = bb.add(seed, bb.broadcast_to(step_no, seed.shape))
        new, accepted = step(bb, key, *state)
        kept = [bb.select(done, old, v) for old, v in zip(state, new)]
        return [bb.add(i, bb.constant(1, torch.int64)), bb.binary("or", done, accepted), *kept]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    start = [b.constant(0, torch.int64), b.constant(False, torch.bool, shape), *init]
    outs = b.op("stablehlo.while", start, types, region=regions)
    done = outs[1]
    # an element that never accepted is NaN, never a leftover candidate
    return [b.select(done, v, b.constant(math.nan, v.dtype, shape)) if v.dtype.is_floating_point else v
            for v in outs[2:]]


def standard_gamma(b: Builder, seed: Value, alpha: Value) -> Value:
    """Gamma(alpha, 1) samples (f32) for an f32 ``alpha`` of any shape."""
    shape = alpha.shape
    f32 = torch.float32

    def c(v: float) -> Value:
        return b.constant(v, f32, shape)

    small = b.compare(alpha, c(1.0), "LT")
    a = b.select(small, b.add(alpha, c(1.0)), alpha)
    d = b.sub(a, c(1.0 / 3.0))
    cc = b.div(c(1.0), b.unary("sqrt", b.mul(c(9.0), d)))
    boost = b.binary("power", b.sub(c(1.0), uniform01(b, seed, shape, _BOOST_SALT)), b.div(c(1.0), alpha))
    scale = b.select(small, boost, c(1.0))

    def step(bb: Builder, key: Value, value: Value) -> tuple[list[Value], Value]:
        def k(v: float) -> Value:
            return bb.constant(v, f32, shape)

        x = normal01(bb, key, shape)
        y = bb.add(k(1.0), bb.mul(cc, x))
        v = bb.mul(bb.mul(y, y), y)
        u = bb.sub(k(1.0), uniform01(bb, key, shape, _SECOND_SALT))
        xx = bb.mul(x, x)
        squeeze = bb.compare(u, bb.sub(k(1.0), bb.mul(k(0.0331), bb.mul(xx, xx))), "LT")
        log_test = bb.compare(bb.unary("log", u), bb.add(bb.mul(k(0.5), xx),
                                                           bb.mul(d, bb.add(bb.sub(k(1.0), v), bb.unary("log", v)))),
                              "LT")
        # CPU redraws while y <= 0, so a NaN y (a NaN or negative alpha) is a candidate too
        valid = bb.unary("not", bb.compare(y, k(0.0), "LE"))
        return [bb.mul(d, v)], bb.binary("and", valid, bb.binary("or", squeeze, log_test))

    value, = _until_accepted(b, seed, shape, [c(math.nan)], step)
    return b.select(b.compare(alpha, c(0.0), "EQ"), c(0.0), b.mul(scale, value))  # CPU: alpha 0 gives 0


def _clamped(b: Builder, x: Value, dtype: torch.dtype, upper: bool = False) -> Value:
    """``x`` in ``dtype``, at least its smallest normal number (and below 1 with ``upper``),
    as CPU's std::max / std::min, which also turn a NaN into the bound."""
    x = b.convert(x, dtype)
    tiny = b.constant(torch.finfo(dtype).tiny, dtype, x.shape)
    out = b.select(b.compare(tiny, x, "LT"), x, tiny)
    if upper:
        below_one = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype)).item()
        top = b.constant(below_one, dtype, x.shape)
        out = b.select(b.compare(out, top, "LT"), out, top)
    return out


@register(aten._standard_gamma.default)
def _standard_gamma(ctx: LoweringContext, alpha: Value, generator: Any = None) -> Value:
    b = ctx.b
    sample = standard_gamma(b, _seed(ctx, generator), b.convert(alpha, torch.float32))
    return _clamped(b, sample, ctx.out_dtype())


@register(aten._sample_dirichlet.default)
def _sample_dirichlet(ctx: LoweringContext, alpha: Value, generator: Any = None) -> Value:
    """Gamma samples normalized along the last dim, kept inside (0, 1) as CPU keeps them."""
    b = ctx.b
    dtype = ctx.out_dtype()
    gamma = _clamped(b, standard_gamma(b, _seed(ctx, generator), b.convert(alpha, torch.float32)), torch.float32)
    last = alpha.rank - 1
    total = b.reduce(gamma, [last], b.constant(0.0, torch.float32), "stablehlo.add")
    total = b.broadcast_in_dim(total, gamma.shape, list(range(last)))
    return _clamped(b, b.div(gamma, total), dtype, upper=True)


@register(aten.poisson.default)
def _poisson(ctx: LoweringContext, rate: Value, generator: Any = None) -> Value:
    b = ctx.b
    seed = _seed(ctx, generator)
    lam = b.convert(rate, torch.float32)
    shape = lam.shape
    f32 = torch.float32

    def c(v: float) -> Value:
        return b.constant(v, f32, shape)

    large = b.compare(lam, c(10.0), "GE")
    # PTRS constants, for rates of 10 or more (others get harmless stand-ins)
    lam_big = b.select(large, lam, c(10.0))
    slam = b.unary("sqrt", lam_big)
    loglam = b.unary("log", lam_big)
    pb = b.add(c(0.931), b.mul(c(2.53), slam))
    pa = b.add(c(-0.059), b.mul(c(0.02483), pb))
    log_inv_alpha = b.unary("log", b.add(c(1.1239), b.div(c(1.1328), b.sub(pb, c(3.4)))))
    vr = b.sub(c(0.9277), b.div(c(3.6224), b.sub(pb, c(2.0))))
    enlam = b.unary("exponential", b.neg(lam))  # the small-rate method's threshold

    def step(bb: Builder, key: Value, count: Value, prod: Value) -> tuple[list[Value], Value]:
        def k(v: float) -> Value:
            return bb.constant(v, f32, shape)

        u1 = uniform01(bb, key, shape)
        u2 = uniform01(bb, key, shape, _SECOND_SALT)
        # small rates: multiply uniforms until the product drops to e^-rate or below
        prod = bb.mul(prod, u1)
        stop = bb.unary("not", bb.compare(prod, enlam, "GT"))
        small_count = bb.select(stop, count, bb.add(count, k(1.0)))
        # large rates: one PTRS candidate
        u = bb.sub(u1, k(0.5))
        us = bb.sub(k(0.5), bb.unary("abs", u))
        cand = bb.unary("floor", bb.add(bb.add(bb.mul(bb.add(bb.div(bb.mul(k(2.0), pa), us), pb), u), lam_big),
                                         k(0.43)))
        quick = bb.binary("and", bb.compare(us, k(0.07), "GE"), bb.compare(u2, vr, "LE"))
        reject = bb.binary("or", bb.compare(cand, k(0.0), "LT"),
                           bb.binary("and", bb.compare(us, k(0.013), "LT"), bb.compare(u2, us, "GT")))
        lhs = bb.sub(bb.add(bb.unary("log", u2), log_inv_alpha),
                     bb.unary("log", bb.add(bb.div(pa, bb.mul(us, us)), pb)))
        rhs = bb.sub(bb.add(bb.neg(lam_big), bb.mul(cand, loglam)), lgamma_value(bb, bb.add(cand, k(1.0))))
        slow = bb.binary("and", bb.unary("not", reject), bb.compare(lhs, rhs, "LE"))
        big_ok = bb.binary("or", quick, slow)
        new_count = bb.select(large, cand, small_count)
        accepted = bb.select(large, big_ok, stop)
        return [new_count, prod], accepted

    count, _ = _until_accepted(b, seed, shape, [c(0.0), c(1.0)], step)
    out = b.select(b.compare(lam, c(0.0), "EQ"), c(0.0), count)
    # a negative or NaN rate: NaN, and CPU's error at the next read (see _poisson_rate_bounds)
    out = b.select(b.compare(lam, c(0.0), "GE"), out, c(math.nan))
    return b.convert(out, ctx.out_dtype())


# Stirling's series tail log(k!) - [(k + 1/2) log(k + 1) - (k + 1) + log(2 pi) / 2] for k = 0..9
# (PyTorch's table; from the series beyond)
_STIRLING_TAIL = (0.0810614667953272, 0.0413406959554092, 0.0276779256849983, 0.02079067210376509,
                  0.0166446911898211, 0.0138761288230707, 0.0118967099458917, 0.0104112652619720,
                  0.00925546218271273, 0.00833056343336287)


def _stirling_tail(b: Builder, k: Value) -> Value:
    """PyTorch's stirling_approx_tail of a float k >= 0 (its table below 10, the series above)."""
    def c(v: float) -> Value:
        return b.constant(v, k.dtype, k.shape)

    kp1 = b.add(k, c(1.0))
    kp1sq = b.mul(kp1, kp1)
    series = b.div(b.sub(c(1.0 / 12), b.div(b.sub(c(1.0 / 360), b.div(c(1.0 / 1260), kp1sq)), kp1sq)), kp1)
    out = series
    for i, v in enumerate(_STIRLING_TAIL):
        out = b.select(b.compare(k, c(float(i)), "EQ"), c(v), out)
    return out


@register(aten.binomial.default)
def _binomial(ctx: LoweringContext, count: Value, prob: Value, generator: Any = None) -> Value:
    """PyTorch's sample_binomial: with q the smaller of prob and 1 - prob, Hoermann's BTRS where
    count * q >= 10, else the inversion by geometric gaps; count minus the sample when q = 1 - prob."""
    b = ctx.b
    seed = _seed(ctx, generator)
    f32 = torch.float32
    n = b.convert(count, f32)
    p = b.convert(prob, f32)
    shape = ctx.out_shape()
    n, p = b.broadcast_to(n, shape), b.broadcast_to(p, shape)

    def c(v: float) -> Value:
        return b.constant(v, f32, shape)

    flip = b.compare(p, c(0.5), "GT")
    q = b.select(flip, b.sub(c(1.0), p), p)
    q = b.select(b.compare(q, c(0.0), "GT"), q, c(0.25))  # stand-in where the result is fixed anyway
    big = b.compare(b.mul(n, q), c(10.0), "GE")
    # BTRS constants
    spq = b.unary("sqrt", b.mul(b.mul(n, q), b.sub(c(1.0), q)))
    pb = b.add(c(1.15), b.mul(c(2.53), spq))
    pa = b.add(b.add(c(-0.0873), b.mul(c(0.0248), pb)), b.mul(c(0.01), q))
    pc = b.add(b.mul(n, q), c(0.5))
    v_r = b.sub(c(0.92), b.div(c(4.2), pb))
    r = b.div(q, b.sub(c(1.0), q))
    alpha = b.mul(b.add(c(2.83), b.div(c(5.1), pb)), spq)
    m = b.unary("floor", b.mul(b.add(n, c(1.0)), q))
    log_q1 = b.unary("log_plus_one", b.neg(q))

    def step(bb: Builder, key: Value, count_: Value, geom_sum: Value) -> tuple[list[Value], Value]:
        def k_(v: float) -> Value:
            return bb.constant(v, f32, shape)

        u1 = uniform01(bb, key, shape)
        u2 = uniform01(bb, key, shape, _SECOND_SALT)
        # inversion: add a geometric gap; stop once the gaps pass count
        geom_sum = bb.add(geom_sum, bb.unary("ceil", bb.div(bb.unary("log", u1), log_q1)))
        stop = bb.compare(geom_sum, n, "GT")
        inv_count = bb.select(stop, count_, bb.add(count_, k_(1.0)))
        # BTRS candidate
        u = bb.sub(u1, k_(0.5))
        us = bb.sub(k_(0.5), bb.unary("abs", u))
        k = bb.unary("floor", bb.add(bb.mul(bb.add(bb.div(bb.mul(k_(2.0), pa), us), pb), u), pc))
        sane = bb.binary("and", bb.compare(k, k_(0.0), "GE"), bb.compare(k, n, "LE"))
        quick = bb.binary("and", bb.compare(us, k_(0.07), "GE"), bb.compare(u2, v_r, "LE"))
        v = bb.unary("log", bb.div(bb.mul(u2, alpha), bb.add(bb.div(pa, bb.mul(us, us)), pb)))
        nm1 = bb.add(bb.sub(n, m), k_(1.0))
        nk1 = bb.add(bb.sub(n, k), k_(1.0))
        upper = bb.add(bb.add(
            bb.mul(bb.add(m, k_(0.5)), bb.unary("log", bb.div(bb.add(m, k_(1.0)), bb.mul(r, nm1)))),
            bb.mul(bb.add(n, k_(1.0)), bb.unary("log", bb.div(nm1, nk1)))),
            bb.mul(bb.add(k, k_(0.5)), bb.unary("log", bb.div(bb.mul(r, nk1), bb.add(k, k_(1.0))))))
        upper = bb.sub(bb.add(bb.add(upper, _stirling_tail(bb, m)), _stirling_tail(bb, bb.sub(n, m))),
                       bb.add(_stirling_tail(bb, bb.select(sane, k, k_(0.0))),
                              _stirling_tail(bb, bb.select(sane, bb.sub(n, k), k_(0.0)))))
        btrs_ok = bb.binary("and", sane, bb.binary("or", quick, bb.compare(v, upper, "LE")))
        return [bb.select(big, k, inv_count), geom_sum], bb.select(big, btrs_ok, stop)

    sample, _ = _until_accepted(b, seed, shape, [c(0.0), c(0.0)], step)
    sample = b.select(flip, b.sub(n, sample), sample)
    # CPU's order: no trials or no chance gives 0, certainty gives count, a NaN probability NaN
    out = b.select(b.compare(p, p, "NE"), c(math.nan), b.select(b.compare(p, c(1.0), "GE"), n, sample))
    fixed_zero = b.binary("or", b.compare(n, c(0.0), "LE"), b.compare(p, c(0.0), "LE"))
    return b.convert(b.select(fixed_zero, c(0.0), out), ctx.out_dtype())


@register_index_bounds(aten.poisson.default)
def _poisson_rate_bounds(rate: Any, generator: Any = None) -> list[Bound]:
    """CPU raises for a negative or NaN rate: ``rate >= 0`` must hold everywhere, checked on the
    device flag (reported at the next read; at once in Debug mode), as the index checks are."""
    if not isinstance(rate, torch.Tensor) or rate.device.type != "tpu":
        return []
    return [Bound(rate >= 0, 1, 2, RuntimeError, "invalid Poisson rate, expected rate to be non-negative")]


# PyTorch has no meta kernels for the Dirichlet and binomial samplers; the engine needs their
# output metadata.
_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_sample_dirichlet", lambda alpha, generator=None: torch.empty_like(alpha), "Meta")
_meta_lib.impl("binomial", lambda count, prob, generator=None: count.new_empty(
    torch.broadcast_shapes(count.shape, prob.shape)), "Meta")
