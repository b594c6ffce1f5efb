"""``_foreach_*`` ops: one program for the whole tensor list.

Without these, PyTorch's composite kernels run one tiny executable per tensor
(an AdamW step on a GPT is then thousands of launches). Each element reuses
the lowering of the matching single-tensor op.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import registry
from .builder import Value
from .registry import LoweringContext, OutMeta, register

aten = torch.ops.aten

# foreach op name -> overload of the single-tensor op used per element
_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "clamp_min", "clamp_max"]
_UNARY = ["sqrt", "exp", "log", "abs", "neg", "reciprocal", "sigmoid", "tanh", "sign", "zero", "rsqrt", "sin",
          "cos", "floor", "ceil", "round", "trunc", "frac", "log1p", "expm1", "erf", "acos", "asin", "atan", "cosh",
          "sinh", "tan", "erfc", "lgamma", "log10", "log2", "max", "clone"]
_TERNARY = ["addcmul", "addcdiv", "lerp"]


def _base_overload(name: str, foreach_overload: str) -> torch._ops.OpOverload:
    packet = getattr(aten, name)
    if name in ("clamp_min", "clamp_max"):
        return packet.Tensor if foreach_overload == "List" else packet.default
    if name in ("maximum", "minimum"):
        return packet.default
    if name == "pow":
        if foreach_overload == "ScalarAndTensor":
            return packet.Scalar
        return packet.Tensor_Tensor if foreach_overload == "List" else packet.Tensor_Scalar
    if name == "lerp":
        return packet.Tensor if foreach_overload == "List" else packet.Scalar
    if name in ("addcmul", "addcdiv", "zero") or name in _UNARY:
        return packet.default
    if foreach_overload in ("List", "Tensor"):
        return packet.Tensor
    return packet.Scalar if hasattr(packet, "Scalar") else packet.Tensor


def _lower_foreach(ctx: LoweringContext, *args: Any) -> list[Any]:
    op = ctx.op
    name = op.overloadpacket.__name__[len("_foreach_"):]
    base = _base_overload(name, op._overloadname)
    fn = registry.lookup(base)
    if fn is None:
        raise NotImplementedError(f"torchtpu: no lowering for aten::{base} used by {op}")
    schema = op._schema.arguments
    n = next(len(a) for a, s in zip(args, schema) if str(s.type).startswith("List["))
    stacked = _stacked_scalars(ctx, fn, base, args, schema, n)
    if stacked is not None:
        return stacked
    results = []
    for i in range(n):
        elem = []
        elem_meta = []
        for a, m, s in zip(args, ctx.metas or [None] * len(args), schema):
            per_elem = str(s.type).startswith("List[")
            elem.append(a[i] if per_elem else a)
            elem_meta.append(m[i] if per_elem and m is not None else m)
        sub = LoweringContext(ctx.b, base, [ctx.out[i]], ctx.precision, ctx.extras, metas=elem_meta)
        results.append(fn(sub, *elem))
    return results


def _stacked_scalars(ctx: LoweringContext, fn: Any, base: torch._ops.OpOverload, args: tuple,
                     schema: list, n: int) -> list[Any] | None:
    """A list of one-element tensors (an optimizer's per-parameter step counts) as one vector
    through the base op, then sliced: one op where a loop would write n. A TPU's compiler spends
    about the same time on a scalar op as on a vector one (capturable AdamW's beta ** step, two
    per parameter, was thousands of scalar ops). None where the lists are not all such scalars."""
    lists = [i for i, s in enumerate(schema) if str(s.type).startswith("List[")]
    if n < 2 or any(m is None for m in ctx.out) or len({(m.shape, m.dtype) for m in ctx.out}) != 1:
        return None
    shape = ctx.out[0].shape
    if math.prod(shape) != 1:
        return None
    for i in lists:
        if not all(isinstance(v, Value) and v.shape == shape and v.dtype == args[i][0].dtype for v in args[i]):
            return None
    b = ctx.b
    elem = [b.concatenate([b.reshape(v, (1,)) for v in a], 0) if i in lists else a for i, a in enumerate(args)]
    elem_meta = [m[0] if i in lists and m is not None else m for i, m in enumerate(ctx.metas or [None] * len(args))]
    sub = LoweringContext(b, base, [OutMeta((n,), ctx.out[0].dtype)], ctx.precision, ctx.extras, metas=elem_meta)
    vector = fn(sub, *elem)
    if not isinstance(vector, Value) or vector.shape != (n,):
        return None  # (a base lowering that answers otherwise: the per-element loop does it)
    return [b.reshape(b.slice(vector, [i], [i + 1]), shape) for i in range(n)]


def _register_all() -> None:
    for name in _BINARY + _UNARY + _TERNARY:
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload in packet.overloads():
            if overload == "Tensor" and name in _TERNARY:
                continue  # per-element scalars held in a tensor: left to PyTorch's composite
            register(getattr(packet, overload))(_lower_foreach)


_register_all()


@register(aten._foreach_norm.Scalar, aten._foreach_norm.Scalar_out)
def _foreach_norm(ctx: LoweringContext, tensors: list, ord: Any = 2, dtype: Any = None) -> list:
    """Each tensor's vector norm (``clip_grad_norm_``'s first step), as linalg_vector_norm."""
    base = aten.linalg_vector_norm.default
    fn = registry.lookup(base)
    return [fn(LoweringContext(ctx.b, base, [ctx.out[i]], ctx.precision, ctx.extras), t, ord, None, False, dtype)
            for i, t in enumerate(tensors)]


@register(aten._foreach_copy.default)
def _foreach_copy(ctx: LoweringContext, dst: list, src: list, non_blocking: bool = False) -> list:
    b = ctx.b
    return [b.broadcast_to(b.convert(s, ctx.out[i].dtype), ctx.out[i].shape) for i, s in enumerate(src)]
