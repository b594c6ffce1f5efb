"""Random ops: XLA's counter-based generator, seeded per call from the tpu Generator.

Each call draws a fresh 64-bit seed from the (C++) generator, so results
depend only on ``torch.manual_seed`` and the call sequence, never on timing.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .builder import Builder, Value
from .elementwise import opmath
from .registry import (
    LoweringContext,
    register,
    register_argument_check,
    register_graph_only,
    register_host_kernel,
)

aten = torch.ops.aten


def _seed(ctx: LoweringContext, generator: Any) -> Value:
    if isinstance(generator, Value):
        return generator
    return ctx.extras["seed"]


def uniform01(b: Builder, state: Value, shape: tuple[int, ...], salt: int = 0) -> Value:
    """f32 uniforms in [0, 1) from 23 random mantissa bits."""
    if salt:
        state = b.add(state, b.constant(salt, torch.uint64, state.shape))
    _, bits = b.rng_bit_generator(state, shape, torch.uint32)
    mant = b.binary("shift_right_logical", bits, b.constant(9, torch.uint32, shape))
    one_bits = b.binary("or", mant, b.constant(0x3F800000, torch.uint32, shape))
    f = b.bitcast_convert(one_bits, torch.float32, shape)
    return b.sub(f, b.constant(1.0, torch.float32, shape))


def normal01(b: Builder, state: Value, shape: tuple[int, ...]) -> Value:
    """Standard normals by Box-Muller."""
    u1 = uniform01(b, state, shape, 0)
    u2 = uniform01(b, state, shape, 0x9E3779B97F4A7C15)
    one = b.constant(1.0, torch.float32, shape)
    r = b.unary("sqrt", b.mul(b.constant(-2.0, torch.float32, shape), b.unary("log", b.sub(one, u1))))
    theta = b.mul(b.constant(2.0 * math.pi, torch.float32, shape), u2)
    return b.mul(r, b.unary("cosine", theta))


@register(aten.uniform.default)
def _uniform(ctx: LoweringContext, x: Value, lo: Any = 0.0, hi: Any = 1.0, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    acc = opmath(ctx.out_dtype())
    u = b.convert(uniform01(b, _seed(ctx, generator), shape), acc)
    lov, hiv = ctx.scalar(lo, acc, shape), ctx.scalar(hi, acc, shape)
    return b.convert(b.add(lov, b.mul(u, b.sub(hiv, lov))), ctx.out_dtype())


@register(aten.normal_functional.default)
def _normal(ctx: LoweringContext, x: Value, mean: Any = 0.0, std: Any = 1.0, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    acc = opmath(ctx.out_dtype())
    z = b.convert(normal01(b, _seed(ctx, generator), shape), acc)
    return b.convert(b.add(ctx.scalar(mean, acc, shape), b.mul(z, ctx.scalar(std, acc, shape))), ctx.out_dtype())


@register(aten.bernoulli.p)
def _bernoulli(ctx: LoweringContext, x: Value, p: Any = 0.5, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    u = uniform01(b, _seed(ctx, generator), shape)
    return b.convert(b.compare(u, ctx.scalar(p, torch.float32, shape), "LT"), ctx.out_dtype())


@register(aten.bernoulli.default)
def _bernoulli_tensor(ctx: LoweringContext, x: Value, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    u = uniform01(b, _seed(ctx, generator), shape)
    return b.convert(b.compare(u, b.convert(x, torch.float32), "LT"), ctx.out_dtype())


@register(aten.bernoulli.Tensor)
def _bernoulli_p_tensor(ctx: LoweringContext, x: Value, p: Value, generator: Any = None) -> Value:
    """``bernoulli_(p)`` with a tensor of probabilities, broadcast to ``x``'s shape."""
    b = ctx.b
    shape = ctx.out_shape()
    u = uniform01(b, _seed(ctx, generator), shape)
    return b.convert(b.compare(u, b.broadcast_to(b.convert(p, torch.float32), shape), "LT"), ctx.out_dtype())


@register_host_kernel(aten.randperm.generator_out)
def randperm(n: int, *, generator: Any = None, out: torch.Tensor) -> torch.Tensor:
    """A permutation of 0..n-1: the stable argsort of n random 64-bit keys (tied keys keep their
    order, so the result is a permutation whatever the keys), as device ops."""
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (n,), dtype=torch.int64, device=out.device, generator=generator)
    perm = torch.argsort(keys, stable=True)
    out.resize_(n)
    return out.copy_(perm)


