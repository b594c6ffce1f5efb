"""``prims`` ops, which PyTorch's reference decompositions (``torch._refs``) emit.

A traced decomposition of an op without a lowering (``copysign``, ``logaddexp``,
...) comes back as prims. Most have an ATen twin with a lowering and the same
semantics once types are promoted (prims never promote: their operands
already share a dtype), so they delegate to it; the rest (broadcast, reshape
and reduction prims) are a few lines each.
"""

from __future__ import annotations

from typing import Any

import torch

from .builder import Value
from .elementwise import opmath
from .reductions import variance
from .registry import LoweringContext, lookup
from .registry import register_graph_only as register  # prims never reach the dispatcher: graph-only

aten = torch.ops.aten
prims = torch.ops.prims


def _delegate(target: torch._ops.OpOverload):
    def lower(ctx: LoweringContext, *args: Any) -> Any:
        fn = lookup(target)
        if fn is None:
            raise NotImplementedError(f"torchtpu: no lowering for aten::{target.__name__} (for prims)")
        sub = LoweringContext(ctx.b, target, ctx.out, ctx.precision, ctx.extras, ctx.metas)
        return fn(sub, *args)

    return lower


_UNARY = {
    "abs": aten.abs.default, "acos": aten.acos.default, "acosh": aten.acosh.default, "asin": aten.asin.default,
    "asinh": aten.asinh.default, "atan": aten.atan.default, "atanh": aten.atanh.default, "cos": aten.cos.default,
    "cosh": aten.cosh.default, "bitwise_not": aten.bitwise_not.default, "ceil": aten.ceil.default,
    "digamma": aten.digamma.default, "erf": aten.erf.default, "erf_inv": aten.erfinv.default,
    "erfc": aten.erfc.default, "exp": aten.exp.default, "expm1": aten.expm1.default, "exp2": aten.exp2.default,
    "floor": aten.floor.default, "isfinite": aten.isfinite.default, "lgamma": aten.lgamma.default,
    "log": aten.log.default, "log1p": aten.log1p.default, "log2": aten.log2.default, "log10": aten.log10.default,
    "neg": aten.neg.default, "reciprocal": aten.reciprocal.default, "round": aten.round.default,
    "sign": aten.sign.default, "signbit": aten.signbit.default, "sin": aten.sin.default, "sinh": aten.sinh.default,
    "sqrt": aten.sqrt.default, "tan": aten.tan.default, "tanh": aten.tanh.default, "trunc": aten.trunc.default,
    "rsqrt": aten.rsqrt.default, "conj_physical": aten.conj_physical.default,
}
_BINARY = {
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor, "atan2": aten.atan2.default,
    "bitwise_and": aten.bitwise_and.Tensor, "bitwise_or": aten.bitwise_or.Tensor,
    "bitwise_xor": aten.bitwise_xor.Tensor, "eq": aten.eq.Tensor, "ne": aten.ne.Tensor, "ge": aten.ge.Tensor,
    "gt": aten.gt.Tensor, "le": aten.le.Tensor, "lt": aten.lt.Tensor, "fmax": aten.fmax.default,
    "fmin": aten.fmin.default, "maximum": aten.maximum.default, "minimum": aten.minimum.default,
    "fmod": aten.fmod.Tensor, "remainder": aten.remainder.Tensor, "pow": aten.pow.Tensor_Tensor,
    "hypot": aten.hypot.default, "nextafter": aten.nextafter.default,
    "shift_left": aten.bitwise_left_shift.Tensor, "shift_right_arithmetic": aten.bitwise_right_shift.Tensor,
    "igamma": aten.igamma.default, "igammac": aten.igammac.default, "zeta": aten.special_zeta.default,
    "gcd": aten.gcd.default,
}

for _name, _target in {**_UNARY, **_BINARY}.items():
    _p = getattr(prims, _name, None)
    if _p is not None:
        register(_p.default)(_delegate(_target))


@register(prims.div.default)
def _div(ctx: LoweringContext, a: Any, c: Any) -> Value:
    # prims.div truncates integers (C semantics) and divides floats exactly.
    mode = None if ctx.out_dtype().is_floating_point else "trunc"
    return _delegate(aten.div.Tensor_mode)(ctx, a, c, mode)


@register(prims.where.default)
def _where(ctx: LoweringContext, pred: Any, a: Any, c: Any) -> Value:
    if not isinstance(pred, Value):
        pred = ctx.b.constant(bool(pred), torch.bool)
    return _delegate(aten.where.self)(ctx, pred, a, c)


