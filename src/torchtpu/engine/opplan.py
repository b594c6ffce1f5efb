"""Per-OpOverload facts the engine needs on every call, computed once.

Which arguments are runtime scalars, which are written to, which functional
overload carries the lowering, and how the op's returns map to arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..lowering import registry

_RUNTIME_SCALAR_TYPES = {"number", "Optional[number]", "List[number]", "float", "Optional[float]", "List[float]",
                         # wrapped Python numbers reach Tensor arguments as plain numbers
                         "Tensor", "Optional[Tensor]"}


@dataclass(eq=False)  # hashed by identity: one plan per op stands for it in cache keys
class OpPlan:
    op: torch._ops.OpOverload
    names: list[str]
    defaults: list[Any]
    kwarg_only: list[bool]
    runtime_scalar: list[bool]
    mutated: list[int]  # argument positions written to (in-place self, out=)
    functional: torch._ops.OpOverload | None
    lowering: registry.Lowering | None
    # For each return: ("arg", position) when it aliases an argument, else ("new", k).
    returns: list[tuple[str, int]]
    returns_list: bool  # schema returns a single Tensor[]
    func_arg_positions: list[int]  # for each functional arg, its position in this op's args
    random: bool  # draws from a generator (explicit or default)
    # CPU's TensorIterator rejects a written tensor whose elements share memory
    # (an expanded view) for these ops; fill_, index_fill_ and friends allow it.
    rejects_internal_overlap: bool = False
    # CPU's kernel refuses an out= tensor sharing memory with an input (assert_no_overlap)
    rejects_input_overlap: bool = False
    # registry.argument_check of the functional op: run on every call (see executor.run_plan)
    argument_check: Callable[..., None] | None = None
    # registry.index_bounds of the functional op: its index arguments' ranges (see executor.run_plan)
    index_bounds: Callable[..., list] | None = None

    @property
    def is_functional(self) -> bool:
        return not self.mutated


_MISSING = object()
# Scalars that shape the program itself (a correction term, a norm's order)
# stay compile-time constants.
_STATIC_SCALAR_NAMES = {"correction", "ord", "start", "end", "step",  # arange: they set the shape
                        # interpolation: the scales pick the source indices
                        "scales", "scales_d", "scales_h", "scales_w", "scale_factors"}
_aten = torch.ops.aten
# In-place ops whose functional twin does not follow the naming rule.
_FUNCTIONAL_OVERRIDES = {
    _aten.normal_.default: _aten.normal_functional.default,
}
# Random ops without a generator argument.
_RANDOM_WITHOUT_GENERATOR = {_aten.native_dropout.default,
                             # random factories (graph-only lowerings: eager runs their composites)
                             _aten.rand.default, _aten.randn.default, _aten.randint.default, _aten.randint.low,
                             _aten.rand_like.default, _aten.randn_like.default, _aten.randint_like.default,
                             _aten.randint_like.low_dtype}


def _functional_overload(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    if op in _FUNCTIONAL_OVERRIDES:
        return _FUNCTIONAL_OVERRIDES[op]
    schema = op._schema
    if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return op
    name = op.overloadpacket.__name__
    kept = [a for a in schema.arguments if not (a.alias_info is not None and a.alias_info.is_write
                                                 and a.kwarg_only)]
    keep = [a.name for a in kept]
    # Overloads can share argument names and differ in types (masked_fill_.Tensor must map
    # to masked_fill.Tensor, not masked_fill.Scalar): prefer the one whose types match too.
    keep_typed = [(a.name, str(a.type)) for a in kept]
    candidates = [name[:-1]] if name.endswith("_") else []
    candidates.append(name)
    by_name = None
    for base in candidates:
        packet = getattr(torch.ops.aten, base, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            cand = getattr(packet, overload)
            cs = cand._schema
            if any(a.alias_info is not None and a.alias_info.is_write for a in cs.arguments):
                continue
            if [(a.name, str(a.type)) for a in cs.arguments] == keep_typed:
                return cand
            if by_name is None and [a.name for a in cs.arguments] == keep:
                by_name = cand
    return by_name


# c10::ScalarType codes, which schema defaults such as ``ScalarType dtype=long`` carry
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
                 5: torch.float16, 6: torch.float32, 7: torch.float64, 9: torch.complex64, 10: torch.complex128,
                 11: torch.bool, 15: torch.bfloat16}


def _default(a: Any) -> Any:
    if not a.has_default_value():
        return _MISSING
    v = a.default_value
    if isinstance(v, int) and not isinstance(v, bool) and a.name == "dtype":  # typed int in the schema
        return _SCALAR_TYPES.get(v, v)
    return v


@functools.cache
def plan_for(op: torch._ops.OpOverload) -> OpPlan:
    schema = op._schema
    args = schema.arguments
    names = [a.name for a in args]
    defaults = [_default(a) for a in args]
    functional = _functional_overload(op)
    lowering = registry.lookup(functional) if functional is not None else None
    mutated = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    # Runtime scalars only where a hand-written lowering receives them; a
    # decomposition is traced with concrete Python values.
    runtime_scalar = [lowering is not None and str(a.type) in _RUNTIME_SCALAR_TYPES
                      and a.name not in _STATIC_SCALAR_NAMES for a in args]
    returns: list[tuple[str, int]] = []
    k = 0
    for r in schema.returns:
        pos = None
        if r.alias_info is not None and r.alias_info.is_write:
            sets = r.alias_info.before_set
            pos = next((i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.before_set == sets),
                       None)
        if pos is not None:
            returns.append(("arg", pos))
        else:
            returns.append(("new", k))
            k += 1
    returns_list = len(schema.returns) == 1 and str(schema.returns[0].type) == "List[Tensor]"
    func_arg_positions: list[int] = []
    if functional is not None:
        for fa in functional._schema.arguments:
            func_arg_positions.append(names.index(fa.name))
    random = "generator" in names or op in _RANDOM_WITHOUT_GENERATOR or functional in _RANDOM_WITHOUT_GENERATOR
    rejects_overlap = bool(mutated) and (torch.Tag.pointwise in op.tags or op.name() in _OVERLAP_CHECKED)
    check = registry.argument_check(functional) if functional is not None else None
    bounds = registry.index_bounds(functional) if functional is not None else None
    return OpPlan(op, names, defaults, [a.kwarg_only for a in args], runtime_scalar, mutated, functional,
                  lowering, returns, returns_list, func_arg_positions, random, rejects_overlap,
                  op.name() in _INPUT_OVERLAP_CHECKED, check, bounds)


# Writing ops outside the pointwise tag whose CPU kernels check internal overlap.
_OVERLAP_CHECKED = frozenset({
    "aten::copy_", "aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::exponential_",
    "aten::random_", "aten::cauchy_", "aten::log_normal_", "aten::geometric_", "aten::where",
    # their out= variants
    "aten::cat.out", "aten::index_select.out", "aten::take.out", "aten::gather.out", "aten::bernoulli.out",
})


# out= ops whose CPU kernels refuse an out tensor that shares memory with an input.
_INPUT_OVERLAP_CHECKED = frozenset({"aten::take.out", "aten::masked_select.out", "aten::kthvalue.values",
                                    "aten::index_select.out", "aten::gather.out", "aten::cat.out"})


def normalize_args(plan: OpPlan, args: tuple, kwargs: dict) -> list[Any]:
    """All schema arguments positionally, defaults filled in."""
    out = list(args)
    n = len(plan.names)
    if len(out) < n:
        for i in range(len(out), n):
            name = plan.names[i]
            if name in kwargs:
                out.append(kwargs[name])
            else:
                d = plan.defaults[i]
                if d is _MISSING:
                    raise TypeError(f"{plan.op}: missing argument '{name}'")
                out.append(d)
    return out


def call_op(op: torch._ops.OpOverload, values: list[Any]) -> Any:
    """Call ``op`` with schema-ordered ``values`` (kwarg-only ones passed by name)."""
    args, kwargs = [], {}
    for a, v in zip(op._schema.arguments, values):
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return op(*args, **kwargs)