@register(aten.native_dropout.default)
def _dropout(ctx: LoweringContext, x: Value, p: Any, train: bool | None) -> tuple[Value, Value]:
    b = ctx.b
    if train is False:
        return x, b.constant(True, torch.bool, x.shape)
    acc = opmath(x.dtype)
    u = uniform01(b, ctx.extras["seed"], x.shape)
    pv = ctx.scalar(p, torch.float32, x.shape)
    keep = b.compare(u, pv, "GE")
    one = b.constant(1.0, acc, x.shape)
    scale = b.div(one, b.sub(one, b.convert(pv, acc)))
    y = b.select(keep, b.mul(b.convert(x, acc), scale), b.constant(0.0, acc, x.shape))
    return b.convert(y, ctx.out_dtype(0)), keep


@register(aten.native_dropout_backward.default)
def _dropout_backward(ctx: LoweringContext, grad: Value, mask: Value, scale: Any) -> Value:
    b = ctx.b
    # in the result's type: a bool or integer gradient times a float scale is a float (CPU's
    # grad * mask * scale), not a product taken in bool (which turned scale 2 into 1)
    acc = opmath(ctx.out_dtype())
    g = b.convert(grad, acc)
    m = b.convert(mask, acc)
    return b.convert(b.mul(b.mul(g, m), ctx.scalar(scale, acc, g.shape)), ctx.out_dtype())


# The parameter checks of CPU's distribution kernels (DistributionTemplates.h), same messages. The
# parameters are runtime scalars, so these run on every call (registry.register_argument_check).
@register_argument_check(aten.exponential.default)
def _check_exponential(x: Any, lambd: Any = 1.0, generator: Any = None) -> None:
    if not lambd > 0.0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")


@register_argument_check(aten.cauchy.default)
def _check_cauchy(x: Any, median: Any = 0.0, sigma: Any = 1.0, generator: Any = None) -> None:
    if not sigma > 0.0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma:g}")


@register_argument_check(aten.log_normal.default)
def _check_log_normal(x: Any, mean: Any = 1.0, std: Any = 2.0, generator: Any = None) -> None:
    if not std > 0.0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std:g}")


def _check_normal_std(std: Any) -> None:
    if isinstance(std, (int, float)) and not std >= 0.0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")


@register_argument_check(aten.normal_functional.default)
def _check_normal_(x: Any, mean: Any = 0.0, std: Any = 1.0, generator: Any = None) -> None:
    _check_normal_std(std)


@register_argument_check(aten.normal.Tensor_float, aten.normal.float_float)
def _check_normal(mean: Any, std: Any = 1.0, *rest: Any) -> None:
    _check_normal_std(std)  # a tensor std is a derived check (index_bounds.py)


@register_argument_check(aten.geometric.default)
def _check_geometric(x: Any, p: Any, generator: Any = None) -> None:
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p:g}")


@register_argument_check(aten.uniform.default)
def _check_uniform(x: Any, low: Any = 0.0, high: Any = 1.0, generator: Any = None) -> None:
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}")


