"""Elementwise ops: unary math, binary arithmetic, comparisons, activations and their backwards.

Reduced-precision floats (bf16, f16) are computed in f32 and rounded once, as
PyTorch's CPU kernels do (their "opmath" type).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import accurate_math, target
from .builder import Builder, Value
from .registry import LoweringContext, register, register_argument_check, register_output_layout

aten = torch.ops.aten
_LOW = (torch.bfloat16, torch.float16)


def opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW else dtype


def modulus(b: Builder, v: Value) -> Value:
    """|v|: for a complex value its (real) modulus."""
    if v.dtype.is_complex:
        return b.op1("stablehlo.abs", [v], v.shape, v.dtype.to_real())
    return b.unary("abs", v)


def operand(ctx: LoweringContext, x: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> Value:
    """An argument (Value or Python number) converted to ``dtype`` and broadcast to ``shape``."""
    return ctx.scalar(x, dtype, shape)


def _shape(ctx: LoweringContext) -> tuple[int, ...]:
    return ctx.out_shape(0)


# -- unary -------------------------------------------------------------------
_UNARY_FLOAT = {
    aten.exp: "exponential", aten.log: "log", aten.sin: "sine", aten.cos: "cosine", aten.tanh: "tanh",
    aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.log1p: "log_plus_one", aten.expm1: "exponential_minus_one",
    aten.floor: "floor", aten.ceil: "ceil", aten.tan: "tan", aten.sigmoid: "logistic",
    aten.round: "round_nearest_even",
}
_UNARY_CHLO = {aten.asin: "asin", aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh",
               aten.cosh: "cosh", aten.erfinv: "erf_inv",
               aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh"}


_INTEGER_IDENTITY = {"stablehlo.floor", "stablehlo.ceil", "stablehlo.round_nearest_even"}


def _float_unary(name: str):
    def lower(ctx: LoweringContext, x: Value) -> Value:
        out = ctx.out_dtype()
        if name in _INTEGER_IDENTITY and not out.is_floating_point:
            return x  # rounding an integer (or bool) tensor is the identity, as on CPU
        v = ctx.b.convert(x, opmath(out))
        accurate = accurate_math.FORMS.get(name)
        if accurate is not None and v.dtype == torch.float32 and target.accurate_transcendentals():
            return ctx.b.convert(accurate(ctx.b, v), out)
        return ctx.b.convert(ctx.b.op1(name, [v], v.shape, v.dtype), out)

    return lower


for _op, _name in _UNARY_FLOAT.items():
    register(_op.default)(_float_unary(f"stablehlo.{_name}"))
for _op, _name in _UNARY_CHLO.items():
    register(_op.default)(_float_unary(f"chlo.{_name}"))


@register(aten.round.decimals)
def _round_decimals(ctx: LoweringContext, x: Value, decimals: int = 0) -> Value:
    b = ctx.b
    if not x.dtype.is_floating_point:
        return x
    v = b.convert(x, opmath(x.dtype))
    scale = b.constant(10.0 ** decimals, v.dtype, v.shape)
    r = b.unary("round_nearest_even", b.mul(v, scale))
    return b.convert(b.div(r, scale), ctx.out_dtype())


@register(aten.log2.default, aten.log10.default)
def _log_base(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    base = 2.0 if ctx.op.overloadpacket is aten.log2 else 10.0
    r = b.div(b.unary("log", v), b.constant(math.log(base), v.dtype, v.shape))
    return b.convert(r, out)


@register(aten.exp2.default)
def _exp2(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    return b.convert(b.unary("exponential", b.mul(v, b.constant(math.log(2.0), v.dtype, v.shape))), out)


@register(aten.neg.default)
def _neg(ctx: LoweringContext, x: Value) -> Value:
    return ctx.b.neg(x)


@register(aten.abs.default)
def _abs(ctx: LoweringContext, x: Value) -> Value:
    if x.dtype == torch.bool:
        return x
    return modulus(ctx.b, x)


@register(aten.sign.default, aten.sgn.default)
def _sign(ctx: LoweringContext, x: Value) -> Value:
    if x.dtype == torch.bool:
        return x
    if not x.dtype.is_floating_point:
        return ctx.b.unary("sign", x)
    # PyTorch computes (0 < x) - (x < 0): +0 for -0 and for nan, where stablehlo.sign keeps them
    b = ctx.b
    zero = b.constant(0.0, x.dtype, x.shape)
    return b.sub(b.convert(b.compare(x, zero, "GT"), x.dtype), b.convert(b.compare(x, zero, "LT"), x.dtype))


@register(aten.trunc.default, aten.fix.default)
def _trunc(ctx: LoweringContext, x: Value) -> Value:
    if not x.dtype.is_floating_point:
        return x
    b = ctx.b
    v = b.convert(x, opmath(x.dtype))
    zero = b.constant(0, v.dtype, v.shape)
    r = b.select(b.compare(v, zero, "LT"), b.unary("ceil", v), b.unary("floor", v))
    return b.convert(r, x.dtype)


@register(aten.frac.default)
def _frac(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    return b.sub(x, _trunc(ctx, x))


@register(aten.reciprocal.default)
def _reciprocal(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    return b.convert(b.div(b.constant(1.0, v.dtype, v.shape), v), out)


@register(aten.square.default)
def _square(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    v = b.convert(x, ctx.out_dtype())
    return b.mul(v, v)


@register(aten.bitwise_not.default, aten.logical_not.default)
def _not(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    if ctx.op.overloadpacket is aten.logical_not:
        x = b.convert(x, torch.bool)
        return b.convert(b.unary("not", x), ctx.out_dtype())
    return b.unary("not", x)


@register(aten.isnan.default)
def _isnan(ctx: LoweringContext, x: Value) -> Value:
    if not x.dtype.is_floating_point:
        return ctx.b.constant(False, torch.bool, x.shape)
    return ctx.b.compare(x, x, "NE")


@register(aten.isinf.default)
def _isinf(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    if not x.dtype.is_floating_point:
        return b.constant(False, torch.bool, x.shape)
    return b.compare(b.unary("abs", x), b.constant(math.inf, x.dtype, x.shape), "EQ")


@register(aten.isfinite.default)
def _isfinite(ctx: LoweringContext, x: Value) -> Value:
    if not x.dtype.is_floating_point:
        return ctx.b.constant(True, torch.bool, x.shape)
    return ctx.b.op1("stablehlo.is_finite", [x], x.shape, torch.bool)


# -- binary ------------------------------------------------------------------
def _binary_operands(ctx: LoweringContext, a: Any, c: Any) -> tuple[Value, Value, torch.dtype]:
    out = ctx.out_dtype()
    compute = opmath(out)
    shape = _shape(ctx)
    return operand(ctx, a, compute, shape), operand(ctx, c, compute, shape), out


@register(aten.add.Tensor, aten.add.Scalar)
def _add(ctx: LoweringContext, a: Any, c: Any, alpha: Any = 1) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    b = ctx.b
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = b.mul(y, operand(ctx, alpha, y.dtype, y.shape))
    if out == torch.bool:
        return b.binary("or", x, y)
    return b.convert(b.add(x, y), out)


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(ctx: LoweringContext, a: Any, c: Any, alpha: Any = 1) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    b = ctx.b
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = b.mul(y, operand(ctx, alpha, y.dtype, y.shape))
    return b.convert(b.sub(x, y), out)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx: LoweringContext, a: Any, c: Any, alpha: Any = 1) -> Value:
    return _sub(ctx, c, a, alpha)


@register(aten.mul.Tensor, aten.mul.Scalar)
def _mul(ctx: LoweringContext, a: Any, c: Any) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    b = ctx.b
    if out == torch.bool:
        return b.binary("and", x, y)
    r = b.mul(x, y)
    if out.is_floating_point:
        # XLA rewrites v * convert(pred) as select(pred, v, 0), which loses IEEE's 0 * inf = NaN
        # (CPU: tensor([True, False]) * inf is [inf, nan]); put the NaN back where it belongs
        for flag, other in ((a, y), (c, x)):
            if isinstance(flag, Value) and flag.dtype == torch.bool:
                off = b.unary("not", b.broadcast_to(flag, r.shape))
                lost = b.binary("and", off, b.unary("not", b.op1("stablehlo.is_finite", [other], r.shape, torch.bool)))
                r = b.select(lost, b.constant(math.nan, r.dtype, r.shape), r)
    return b.convert(r, out)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(ctx: LoweringContext, a: Any, c: Any, rounding_mode: str | None = None) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    if rounding_mode is None or out.is_floating_point:
        compute = opmath(out) if out.is_floating_point or out.is_complex else torch.float32
        x, y = operand(ctx, a, compute, shape), operand(ctx, c, compute, shape)
        q = b.div(x, y)
        if rounding_mode == "trunc":
            if out in _LOW:
                # CPU rounds the quotient to the dtype before truncating
                q = b.convert(b.convert(q, out), compute)
            q = _trunc(ctx, q)
        elif rounding_mode == "floor":
            q = _floor_div_float(b, x, y)
        return b.convert(q, out)
    x, y = operand(ctx, a, out, shape), operand(ctx, c, out, shape)
    q = b.div(x, y)  # integer division truncates toward zero
    if rounding_mode == "floor":
        r = b.binary("remainder", x, y)
        zero = b.constant(0, out, shape)
        adjust = b.binary("and", b.compare(r, zero, "NE"),
                          b.compare(b.compare(r, zero, "LT"), b.compare(y, zero, "LT"), "NE"))
        q = b.select(adjust, b.sub(q, b.constant(1, out, shape)), q)
    return q


def _floor_div_float(b: Builder, x: Value, y: Value) -> Value:
    # Python semantics, as PyTorch computes it: floor((x - fmod(x, y)) / y) corrected.
    mod = b.binary("remainder", x, y)
    div = b.div(b.sub(x, mod), y)
    zero = b.constant(0.0, x.dtype, x.shape)
    fix = b.binary("and", b.compare(mod, zero, "NE"), b.compare(b.compare(y, zero, "LT"), b.compare(mod, zero, "LT"),
                                                                   "NE"))
    div = b.select(fix, b.sub(div, b.constant(1.0, x.dtype, x.shape)), div)
    floored = b.unary("floor", div)
    half = b.constant(0.5, x.dtype, x.shape)
    floored = b.select(b.compare(b.sub(div, floored), half, "GT"), b.add(floored, b.constant(1.0, x.dtype, x.shape)),
                       floored)
    plain = b.div(x, y)
    # a zero quotient keeps the sign of x / y; a zero divisor gives the IEEE quotient (±inf, nan)
    floored = b.select(b.compare(div, zero, "EQ"), b.mul(zero, plain), floored)
    return b.select(b.compare(y, zero, "EQ"), plain, floored)


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(ctx: LoweringContext, a: Any, c: Any) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    return ctx.b.convert(ctx.b.binary("remainder", x, y), out)


@register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def _remainder(ctx: LoweringContext, a: Any, c: Any) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    b = ctx.b
    r = b.binary("remainder", x, y)
    zero = b.constant(0, r.dtype, r.shape)
    fix = b.binary("and", b.compare(r, zero, "NE"), b.compare(b.compare(r, zero, "LT"), b.compare(y, zero, "LT"),
                                                               "NE"))
    return b.convert(b.select(fix, b.add(r, y), r), out)


@register_argument_check(aten.pow.Tensor_Scalar)
def _check_pow_exponent(x: Any, exponent: Any) -> None:
    """CPU refuses an integer tensor to a negative integer power (the exponent is a runtime scalar)."""
    integral = not (x.dtype.is_floating_point or x.dtype.is_complex)
    if integral and isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")


@register_output_layout(aten.pow.Tensor_Scalar)
def _pow_bool_result(metas: list, x: torch.Tensor, exponent: Any) -> list:
    """CPU's kernel keeps a bool tensor to a bool power bool (its meta kernel says int64)."""
    if x.dtype == torch.bool and isinstance(exponent, bool):
        m = metas[0]
        return [torch.empty_strided(m.shape, m.stride(), dtype=torch.bool, device="meta")]
    return metas


