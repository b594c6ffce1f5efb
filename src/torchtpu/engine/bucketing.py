"""Bounded dynamism: one executable per size *bucket*, not per size.

A graph traced with symbolic sizes (``torch.compile(dynamic=True)``,
``mark_dynamic``) is compiled for bucket sizes (powers of two by default,
capped at a dimension's declared maximum) and run on inputs padded up to the
bucket. The actual sizes are a runtime input, so every size in a bucket
shares the executable. Correctness rests on one invariant, checked per graph
before bucketing is used: in every tensor of the graph, the elements of the
unpadded computation sit at the same positions of the padded array (a
"layout": per dimension, the factors it is made of, so that ``(B, T) ->
(B*T)`` views stay exact), and padded garbage never reaches them. Ops that
mix positions along a padded dimension get masks built from the actual
sizes: reductions and softmax see their identity, contractions see zeros,
means divide by the actual count. An op the analysis does not know, a random
op, or an output whose layout is not a plain prefix box makes the graph fall
back to one executable per size (still correct).

Configuration: ``TORCH_TPU_DYNAMIC_BUCKETS`` = ``pow2`` (default), a comma
list of sizes (a size above the largest runs unpadded), or ``exact`` (off);
``torch.tpu.set_dynamic_buckets(...)`` sets it in code.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

from ..lowering.builder import Builder, Value
from ..lowering.views import contiguous_strides, gather_flat
from ..runtime import env

aten = torch.ops.aten

Factors = tuple  # the non-unit factors (sympy expressions) of one dimension, in row-major order
Layout = tuple  # one Factors per dimension


class NotBucketable(Exception):
    """The graph cannot run padded; it runs at exact sizes instead."""


# -- bucket sizes -------------------------------------------------------------------
_buckets: list[int] | str = "pow2"


def set_dynamic_buckets(spec: str | Sequence[int]) -> None:
    """``"pow2"`` (default), ``"exact"`` (no padding), or an ascending list of sizes."""
    global _buckets
    if isinstance(spec, str):
        if spec not in ("pow2", "exact"):
            spec = [int(s) for s in spec.split(",") if s.strip()]
    else:
        spec = sorted(int(s) for s in spec)
    if isinstance(spec, list) and (not spec or spec[0] < 1):
        raise ValueError(f"torchtpu: bucket sizes must be positive integers, got {spec!r}")
    _buckets = spec


def enabled() -> bool:
    return _buckets != "exact"


def bucket_for(size: int, upper: int | None) -> int:
    """The padded size for ``size``; ``upper`` is the dimension's declared maximum, if any."""
    if isinstance(_buckets, str):
        b = 1 << max(0, size - 1).bit_length()
    else:
        b = next((s for s in _buckets if s >= size), size)
    if upper is not None and size <= upper < b:
        b = upper
    return max(b, size)


def _buckets_from_environment() -> None:
    spec = env.read("TORCH_TPU_DYNAMIC_BUCKETS")
    try:
        set_dynamic_buckets(spec)
    except ValueError:
        env.warn_invalid("TORCH_TPU_DYNAMIC_BUCKETS", spec, "is not pow2, exact or ascending positive sizes")
        set_dynamic_buckets("pow2")


_buckets_from_environment()


# -- layouts ----------------------------------------------------------------------------
def _expr(d: Any) -> sympy.Expr:
    return d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(int(d))


def _padded(f: sympy.Expr) -> bool:
    return bool(f.free_symbols)


def _normalize(factors: Sequence[sympy.Expr]) -> Factors:
    """Merge runs of constant factors, drop unit ones: layouts compare structurally."""
    out: list[sympy.Expr] = []
    for f in factors:
        f = sympy.sympify(f)
        if f == 1:
            continue
        if not _padded(f) and out and not _padded(out[-1]):
            out[-1] = out[-1] * f
        else:
            out.append(f)
    return tuple(out)


def _plain(val: torch.Tensor) -> Layout:
    return tuple(_normalize([_expr(d)]) for d in val.shape)


def _is_padded(layout: Layout, dims: Sequence[int] | None = None) -> bool:
    dims = range(len(layout)) if dims is None else dims
    return any(_padded(f) for d in dims for f in layout[d])


def _is_box(layout: Layout) -> bool:
    """Each dimension is a single factor: the valid region is a prefix box."""
    return all(len(f) <= 1 for f in layout)