@register(aten.exponential.default)
def _exponential(ctx: LoweringContext, x: Value, lambd: Any = 1.0, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    u = uniform01(b, _seed(ctx, generator), shape)
    one = b.constant(1.0, torch.float32, shape)
    # -log(1 - u) / lambda, with 1 - u in (0, 1]
    r = b.div(b.neg(b.unary("log", b.sub(one, u))), ctx.scalar(lambd, torch.float32, shape))
    return b.convert(r, ctx.out_dtype())


@register(aten.cauchy.default)
def _cauchy(ctx: LoweringContext, x: Value, median: Any = 0.0, sigma: Any = 1.0, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    u = uniform01(b, _seed(ctx, generator), shape)
    t = b.unary("tan", b.mul(b.constant(math.pi, torch.float32, shape),
                             b.sub(u, b.constant(0.5, torch.float32, shape))))
    r = b.add(ctx.scalar(median, torch.float32, shape), b.mul(ctx.scalar(sigma, torch.float32, shape), t))
    return b.convert(r, ctx.out_dtype())


@register(aten.log_normal.default)
def _log_normal(ctx: LoweringContext, x: Value, mean: Any = 1.0, std: Any = 2.0, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    z = normal01(b, _seed(ctx, generator), shape)
    r = b.unary("exponential", b.add(ctx.scalar(mean, torch.float32, shape),
                                      b.mul(ctx.scalar(std, torch.float32, shape), z)))
    return b.convert(r, ctx.out_dtype())


@register(aten.geometric.default)
def _geometric(ctx: LoweringContext, x: Value, p: Any, generator: Any = None) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    u = uniform01(b, _seed(ctx, generator), shape)
    one = b.constant(1.0, torch.float32, shape)
    # number of Bernoulli(p) trials up to the first success: ceil(log(1-u) / log(1-p)), at least 1
    k = b.unary("ceil", b.div(b.unary("log", b.sub(one, u)),
                              b.unary("log", b.sub(one, ctx.scalar(p, torch.float32, shape)))))
    return b.convert(b.maximum(k, one), ctx.out_dtype())


def _normal_from(ctx: LoweringContext, mean: Any, std: Any, generator: Any) -> Value:
    b = ctx.b
    shape = ctx.out_shape()
    acc = opmath(ctx.out_dtype())
    z = b.convert(normal01(b, _seed(ctx, generator), shape), acc)
    return b.convert(b.add(ctx.scalar(mean, acc, shape), b.mul(z, ctx.scalar(std, acc, shape))), ctx.out_dtype())


@register(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _normal_tensors(ctx: LoweringContext, mean: Any, std: Any = 1.0, generator: Any = None) -> Value:
    return _normal_from(ctx, mean, std, generator)


@register(aten.normal.float_float)
def _normal_float_float(ctx: LoweringContext, mean: Any, std: Any, size: list[int], generator: Any = None,
                        *rest: Any) -> Value:
    return _normal_from(ctx, mean, std, generator)


def _random_int(ctx: LoweringContext, lo: Any, hi: Any, generator: Any) -> Value:
    """Integers uniform in [lo, hi) from 2 x 32 random bits (computed in f64, then floored)."""
    _check_random_range(lo, hi)  # eager calls checked it already; a compiled randint is checked here
    b = ctx.b
    shape = ctx.out_shape()
    state = _seed(ctx, generator)
    _, bits = b.rng_bit_generator(state, shape, torch.uint64)
    u = b.div(b.convert(b.binary("shift_right_logical", bits, b.constant(11, torch.uint64, shape)), torch.float64),
              b.constant(float(1 << 53), torch.float64, shape))
    lov = ctx.scalar(lo, torch.float64, shape)
    span = b.sub(ctx.scalar(hi, torch.float64, shape), lov)
    r = b.add(lov, b.unary("floor", b.mul(u, span)))
    return b.convert(b.convert(r, torch.int64), ctx.out_dtype())


def _check_random_range(lo: Any, hi: Any) -> None:
    if isinstance(lo, int) and isinstance(hi, int) and lo >= hi:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={hi}")


@register_argument_check(getattr(aten.random, "from"))
def _check_random_from(x: Any, lo: int, hi: int | None, generator: Any = None) -> None:
    _check_random_range(lo, hi)


@register_argument_check(aten.random.to)
def _check_random_to(x: Any, hi: int, generator: Any = None) -> None:
    _check_random_range(0, hi)


def _unbounded_end(out: torch.dtype) -> int:
    """One past the largest value ``random_`` draws without an upper bound, as on PyTorch's CPU:
    an integer dtype's max, 1 for bool, and 2**digits for a float dtype (all exact there)."""
    if out == torch.bool:
        return 2
    if out.is_floating_point:
        digits = 1 - round(math.log2(torch.finfo(out).eps))  # 24 for float32, 8 for bfloat16
        return (1 << digits) + 1
    return torch.iinfo(out).max + 1


@register(getattr(aten.random, "from"))
def _random_from(ctx: LoweringContext, x: Value, lo: int, hi: int | None, generator: Any = None) -> Value:
    return _random_int(ctx, lo, _unbounded_end(ctx.out_dtype()) if hi is None else hi, generator)


@register(aten.random.to)
def _random_to(ctx: LoweringContext, x: Value, hi: int, generator: Any = None) -> Value:
    return _random_int(ctx, 0, hi, generator)


@register(aten.random.default)
def _random_full_range(ctx: LoweringContext, x: Value, generator: Any = None) -> Value:
    """``random_()`` without bounds: 0 up to :func:`_unbounded_end`, as on PyTorch's CPU."""
    return _random_int(ctx, 0, _unbounded_end(ctx.out_dtype()), generator)


@register(aten.multinomial.default)
def _multinomial(ctx: LoweringContext, probs: Value, num_samples: int, replacement: bool = False,
                 generator: Any = None) -> Value:
    """Categorical draws: inverse CDF with replacement, Gumbel top-k without."""
    b = ctx.b
    if not probs.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {probs.dtype}")
    rows = probs.shape[0] if probs.rank == 2 else 1
    c = probs.shape[-1]
    if not replacement and num_samples > c:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    p = b.reshape(b.convert(probs, torch.float32), (rows, c))
    state = _seed(ctx, generator)
    if replacement:
        from .reductions import _scan

        cdf = _scan(b, p, 1, "stablehlo.add", 0)
        total = b.reduce(p, [1], b.constant(0.0, torch.float32), "stablehlo.add")
        u = uniform01(b, state, (rows, num_samples))
        target = b.mul(u, b.broadcast_in_dim(total, (rows, num_samples), [0]))
        full = (rows, num_samples, c)
        below = b.compare(b.broadcast_in_dim(cdf, full, [0, 2]), b.broadcast_in_dim(target, full, [0, 1]), "LE")
        idx = b.reduce(b.convert(below, torch.int64), [2], b.constant(0, torch.int64), "stablehlo.add")
        idx = b.minimum(idx, b.constant(c - 1, torch.int64, idx.shape))
    else:
        from .sort import sort_with_indices

        u = uniform01(b, state, (rows, c))
        tiny = b.constant(1e-20, torch.float32, (rows, c))
        gumbel = b.neg(b.unary("log", b.neg(b.unary("log", b.maximum(u, tiny)))))
        keys = b.add(b.unary("log", p), gumbel)
        _, order = sort_with_indices(b, keys, 1, descending=True)
        idx = b.slice(order, [0, 0], [rows, num_samples])
    return b.reshape(idx, ctx.out_shape())


@register(aten.rrelu_with_noise_functional.default)
def _rrelu_with_noise(ctx: LoweringContext, x: Value, noise: Value, lower: Any = 0.125, upper: Any = 1.0 / 3.0,
                      training: bool = False, generator: Any = None) -> tuple[Value, Value]:
    """Training: negative inputs scaled by a uniform draw in [lower, upper] (the noise records it)."""
    b = ctx.b
    acc = opmath(x.dtype)
    v = b.convert(x, acc)
    s = v.shape
    zero = b.constant(0.0, acc, s)
    lo, hi = ctx.scalar(lower, acc, s), ctx.scalar(upper, acc, s)
    if training:
        u = b.convert(uniform01(b, _seed(ctx, generator), s), acc)
        r = b.add(lo, b.mul(u, b.sub(hi, lo)))
        pos = b.compare(v, zero, "GT")
        out = b.select(pos, v, b.mul(v, r))
        new_noise = b.select(pos, b.constant(1.0, acc, s), r)
        return b.convert(out, ctx.out_dtype(0)), b.convert(new_noise, ctx.out_dtype(1))
    slope = b.div(b.add(lo, hi), b.constant(2.0, acc, s))
    out = b.select(b.compare(v, zero, "GT"), v, b.mul(v, slope))
    return b.convert(out, ctx.out_dtype(0)), noise


@register(aten.rrelu_with_noise_backward.default)
def _rrelu_with_noise_backward(ctx: LoweringContext, grad: Value, x: Value, noise: Value, lower: Any, upper: Any,
                               training: bool, self_is_result: bool) -> Value:
    b = ctx.b
    acc = opmath(grad.dtype)
    g, v = b.convert(grad, acc), b.convert(x, acc)
    s = g.shape
    lo, hi = ctx.scalar(lower, acc, s), ctx.scalar(upper, acc, s)
    slope = b.div(b.add(lo, hi), b.constant(2.0, acc, s))
    eval_grad = b.select(b.compare(v, b.constant(0.0, acc, s), "GT"), g, b.mul(g, slope))
    if training:
        noisy = b.compare(b.sub(hi, lo), b.constant(1e-6, acc, s), "GT")
        r = b.select(noisy, b.mul(g, b.convert(noise, acc)), eval_grad)
    else:
        r = eval_grad
    return b.convert(r, ctx.out_dtype())


# Random factories. In eager mode PyTorch's composites run them as empty + uniform_/normal_/random_
# (the lowerings above); a compiled graph keeps them whole, so they are lowered here, the same way.
def _generator(ctx: LoweringContext, args: tuple) -> Any:
    names = [a.name for a in ctx.op._schema.arguments]
    return args[names.index("generator")] if "generator" in names else None


@register_graph_only(aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.rand_like.generator)
def _rand(ctx: LoweringContext, *args: Any) -> Value:
    return ctx.b.convert(uniform01(ctx.b, _seed(ctx, _generator(ctx, args)), ctx.out_shape()), ctx.out_dtype())


@register_graph_only(aten.randn.default, aten.randn.generator, aten.randn_like.default, aten.randn_like.generator)
def _randn(ctx: LoweringContext, *args: Any) -> Value:
    return ctx.b.convert(normal01(ctx.b, _seed(ctx, _generator(ctx, args)), ctx.out_shape()), ctx.out_dtype())


@register_graph_only(aten.randint.default, aten.randint.generator, aten.randint_like.default,
                     aten.randint_like.generator)
def _randint_high(ctx: LoweringContext, *args: Any) -> Value:
    # randint(high, size) or randint_like(self, high)
    high = args[0] if ctx.op in (aten.randint.default, aten.randint.generator) else args[1]
    return _random_int(ctx, 0, high, _generator(ctx, args))


@register_graph_only(aten.randint.low, aten.randint.low_generator, aten.randint_like.low_dtype,
                     aten.randint_like.low_generator_dtype)
def _randint_low(ctx: LoweringContext, *args: Any) -> Value:
    # randint(low, high, size) or randint_like(self, low, high)
    low, high = args[:2] if ctx.op in (aten.randint.low, aten.randint.low_generator) else args[1:3]
    return _random_int(ctx, low, high, _generator(ctx, args))
