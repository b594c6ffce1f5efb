"""Gradient scaling for mixed precision: the two kernels behind ``torch.amp.GradScaler``.

``GradScaler.unscale_`` multiplies every gradient by the inverse scale and records whether
any was inf or NaN; ``GradScaler.update`` then backs the scale off or grows it. Both stay
on the device (one program each, no host read), as CUDA's kernels do. Semantics and
argument errors follow CPU's kernels (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp).
"""

from __future__ import annotations

from typing import Any

import torch

from .builder import Value
from .elementwise import opmath
from .meta_checks import scalar_type_name
from .registry import LoweringContext, register, register_meta_check

aten = torch.ops.aten
_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_scalars(one_element: list[tuple[torch.Tensor, str]],
                   typed: list[tuple[torch.Tensor, str, torch.dtype]]) -> None:
    """CPU's checks, in its order: every one-element check, then every dtype check."""
    for t, name in one_element:
        if t.numel() != 1:
            raise RuntimeError(f"{name} must be a 1-element tensor.")
    for t, name, dtype in typed:
        if t.dtype != dtype:
            raise RuntimeError(f"{name} must be {'a float' if dtype == torch.float32 else 'an int'} tensor.")


@register_meta_check(aten._amp_foreach_non_finite_check_and_unscale.default)
def _check_unscale(grads: list, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    if not grads:
        return
    _check_scalars([(inv_scale, "inv_scale"), (found_inf, "found_inf")],
                   [(inv_scale, "inv_scale", torch.float32), (found_inf, "found_inf", torch.float32)])
    for g in grads:
        if g.dtype not in _FLOATING:
            raise NotImplementedError(f'"_amp_foreach_non_finite_check_and_unscale_cpu" not implemented for '
                                      f"'{scalar_type_name(g.dtype)}'")


@register(aten._amp_foreach_non_finite_check_and_unscale.default)
def _unscale(ctx: LoweringContext, grads: list, found_inf: Value, inv_scale: Value) -> tuple[list, Value]:
    """Each gradient times ``inv_scale`` (in its op math type); ``found_inf`` becomes 1.0 when any
    element of any gradient is inf or NaN, and is left as it is otherwise."""
    b = ctx.b
    if not grads:
        return [], found_inf
    out = []
    nonfinite = b.constant(False, torch.bool)
    for g in grads:
        acc = opmath(g.dtype)
        v = b.convert(g, acc)
        out.append(b.convert(b.mul(v, ctx.scalar(inv_scale, acc, g.shape)), g.dtype))
        bad = b.unary("not", b.op1("stablehlo.is_finite", [v], g.shape, torch.bool))
        any_bad = b.reduce(bad, list(range(g.rank)), b.constant(False, torch.bool), "stablehlo.or")
        nonfinite = b.binary("or", nonfinite, any_bad)
    flag = b.broadcast_to(nonfinite, found_inf.shape)
    return out, b.select(flag, b.constant(1.0, torch.float32, found_inf.shape), found_inf)


@register_meta_check(aten._amp_update_scale.default)
def _check_update_scale(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                        *factors: Any) -> None:
    _check_scalars([(growth_tracker, "growth_tracker"), (scale, "current_scale"), (found_inf, "found_inf")],
                   [(growth_tracker, "growth_tracker", torch.int32), (scale, "current_scale", torch.float32),
                    (found_inf, "found_inf", torch.float32)])


@register(aten._amp_update_scale.default)
def _update_scale(ctx: LoweringContext, scale: Value, growth_tracker: Value, found_inf: Value,
                  growth_factor: Any, backoff_factor: Any, growth_interval: int) -> tuple[Value, Value]:
    """After an overflow: scale * backoff_factor and the tracker reset. Otherwise the tracker counts
    the step, and at ``growth_interval`` successful steps the scale grows (unless that overflows
    f32) and the tracker restarts.

    CPU multiplies in double; here the factors are rounded to f32 first, which changes nothing
    for the factors GradScaler uses (powers of two) and keeps the kernel free of f64 for TPUs.
    """
    b = ctx.b
    f32, i32 = torch.float32, torch.int32
    shape = scale.shape
    overflow = b.compare(found_inf, b.constant(0.0, f32, shape), "NE")  # NaN counts, as in C's `if (x)`
    successful = b.add(growth_tracker, b.constant(1, i32, shape))
    due = b.compare(successful, b.constant(int(growth_interval), i32, shape), "EQ")
    grown = b.mul(scale, ctx.scalar(growth_factor, f32, shape))
    grow = b.binary("and", due, b.op1("stablehlo.is_finite", [grown], shape, torch.bool))
    new_scale = b.select(overflow, b.mul(scale, ctx.scalar(backoff_factor, f32, shape)),
                         b.select(grow, grown, scale))
    zero = b.constant(0, i32, shape)
    new_tracker = b.select(overflow, zero, b.select(due, zero, successful))
    return new_scale, new_tracker