def _reshape(layout: Layout, shape: Sequence[sympy.Expr]) -> Layout:
    atoms = [f for dim in layout for f in dim]
    out: list[Factors] = []
    for e in shape:
        e = sympy.sympify(e)
        taken: list[sympy.Expr] = []
        remaining = e
        while remaining != 1:
            if not atoms:
                raise NotBucketable("view changes the element count")
            a = atoms[0]
            if not _padded(a) and not _padded(remaining):
                ai, ri = int(a), int(remaining)
                if ai % ri == 0:
                    taken.append(sympy.Integer(ri))
                    atoms[0] = sympy.Integer(ai // ri)
                    if atoms[0] == 1:
                        atoms.pop(0)
                    remaining = sympy.Integer(1)
                    continue
                if ri % ai:
                    raise NotBucketable("view splits a dimension across factors")
                taken.append(a)
                atoms.pop(0)
                remaining = sympy.Integer(ri // ai)
                continue
            rest = sympy.cancel(remaining / a)
            if sympy.fraction(rest)[1] != 1:
                raise NotBucketable("view mixes a padded dimension with another")
            taken.append(a)
            atoms.pop(0)
            remaining = rest
        out.append(_normalize(taken))
    if atoms:
        raise NotBucketable("view changes the element count")
    return tuple(out)


def _broadcast(layouts: list[Layout], val: torch.Tensor) -> Layout:
    rank = val.dim()
    out: list[Factors] = []
    for j in range(rank):
        seen: Factors | None = None
        for lay in layouts:
            k = j - (rank - len(lay))
            if k < 0 or lay[k] == ():
                continue
            if seen is None:
                seen = lay[k]
            elif seen != lay[k]:
                raise NotBucketable("broadcast of two different layouts")
        out.append(seen if seen is not None else _normalize([_expr(val.shape[j])]))
    return tuple(out)


# Element-wise ops besides those tagged pointwise (positions do not mix).
_ELEMENTWISE = {
    "where", "clone", "_to_copy", "alias", "detach", "lift_fresh_copy", "zeros_like", "ones_like", "full_like",
    "empty_like", "masked_fill", "copy", "contiguous", "gelu", "relu", "silu", "sigmoid", "tanh", "hardtanh",
    "leaky_relu", "elu", "softplus", "threshold",
}
_VIEWS = {"view", "_unsafe_view", "reshape"}
_FACTORIES = {"arange", "ones", "zeros", "full", "empty", "scalar_tensor", "new_ones", "new_zeros", "new_full",
              "new_empty", "empty_strided"}
# reductions: identity of the masked-out elements ("mean" divides by the actual count)
_REDUCTIONS = {"sum": 0, "amax": "-inf", "amin": "inf", "any": False, "all": True, "argmax": "-inf",
               "argmin": "inf", "logsumexp": "-inf", "prod": 1, "mean": "mean"}
_SOFTMAX = {"_softmax": "-inf", "_log_softmax": "-inf", "_safe_softmax": "-inf"}
_CONTRACTIONS = {"mm", "addmm", "bmm", "baddbmm"}


@dataclass
class Mask:
    """Mask arguments of one node: ``(arg position, dims)`` pairs, with the masked-out value."""

    operands: list[tuple[int, list[int]]]
    identity: Any
    mean_dims: list[int] = field(default_factory=list)  # for mean: the reduced dims of the input


@dataclass
class Plan:
    symbols: list[sympy.Symbol]
    symbol_positions: list[int]  # placeholder index of each symbol
    upper: list[int | None]  # declared maximum of each symbol
    layouts: dict[torch.fx.Node, Any]
    masks: dict[torch.fx.Node, Mask]
    outputs: list[Any]  # per output: a size-expression tuple (tensor), a sympy expr (SymInt) or None
    output_layouts: list[Any] = field(default_factory=list)  # per output: its Layout, or None
    compacted: set[int] = field(default_factory=set)  # outputs packed contiguously (see MaskHook.compact)
    padded_inputs: list[tuple[int, tuple]] = field(default_factory=list)  # (placeholder, size exprs)


def analyze(gm: torch.fx.GraphModule, compact_outputs: bool = False, eager: bool = False) -> Plan:
    """Check the bucketing invariant over the whole graph; raise NotBucketable if it fails.

    ``compact_outputs``: outputs will be packed contiguously (see MaskHook.compact), so an
    output with a merged padded dimension is fine; otherwise outputs must be prefix boxes.
    ``eager``: a one-op graph of an eager call (engine/eager_buckets.py), which may also use the
    rules of ``EAGER_RULES`` (ops whose masks compiled graphs have not needed yet).
    """
    rules = {**_RULES, **EAGER_RULES} if eager else _RULES
    symbols: list[sympy.Symbol] = []
    positions: list[int] = []
    upper: list[int | None] = []
    layouts: dict[torch.fx.Node, Any] = {}
    masks: dict[torch.fx.Node, Mask] = {}
    padded_inputs: list[tuple[int, tuple]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt):
            expr = val.node.expr
            if not isinstance(expr, sympy.Symbol):
                raise NotBucketable("a size input is an expression")
            symbols.append(expr)
            positions.append(i)
            upper.append(_upper_bound(val, expr))
        elif isinstance(val, torch.Tensor):
            layouts[n] = _plain(val)
            if _is_padded(layouts[n]):
                padded_inputs.append((i, tuple(_expr(d) for d in val.shape)))
    if not symbols:
        raise NotBucketable("no symbolic size inputs")
    for n in gm.graph.nodes:
        if n.op == "call_function":
            _visit(n, layouts, masks, rules)
        elif n.op == "get_attr":  # a tensor constant of the graph: never padded
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and not _is_padded(_plain(val)):
                layouts[n] = _plain(val)
            elif isinstance(val, torch.Tensor) or val is None:
                raise NotBucketable("a graph constant of unknown or symbolic shape")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    out_exprs: list[Any] = []
    out_layouts: list[Any] = []
    for o in outs:
        val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
        if isinstance(val, torch.Tensor):
            if not compact_outputs and not _is_box(layouts[o]):
                raise NotBucketable("an output's layout is not a prefix box")
            out_exprs.append(tuple(_expr(d) for d in val.shape))
            out_layouts.append(layouts[o])
        elif isinstance(val, torch.SymInt):
            out_exprs.append(val.node.expr)
            out_layouts.append(None)
        else:
            out_exprs.append(None)
            out_layouts.append(None)
    plan = Plan(symbols, positions, upper, layouts, masks, out_exprs, out_layouts, padded_inputs=padded_inputs)
    if compact_outputs:
        plan.compacted = compacted_outputs(plan)
    return plan


def _upper_bound(val: torch.SymInt, expr: sympy.Symbol) -> int | None:
    try:
        hi = val.node.shape_env.var_to_range[expr].upper
    except (AttributeError, KeyError):
        return None
    try:
        value = int(hi)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None  # unbounded (torch's int_oo)
    return value if value < (1 << 40) else None


def _arg_layout(a: Any, layouts: dict) -> Any:
    if isinstance(a, torch.fx.Node):
        return layouts.get(a)
    return None


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _size_type(t: Any) -> bool:
    """Whether a schema argument's type is a size's (int or SymInt, a list of them, optional): a size
    given there shapes a tensor, and at the bucket size it shapes the padded tensor, as it should."""
    for wrapper in (torch.OptionalType, torch.ListType, torch.OptionalType):
        if isinstance(t, wrapper):
            t = t.getElementType()
    return isinstance(t, (torch.IntType, torch.SymIntType))


def _symbolic(a: Any) -> bool:
    if isinstance(a, torch.fx.Node):
        return isinstance(a.meta.get("val"), _SYMBOLIC)
    if isinstance(a, (list, tuple)):
        return any(_symbolic(x) for x in a)
    return False


def _refuse_sizes_used_as_values(target: torch._ops.OpOverload, name: str, n: torch.fx.Node) -> None:
    """A graph's size symbols hold the bucket sizes when it runs padded. Given to an op as a size
    (a view's shape, a factory's size, arange's end) that is what the padded tensors need; given as
    a value (``x.sum(1) / x.shape[1]``: aten.div.Tensor(sum, s1)) it would compute with the bucket
    size, silently wrong, so such a graph runs at its exact sizes."""
    schema = target._schema
    actual = dict(zip((a.name for a in schema.arguments), n.args))
    actual.update(n.kwargs)
    for arg in schema.arguments:
        if arg.name not in actual or not _symbolic(actual[arg.name]):
            continue
        if _size_type(arg.type) or (name == "arange" and arg.name == "end"):
            continue
        raise NotBucketable(f"aten::{name} takes a size as a value (its argument {arg.name})")


def _visit(n: torch.fx.Node, layouts: dict, masks: dict, rules: dict[str, Callable]) -> None:
    target = n.target
    val = n.meta.get("val")
    args = list(n.args)
    if target is operator.getitem:
        src = layouts.get(args[0])
        if src is not None:
            layouts[n] = src[args[1]]
        return
    if not isinstance(target, torch._ops.OpOverload):
        if isinstance(val, torch.Tensor):
            raise NotBucketable(f"non-ATen node {target}")
        return  # arithmetic on sizes
    name = target.overloadpacket.__name__
    if name.startswith("sym_"):
        return  # sizes: computed from the bucket-sized values, like the graph's other sizes
    _refuse_sizes_used_as_values(target, name, n)
    ins = [_arg_layout(a, layouts) for a in args]
    tensor_ins = [x for x in ins if x is not None]
    for a in args:
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) and x in layouts for x in a):
            tensor_ins.extend(layouts[x] for x in a if isinstance(x, torch.fx.Node) and x in layouts)
    padded_in = any(_is_padded(x) for x in tensor_ins)
    if torch.Tag.nondeterministic_seeded in target.tags and (
            padded_in or (isinstance(val, torch.Tensor) and _is_padded(_plain(val)))):
        # its random stream would be laid out at the bucket size: not the static result
        raise NotBucketable(f"random op {name} on padded data")
    if name in _FACTORIES:
        layouts[n] = _plain(val)
        return
    if not padded_in:
        if isinstance(val, torch.Tensor):
            lay = _plain(val)
            if _is_padded(lay) and name not in ("tril", "triu", "expand") and name not in _ELEMENTWISE:
                raise NotBucketable(f"{name} creates a padded dimension")
            layouts[n] = lay
        elif isinstance(val, (list, tuple)):
            layouts[n] = [(_plain(v) if isinstance(v, torch.Tensor) else None) for v in val]
        return
    rule = rules.get(name)
    if rule is None:
        if torch.Tag.pointwise in target.tags or name in _ELEMENTWISE:
            rule = _pointwise
        else:
            raise NotBucketable(f"aten::{name} on a padded dimension")
    rule(n, args, ins, val, layouts, masks)


