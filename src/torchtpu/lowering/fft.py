"""FFT: ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r`` (everything ``torch.fft`` lowers to) as ``stablehlo.fft``.

``stablehlo.fft`` transforms the innermost dimensions, so the requested ones are
moved last (in order: the last one is the halved dimension of a real transform)
and back. XLA's inverse transforms divide by the signal size; PyTorch's
``normalization`` (0: none, 1: 1/sqrt(n), 2: 1/n) is applied on top of an
unnormalized result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .builder import Builder, Value, _i64_array
from .registry import LoweringContext, register, register_graph_only

aten = torch.ops.aten
_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _perm(rank: int, dims: Sequence[int]) -> list[int]:
    return [d for d in range(rank) if d not in dims] + list(dims)


def _inverse(perm: Sequence[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _fft(b: Builder, x: Value, dims: Sequence[int], kind: str, lengths: Sequence[int], out_dtype: torch.dtype
         ) -> Value:
    perm = _perm(x.rank, dims)
    xt = b.transpose(x, perm)
    shape = list(xt.shape)
    if kind == "RFFT":
        shape[-1] = lengths[-1] // 2 + 1
    elif kind == "IRFFT":
        shape[-1] = lengths[-1]
    attrs = f"fft_type = #stablehlo<fft_type {kind}>, fft_length = {_i64_array(lengths)}"
    r = b.op1("stablehlo.fft", [xt], shape, out_dtype, attrs=attrs)
    return b.transpose(r, _inverse(perm))


def _scale(b: Builder, v: Value, factor: float) -> Value:
    if factor == 1.0:
        return v
    if v.dtype.is_complex:
        real_t = _REAL[v.dtype]
        re = b.constant(factor, real_t, v.shape)
        c = b.op1("stablehlo.complex", [re, b.constant(0.0, real_t, v.shape)], v.shape, v.dtype)
        return b.mul(v, c)
    return b.mul(v, b.constant(factor, v.dtype, v.shape))


def _norm_factor(normalization: int, n: int, undo_xla_inverse: bool) -> float:
    f = float(n) if undo_xla_inverse else 1.0
    if normalization == 1:
        f /= math.sqrt(n)
    elif normalization == 2:
        f /= n
    return f


def _norm_dims(dims: Sequence[int], rank: int) -> list[int]:
    return [d % rank for d in dims]


@register(aten._fft_r2c.default)
def _fft_r2c(ctx: LoweringContext, x: Value, dim: list[int], normalization: int, onesided: bool) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    dims = _norm_dims(dim, x.rank)
    lengths = [x.shape[d] for d in dims]
    v = b.convert(x, _REAL[out])
    if onesided:
        r = _fft(b, v, dims, "RFFT", lengths, out)
    else:
        c = b.op1("stablehlo.complex", [v, b.constant(0.0, v.dtype, v.shape)], v.shape, out)
        r = _fft(b, c, dims, "FFT", lengths, out)
    return _scale(b, r, _norm_factor(normalization, math.prod(lengths), False))


@register(aten._fft_c2c.default)
def _fft_c2c(ctx: LoweringContext, x: Value, dim: list[int], normalization: int, forward: bool) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    dims = _norm_dims(dim, x.rank)
    if not dims:
        return b.convert(x, out)
    lengths = [x.shape[d] for d in dims]
    r = _fft(b, b.convert(x, out), dims, "FFT" if forward else "IFFT", lengths, out)
    return _scale(b, r, _norm_factor(normalization, math.prod(lengths), not forward))


@register(aten._fft_c2r.default)
def _fft_c2r(ctx: LoweringContext, x: Value, dim: list[int], normalization: int, last_dim_size: int) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    dims = _norm_dims(dim, x.rank)
    lengths = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    # the halved dimension holds last_dim_size // 2 + 1 coefficients; trim or zero-pad to that
    want = last_dim_size // 2 + 1
    d = dims[-1]
    v = x
    if v.shape[d] > want:
        limit = list(v.shape)
        limit[d] = want
        v = b.slice(v, [0] * v.rank, limit)
    elif v.shape[d] < want:
        high = [0] * v.rank
        high[d] = want - v.shape[d]
        v = b.pad(v, b.op1("stablehlo.complex", [b.constant(0.0, _REAL[v.dtype]), b.constant(0.0, _REAL[v.dtype])],
                             (), v.dtype), [0] * v.rank, high)
    r = _fft(b, v, dims, "IRFFT", lengths, out)
    return _scale(b, r, _norm_factor(normalization, math.prod(lengths), True))


def conj(b: Builder, v: Value) -> Value:
    if not v.dtype.is_complex:
        return v
    return b.op1("stablehlo.complex", [b.real(v), b.neg(b.imag(v))], v.shape, v.dtype)


@register(aten.conj_physical.default)
def _conj_physical(ctx: LoweringContext, x: Value) -> Value:
    return conj(ctx.b, x)


@register_graph_only(aten.view_as_real.default)
def _view_as_real_graph(ctx: LoweringContext, x: Value) -> Value:
    # inside a traced graph views are values: (re, im) stacked on a new last dimension
    b = ctx.b
    re = b.reshape(b.real(x), (*x.shape, 1))
    im = b.reshape(b.imag(x), (*x.shape, 1))
    return b.concatenate([re, im], x.rank)


@register_graph_only(aten.view_as_complex.default)
def _view_as_complex_graph(ctx: LoweringContext, x: Value) -> Value:
    b = ctx.b
    shape = x.shape[:-1]
    re = b.reshape(b.slice(x, [0] * x.rank, [*shape, 1]), shape)
    im = b.reshape(b.slice(x, [0] * (x.rank - 1) + [1], [*shape, 2]), shape)
    return b.op1("stablehlo.complex", [re, im], shape, _COMPLEX[x.dtype])


def _real_parts(ctx: LoweringContext, a: Value, c: Value) -> tuple[Value, Value]:
    """Both operands in the output's real part dtype, broadcast to the output shape."""
    b = ctx.b
    part, shape = _REAL.get(ctx.out_dtype()), ctx.out_shape()
    if part is None:  # complex32: no StableHLO element type (was a bare KeyError)
        raise NotImplementedError(f"dtype {ctx.out_dtype()} is not supported on tpu")
    return b.broadcast_to(b.convert(a, part), shape), b.broadcast_to(b.convert(c, part), shape)


@register(aten.complex.default)
def _complex(ctx: LoweringContext, re: Value, im: Value) -> Value:
    re, im = _real_parts(ctx, re, im)
    return ctx.b.op1("stablehlo.complex", [re, im], ctx.out_shape(), ctx.out_dtype())


@register(aten.polar.default)
def _polar(ctx: LoweringContext, mag: Value, angle: Value) -> Value:
    b = ctx.b
    r, t = _real_parts(ctx, mag, angle)
    return b.op1("stablehlo.complex", [b.mul(r, b.unary("cosine", t)), b.mul(r, b.unary("sine", t))],
                 ctx.out_shape(), ctx.out_dtype())
