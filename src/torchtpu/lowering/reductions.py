"""Reductions, softmax and scans."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import target
from .builder import Builder, Value
from .elementwise import modulus, opmath
from .registry import LoweringContext, register

aten = torch.ops.aten


def norm_dims(dims: Any, rank: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({(d % rank) if rank else 0 for d in dims}) if rank else []


def _keep(b: Builder, r: Value, shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> Value:
    if keepdim:
        return b.reshape(r, [1 if i in dims else d for i, d in enumerate(shape)])
    return r


def reduce_sum(b: Builder, v: Value, dims: Sequence[int]) -> Value:
    return b.reduce(v, dims, b.constant(0, v.dtype), "stablehlo.add")


def _init_max(dtype: torch.dtype, is_max: bool) -> float | int | bool:
    if dtype == torch.bool:
        return not is_max
    if dtype.is_floating_point:
        return -math.inf if is_max else math.inf
    info = torch.iinfo(dtype)
    return info.min if is_max else info.max


def reduce_max(b: Builder, v: Value, dims: Sequence[int], is_max: bool = True) -> Value:
    """Max (or min) over ``dims``. XLA:CPU may drop NaN: use ``reduce_max_nan`` where it must win."""
    init = b.constant(_init_max(v.dtype, is_max), v.dtype)
    return b.reduce(v, dims, init, "stablehlo.maximum" if is_max else "stablehlo.minimum")


def reduce_max_nan(b: Builder, v: Value, dims: Sequence[int], is_max: bool = True) -> Value:
    """``reduce_max`` where a NaN in the reduced elements gives NaN, as in PyTorch."""
    r = reduce_max(b, v, dims, is_max)
    if not v.dtype.is_floating_point:
        return r
    anynan = b.reduce(b.compare(v, v, "NE"), dims, b.constant(False, torch.bool), "stablehlo.or")
    return b.select(anynan, b.constant(math.nan, v.dtype, r.shape), r)


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: LoweringContext, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    b = ctx.b
    if ctx.op is aten.sum.default:
        dims, keepdim = None, False
    out = ctx.out_dtype()
    d = norm_dims(dims, x.rank)
    acc = opmath(out) if out != torch.bool else torch.int64
    r = reduce_sum(b, b.convert(x, acc), d)
    return b.convert(_keep(b, r, x.shape, d, keepdim), out)


@register(aten.nansum.default)
def _nansum(ctx: LoweringContext, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    """sum with NaNs as 0. (Regression: PyTorch's decomposition took dim=() for no dims, where
    CPU, as sum, reduces all of them: nansum(x, ()) kept x's shape.)"""
    b = ctx.b
    out = ctx.out_dtype()
    d = norm_dims(dims, x.rank)
    acc = opmath(out) if out != torch.bool else torch.int64
    v = b.convert(x, acc)
    if acc.is_floating_point:
        v = b.select(b.compare(v, v, "NE"), b.constant(0.0, acc, v.shape), v)
    return b.convert(_keep(b, reduce_sum(b, v, d), x.shape, d, keepdim), out)


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx: LoweringContext, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    b = ctx.b
    if ctx.op is aten.mean.default:
        dims, keepdim = None, False
    out = ctx.out_dtype()
    d = norm_dims(dims, x.rank)
    acc = opmath(out)
    r = reduce_sum(b, b.convert(x, acc), d)
    n = math.prod(x.shape[i] for i in d)
    r = b.div(r, b.constant(float(n) if n else math.nan, acc, r.shape))
    return b.convert(_keep(b, r, x.shape, d, keepdim), out)


@register(aten.prod.default, aten.prod.dim_int)
def _prod(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    b = ctx.b
    if ctx.op is aten.prod.default:
        dim, keepdim = None, False
    out = ctx.out_dtype()
    d = norm_dims(dim, x.rank)
    acc = opmath(out) if out != torch.bool else torch.int64
    v = b.convert(x, acc)
    r = b.reduce(v, d, b.constant(1, acc), "stablehlo.multiply")
    return b.convert(_keep(b, r, x.shape, d, keepdim), out)


@register(aten.amax.default, aten.amin.default)
def _amax(ctx: LoweringContext, x: Value, dims: Any = (), keepdim: bool = False) -> Value:
    b = ctx.b
    d = norm_dims(dims, x.rank)
    is_max = ctx.op.overloadpacket is aten.amax
    r = reduce_max_nan(b, x, d, is_max)  # NaN propagates through max/min in PyTorch
    return _keep(b, r, x.shape, d, keepdim)


@register(aten.max.default, aten.min.default)
def _max_all(ctx: LoweringContext, x: Value) -> Value:
    if x.numel == 0:
        raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0. "
                           "Specify the reduction dim with the 'dim' argument.")
    ctx2 = LoweringContext(ctx.b, aten.amax.default if ctx.op is aten.max.default else aten.amin.default, ctx.out,
                           ctx.precision)
    return _amax(ctx2, x, list(range(x.rank)), False)


def arg_reduce(b: Builder, x: Value, dim: int, is_max: bool) -> tuple[Value, Value]:
    """(values, first index as int64) along ``dim``; NaN counts as the extreme, like PyTorch.

    The reduction carries the index as int32 where the dim allows (always, in practice) and widens
    the result: a TPU has no 64-bit integer unit, so an int64 index is emulated as a pair of 32-bit
    words in every comparison and select of the reduction's body (a decode step's argmax over the
    vocabulary, at every token)."""
    index_type = torch.int32 if x.shape[dim] < 2**31 else torch.int64
    idx = b.iota(x.shape, dim, index_type)
    init_v = b.constant(_init_max(x.dtype, is_max), x.dtype)
    init_i = b.constant(0, index_type)
    floating = x.dtype.is_floating_point

    def body(bb: Builder, av: Value, ai: Value, ev: Value, ei: Value) -> list[Value]:
        better = bb.compare(ev, av, "GT" if is_max else "LT")
        if floating:
            e_nan = bb.compare(ev, ev, "NE")
            a_nan = bb.compare(av, av, "NE")
            better = bb.binary("or", bb.binary("and", e_nan, bb.unary("not", a_nan)),
                               bb.binary("and", better, bb.unary("not", a_nan)))
        same = bb.compare(ev, av, "EQ")
        if floating:
            same = bb.binary("or", same, bb.binary("and", bb.compare(ev, ev, "NE"), bb.compare(av, av, "NE")))
        lower_idx = bb.compare(ei, ai, "LT")
        take = bb.binary("or", better, bb.binary("and", same, lower_idx))
        return [bb.select(take, ev, av), bb.select(take, ei, ai)]

    vals, inds = b.reduce_multi([x, idx], [init_v, init_i], [dim], body)
    return vals, b.convert(inds, torch.int64)


@register(aten.max.dim, aten.min.dim)
def _max_dim(ctx: LoweringContext, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = dim % x.rank
    v, i = arg_reduce(b, x, d, ctx.op.overloadpacket is aten.max)
    return _keep(b, v, x.shape, [d], keepdim), _keep(b, i, x.shape, [d], keepdim)


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx: LoweringContext, x: Value, dim: int | None = None, keepdim: bool = False) -> Value:
    b = ctx.b
    is_max = ctx.op.overloadpacket is aten.argmax
    if dim is None:
        flat = b.reshape(x, (x.numel,))
        _, i = arg_reduce(b, flat, 0, is_max)
        return b.reshape(i, ctx.out_shape()) if keepdim else i
    if x.rank == 0:
        return b.constant(0, torch.int64)
    d = dim % x.rank
    _, i = arg_reduce(b, x, d, is_max)
    return _keep(b, i, x.shape, [d], keepdim)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any_all(ctx: LoweringContext, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    b = ctx.b
    v = b.convert(x, torch.bool)
    if isinstance(dim, (list, tuple)) and not dim:
        # any/all.dims with dim=() reduce nothing on CPU (sum's dim=() reduces everything)
        return b.convert(v, ctx.out_dtype())
    d = norm_dims(dim, x.rank)
    is_any = ctx.op.overloadpacket is aten.any
    r = b.reduce(v, d, b.constant(not is_any, torch.bool), "stablehlo.or" if is_any else "stablehlo.and")
    return b.convert(_keep(b, r, x.shape, d, keepdim), ctx.out_dtype())


def variance(b: Builder, v: Value, d: Sequence[int], correction: Any) -> Value:
    """The variance of ``v`` (already in its op math type) over dims ``d``, dropped: the mean
    squared modulus of ``v - mean`` (real for a complex ``v``), divided by n - correction."""
    n = math.prod(v.shape[i] for i in d)
    mean = b.div(reduce_sum(b, v, d), b.constant(float(n), v.dtype, [s for i, s in enumerate(v.shape) if i not in d]))
    keep_shape = [1 if i in d else s for i, s in enumerate(v.shape)]
    centered = b.sub(v, b.broadcast_to(b.reshape(mean, keep_shape), v.shape))
    if centered.dtype.is_complex:
        re, im = b.real(centered), b.imag(centered)
        ss = reduce_sum(b, b.add(b.mul(re, re), b.mul(im, im)), d)
    else:
        ss = reduce_sum(b, b.mul(centered, centered), d)
    denom = max(n - (1 if correction is None else correction), 0)
    return b.div(ss, b.constant(float(denom) if denom else 0.0, ss.dtype, ss.shape))


@register(aten.var.correction, aten.std.correction)
def _var(ctx: LoweringContext, x: Value, dim: Any = None, correction: Any = None, keepdim: bool = False
         ) -> Value:
    b = ctx.b
    d = norm_dims(dim, x.rank)
    r = variance(b, b.convert(x, opmath(x.dtype)), d, correction)
    if ctx.op.overloadpacket is aten.std:
        r = b.unary("sqrt", r)
    return b.convert(_keep(b, r, x.shape, d, keepdim), ctx.out_dtype())


@register(aten.logsumexp.default)
def _logsumexp(ctx: LoweringContext, x: Value, dim: Any, keepdim: bool = False) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = opmath(out) if out.is_floating_point or out.is_complex else torch.float32
    v = b.convert(x, acc)
    d = norm_dims(dim, x.rank)
    m = reduce_max(b, b.real(v), d)  # complex: shifted by the real parts' max, as CPU
    keep_shape = [1 if i in d else s for i, s in enumerate(x.shape)]
    finite = b.select(b.op1("stablehlo.is_finite", [m], m.shape, torch.bool), m, b.constant(0.0, m.dtype, m.shape))
    finite = b.convert(finite, acc)
    mb = b.broadcast_to(b.reshape(finite, keep_shape), x.shape)
    s = reduce_sum(b, b.unary("exponential", b.sub(v, mb)), d)
    r = b.add(b.unary("log", s), finite)
    return b.convert(_keep(b, r, x.shape, d, keepdim), out)


def softmax(b: Builder, v: Value, dim: int, log: bool) -> Value:
    m = reduce_max(b, v, [dim])
    keep = [1 if i == dim else s for i, s in enumerate(v.shape)]
    # A row of -inf shifts by 0 (its result is NaN either way, as on CPU); a row with +inf keeps
    # its max, so that inf - inf makes the row NaN, as on CPU.
    m = b.select(b.compare(m, b.constant(-math.inf, v.dtype, m.shape), "EQ"), b.constant(0.0, v.dtype, m.shape), m)
    shifted = b.sub(v, b.broadcast_to(b.reshape(m, keep), v.shape))
    e = b.unary("exponential", shifted)
    s = b.broadcast_to(b.reshape(reduce_sum(b, e, [dim]), keep), v.shape)
    if log:
        return b.sub(shifted, b.unary("log", s))
    return b.div(e, s)


@register(aten._softmax.default, aten._log_softmax.default)
def _softmax(ctx: LoweringContext, x: Value, dim: int, half_to_float: bool) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    # (an integer x reaches here only empty, as CPU returns it: computed as float32, not -inf in int64)
    floating = x.dtype.is_floating_point or x.dtype.is_complex
    v = b.convert(x, opmath(x.dtype) if floating else torch.float32)
    if x.rank == 0:
        # as a 1-element row: exp(x - x) is NaN at +-inf and NaN, as on CPU (not a constant 1)
        return b.convert(b.reshape(softmax(b, b.reshape(v, (1,)), 0, ctx.op is aten._log_softmax.default), ()), out)
    return b.convert(softmax(b, v, dim % x.rank, ctx.op is aten._log_softmax.default), out)


@register(aten._safe_softmax.default)
def _safe_softmax(ctx: LoweringContext, x: Value, dim: int, dtype: Any = None) -> Value:
    """Softmax whose rows of only -inf give 0, not NaN (attention over fully masked rows).

    One lowering instead of PyTorch's composite (softmax, eq, all, where): four eager ops
    per attention layer become one, and the mask test shares softmax's row maximum.
    """
    b = ctx.b
    out = ctx.out_dtype()
    xd = b.convert(x, out)  # a dtype argument converts the input first, as at::softmax does
    if x.rank == 0:  # as a 1-element row (+inf and NaN give NaN, -inf 0, as on CPU)
        return b.reshape(_safe_softmax_of(b, b.reshape(xd, (1,)), 0, out), ())
    return _safe_softmax_of(b, xd, dim % x.rank, out)


def _safe_softmax_of(b: Builder, xd: Value, d: int, out: torch.dtype) -> Value:
    v = b.convert(xd, opmath(out))
    keep = [1 if i == d else s for i, s in enumerate(xd.shape)]
    # all(x == -inf) along dim, as a NaN-propagating max: a row holding a NaN is not masked
    m = reduce_max(b, v, [d])
    masked = b.broadcast_to(b.reshape(b.compare(m, b.constant(float("-inf"), v.dtype, m.shape), "EQ"), keep),
                            xd.shape)
    y = b.convert(softmax(b, v, d, log=False), out)
    return b.select(masked, b.constant(0.0, out, xd.shape), y)


@register(aten._softmax_backward_data.default)
def _softmax_backward(ctx: LoweringContext, grad: Value, y: Value, dim: int, input_dtype: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = opmath(grad.dtype)
    g, o = b.convert(grad, acc), b.convert(y, acc)
    if g.rank == 0:
        return b.constant(0.0, out)
    d = dim % g.rank
    keep = [1 if i == d else s for i, s in enumerate(g.shape)]
    go = b.mul(g, o)
    s = b.broadcast_to(b.reshape(reduce_sum(b, go, [d]), keep), g.shape)
    return b.convert(b.sub(go, b.mul(o, s)), out)


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward(ctx: LoweringContext, grad: Value, y: Value, dim: int, input_dtype: Any) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = opmath(grad.dtype)
    g, o = b.convert(grad, acc), b.convert(y, acc)
    if g.rank == 0:
        return b.constant(0.0, out)
    d = dim % g.rank
    keep = [1 if i == d else s for i, s in enumerate(g.shape)]
    s = b.broadcast_to(b.reshape(reduce_sum(b, g, [d]), keep), g.shape)
    return b.convert(b.sub(g, b.mul(b.unary("exponential", o), s)), out)


def _scan(b: Builder, v: Value, dim: int, body_op: str, init: Any) -> Value:
    n = v.shape[dim]
    if v.numel == 0:
        return v  # XLA rejects a zero-sized window; an empty scan is empty
    window = [1] * v.rank
    window[dim] = n
    pad = [(0, 0)] * v.rank
    pad[dim] = (n - 1, 0)
    return b.reduce_window(v, b.constant(init, v.dtype), body_op, window, [1] * v.rank, pad)


@register(aten.cumsum.default)
def _cumsum(ctx: LoweringContext, x: Value, dim: int, dtype: Any = None) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    if x.rank == 0:
        return b.convert(x, out)
    acc = opmath(out) if out != torch.bool else torch.int64
    return b.convert(_scan(b, b.convert(x, acc), dim % x.rank, "stablehlo.add", 0), out)


@register(aten.cumprod.default)
def _cumprod(ctx: LoweringContext, x: Value, dim: int, dtype: Any = None) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    if x.rank == 0:
        return b.convert(x, out)
    acc = opmath(out) if out != torch.bool else torch.int64
    return b.convert(_scan(b, b.convert(x, acc), dim % x.rank, "stablehlo.multiply", 1), out)


@register(aten.linalg_vector_norm.default)
def _vector_norm(ctx: LoweringContext, x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False,
                 dtype: Any = None) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    acc = opmath(out)
    source = opmath(x.dtype) if x.dtype.is_complex else acc  # the modulus first: it is real
    v = b.convert(modulus(b, b.convert(x, source)), acc)
    d = norm_dims(dim, x.rank)
    o = float(ord)
    if o == math.inf:
        r = reduce_max_nan(b, v, d)
    elif o == -math.inf:
        r = reduce_max_nan(b, v, d, is_max=False)
    elif o == 0:
        r = reduce_sum(b, b.convert(b.compare(v, b.constant(0.0, acc, v.shape), "NE"), acc), d)
    elif o == 1:
        r = reduce_sum(b, v, d)
    elif o == 2:
        r = b.unary("sqrt", reduce_sum(b, b.mul(v, v), d))
    else:
        p = b.binary("power", v, b.constant(o, acc, v.shape))
        s = reduce_sum(b, p, d)
        r = b.binary("power", s, b.constant(1.0 / o, acc, s.shape))
    return b.convert(_keep(b, r, x.shape, d, keepdim), out)


@register(aten.cummax.default, aten.cummin.default)
def _cummax(ctx: LoweringContext, x: Value, dim: int) -> tuple[Value, Value]:
    """Running max/min with CPU's index rule: ties and NaNs take the later position.

    Three single-output running maxima, not one reduce_window over (value, index) pairs: XLA:CPU
    failed to compile that variadic form once the dim reached 17 ("The shape doesn't match when
    replacing reduce-window"). The index is the latest position where the value equals the running
    extremum (a new extremum or a tie: every such position is one), or the latest NaN once one came.
    """
    b = ctx.b
    if x.rank == 0:
        return x, b.constant(0, torch.int64)
    d = dim % x.rank
    if x.numel == 0:
        return x, b.constant(0, torch.int64, x.shape)
    is_max = ctx.op is aten.cummax.default
    n = x.shape[d]
    window = [1] * x.rank
    window[d] = n
    ones = [1] * x.rank
    pads = [(0, 0)] * x.rank
    pads[d] = (n - 1, 0)

    def running(v: Value, op: str) -> Value:
        init = b.constant(_init_max(v.dtype, op == "stablehlo.maximum"), v.dtype)
        return b.reduce_window(v, init, op, window, ones, pads)

    idx = b.iota(x.shape, d, torch.int64)
    none = b.constant(-1, torch.int64, x.shape)
    extreme = "stablehlo.maximum" if is_max else "stablehlo.minimum"
    if not x.dtype.is_floating_point:
        vals = running(x, extreme)
        return vals, running(b.select(b.compare(x, vals, "EQ"), idx, none), "stablehlo.maximum")
    nan = b.compare(x, x, "NE")
    # NaN set aside (XLA:CPU's max may drop it): the running extremum of the numbers, and the latest NaN
    numbers = b.select(nan, b.constant(_init_max(x.dtype, is_max), x.dtype, x.shape), x)
    vals = running(numbers, extreme)
    record = b.binary("and", b.compare(x, vals, "EQ"), b.unary("not", nan))
    at = running(b.select(record, idx, none), "stablehlo.maximum")
    last_nan = running(b.select(nan, idx, none), "stablehlo.maximum")
    seen_nan = b.compare(last_nan, b.constant(0, torch.int64, x.shape), "GE")
    vals = b.select(seen_nan, b.constant(math.nan, x.dtype, x.shape), vals)
    return vals, b.select(seen_nan, last_nan, at)


@register(aten.logcumsumexp.default, aten._logcumsumexp.default)
def _logcumsumexp(ctx: LoweringContext, x: Value, dim: int) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    if x.rank == 0 or x.numel == 0:
        return b.convert(x, out)
    d = dim % x.rank
    acc = opmath(out)
    v = b.convert(x, acc)

    def body(bb: Builder, a: Value, c: Value) -> Value:
        # log(exp(a) + exp(c)) = max + log1p(exp(-|a - c|)); -inf + -inf stays -inf
        hi, lo = bb.maximum(a, c), bb.minimum(a, c)
        neg_inf = bb.constant(-math.inf, acc)
        r = bb.add(hi, bb.unary("log_plus_one", bb.unary("exponential", bb.sub(lo, hi))))
        r = bb.select(bb.compare(lo, neg_inf, "EQ"), hi, r)
        return bb.select(bb.compare(hi, bb.constant(math.inf, acc), "EQ"), hi, r)

    n = x.shape[d]
    window = [1] * x.rank
    window[d] = n
    pads = [(0, 0)] * x.rank
    pads[d] = (n - 1, 0)
    region = b.region([((), acc), ((), acc)], body)
    pad_attr = ", ".join(f"[{lo}, {hi}]" for lo, hi in pads)
    ones = ", ".join(["1"] * x.rank)
    attrs = (f"window_dimensions = array<i64: {', '.join(map(str, window))}>, window_strides = array<i64: {ones}>, "
             f"base_dilations = array<i64: {ones}>, window_dilations = array<i64: {ones}>, "
             f"padding = dense<[{pad_attr}]> : tensor<{x.rank}x2xi64>")
    r = b.op1("stablehlo.reduce_window", [v, b.constant(-math.inf, acc)], x.shape, acc, attrs=attrs, region=region)
    return b.convert(r, out)


@register(aten.hash_tensor.default)
def _hash_tensor(ctx: LoweringContext, x: Value, dim: Any = (), keepdim: bool = False, mode: int = 0) -> Value:
    """XOR of the values' 64-bit patterns (floats as float64, integers sign-extended to int64), as CPU."""
    b = ctx.b
    if mode != 0:
        raise RuntimeError(f"hash_tensor: unsupported mode {mode}")
    if x.dtype.is_floating_point and target.emulated_float64():
        if x.dtype == torch.float64:
            raise TypeError("torchtpu: hash_tensor of float64 is not supported on a TPU: its float64 values are "
                            "float32 pairs, without IEEE float64's bit patterns; hash on the CPU (x.cpu()) instead")
        bits = _float64_bits_of_float32(b, b.convert(x, torch.float32))
    elif x.dtype.is_floating_point:
        bits = b.bitcast_convert(b.convert(x, torch.float64), torch.uint64, x.shape)
    else:
        bits = b.bitcast_convert(b.convert(x, torch.int64), torch.uint64, x.shape)
    d = norm_dims(dim, x.rank)
    r = b.reduce(bits, d, b.constant(0, torch.uint64), "stablehlo.xor")
    return b.convert(_keep(b, r, x.shape, d, keepdim), ctx.out_dtype())


def _float64_bits_of_float32(b: Builder, x: Value) -> Value:
    """The IEEE float64 bit patterns of float32 values, built from their float32 bits in integers.
    Where float64 is float32 pairs (a TPU), bitcasting the float64 conversion gives the pair's
    bits: a v5e's hash of -8.478 was 0xc107a76b00000000 (the float32 bits, shifted), CPU's
    0xc020f4ed60000000."""
    u32 = torch.uint32

    def c(v: int) -> Value:
        return b.constant(v, u32, x.shape)

    def shl(v: Value, n: Value | int) -> Value:
        return b.binary("shift_left", v, c(n) if isinstance(n, int) else n)

    def shr(v: Value, n: int) -> Value:
        return b.binary("shift_right_logical", v, c(n))

    bits = b.bitcast_convert(x, u32, x.shape)
    sign = b.binary("and", bits, c(0x80000000))
    exponent = b.binary("and", shr(bits, 23), c(0xFF))
    mantissa = b.binary("and", bits, c(0x7FFFFF))
    # a subnormal's leading one moves to bit 23 (the implicit bit), its exponent down as far
    shift = b.sub(b.unary("count_leading_zeros", mantissa), c(8))
    normalized = b.binary("and", shl(mantissa, shift), c(0x7FFFFF))
    subnormal = b.binary("and", b.compare(exponent, c(0), "EQ"), b.compare(mantissa, c(0), "NE"))
    zero = b.binary("and", b.compare(exponent, c(0), "EQ"), b.compare(mantissa, c(0), "EQ"))
    exponent64 = b.select(b.compare(exponent, c(0xFF), "EQ"), c(0x7FF),                 # inf, NaN
                          b.select(subnormal, b.sub(c(897), shift), b.add(exponent, c(896))))
    exponent64 = b.select(zero, c(0), exponent64)
    mantissa = b.select(subnormal, normalized, mantissa)
    high = b.binary("or", b.binary("or", sign, shl(exponent64, 20)), shr(mantissa, 3))
    low = shl(mantissa, 29)
    u64 = torch.uint64
    return b.binary("or", b.binary("shift_left", b.convert(high, u64), b.constant(32, u64, x.shape)),
                    b.convert(low, u64))

