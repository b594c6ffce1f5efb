"""Ops without a hand-written lowering: trace PyTorch's own decomposition.

The decomposition is traced with ``make_fx`` on meta tensors into a graph of
ATen ops, and every node is lowered into the *same* builder, so one ATen call
still becomes one executable. ``lower_graph`` is also the entry point for
whole graphs (torch.compile, fused eager).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._decomp import decomposition_table
from torch.fx.experimental.proxy_tensor import make_fx

from . import registry
from .builder import Builder, Value

_aten = torch.ops.aten


# make_fx keeps its tracing state in module globals (torch.fx's current patcher): two threads
# lowering ops at once (a threaded conformance sweep, a user's threads sharing the device) broke
# each other's traces ("CURRENT_PATCHER is None in finally block"). Traces are serialized: ours
# here, and AOTAutograd's for the "tpu" compile backend (torchtpu.compile), which uses make_fx too.
tracing_lock = threading.RLock()


@functools.cache
def _table() -> dict:
    return dict(decomposition_table)


def _inner_table() -> dict:
    """Decompositions applied *inside* a traced decomposition: only for ops without a lowering.

    Decomposing an op that has a lowering would only lose it (PyTorch's refs turn
    ``aten.mul`` into ``prims.mul``, and so on), so those ops stay whole. Not
    cached: lowerings may be registered after the first trace.
    """
    return {op: fn for op, fn in _table().items()
            if not isinstance(op, torch._ops.OpOverload) or registry.lookup(op) is None}


def has_decomposition(op: torch._ops.OpOverload) -> bool:
    return op in _table()


def _meta_like(v: Value) -> torch.Tensor:
    return torch.empty(v.shape, dtype=v.dtype, device="meta")


def lower_by_decomposition(ctx: registry.LoweringContext, *args: Any) -> Any:
    op = ctx.op
    decomp = _table().get(op)
    if decomp is None:
        raise NotImplementedError(f"torchtpu: no lowering or decomposition for aten::{op.__name__}")
    return lower_composite(ctx, decomp, *args)


def lower_composite(ctx: registry.LoweringContext, composite: Any, *args: Any) -> Any:
    """Lower ``ctx.op`` by tracing ``composite``, a function of ATen ops with the op's
    signature, on meta tensors, and lowering each traced op into the same builder."""
    op = ctx.op
    leaves: list[Value] = []

    def collect(a: Any) -> Any:
        if isinstance(a, Value):
            leaves.append(a)
            return ("__leaf__", len(leaves) - 1)
        if isinstance(a, (list, tuple)):
            return type(a)(collect(x) for x in a)
        return a

    template = [collect(a) for a in args]

    def rebuild(t: Any, tensors: Sequence[torch.Tensor]) -> Any:
        if isinstance(t, tuple) and len(t) == 2 and t[0] == "__leaf__":
            return tensors[t[1]]
        if isinstance(t, (list, tuple)):
            return type(t)(rebuild(x, tensors) for x in t)
        return t

    schema_args = op._schema.arguments

    def fn(*tensors: torch.Tensor) -> Any:
        pos, kw = [], {}
        for a, t in zip(schema_args, template):
            v = rebuild(t, tensors)
            if isinstance(v, torch.device):
                v = torch.device("meta")
            if a.kwarg_only:
                kw[a.name] = v
            else:
                pos.append(v)
        return composite(*pos, **kw)

    with tracing_lock:
        gm = make_fx(fn, decomposition_table=_inner_table(), tracing_mode="real")(*[_meta_like(v) for v in leaves])
    # (the op's own checks ran on the user's call: its decomposition's inner ops take arguments CPU's
    # kernel never checks, e.g. index_fill of an empty x becomes an index into a size-0 dim)
    outs = lower_graph(ctx.b, gm.graph, leaves, ctx.precision, ctx.extras, check=False)
    if isinstance(outs, (list, tuple)) and len(outs) == 1 and len(ctx.out) == 1:
        return outs[0]
    return outs


def _has_value(xs: Any) -> bool:
    for x in xs:
        if isinstance(x, Value) or (isinstance(x, (list, tuple)) and _has_value(x)):
            return True
    return False


def _as_meta(v: Any) -> Any:
    if isinstance(v, Value):
        return _meta_like(v)
    if isinstance(v, (list, tuple)):
        return [_as_meta(x) for x in v]
    return v


def _out_meta(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return registry.OutMeta(tuple(val.shape), val.dtype)
    if isinstance(val, (list, tuple)):
        return [_out_meta(v) for v in val]
    return None


_with_effects = torch.ops.higher_order.with_effects


def is_linalg_check(node: torch.fx.Node) -> bool:
    """AOTAutograd's ``with_effects(token, _linalg_check_errors, info, api_name, is_matrix=...)``:
    linalg.inv/cholesky/lu_factor... raising on a nonzero LAPACK info."""
    return (node.op == "call_function" and node.target is _with_effects
            and node.args[1] is _aten._linalg_check_errors.default)


def lower_graph(b: Builder, graph: torch.fx.Graph, inputs: Sequence[Any], precision: str,
                extras: dict | None = None, mutations: dict | None = None, vals: dict | None = None,
                hook: Any = None, env: dict | None = None, check: bool = True) -> Any:
    """Lower an FX graph of ATen ops; ``inputs`` bind the placeholders in order.

    ``check``: run each op's checks of CPU's kernel on its arguments (``check_arguments``): a user's
    graph (torch.compile), not an op's decomposition.

    ``vals`` overrides the nodes' example values (``node.meta["val"]``) with
    concrete ones, for graphs traced with symbolic shapes.

    ``copy_`` into a placeholder (AOTAutograd's in-graph input mutation) is
    recorded in ``mutations`` (placeholder position -> new value) when given.

    ``hook(node, args, kwargs) -> (args, kwargs, post)`` may rewrite an ATen
    node's lowered arguments and its result (bucketed graphs mask padding).

    ``env``, when given, is filled with every node's lowered value.
    """
    positions = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    env = {} if env is None else env
    it = iter(inputs)
    result = None

    def load(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(load(x) for x in a)
        return a

    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "call_function":
            target = node.target
            args = [load(a) for a in node.args]
            kwargs = {k: load(v) for k, v in node.kwargs.items()}
            if target is _getitem:
                env[node] = args[0][args[1]]
                continue
            if target is _aten.copy_.default and mutations is not None and node.args[0] in positions:
                dst = node.args[0]
                val = dst.meta.get("val")
                src = args[1]
                if isinstance(src, Value) and isinstance(val, torch.Tensor):
                    src = b.convert(src, val.dtype)
                    if src.shape != tuple(val.shape):
                        src = b.broadcast_to(src, tuple(val.shape))
                mutations[positions[dst]] = src
                env[dst] = src
                env[node] = src
                continue
            if is_linalg_check(node):
                # The check itself is folded into the index-check flag (engine/graph_runner.py);
                # the effect token passes through.
                env[node] = (args[0],)
                continue
            if isinstance(target, type) and issubclass(target, tuple):
                # A decomposition's named result (e.g. var_mean's), built in the graph.
                env[node] = target(*args, **kwargs)
                continue
            val = vals[node] if vals is not None and node in vals else node.meta.get("val")
            if isinstance(target, torch._ops.HigherOrderOperator):
                lower_higher_order = registry.higher_order(target)
                if lower_higher_order is None:
                    raise NotImplementedError(f"torchtpu: cannot lower graph node {target} (the higher-order op "
                                              f"{target.__name__} has no lowering yet)")
                env[node] = lower_higher_order(b, args, val, precision, extras, vals)
                continue
            if (isinstance(target, torch._ops.OpOverload) and target.overloadpacket.__name__.startswith("sym_")
                    and isinstance(val, (int, float, bool))):
                # a size, stride or offset of a traced tensor (aten.sym_size.int ...: a graph traced with
                # symbolic shapes reads them off tensors): its concrete value for these inputs
                env[node] = val
                continue
            if not isinstance(target, torch._ops.OpOverload):
                if _has_value(args) or _has_value(list(kwargs.values())):
                    raise NotImplementedError(f"torchtpu: cannot lower graph node {target}")
                env[node] = target(*args, **kwargs)  # arithmetic on sizes (symbolic shapes)
                continue
            post = None
            with b.located(node_location(node)):
                if hook is not None:
                    args, kwargs, post = hook(node, args, kwargs)
                if check:
                    check_arguments(target, args, kwargs)
                env[node] = lower_call(b, target, args, kwargs, val, precision, extras)
                if post is not None:
                    env[node] = post(env[node])
        elif node.op == "output":
            result = load(node.args[0])
        elif node.op == "get_attr":
            env[node] = _graph_constant(b, graph, node)
    return result


_getitem = __import__("operator").getitem


def node_location(node: torch.fx.Node) -> str:
    """A graph node's location (Builder.located): the module that called it, by its attribute path
    (``blocks.3.attn``; a backward node by its forward's), then its op, ``aten.mm.default``."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    module = ""
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else str(path)
        module = _module_path(path)
    op = str(node.target)
    return f"{module}/{op}" if module else op


def _module_path(qualified: str) -> str:
    """Dynamo's qualified name of a module, ``L['self'].blocks[3].attn``, as its attribute path
    ``blocks.3.attn`` (a mangled ``L__self___blocks_3_attn`` loses only its prefix)."""
    text = re.sub(r"^L\['self'\]\.?|^L__self___?", "", qualified)
    return re.sub(r"\[(\d+)\]", r".\1", text).strip(".")


# Tensor constants a graph holds as attributes (small tensors a model builds in its
# forward, lifted by AOTAutograd) are embedded in the program text up to this size.
_MAX_EMBEDDED_CONSTANT = 1 << 16


def _graph_constant(b: Builder, graph: torch.fx.Graph, node: torch.fx.Node) -> Any:
    value = graph.owning_module
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_complex() or value.numel() > _MAX_EMBEDDED_CONSTANT:
        raise NotImplementedError(
            f"torchtpu: graph constant {node.target} ({value.dtype}, {value.numel()} elements) is not supported")
    host = value.detach().cpu()
    if host.is_floating_point():
        host = host.double() if host.dtype == torch.float64 else host.float()  # exact for bf16/f16
    return b.dense_constant(host.numpy(), value.dtype)


def check_arguments(op: torch._ops.OpOverload, args: list, kwargs: dict) -> None:
    """The op's checks of CPU's kernel that PyTorch's meta kernels lack (registry.register_meta_check:
    dims, dtypes) and its per-call argument checks (register_argument_check: a fill value that overflows
    the dtype, a distribution's parameters, ...), on the graph's scalars and its tensors' metadata, when
    the graph is lowered (its first call). Eager runs them per op key and per call; compiled graphs ran
    neither (regression: under torch.compile `full((2,), 2**31, dtype=int32)` and `where(int32 > 1, x,
    2**31)` wrapped where CPU raises, `softmax(x, 3)` of a 3-d x gave a result, `F.pad(uint8,
    value=inf)` raised OverflowError)."""
    from ..engine.opplan import normalize_args, plan_for

    plan = plan_for(op)
    meta_check = registry.meta_check(plan.functional)
    if plan.argument_check is None and meta_check is None:
        return
    values = normalize_args(plan, tuple(args), kwargs)
    func_args = [_as_meta(values[i]) for i in plan.func_arg_positions]
    try:
        if meta_check is not None:
            meta_check(*func_args)
        if plan.argument_check is not None:
            plan.argument_check(*func_args)
    except NotImplementedError as e:
        # CPU's "not implemented for 'Int'": the user's error, where a NotImplementedError from a
        # lowering is torchtpu's gap (the graph then runs op by op: graph_runner)
        e.refused_argument = True  # type: ignore[attr-defined]
        raise


def lower_call(b: Builder, op: torch._ops.OpOverload, args: list, kwargs: dict, val: Any, precision: str,
               extras: dict | None = None) -> Any:
    """Lower one ATen call whose tensor arguments are already Values."""
    from ..engine.opplan import normalize_args, plan_for

    if not _has_value(args) and not _has_value(list(kwargs.values())) and not isinstance(val, torch.Tensor):
        # Scalar arithmetic on Python numbers (e.g. aten.eq.default on ints).
        return op(*args, **kwargs)
    plan = plan_for(op)
    if extras and "seed_counter" in extras and plan.random:
        # A graph has one seed input; every random node gets its own stream.
        extras = dict(extras)
        extras["seed_counter"][0] += 1
        bump = b.constant(extras["seed_counter"][0] * 0x9E3779B97F4A7C15 % (1 << 64), torch.uint64, (2,))
        extras["seed"] = b.add(extras["seed"], bump)
    if plan.mutated:
        raise NotImplementedError(f"torchtpu: in-place aten::{op.__name__} inside a decomposition")
    values = normalize_args(plan, tuple(args), kwargs)
    metas = _out_meta(val)
    out = metas if isinstance(metas, list) else [metas]
    ctx = registry.LoweringContext(b, op, out, precision=precision, extras=dict(extras or {}),
                                   metas=[_as_meta(v) for v in values])
    fn = plan.lowering or lower_by_decomposition
    res = fn(ctx, *values)
    if isinstance(val, torch.Tensor) and isinstance(res, Value):
        if res.dtype != val.dtype:
            res = b.convert(res, val.dtype)
        if res.shape != tuple(val.shape):
            res = b.broadcast_to(res, tuple(val.shape)) if res.numel != val.numel() else b.reshape(res, val.shape)
    return res