def integer_power(b: Builder, x: Value, y: Value) -> Value:
    """``x ** y`` for integers as ATen computes it: by squaring, wrapping on overflow, and for a
    negative exponent 1 (x == 1), +-1 (x == -1) or 0. Written out rather than StableHLO's integer
    ``power``: a TPU's compiler computed that through floats (off by one in 14 of 250 int32 and
    int64 values on a v5e), and one exact form serves every platform."""
    dt, shape = x.dtype, x.shape
    i32 = torch.int32

    def c(v: int, bb: Builder = b) -> Value:
        return bb.constant(v, dt, shape)

    signed = torch.iinfo(dt).min < 0
    bits = torch.iinfo(dt).bits
    types = [((), i32), (shape, dt), (shape, dt), (shape, dt)]

    def cond(bb: Builder, i: Value, *state: Value) -> Value:
        return bb.compare(i, bb.constant(bits, i32), "LT")

    def body(bb: Builder, i: Value, result: Value, base: Value, e: Value) -> list[Value]:
        odd = bb.compare(bb.binary("and", e, c(1, bb)), c(0, bb), "NE")
        return [bb.add(i, bb.constant(1, i32)), bb.select(odd, bb.mul(result, base), result), bb.mul(base, base),
                bb.binary("shift_right_logical", e, c(1, bb))]

    e = b.maximum(y, c(0)) if signed else y
    regions = b.region(types, cond) + ", " + b.region(types, body)
    r = b.op("stablehlo.while", [b.constant(0, i32), c(1), x, e], types, region=regions)[1]
    if not signed:
        return r
    odd_y = b.compare(b.binary("and", y, c(1)), c(0), "NE")
    unit = b.select(b.compare(x, c(1), "EQ"), c(1),
                    b.select(b.compare(x, c(-1), "EQ"), b.select(odd_y, c(-1), c(1)), c(0)))
    return b.select(b.compare(y, c(0), "LT"), unit, r)


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(ctx: LoweringContext, a: Any, c: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    # PyTorch's kernels (CPU and CUDA) compute x ** 0.5 as sqrt(x) and x ** -0.5 as rsqrt(x)
    # for floating and complex results. That differs from pow at -0 and -inf: sqrt(-0) is
    # -0 and sqrt(-inf) is nan, where pow gives +0 and +inf.
    static = isinstance(c, (int, float)) and not isinstance(c, bool)
    if static and (c == 2 or (c in (0.5, -0.5) and (out.is_floating_point or out.is_complex))):
        x = operand(ctx, a, opmath(out), _shape(ctx))
        r = b.mul(x, x) if c == 2 else b.unary("sqrt" if c > 0 else "rsqrt", x)
        return b.convert(r, out)
    x, y, out = _binary_operands(ctx, a, c)
    if x.dtype == torch.bool:  # StableHLO has no bool power: 0 ** 0 == 1 in int32, then back to bool
        x, y = b.convert(x, torch.int32), b.convert(y, torch.int32)
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        return b.convert(integer_power(b, x, y), out)
    r = b.binary("power", x, y)
    if ctx.op == aten.pow.Tensor_Scalar and isinstance(c, Value) and out.is_floating_point:
        # an exponent passed at run time (eager mode): the same choice, made per launch
        for e, name in ((0.5, "sqrt"), (-0.5, "rsqrt")):
            r = b.select(b.compare(y, b.constant(e, y.dtype, y.shape), "EQ"), b.unary(name, x), r)
    return b.convert(r, out)


@register(aten.maximum.default, aten.minimum.default, aten.fmax.default, aten.fmin.default)
def _max_min(ctx: LoweringContext, a: Any, c: Any) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    b = ctx.b
    is_max = ctx.op.overloadpacket in (aten.maximum, aten.fmax)
    r = b.maximum(x, y) if is_max else b.minimum(x, y)
    if out.is_floating_point and ctx.op.overloadpacket in (aten.fmax, aten.fmin):  # NaN loses (b.maximum: wins)
        r = b.select(b.compare(x, x, "NE"), y, b.select(b.compare(y, y, "NE"), x, r))
    return b.convert(r, out)


@register(aten.atan2.default)
def _atan2(ctx: LoweringContext, a: Any, c: Any) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    return ctx.b.convert(ctx.b.binary("atan2", x, y), out)


_COMPARE = {aten.eq: "EQ", aten.ne: "NE", aten.lt: "LT", aten.le: "LE", aten.gt: "GT", aten.ge: "GE"}


def _compare(ctx: LoweringContext, a: Any, c: Any) -> Value:
    common = ctx.result_type(0, 1)
    shape = _shape(ctx)
    x, y = operand(ctx, a, common, shape), operand(ctx, c, common, shape)
    return ctx.b.compare(x, y, _COMPARE[ctx.op.overloadpacket])


for _op in _COMPARE:
    register(_op.Tensor, _op.Scalar)(_compare)


def _logical(name: str):
    def lower(ctx: LoweringContext, a: Any, c: Any) -> Value:
        shape = _shape(ctx)
        x, y = operand(ctx, a, torch.bool, shape), operand(ctx, c, torch.bool, shape)
        return ctx.b.convert(ctx.b.binary(name, x, y), ctx.out_dtype())

    return lower


register(aten.logical_and.default)(_logical("and"))
register(aten.logical_or.default)(_logical("or"))
register(aten.logical_xor.default)(_logical("xor"))


def _bitwise(name: str):
    def lower(ctx: LoweringContext, a: Any, c: Any) -> Value:
        out = ctx.out_dtype()
        shape = _shape(ctx)
        return ctx.b.binary(name, operand(ctx, a, out, shape), operand(ctx, c, out, shape))

    return lower


for _op, _name in ((aten.bitwise_and, "and"), (aten.bitwise_or, "or"), (aten.bitwise_xor, "xor")):
    register(_op.Tensor, _op.Scalar)(_bitwise(_name))


@register(aten.where.self)
def _where(ctx: LoweringContext, cond: Value, a: Any, c: Any) -> Value:
    out = ctx.out_dtype()
    shape = _shape(ctx)
    p = ctx.b.broadcast_to(ctx.b.convert(cond, torch.bool), shape)
    return ctx.b.select(p, operand(ctx, a, out, shape), operand(ctx, c, out, shape))


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: LoweringContext, x: Value, mask: Value, value: Any) -> Value:
    out = ctx.out_dtype()
    shape = _shape(ctx)
    p = ctx.b.broadcast_to(ctx.b.convert(mask, torch.bool), shape)
    return ctx.b.select(p, operand(ctx, value, out, shape), ctx.b.broadcast_to(x, shape))


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx: LoweringContext, x: Value, lo: Any = None, hi: Any = None) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    v = operand(ctx, x, out, shape)
    floating = out.is_floating_point or out.is_complex
    for bound, direction in ((lo, "LT"), (hi, "GT")):
        if bound is None:
            continue
        bv = operand(ctx, bound, out, shape)
        if not floating:
            v = b.maximum(v, bv) if direction == "LT" else b.minimum(v, bv)
            continue
        # a NaN x stays NaN (its comparisons are false), and a NaN bound gives NaN, as on CPU
        # (regression: clamp(x, min=nan) returned x)
        v = b.select(b.compare(v, bv, direction), bv, v)
        v = b.select(b.compare(bv, bv, "NE"), bv, v)
    return v


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx: LoweringContext, x: Value, lo: Any) -> Value:
    return _clamp(ctx, x, lo, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx: LoweringContext, x: Value, hi: Any) -> Value:
    return _clamp(ctx, x, None, hi)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx: LoweringContext, start: Value, end: Value, weight: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    c = opmath(out)
    s, e, w = operand(ctx, start, c, shape), operand(ctx, end, c, shape), operand(ctx, weight, c, shape)
    # PyTorch's formula: weight < 0.5 ? start + w*(end-start) : end - (end-start)*(1-w)
    diff = b.sub(e, s)
    low = b.add(s, b.mul(w, diff))
    high = b.sub(e, b.mul(diff, b.sub(b.constant(1.0, c, shape), w)))
    small = modulus(b, w)
    r = b.select(b.compare(small, b.constant(0.5, small.dtype, shape), "LT"), low, high)
    return b.convert(r, out)


