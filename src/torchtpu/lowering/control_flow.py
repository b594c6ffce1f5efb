"""Control flow in compiled graphs: ``torch.cond`` and ``while_loop``.

Dynamo keeps them as higher-order ops whose branches (or loop condition and
body) are subgraphs of ATen ops. Each becomes one StableHLO op with regions,
``stablehlo.if`` and ``stablehlo.while``, inside the graph's program, so a
data-dependent branch or loop runs on the device without a host round trip.
The subgraphs are lowered with the same graph lowering as the graph itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .builder import Builder, Value
from .registry import register_higher_order

_hop = torch.ops.higher_order


def _lower_subgraph(b: Builder, gm: torch.fx.GraphModule, inputs: Sequence[Any], precision: str,
                    extras: dict | None, vals: dict | None) -> list[Any]:
    from .decompose import lower_graph  # (decompose imports the registry this module fills)

    out = lower_graph(b, gm.graph, list(inputs), precision, extras, vals=vals)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _as_typed(b: Builder, v: Any, like: torch.Tensor) -> Value:
    """A branch's or loop's result with the node's declared dtype and shape (a lowering may
    compute in another type, e.g. a scalar constant kept as a Python number)."""
    shape = tuple(int(d) for d in like.shape)
    if not isinstance(v, Value):
        return b.constant(v, like.dtype, shape)
    v = b.convert(v, like.dtype)
    if v.shape != shape:
        v = b.reshape(v, shape) if v.numel == like.numel() else b.broadcast_to(v, shape)
    return v


def _in_region(extras: dict | None, lower: Any) -> Any:
    """Run ``lower`` for a region body, keeping the graph's RNG seed value outside it.

    A random op bumps ``extras["seed"]`` to a value computed where it is lowered; one computed
    inside a region must not be used after it, so the seed is restored (the bump counter keeps
    counting, so later draws still differ)."""
    seed = extras.get("seed") if extras else None
    try:
        return lower()
    finally:
        if seed is not None:
            extras["seed"] = seed


def _tensors(val: Any) -> list[torch.Tensor]:
    return list(val) if isinstance(val, (list, tuple)) else [val]


@register_higher_order(_hop.cond)
def _cond(b: Builder, args: list[Any], val: Any, precision: str, extras: dict | None, vals: dict | None) -> tuple:
    pred, true_gm, false_gm, operands = args
    outs = _tensors(val)
    if not isinstance(pred, Value):  # a static predicate: only its branch
        chosen = _lower_subgraph(b, true_gm if pred else false_gm, operands, precision, extras, vals)
        return tuple(_as_typed(b, v, t) for v, t in zip(chosen, outs))
    p = b.reshape(b.convert(pred, torch.bool), ())

    def branch(gm: torch.fx.GraphModule) -> str:
        def body(bb: Builder) -> list[Value]:
            results = _lower_subgraph(bb, gm, operands, precision, extras, vals)
            return [_as_typed(bb, v, t) for v, t in zip(results, outs)]

        return _in_region(extras, lambda: b.region([], body))

    regions = branch(true_gm) + ", " + branch(false_gm)
    return tuple(b.op("stablehlo.if", [p], [(tuple(t.shape), t.dtype) for t in outs], region=regions))


@register_higher_order(_hop.while_loop)
def _while_loop(b: Builder, args: list[Any], val: Any, precision: str, extras: dict | None,
                vals: dict | None) -> tuple:
    cond_gm, body_gm, carried, additional = args
    outs = _tensors(val)
    if not all(isinstance(v, Value) for v in carried) or len(outs) != len(carried):
        raise NotImplementedError("torchtpu: while_loop carries only tensors in compiled graphs")
    # The loop-invariant inputs ride along as operands: the regions see only their arguments.
    state = [_as_typed(b, v, t) for v, t in zip(carried, outs)]
    invariant = [v if isinstance(v, Value) else b.constant(v, torch.int64) for v in additional]
    types = [(v.shape, v.dtype) for v in (*state, *invariant)]
    n = len(state)

    def cond(bb: Builder, *xs: Value) -> Value:
        (r,) = _lower_subgraph(bb, cond_gm, xs, precision, extras, vals)
        return bb.reshape(bb.convert(r, torch.bool), ())

    def body(bb: Builder, *xs: Value) -> list[Value]:
        new = _lower_subgraph(bb, body_gm, xs, precision, extras, vals)
        return [*(_as_typed(bb, v, t) for v, t in zip(new, outs)), *xs[n:]]

    regions = _in_region(extras, lambda: b.region(types, cond) + ", " + b.region(types, body))
    return tuple(b.op("stablehlo.while", [*state, *invariant], types, region=regions)[:n])
