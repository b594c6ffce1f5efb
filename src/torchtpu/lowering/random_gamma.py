"""Gamma and Dirichlet samples: ``torch.distributions.Gamma/Dirichlet/Beta(...).sample()``.

Marsaglia and Tsang's rejection method, as PyTorch's ``sample_gamma``
(aten/src/ATen/native/Distributions.h): shape parameters below 1 are boosted by one and
the sample scaled by U^(1/alpha); each element draws (normal, uniform) candidates until
one is accepted. On the device every element draws a candidate per round of a
``stablehlo.while``, and rounds go on until every element has accepted one (more than
95% accept in each round). Each round's random bits come from the op's seed advanced by
the round number, so a result depends only on the seed, as every random op here.
Samples are clamped below at the dtype's smallest normal number, as on CPU.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .builder import Builder, Value
from .random_ops import _seed, normal01, uniform01
from .registry import LoweringContext, register

aten = torch.ops.aten

# An element that has not accepted after this many rounds stays NaN; each round accepts
# with probability > 95%, so no element gets near it.
_MAX_ROUNDS = 512
_ROUND_STEP = 0xD1B54A32D192ED03  # added to the seed per round (odd: every round differs)
_BOOST_SALT = 0x94D049BB133111EB
_ACCEPT_SALT = 0xBF58476D1CE4E5B9


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

    types = [((), torch.int64), (shape, torch.bool), (shape, f32)]
    n = len(shape)

    def cond(bb: Builder, i: Value, done: Value, value: Value) -> Value:
        open_ = bb.convert(bb.unary("not", done), torch.int32)
        any_open = bb.compare(bb.reduce(open_, list(range(n)), bb.constant(0, torch.int32), "stablehlo.maximum"),
                              bb.constant(0, torch.int32), "GT")
        return bb.binary("and", bb.compare(i, bb.constant(_MAX_ROUNDS, torch.int64), "LT"), any_open)

    def body(bb: Builder, i: Value, done: Value, value: Value) -> list[Value]:
        def k(v: float) -> Value:
            return bb.constant(v, f32, shape)

        step = bb.mul(bb.convert(bb.add(i, bb.constant(1, torch.int64)), torch.uint64),
                      bb.constant(_ROUND_STEP, torch.uint64))
        key = bb.add(seed, bb.broadcast_to(step, seed.shape))
        x = normal01(bb, key, shape)
        y = bb.add(k(1.0), bb.mul(cc, x))
        v = bb.mul(bb.mul(y, y), y)
        u = bb.sub(k(1.0), uniform01(bb, key, shape, _ACCEPT_SALT))
        xx = bb.mul(x, x)
        squeeze = bb.compare(u, bb.sub(k(1.0), bb.mul(k(0.0331), bb.mul(xx, xx))), "LT")
        log_test = bb.compare(bb.unary("log", u), bb.add(bb.mul(k(0.5), xx),
                                                           bb.mul(d, bb.add(bb.sub(k(1.0), v), bb.unary("log", v)))),
                              "LT")
        # CPU redraws while y <= 0, so a NaN y (a NaN or negative alpha) is a candidate too
        valid = bb.unary("not", bb.compare(y, k(0.0), "LE"))
        ok = bb.binary("and", valid, bb.binary("or", squeeze, log_test))
        take = bb.binary("and", ok, bb.unary("not", done))
        value = bb.select(take, bb.mul(d, v), value)
        return [bb.add(i, bb.constant(1, torch.int64)), bb.binary("or", done, ok), value]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    start = [b.constant(0, torch.int64), b.constant(False, torch.bool, shape), c(math.nan)]
    _, _, value = b.op("stablehlo.while", start, types, region=regions)
    sample = b.mul(scale, value)
    return b.select(b.compare(alpha, c(0.0), "EQ"), c(0.0), sample)  # CPU: alpha 0 gives 0


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


# PyTorch has no meta kernel for the Dirichlet sampler; the engine needs its output metadata.
_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_sample_dirichlet", lambda alpha, generator=None: torch.empty_like(alpha), "Meta")