def _dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _pointwise(n, args, ins, val, layouts, masks) -> None:
    layouts[n] = _broadcast([x for x in ins if x is not None], val)


def _view(n, args, ins, val, layouts, masks) -> None:
    layouts[n] = _reshape(ins[0], [_expr(d) for d in val.shape])


def _permute(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    if n.target.overloadpacket.__name__ == "permute":
        perm = [_dim(d, len(lay)) for d in args[1]]
    elif n.target.overloadpacket.__name__ == "t":
        perm = list(reversed(range(len(lay))))
    else:
        a, b = _dim(args[1], len(lay)), _dim(args[2], len(lay))
        perm = list(range(len(lay)))
        perm[a], perm[b] = perm[b], perm[a]
    layouts[n] = tuple(lay[p] for p in perm)


def _expand(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    rank = val.dim()
    out = []
    for j in range(rank):
        k = j - (rank - len(lay))
        out.append(lay[k] if k >= 0 and lay[k] != () else _normalize([_expr(val.shape[j])]))
    layouts[n] = tuple(out)


def _unsqueeze(n, args, ins, val, layouts, masks) -> None:
    lay = list(ins[0])
    lay.insert(_dim(args[1], len(lay) + 1), ())
    layouts[n] = tuple(lay)


def _squeeze(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    if len(args) > 1:
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        drop = {_dim(d, len(lay)) for d in dims}
    else:
        drop = set(range(len(lay)))
    out = tuple(f for d, f in enumerate(lay) if not (d in drop and f == ()))
    if len(out) != val.dim():
        raise NotBucketable("squeeze of a padded dimension")
    layouts[n] = out


def _slice(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    dim = _dim(args[1] if len(args) > 1 else 0, len(lay))
    start = args[2] if len(args) > 2 else 0
    step = args[4] if len(args) > 4 else 1
    out = list(lay)
    if _is_padded(lay, [dim]) and (len(lay[dim]) != 1 or not isinstance(start, int) or start < 0 or step != 1):
        raise NotBucketable("slice of a padded dimension that does not start at a fixed index")
    out[dim] = _normalize([_expr(val.shape[dim])])
    layouts[n] = tuple(out)


def _select(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    dim = _dim(args[1], len(lay))
    if _is_padded(lay, [dim]):
        raise NotBucketable("select on a padded dimension")
    layouts[n] = lay[:dim] + lay[dim + 1:]


def _split(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    dim = _dim(args[2] if len(args) > 2 else 0, len(lay))
    if _is_padded(lay, [dim]):
        raise NotBucketable("split along a padded dimension")
    outs = []
    for v in val:
        o = list(lay)
        o[dim] = _normalize([_expr(v.shape[dim])])
        outs.append(tuple(o))
    layouts[n] = outs


def _cat(n, args, ins, val, layouts, masks) -> None:
    nodes = [x for x in args[0] if isinstance(x, torch.fx.Node) and not _statically_empty(x)]
    parts = [layouts[x] for x in nodes]
    rank = val.dim()
    if len(parts) == 1 and len(parts[0]) == rank:
        layouts[n] = parts[0]  # cat onto an empty tensor (a KV cache's first update): a copy
        return
    dim = _dim(args[1] if len(args) > 1 else 0, rank)
    if any(_is_padded(p, [dim]) for p in parts if len(p) == rank):
        raise NotBucketable("cat along a padded dimension")
    out = []
    for j in range(rank):
        if j == dim:
            out.append(_normalize([_expr(val.shape[j])]))
            continue
        dims = {p[j] for p in parts if len(p) == rank}
        if len(dims) != 1:
            raise NotBucketable("cat of different layouts")
        out.append(dims.pop())
    layouts[n] = tuple(out)


def _statically_empty(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and any(isinstance(d, int) and d == 0 for d in val.shape)


def _reduction(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    rank = len(lay)
    name = n.target.overloadpacket.__name__
    dims_arg = args[1] if len(args) > 1 else None
    if isinstance(dims_arg, int):
        dims = [_dim(dims_arg, rank)]
    elif isinstance(dims_arg, (list, tuple)) and dims_arg:
        dims = [_dim(d, rank) for d in dims_arg]
    elif isinstance(dims_arg, (list, tuple)) and name in ("any", "all"):
        dims = []  # any/all.dims with dim=() reduce nothing (sum's dim=() reduces everything)
    else:
        dims = list(range(rank))
    keepdim = bool(args[2]) if len(args) > 2 and isinstance(args[2], bool) else bool(n.kwargs.get("keepdim", False))
    if name in ("argmax", "argmin"):
        # The index is a row-major position over the reduced dims' factors: in the padded program
        # each factor's stride is the product of the padded sizes after it, so only the first
        # factor may be padded (argmin of a transposed [3, 3] at bucket [4, 3] gave 6 for 5).
        factors = [f for d in dims for f in lay[d]]
        if any(_padded(f) for f in factors[1:]):
            raise NotBucketable(f"{name}'s flat index over a padded inner dimension")
    if _is_padded(lay, dims):
        identity = _REDUCTIONS[name]
        if identity == "mean":
            masks[n] = Mask([(0, dims)], 0, mean_dims=dims)
        else:
            masks[n] = Mask([(0, dims)], identity)
    if isinstance(val, torch.Tensor) and val.dim() == rank and not keepdim:
        keepdim = True  # the result kept its rank: keepdim given in a form not parsed above
    layouts[n] = tuple(() if d in dims else lay[d] for d in range(rank)) if keepdim else \
        tuple(lay[d] for d in range(rank) if d not in dims)
    if isinstance(val, torch.Tensor) and len(layouts[n]) != val.dim():
        raise NotBucketable(f"unexpected rank after {name}")


def _softmax(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    dim = _dim(args[1], len(lay))
    if _is_padded(lay, [dim]):
        masks[n] = Mask([(0, [dim])], _SOFTMAX[n.target.overloadpacket.__name__])
    layouts[n] = lay


def _cumsum(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    dim = _dim(args[1], len(lay))
    if _is_padded(lay, [dim]) and len(lay[dim]) != 1:
        raise NotBucketable("cumsum along a merged padded dimension")
    layouts[n] = lay  # prefix-causal: valid positions only read valid ones


def _tril(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    if len(lay) < 2 or len(lay[-1]) > 1 or len(lay[-2]) > 1:
        raise NotBucketable("tril/triu over merged dimensions")
    layouts[n] = lay


def _contraction(n, args, ins, val, layouts, masks) -> None:
    name = n.target.overloadpacket.__name__
    off = 1 if name in ("addmm", "baddbmm") else 0
    a, b = ins[off], ins[off + 1]
    if a is None or b is None:
        raise NotBucketable(f"{name} of non-tensors")
    ka, kb = len(a) - 1, len(b) - 2
    if a[ka] != b[kb]:
        raise NotBucketable(f"{name} contracts two different layouts")
    if _is_padded(a, [ka]):
        masks[n] = Mask([(off, [ka]), (off + 1, [kb])], 0)
    if len(a) == 3 and a[0] != b[0] and a[0] != () and b[0] != ():
        raise NotBucketable("bmm batch layouts differ")
    out = (a[:-1] + (b[-1],)) if len(a) == 2 else ((a[0] or b[0]), a[1], b[2])
    if off:
        bias = ins[0]
        if bias is not None and _is_padded(bias):
            out = _broadcast([bias, out], val)
    layouts[n] = tuple(out)


def _layer_norm(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    k = len(args[1])
    if _is_padded(lay, range(len(lay) - k, len(lay))):
        raise NotBucketable("layer_norm over a padded dimension")
    lead = lay[: len(lay) - k]
    layouts[n] = [lay, lead + ((),) * k, lead + ((),) * k]


def _embedding(n, args, ins, val, layouts, masks) -> None:
    if ins[0] is not None and _is_padded(ins[0]):
        raise NotBucketable("embedding table with a padded dimension")
    layouts[n] = ins[1] + (_normalize([_expr(val.shape[-1])]),)


def _index_select(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    dim = _dim(args[1], len(lay))
    if _is_padded(lay, [dim]):
        raise NotBucketable("index_select along a padded dimension")
    out = list(lay)
    out[dim] = ins[2][0] if ins[2] else ()
    layouts[n] = tuple(out)


_RULES: dict[str, Callable] = {
    **dict.fromkeys(_VIEWS, _view),
    "permute": _permute, "transpose": _permute, "t": _permute,
    "expand": _expand, "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "slice": _slice, "select": _select, "split": _split, "split_with_sizes": _split, "cat": _cat,
    **dict.fromkeys(_REDUCTIONS, _reduction),
    **dict.fromkeys(_SOFTMAX, _softmax),
    "cumsum": _cumsum, "tril": _tril, "triu": _tril,
    **dict.fromkeys(_CONTRACTIONS, _contraction),
    "native_layer_norm": _layer_norm, "embedding": _embedding, "index_select": _index_select,
}


# -- rules of eager calls (engine/eager_buckets.py) ----------------------------------------
# Each sees one op of an eager call whose padded dims are outermost. Masks whose identity is a
# tuple are not constants: ("arg", k) fills padding with the op's argument k as lowered (a
# runtime scalar, or an ignore_index), ("wrap", size) adds the actual ``size`` to negative
# indices (an index into a padded dim counts from its actual end, not the bucket's).
def _sort(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    first = 2 if n.target is aten.sort.stable else 1  # sort.stable's (self, *, stable, dim, descending)
    dim = _dim(args[first] if len(args) > first else -1, len(lay))
    descending = bool(args[first + 1]) if len(args) > first + 1 else False
    if _is_padded(lay, [dim]):
        if len(lay[dim]) != 1:
            raise NotBucketable("sort along a merged padded dimension")
        # padding sorts after every valid value, ties included: the sort is stable (lowering/sort.py)
        # and padding comes last, so it stays behind a valid NaN (ascending) or -inf (descending)
        masks[n] = Mask([(0, [dim])], "-inf" if descending else "nan")
    layouts[n] = [lay, lay]


def _index(n, args, ins, val, layouts, masks) -> None:
    lay = ins[0]
    indices = args[1]
    if len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
        raise NotBucketable("index with other than one index tensor")
    index = indices[0]
    if index.meta["val"].dtype not in (torch.int64, torch.int32):
        raise NotBucketable("index by a mask")
    if _is_padded(lay, range(1, len(lay))) or len(lay[0]) > 1:
        raise NotBucketable("index of a tensor padded past its first dim")
    if _is_padded(lay, [0]):
        masks[n] = Mask([((1, 0), [])], ("wrap", lay[0][0]))
    layouts[n] = tuple(layouts[index]) + tuple(lay[1:])


def _nll_loss(n, args, ins, val, layouts, masks) -> None:
    backward = n.target.overloadpacket.__name__ == "nll_loss_backward"
    off = int(backward)  # nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, ...)
    lay, target, weight = ins[off], ins[off + 1], ins[off + 2]
    if len(lay) != 2 or _is_padded(lay, [1]) or target != (lay[0],) or (weight is not None and _is_padded(weight)):
        raise NotBucketable("nll_loss whose target is not padded as its batch")
    if backward and ins[0] is not None and _is_padded(ins[0]) and ins[0] != target:
        raise NotBucketable("nll_loss_backward's grad_output padded otherwise")
    # padded targets are ignore_index: they add nothing to the loss, its weight or the gradient
    masks[n] = Mask([(off + 1, [0])], ("arg", off + 4))
    if backward:
        layouts[n] = lay
    else:
        layouts[n] = [(lay[0],) if args[3] == 0 else (), ()]


def _softmax_backward(n, args, ins, val, layouts, masks) -> None:
    grad, out = ins[0], ins[1]
    if grad != out:
        raise NotBucketable("softmax backward of differently padded operands")
    dim = _dim(args[2], len(grad))
    if _is_padded(grad, [dim]):
        if len(grad[dim]) != 1:
            raise NotBucketable("softmax backward along a merged padded dimension")
        masks[n] = Mask([(0, [dim]), (1, [dim])], 0)  # the sum over dim sees zeros for padding
    layouts[n] = grad


def _index_bounds_flag(n, args, ins, val, layouts, masks) -> None:
    lay = ins[1]
    if (ins[0] is not None and _is_padded(ins[0])) or _is_padded(lay, range(1, len(lay))) or len(lay[0]) > 1:
        raise NotBucketable("index check of an index padded past its first dim")
    if args[1].meta["val"].dtype != torch.int64:
        raise NotBucketable("index check of a non-int64 index")
    # padding passes the check: a divisor 1, an index the low bound (the reported position of
    # a bad value is unchanged, as padding follows every valid element)
    nonzero = bool(args[6]) if len(args) > 6 else False
    masks[n] = Mask([(1, [0])], 1 if nonzero else ("arg", 2))
    layouts[n] = _plain(val)


EAGER_RULES: dict[str, Callable] = {
    "sort": _sort, "index": _index, "nll_loss_forward": _nll_loss, "nll_loss_backward": _nll_loss,
    "_log_softmax_backward_data": _softmax_backward, "_softmax_backward_data": _softmax_backward,
    "index_bounds_flag": _index_bounds_flag,
}


# -- masking while lowering ------------------------------------------------------------
class MaskHook:
    """Applies a Plan's masks while a graph is lowered for one bucket."""

    def __init__(self, plan: Plan, b: Builder, sizes: Value, buckets: dict[sympy.Symbol, int]) -> None:
        self.plan = plan
        self.b = b
        self.sizes = sizes
        self.buckets = buckets
        self._actual: dict[sympy.Expr, Value] = {}

    def __call__(self, node: torch.fx.Node, args: list, kwargs: dict) -> tuple[list, dict, Callable | None]:
        mask = self.plan.masks.get(node)
        if mask is None:
            return args, kwargs, None
        args = list(args)
        if isinstance(mask.identity, tuple):
            return self._special(node, args, mask), kwargs, None
        lay_in = None
        for pos, dims in mask.operands:
            x = args[pos]
            src = node.args[pos]
            lay = self.plan.layouts[src]
            lay_in = lay_in or lay
            args[pos] = self._apply(x, lay, dims, mask.identity)
        post = None
        if mask.mean_dims:
            padded = math.prod(self._padded_size(lay_in[d]) for d in mask.mean_dims)
            count = self._count(lay_in, mask.mean_dims)

            def post(r: Value, padded: int = padded, count: Value = count) -> Value:
                acc = r.dtype if r.dtype in (torch.float32, torch.float64) else torch.float32
                scale = self.b.div(self.b.constant(padded, acc), self.b.convert(count, acc))
                out = self.b.mul(self.b.convert(r, acc), self.b.broadcast_to(scale, r.shape))
                return self.b.convert(out, r.dtype)
        return args, kwargs, post

    def _special(self, node: torch.fx.Node, args: list, mask: Mask) -> list:
        """The masks of EAGER_RULES whose identity is not a constant (see there)."""
        kind, what = mask.identity
        for pos, dims in mask.operands:
            if isinstance(pos, tuple):  # an element of a list argument
                outer, inner = pos
                items = list(args[outer])
                items[inner] = self._special_one(items[inner], node.args[outer][inner], kind, what, args)
                args[outer] = items
            else:
                args[pos] = self._special_one(args[pos], node.args[pos], kind, what, args)
        return args

    def _special_one(self, x: Value, src: torch.fx.Node, kind: str, what: Any, args: list) -> Value:
        b = self.b
        if kind == "wrap":
            size = b.broadcast_to(b.convert(self._actual_expr(what), x.dtype), x.shape)
            negative = b.compare(x, b.constant(0, x.dtype, x.shape), "LT")
            return b.select(negative, b.add(x, size), x)
        fill = args[what]
        if isinstance(fill, Value):
            fill = b.broadcast_to(b.convert(b.reshape(fill, ()) if fill.shape else fill, x.dtype), x.shape)
        else:
            fill = b.constant(fill, x.dtype, x.shape)
        lay = self.plan.layouts[src]
        valid = None
        for d in range(len(lay)):
            if _is_padded(lay, [d]):
                m = b.broadcast_in_dim(self._dim_mask(lay[d]), x.shape, [d])
                valid = m if valid is None else b.binary("and", valid, m)
        return x if valid is None else b.select(valid, x, fill)

    # sizes
    def _padded_size(self, factors: Factors) -> int:
        return int(math.prod(int(f.subs(self.buckets)) for f in factors)) if factors else 1

    def _actual_expr(self, e: sympy.Expr) -> Value:
        v = self._actual.get(e)
        if v is not None:
            return v
        b = self.b
        if isinstance(e, sympy.Symbol):
            k = self.plan.symbols.index(e)
            v = b.reshape(b.slice(self.sizes, [k], [k + 1]), ())
        elif e.is_Integer:
            v = b.constant(int(e), torch.int64)
        elif isinstance(e, sympy.Add):
            v = self._actual_expr(e.args[0])
            for t in e.args[1:]:
                v = b.add(v, self._actual_expr(t))
        elif isinstance(e, sympy.Mul):
            v = self._actual_expr(e.args[0])
            for t in e.args[1:]:
                v = b.mul(v, self._actual_expr(t))
        else:
            raise NotBucketable(f"size expression {e}")
        self._actual[e] = v
        return v

    def _count(self, lay: Layout, dims: list[int]) -> Value:
        count = self.b.constant(1, torch.int64)
        for d in dims:
            for f in lay[d]:
                count = self.b.mul(count, self._actual_expr(f))
        return count

    def _dim_mask(self, factors: Factors) -> Value:
        """Valid positions along one dimension (made of ``factors``), as a 1-D bool."""
        b = self.b
        sizes = [int(f.subs(self.buckets)) for f in factors]
        valid = None
        for i, f in enumerate(factors):
            if not _padded(f):
                continue
            lt = b.compare(b.iota(sizes, i, torch.int64), b.broadcast_to(self._actual_expr(f), sizes), "LT")
            valid = lt if valid is None else b.binary("and", valid, lt)
        return b.reshape(valid, (math.prod(sizes),))

    def valid_index(self, index: Value, node: torch.fx.Node, bound: Any) -> Value | None:
        """``index`` (``node``'s value at bucket sizes) with its padding set to a valid index,
        for an index check (``bound``: a lowering.index_bounds.Bound). None where the check
        cannot be made at bucket sizes: a range that depends on a symbolic size (the message
        names that size), or a message naming a position, which padding inside shifts."""
        lay = self.plan.layouts.get(node)
        if lay is None or not all(isinstance(v, int) for v in (bound.low, bound.high)) or bound.low >= bound.high:
            return None
        if not _is_padded(lay):
            return index
        if "{position}" in bound.message:
            return None
        return self._apply(index, lay, list(range(len(lay))), bound.low)

    def _apply(self, x: Value, lay: Layout, dims: list[int], identity: Any) -> Value:
        b = self.b
        # A transposed operand (``g.t() @ h``, a weight gradient) is masked before its
        # transpose, which then stays foldable into a product's dimension numbers
        # (matmul._fold_transpose): behind the select XLA's CPU runtime met a transposed bf16
        # operand of a dot it cannot run ("Unsupported element type for DotThunk").
        src = b.transpose_source(x)
        target, perm = (x, list(range(x.rank))) if src is None else src
        mask = None
        for d in dims:
            if not _is_padded(lay, [d]):
                continue
            m = b.broadcast_in_dim(self._dim_mask(lay[d]), target.shape, [perm[d]])
            mask = m if mask is None else b.binary("and", mask, m)
        if mask is None:
            return x
        masked = b.select(mask, target, b.constant(_identity_value(identity, x.dtype), x.dtype, target.shape))
        return masked if src is None else b.transpose(masked, perm)


    def compact(self, v: Value, layout: Layout) -> Value:
        """The actual-size elements of the padded ``v``, packed contiguously at the front of a
        flat bucket-sized array (so the output can be a contiguous tensor). Works factor by
        factor, so a dimension merged from padded ones (``(B*T, C)``) unpacks too."""
        b = self.b
        n = v.numel
        factors = [f for dim in layout for f in dim]
        padded = [int(f.subs(self.buckets)) for f in factors]
        padded_strides = [math.prod(padded[k + 1:]) for k in range(len(padded))]
        rem = b.iota((n,), 0, torch.int64)
        index = b.constant(0, torch.int64, (n,))
        for k in reversed(range(len(factors))):
            size = b.broadcast_to(self._actual_expr(factors[k]), (n,))
            coord = b.binary("remainder", rem, size)
            rem = b.div(rem, size)
            index = b.add(index, b.mul(coord, b.constant(padded_strides[k], torch.int64, (n,))))
        return gather_flat(b, b.reshape(v, (n,)), index)


def compacted_outputs(plan: Plan) -> set[int]:
    """Outputs whose actual elements are not already a contiguous prefix of the padded array
    (a padded dimension other than the outermost non-unit one)."""
    out = set()
    for k, lay in enumerate(plan.output_layouts):
        if lay is None:
            continue
        dims = [d for d, f in enumerate(lay) if f != ()]
        if not _is_box(lay) or any(_is_padded(lay, [d]) for d in dims[1:]):
            out.add(k)
    return out


def _identity_value(identity: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(identity) if not isinstance(identity, str) else identity in ("inf", "nan")
    if identity == "nan":  # what sorts last ascending
        if dtype.is_floating_point:
            return math.nan
        return torch.iinfo(dtype).max
    if isinstance(identity, str):
        sign = -1 if identity.startswith("-") else 1
        if dtype.is_floating_point:
            return sign * math.inf
        info = torch.iinfo(dtype)
        return info.min if sign < 0 else info.max
    return identity


# -- binding inputs and outputs ----------------------------------------------------------
def padded_shape(exprs: Sequence[sympy.Expr], buckets: dict) -> tuple[int, ...]:
    return tuple(int(e.subs(buckets)) for e in exprs)


def pad_input(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t`` seen as its ``shape``-sized padded array: free when ``t`` is a prefix box of one
    (an output of a bucketed program), else a host round trip (inputs from outside)."""
    if tuple(t.shape) == shape:
        return t
    strides = contiguous_strides(shape)
    needed = t.storage_offset() + math.prod(shape)
    if tuple(t.stride()) == strides and t.untyped_storage().nbytes() >= needed * t.element_size():
        return t.as_strided(shape, strides, t.storage_offset())
    host = t.detach().cpu()
    padded = torch.zeros(shape, dtype=t.dtype)
    padded[tuple(slice(0, s) for s in t.shape)] = host
    return padded.to(t.device)


def trim_output(t: torch.Tensor, shape: tuple[int, ...], compacted: bool) -> torch.Tensor:
    """The actual-size tensor of a padded output: a prefix box view, or (``compacted``) the
    contiguous front of the storage."""
    if tuple(t.shape) == shape:
        return t
    if compacted:
        return t.as_strided(shape, contiguous_strides(shape), 0)
    return t.as_strided(shape, t.stride(), t.storage_offset())