@register(prims.convert_element_type.default)
def _convert(ctx: LoweringContext, a: Any, dtype: torch.dtype) -> Value:
    return ctx.scalar(a, dtype) if not isinstance(a, Value) else ctx.b.convert(a, dtype)


@register(prims.broadcast_in_dim.default)
def _broadcast_in_dim(ctx: LoweringContext, a: Value, shape: list[int], dims: list[int]) -> Value:
    b = ctx.b
    # prims allow size-1 operand dims to expand; stablehlo does too when the dims map.
    return b.broadcast_in_dim(a, shape, dims)


@register(prims.squeeze.default)
def _squeeze(ctx: LoweringContext, a: Value, dims: list[int]) -> Value:
    return ctx.b.reshape(a, ctx.out_shape())


def _reshape(ctx: LoweringContext, a: Value, *rest: Any) -> Value:
    return ctx.b.reshape(a, ctx.out_shape())


# Some prims exist only in Python (no torch.ops entry); those never appear in a traced graph.
for _name in ("reshape", "collapse_view", "collapse", "split_dim", "expand_dims", "view_of"):
    _p = getattr(prims, _name, None)
    if _p is not None:
        register(_p.default)(_reshape)


@register(prims.transpose.default)
def _transpose(ctx: LoweringContext, a: Value, perm: list[int]) -> Value:
    return ctx.b.transpose(a, perm)


@register(prims.rev.default)
def _rev(ctx: LoweringContext, a: Value, dims: list[int]) -> Value:
    return ctx.b.reverse(a, list(dims)) if dims else a


@register(prims.cat.default)
def _cat(ctx: LoweringContext, tensors: list[Value], dim: int) -> Value:
    return _delegate(aten.cat.default)(ctx, tensors, dim)


@register(prims.clone.default)
def _clone(ctx: LoweringContext, a: Value, memory_format: Any = None) -> Value:
    return a


@register(prims.fill.default)
def _fill(ctx: LoweringContext, a: Value, value: Any) -> Value:
    return ctx.scalar(value, ctx.out_dtype(), ctx.out_shape())


@register(prims.full.default)
def _full(ctx: LoweringContext, shape: list[int], value: Any, dtype: Any, device: Any, requires_grad: bool
          ) -> Value:
    return ctx.scalar(value, ctx.out_dtype(), ctx.out_shape())


@register(prims.full_like.default)
def _full_like(ctx: LoweringContext, a: Value, value: Any, dtype: Any, device: Any, requires_grad: bool) -> Value:
    return ctx.scalar(value, ctx.out_dtype(), ctx.out_shape())


@register(prims.scalar_tensor.default)
def _scalar_tensor(ctx: LoweringContext, value: Any, dtype: Any = None, device: Any = None) -> Value:
    return ctx.scalar(value, ctx.out_dtype())


def _dims(dims: Any, rank: int) -> list[int]:
    return list(range(rank)) if dims is None else sorted(d % rank for d in dims) if rank else []


def _reduction(kind: str):
    def lower(ctx: LoweringContext, inp: Value, dims: Any, output_dtype: Any = None) -> Value:
        b = ctx.b
        out = ctx.out_dtype()
        d = _dims(dims, inp.rank)
        if kind in ("sum", "prod"):
            acc = torch.float32 if out in (torch.bfloat16, torch.float16) else out
            v = b.convert(inp, acc)
            init = b.constant(0 if kind == "sum" else 1, acc)
            r = b.reduce(v, d, init, "stablehlo.add" if kind == "sum" else "stablehlo.multiply")
            return b.convert(r, out)
        fn = lookup(aten.amax.default if kind == "amax" else aten.amin.default)
        sub = LoweringContext(b, aten.amax.default if kind == "amax" else aten.amin.default, ctx.out,
                              ctx.precision, ctx.extras, ctx.metas)
        return fn(sub, inp, d, False)

    return lower


register(prims.sum.default)(_reduction("sum"))
register(prims.prod.default)(_reduction("prod"))
register(prims.amax.default)(_reduction("amax"))
register(prims.amin.default)(_reduction("amin"))


@register(prims.var.default)
def _var(ctx: LoweringContext, inp: Value, dims: Any, correction: Any = 1, output_dtype: Any = None) -> Value:
    b = ctx.b
    r = variance(b, b.convert(inp, opmath(inp.dtype)), _dims(dims, inp.rank), correction)
    return b.convert(r, ctx.out_dtype())