@register(aten.addcmul.default, aten.addcdiv.default)
def _addc(ctx: LoweringContext, x: Value, t1: Value, t2: Value, value: Any = 1) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    c = opmath(out)
    xv, a1, a2 = operand(ctx, x, c, shape), operand(ctx, t1, c, shape), operand(ctx, t2, c, shape)
    prod = b.mul(a1, a2) if ctx.op.overloadpacket is aten.addcmul else b.div(a1, a2)
    return b.convert(b.add(xv, b.mul(operand(ctx, value, c, shape), prod)), out)


# -- activations ---------------------------------------------------------------
@register(aten.relu.default)
def _relu(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    return b.maximum(x, b.constant(0, x.dtype, x.shape)) if x.dtype != torch.bool else x


def _erf(b: Builder, v: Value) -> Value:
    # chlo.erf saturates at 0.99999982 (f32) where erf rounds to 1, so 1 + erf(x) of a large negative
    # x (gelu's tail) came out 1.8e-7, not 0. Past 3.92773 f32 erf is 1.0 (CPU's too): snap there.
    # (1 - erfc(|x|) is exact all the way but made gelu 3x slower on XLA:CPU.)
    r = b.op1("chlo.erf", [v], v.shape, v.dtype)
    if v.dtype not in (torch.float32, torch.float64):
        return r  # bf16/f16 compute in f32 (opmath); f64 takes its own path through chlo
    big = b.compare(b.unary("abs", v), b.constant(3.92774 if v.dtype == torch.float32 else 6.0, v.dtype, v.shape),
                    "GE")
    return b.select(big, b.unary("sign", v), r)


@register(aten.erf.default)
def _erf_op(ctx: LoweringContext, x: Value) -> Value:
    out = ctx.out_dtype()
    v = ctx.b.convert(x, opmath(out))
    return ctx.b.convert(_erf(ctx.b, v), out)


@register(aten.gelu.default)
def _gelu(ctx: LoweringContext, x: Value, approximate: str = "none") -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    s = v.shape

    def c(val: float) -> Value:
        return b.constant(val, v.dtype, s)

    if approximate == "tanh":
        inner = b.mul(c(math.sqrt(2.0 / math.pi)), b.add(v, b.mul(c(0.044715), b.mul(v, b.mul(v, v)))))
        r = b.mul(b.mul(c(0.5), v), b.add(c(1.0), b.unary("tanh", inner)))
    else:
        r = b.mul(b.mul(v, c(0.5)), b.add(c(1.0), _erf(b, b.mul(v, c(1.0 / math.sqrt(2.0))))))
    return b.convert(r, out)


@register(aten.gelu_backward.default)
def _gelu_backward(ctx: LoweringContext, grad: Value, x: Value, approximate: str = "none") -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    g = b.convert(grad, opmath(out))
    v = b.convert(x, opmath(out))
    s = v.shape

    def c(val: float) -> Value:
        return b.constant(val, v.dtype, s)

    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        x2 = b.mul(v, v)
        inner = b.mul(c(k), b.add(v, b.mul(c(0.044715), b.mul(x2, v))))
        t = b.unary("tanh", inner)
        left = b.mul(c(0.5), b.add(c(1.0), t))
        dinner = b.mul(c(k), b.add(c(1.0), b.mul(c(3 * 0.044715), x2)))
        right = b.mul(b.mul(c(0.5), v), b.mul(b.sub(c(1.0), b.mul(t, t)), dinner))
        d = b.add(left, right)
    else:
        cdf = b.mul(c(0.5), b.add(c(1.0), _erf(b, b.mul(v, c(1.0 / math.sqrt(2.0))))))
        pdf = b.mul(c(1.0 / math.sqrt(2.0 * math.pi)), b.unary("exponential", b.mul(c(-0.5), b.mul(v, v))))
        d = b.add(cdf, b.mul(v, pdf))
    return b.convert(b.mul(g, d), out)


@register(aten.silu.default)
def _silu(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    return b.convert(b.mul(v, b.unary("logistic", v)), out)


@register(aten.silu_backward.default)
def _silu_backward(ctx: LoweringContext, grad: Value, x: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    g, v = b.convert(grad, opmath(out)), b.convert(x, opmath(out))
    s = b.unary("logistic", v)
    one = b.constant(1.0, v.dtype, v.shape)
    return b.convert(b.mul(g, b.mul(s, b.add(one, b.mul(v, b.sub(one, s))))), out)


@register(aten.sigmoid_backward.default)
def _sigmoid_backward(ctx: LoweringContext, grad: Value, y: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    g, v = b.convert(grad, opmath(out)), b.convert(y, opmath(out))
    return b.convert(b.mul(g, b.mul(v, b.sub(b.constant(1.0, v.dtype, v.shape), v))), out)


@register(aten.tanh_backward.default)
def _tanh_backward(ctx: LoweringContext, grad: Value, y: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    g, v = b.convert(grad, opmath(out)), b.convert(y, opmath(out))
    return b.convert(b.mul(g, b.sub(b.constant(1.0, v.dtype, v.shape), b.mul(v, v))), out)


@register(aten.threshold_backward.default)
def _threshold_backward(ctx: LoweringContext, grad: Value, x: Value, threshold: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    xv = b.broadcast_to(x, shape)
    t = operand(ctx, threshold, x.dtype, shape)
    g = operand(ctx, grad, out, shape)
    return b.select(b.compare(xv, t, "LE"), b.constant(0, out, shape), g)


@register(aten.threshold.default)
def _threshold(ctx: LoweringContext, x: Value, threshold: Any, value: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    t = operand(ctx, threshold, out, x.shape)
    return b.select(b.compare(x, t, "LE"), operand(ctx, value, out, x.shape), x)


@register(aten.leaky_relu.default)
def _leaky_relu(ctx: LoweringContext, x: Value, slope: Any = 0.01) -> Value:
    b = ctx.b
    zero = b.constant(0, x.dtype, x.shape)
    return b.select(b.compare(x, zero, "GT"), x, b.mul(x, operand(ctx, slope, x.dtype, x.shape)))


@register(aten.leaky_relu_backward.default)
def _leaky_relu_backward(ctx: LoweringContext, grad: Value, x: Value, slope: Any, self_is_result: bool) -> Value:
    b = ctx.b
    zero = b.constant(0, x.dtype, x.shape)
    return b.select(b.compare(x, zero, "GT"), grad, b.mul(grad, operand(ctx, slope, grad.dtype, grad.shape)))


@register(aten.hardtanh.default)
def _hardtanh(ctx: LoweringContext, x: Value, lo: Any = -1, hi: Any = 1) -> Value:
    return _clamp(ctx, x, lo, hi)


@register(aten.softplus.default)
def _softplus(ctx: LoweringContext, x: Value, beta: Any = 1, threshold: Any = 20) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    bv = operand(ctx, beta, v.dtype, v.shape)
    bx = b.mul(v, bv)
    soft = b.div(b.unary("log_plus_one", b.unary("exponential", bx)), bv)
    r = b.select(b.compare(bx, operand(ctx, threshold, v.dtype, v.shape), "GT"), v, soft)
    return b.convert(r, out)


@register(aten.elu.default)
def _elu(ctx: LoweringContext, x: Value, alpha: Any = 1, scale: Any = 1, input_scale: Any = 1) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    v = b.convert(x, opmath(out))
    s = v.shape
    neg = b.mul(operand(ctx, alpha, v.dtype, s),
                b.unary("exponential_minus_one", b.mul(v, operand(ctx, input_scale, v.dtype, s))))
    r = b.select(b.compare(v, b.constant(0.0, v.dtype, s), "GT"), v, neg)
    return b.convert(b.mul(r, operand(ctx, scale, v.dtype, s)), out)


# -- copies ------------------------------------------------------------------
@register(aten.clone.default, aten.alias_copy.default, aten.detach_copy.default, aten.lift_fresh_copy.default)
def _clone(ctx: LoweringContext, x: Value, *rest: Any, **kw: Any) -> Value:
    return x


@register(aten.copy.default)
def _copy(ctx: LoweringContext, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    return ctx.b.broadcast_to(ctx.b.convert(src, ctx.out_dtype()), ctx.out_shape())


@register(aten.fill.Scalar, aten.fill.Tensor)
def _fill(ctx: LoweringContext, x: Value, value: Any) -> Value:
    return operand(ctx, value, ctx.out_dtype(), ctx.out_shape())


@register(aten.zero.default)
def _zero(ctx: LoweringContext, x: Value) -> Value:
    return ctx.b.constant(0, ctx.out_dtype(), ctx.out_shape())


@register(aten.isneginf.default, aten.isposinf.default)
def _isneginf(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    if not x.dtype.is_floating_point:
        return b.constant(False, torch.bool, x.shape)
    inf = -math.inf if ctx.op is aten.isneginf.default else math.inf
    return b.compare(x, b.constant(inf, x.dtype, x.shape), "EQ")


@register(aten.signbit.default)
def _signbit(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    if x.dtype == torch.bool or x.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return b.constant(False, torch.bool, x.shape)
    if not x.dtype.is_floating_point:
        return b.compare(x, b.constant(0, x.dtype, x.shape), "LT")
    # The sign bit itself: true for -0.0 and negative NaNs too, like std::signbit.
    int_t = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}[x.dtype]
    bits = b.bitcast_convert(x, int_t, x.shape)
    return b.compare(bits, b.constant(0, int_t, x.shape), "LT")


register(aten.erfc.default)(_float_unary("chlo.erfc"))


@register(aten.hypot.default)
def _hypot(ctx: LoweringContext, a: Any, c: Any) -> Value:
    x, y, out = _binary_operands(ctx, a, c)
    b = ctx.b
    # scaled by max(|x|, |y|) so squares neither overflow nor underflow, like std::hypot
    ax, ay = b.unary("abs", x), b.unary("abs", y)
    hi, lo = b.maximum(ax, ay), b.minimum(ax, ay)
    zero = b.constant(0.0, x.dtype, x.shape)
    safe = b.select(b.compare(hi, zero, "EQ"), b.constant(1.0, x.dtype, x.shape), hi)
    q = b.div(lo, safe)
    r = b.mul(hi, b.unary("sqrt", b.add(b.constant(1.0, x.dtype, x.shape), b.mul(q, q))))
    # (a nan operand makes hi nan, hence r) unless the other is inf, as in IEEE hypot
    inf = b.constant(math.inf, x.dtype, x.shape)
    r = b.select(b.binary("or", b.compare(ax, inf, "EQ"), b.compare(ay, inf, "EQ")), inf, r)
    return b.convert(r, out)


_BITS_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


@register(aten.nextafter.default)
def _nextafter(ctx: LoweringContext, a: Any, c: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    x, y = operand(ctx, a, out, shape), operand(ctx, c, out, shape)
    it = _BITS_INT[out]
    bits = b.bitcast_convert(x, it, shape)
    one = b.constant(1, it, shape)
    zero = b.constant(0.0, out, shape)
    # Moving away from zero adds one ulp to the magnitude bits, towards zero subtracts one.
    away = b.compare(b.compare(y, x, "GT"), b.compare(x, zero, "GT"), "EQ")
    stepped = b.bitcast_convert(b.select(away, b.add(bits, one), b.sub(bits, one)), out, shape)
    tiny = b.bitcast_convert(one, out, shape)  # smallest subnormal, signed like y
    from_zero = b.select(b.compare(y, zero, "GT"), tiny, b.neg(tiny))
    r = b.select(b.compare(x, zero, "EQ"), from_zero, stepped)
    r = b.select(b.compare(x, y, "EQ"), y, r)
    nan = b.binary("or", b.compare(x, x, "NE"), b.compare(y, y, "NE"))
    return b.select(nan, b.constant(math.nan, out, shape), r)


def _shift(name: str):
    def lower(ctx: LoweringContext, a: Any, c: Any) -> Value:
        out = ctx.out_dtype()
        shape = _shape(ctx)
        x, y = operand(ctx, a, out, shape), operand(ctx, c, out, shape)
        if name == "shift_right" and out in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
            op = "shift_right_logical"
        else:
            op = "shift_left" if name == "shift_left" else "shift_right_arithmetic"
        # StableHLO reads the shift as unsigned: negative or too-large shifts give 0 (left) or
        # the sign fill (right), which is what PyTorch's CPU kernels return too.
        return ctx.b.binary(op, x, y)

    return lower


register(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
         aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_shift("shift_left"))
register(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
         aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)(
    _shift("shift_right"))


@register(aten.frexp.Tensor)
def _frexp(ctx: LoweringContext, x: Value) -> tuple[Value, Value]:
    b = ctx.b
    s = x.shape
    v = b.convert(x, torch.float32) if x.dtype != torch.float64 else x
    it = torch.int32 if v.dtype == torch.float32 else torch.int64
    mbits, bias = (23, 126) if v.dtype == torch.float32 else (52, 1022)
    emask = (1 << (31 if v.dtype == torch.float32 else 63) - mbits) - 1
    # Subnormals: scale into the normal range first, then take the exponent off the bits.
    small = b.compare(b.unary("abs", v), b.constant(2.0 ** -(bias + 1), v.dtype, s), "LT")
    scaled = b.select(small, b.mul(v, b.constant(2.0 ** 54, v.dtype, s)), v)
    bits = b.bitcast_convert(scaled, it, s)
    efield = b.binary("and", b.binary("shift_right_logical", bits, b.constant(mbits, it, s)),
                      b.constant(emask, it, s))
    e = b.sub(efield, b.constant(bias, it, s))
    e = b.select(small, b.sub(e, b.constant(54, it, s)), e)
    keep = b.constant(~(emask << mbits), it, s)
    mant = b.bitcast_convert(b.binary("or", b.binary("and", bits, keep), b.constant(bias << mbits, it, s)),
                             v.dtype, s)
    special = b.binary("or", b.compare(v, b.constant(0.0, v.dtype, s), "EQ"),
                       b.unary("not", b.op1("stablehlo.is_finite", [v], s, torch.bool)))
    mant = b.select(special, v, mant)
    e = b.select(special, b.constant(0, it, s), e)
    return b.convert(mant, ctx.out_dtype(0)), b.convert(e, ctx.out_dtype(1))


@register(aten.angle.default)
def _angle(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    if x.dtype.is_complex:
        return b.convert(b.binary("atan2", b.imag(x), b.real(x)), out)
    # real input: 0 for x >= 0, pi for x < 0, NaN stays NaN
    v = b.convert(x, opmath(out))
    zero = b.constant(0.0, v.dtype, v.shape)
    r = b.select(b.compare(v, zero, "LT"), b.constant(math.pi, v.dtype, v.shape), zero)
    r = b.select(b.compare(v, v, "NE"), v, r)
    return b.convert(r, out)


@register(aten._efficientzerotensor.default)
def _efficient_zeros(ctx: LoweringContext, size: list[int], *rest: Any) -> Value:
    # CPU's zero tensor is a dispatch-key trick; on tpu it is plain zeros
    return ctx.b.constant(0, ctx.out_dtype(), ctx.out_shape())


@register(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def _shrink_backward(ctx: LoweringContext, grad: Value, x: Value, lambd: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    shape = _shape(ctx)
    xv = operand(ctx, x, opmath(x.dtype), shape)
    lam = operand(ctx, lambd, xv.dtype, shape)
    keep = b.compare(b.unary("abs", xv), lam, "GT")
    return b.select(keep, operand(ctx, grad, out, shape), b.constant(0, out, shape))
