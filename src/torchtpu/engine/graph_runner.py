"""Run a whole FX graph of ATen ops as one XLA executable.

Used by ``torch.compile(backend="tpu")`` for AOTAutograd's forward and
backward graphs. Inputs are bound exactly like an eager op's (whole storages
plus views cut out inside the program), so the same compiled graph serves
inputs with any storage layout; a program variant is compiled per distinct
input layout and cached.
"""

from __future__ import annotations

import operator
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy
import torch
import torch.fx

from .. import _C
from .._config import config
from ..lowering import decompose
from ..lowering.builder import Builder, Value
from ..lowering.index_bounds import fold_bound, linalg_check_bounds
from ..lowering.views import (
    ViewSpec,
    contiguous_strides,
    dense_to_storage,
    is_dense_permutation,
    read_view,
)
from . import bucketing, compile_cache, executor, graph_node, index_checks
from . import precision as precision_mod
from .opplan import normalize_args, plan_for


@dataclass
class OutSpec:
    # "tensor" | "input" (an input returned as is) | "input_view" (a view of an input: value
    # holds its shape, stride and storage offset from the input's, ``view_spec``) | "output_view"
    # (the same, of output ``index``) | "value" (a non-tensor constant)
    kind: str
    index: int = 0
    value: Any = None


class ResultPlan:
    """A graph's results from its program's outputs and its arguments (views cut from either),
    for one list of specs: planned once, called at every launch.

    A training step's forward and backward graphs return ~60 results each: walking their specs
    one by one (attribute reads and string compares per result) cost ~1 us a result on the host.
    Here the results are picked in one ``itemgetter`` call from the arguments, the outputs and
    the constants laid end to end, and only the views are cut one by one, in spec order, from
    what was picked at their position (the viewed input or output).
    """

    __slots__ = ("_consts", "_get", "_sizes", "_specs", "_views")

    def __init__(self, specs: list[OutSpec]) -> None:
        self._specs = specs
        self._consts = tuple(spec.value for spec in specs if spec.kind == "value")
        self._sizes = (-1, -1)  # (arguments, outputs) the plan was made for
        self._get: Any = None
        self._views: tuple = ()

    def _plan(self, n_args: int, n_outs: int) -> None:
        positions: list[int] = []
        views = []
        consts = 0
        for i, spec in enumerate(self._specs):
            kind = spec.kind
            if kind in ("tensor", "output_view"):
                positions.append(n_args + spec.index)
            elif kind in ("input", "input_view"):
                positions.append(spec.index)
            else:
                positions.append(n_args + n_outs + consts)
                consts += 1
            if kind in ("input_view", "output_view"):
                views.append((i, *spec.value))
        # itemgetter of one position returns the item, not a 1-tuple
        get = operator.itemgetter(*positions) if positions else (lambda pool: ())
        self._get = get if len(positions) != 1 else (lambda pool, p=positions[0]: (pool[p],))
        self._views = tuple(views)
        self._sizes = (n_args, n_outs)

    def __call__(self, outs: list[Any], args: list[Any]) -> list[Any]:
        if (len(args), len(outs)) != self._sizes:
            self._plan(len(args), len(outs))
        results = list(self._get([*args, *outs, *self._consts]))
        for i, shape, stride, offset in self._views:
            base = results[i]
            results[i] = base.as_strided(shape, stride, base.storage_offset() + offset)
        return results


def view_spec(val: torch.Tensor, base: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """How an output handed out as a view of ``base`` (an input, or another output) is cut from it:
    its shape, stride and storage offset from ``base``'s. Relative, because a graph runs again on
    inputs at other offsets of their storages (Dynamo's guards do not check offsets): a weight that
    is a view of a flat parameter storage, traced at one offset, gave its backward the transpose of
    the storage's first elements when called at another."""
    return tuple(val.shape), tuple(val.stride()), val.storage_offset() - base.storage_offset()


def output_layout(val: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A graph output's buffer shape and stride: the example value's where it is a dense
    permutation (a transposed result), else contiguous."""
    shape, stride = tuple(int(d) for d in val.shape), tuple(int(d) for d in val.stride())
    return shape, stride if is_dense_permutation(shape, stride) else contiguous_strides(shape)


def output_value(b: Builder, r: Value, val: torch.Tensor) -> Value:
    """A lowered graph output as its example value's dtype and shape."""
    v = b.convert(r, val.dtype)
    shape = tuple(int(d) for d in val.shape)
    if v.shape != shape:
        v = b.reshape(v, shape) if v.numel == val.numel() else b.broadcast_to(v, shape)
    return v


class _NotLowerable(Exception):
    """A graph node has no lowering for these inputs (raised from the lowering's NotImplementedError)."""


class GraphProgram:
    """A lowered graph: call it with the graph's runtime inputs."""

    def __init__(self, gm: torch.fx.GraphModule, name: str = "graph") -> None:
        self.gm = gm
        self.graph = gm.graph
        self.name = name
        self.placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        out_node = next(n for n in self.graph.nodes if n.op == "output")
        outs = out_node.args[0]
        self.out_is_tuple = isinstance(outs, (list, tuple))
        self.out_nodes = list(outs) if self.out_is_tuple else [outs]
        # subgraphs too (torch.cond's branches, a while_loop's body): they draw from the graph's seed
        self.random = any(_is_random(n) for m in gm.modules() if isinstance(m, torch.fx.GraphModule)
                          for n in m.graph.nodes)
        self.cache: dict[_C.OpKey, executor.Entry] = {}
        self.compiles = 0
        # Traced with symbolic shapes (dynamic=True / mark_dynamic): each program
        # variant is specialized to the concrete sizes of its inputs.
        self.symbolic = any(_is_symbolic(n.meta.get("val")) for n in self.graph.nodes)
        self._plan: bucketing.Plan | None | bool = False  # False: not analyzed yet
        self.not_bucketable = ""
        # Indexing nodes whose index ranges are checked on the device (as eager ops' are): the
        # program then takes the device's index-check flag as one more input and returns it with
        # these checks folded in (see _fold_bounds for graphs with symbolic shapes).
        self.bounded = [n for n in self.graph.nodes if _index_bounds_of(n) is not None]
        # The graph module run op by op, once a node could not be lowered (see __call__). Through
        # torch.compiler.disable: Dynamo's frame hook is live while a compiled function runs, and
        # would trace the module's code, and our kernels under it, as a new frame.
        self._eager: Any = None
        # The graph as one recordable op, for DeferAndFuse (engine/graph_node.py); None where it
        # must run as its own program.
        self._node: Any = False  # False: not built yet

    def __call__(self, args: list[Any]) -> Any:
        if self._eager is not None:
            return self._eager(*args)
        if graph_node.may_record(self.name) and graph_node.takes(args):
            if self._node is False:
                self._node = graph_node.inlined(self)
            # (Strict mode records a training step from its first graph: step_recording.py)
            if self._node is not None and graph_node.record(self.name):
                return self._node(args)
        try:
            if self.symbolic and bucketing.enabled():
                plan = self._bucket_plan()
                if plan is not None:
                    return self._call_bucketed(plan, args)
            return self._run(args)
        except _NotLowerable as e:
            # Nothing ran: lowering comes before any launch. The graph's ops run one by one in the
            # current eager mode from now on, where each has its own kernel (a boolean-mask
            # index_put whose values depend on the mask's count, for instance).
            self._eager = torch.compiler.disable(self.gm)
            warnings.warn(f"torchtpu: a compiled {self.name} graph runs op by op in the current eager mode: "
                          f"{e.__cause__}", stacklevel=2)
            return self._eager(*args)

    def _bucket_plan(self) -> bucketing.Plan | None:
        if self._plan is False:
            try:
                # An inference graph's outputs go to the user: packed into contiguous tensors,
                # as eager returns. Training graphs keep prefix-box views, which the next
                # bucketed graph (the backward) reads without a copy.
                self._plan = bucketing.analyze(self.gm, compact_outputs=self.name == "inference")
            except bucketing.NotBucketable as e:
                self._plan = None
                self.not_bucketable = str(e)
        return self._plan

    def _call_bucketed(self, plan: bucketing.Plan, args: list[Any]) -> Any:
        """Run at bucket sizes: pad the inputs, pass the actual sizes, view the outputs back."""
        actual = {s: int(args[p]) for s, p in zip(plan.symbols, plan.symbol_positions)}
        buckets = {s: bucketing.bucket_for(actual[s], hi) for s, hi in zip(plan.symbols, plan.upper)}
        padded_args = list(args)
        for s, p in zip(plan.symbols, plan.symbol_positions):
            padded_args[p] = buckets[s]
        for i, exprs in plan.padded_inputs:
            if isinstance(args[i], torch.Tensor):
                padded_args[i] = bucketing.pad_input(args[i], bucketing.padded_shape(exprs, buckets))
        sizes = np.array([actual[s] for s in plan.symbols], dtype=np.int64)
        results = self._run(padded_args, (plan, sizes))
        out = list(results)
        for k, spec in enumerate(plan.outputs):
            if isinstance(spec, tuple) and isinstance(out[k], torch.Tensor):
                out[k] = bucketing.trim_output(out[k], bucketing.padded_shape(spec, actual),
                                                k in plan.compacted)
            elif isinstance(spec, sympy.Expr):
                out[k] = int(spec.subs(actual))
        return out

    def _run(self, args: list[Any], bucket: tuple | None = None) -> Any:
        col = executor._Collector()
        flag_device = _first_tpu_device(args) if self.bounded and config.index_checks else None
        inputs = args if flag_device is None else [*args, index_checks.current_flag(flag_device)]
        specs, _ = _C._walk_all(col, inputs, [False] * len(inputs))
        if bucket is not None:
            specs.append(("B", len(col.inputs)))  # the actual sizes: a runtime input
            col.inputs.append(("host", bucket[1]))
        if self.random:
            specs.append(col.generator(None))
        if col.device is None:
            col.device = 0
        skeys = tuple(col.skeys)
        key = _C._op_key((precision_mod.current(), tuple(specs), skeys))  # exact: 2 != 2.0, 0.0 != -0.0
        entry = self.cache.get(key)
        if entry is None:
            try:
                entry = self._compile(specs, skeys, col, key, bucket[0] if bucket is not None else None,
                                      flag_device is not None)
            except NotImplementedError as e:
                if getattr(e, "refused_argument", False):
                    raise  # CPU's own refusal of the op's arguments (decompose.check_arguments), not a gap
                raise _NotLowerable() from e
        else:
            executor.stats.hits += 1
        new = executor.execute_and_bind(col, skeys, entry)
        if flag_device is not None:
            index_checks.set_flag(flag_device, new[entry.flag_output])  # type: ignore[attr-defined]
        for pos, k in entry.host_writes:  # type: ignore[attr-defined]
            args[pos].copy_(new[k].cpu())
        return entry.assemble(new, args)  # type: ignore[attr-defined]

    def _concrete_values(self, specs: list) -> dict:
        """Every node's value for these inputs' concrete sizes (meta tensors, no device work)."""
        rec = _MetaRecorder(self.gm)
        rec.run(*[_meta_input(s) for s in specs[: len(self.placeholders)]])
        return rec.values

    def _compile(self, specs: list, skeys: tuple, col: Any, key: _C.OpKey,
                 plan: bucketing.Plan | None = None, flag_input: bool = False) -> executor.Entry:
        executor.stats.misses += 1
        executor.stats.graph_misses += 1
        start = time.perf_counter()
        b = Builder()
        input_values, storage_vals = executor.program_inputs(b, col, skeys)
        graph_inputs = []
        for s in specs[: len(self.placeholders)]:
            kind = s[0] if isinstance(s, tuple) and s else None
            if kind == "T":
                graph_inputs.append(read_view(b, storage_vals[s[1]], ViewSpec(s[2], s[3], s[4], s[5])))
            elif kind in ("C", "S"):
                graph_inputs.append(input_values[s[1]])
            elif kind == "V":
                graph_inputs.append(s[1])
            else:
                graph_inputs.append(None)
        extras: dict[str, Any] = {}
        if self.random:
            extras["seed"] = input_values[specs[-1][1]]
            extras["seed_counter"] = [0]
        mutations: dict[int, Value] = {}
        vals = self._concrete_values(specs) if self.symbolic else None
        hook = None
        if plan is not None:
            # the actual sizes: the input after the graph's own and the index-check flag
            sizes = input_values[specs[len(self.placeholders) + int(flag_input)][1]]
            buckets = {s: specs[p][1] for s, p in zip(plan.symbols, plan.symbol_positions)}
            hook = bucketing.MaskHook(plan, b, sizes, buckets)
        env: dict[torch.fx.Node, Any] = {}
        results = decompose.lower_graph(b, self.graph, graph_inputs, key[0], extras, mutations, vals, hook, env)
        if not self.out_is_tuple:
            results = [results]
        outputs: list[tuple] = []
        out_values: list[Value] = []
        result_specs: list[OutSpec] = []
        compacted = plan.compacted if plan is not None else set()
        shared = _shared_bases(self.out_nodes, env) if vals is None and plan is None else {}
        base_outputs: dict[torch.fx.Node, int] = {}
        for out_index, (node, r) in enumerate(zip(self.out_nodes, results)):
            if isinstance(node, torch.fx.Node) and node.op == "placeholder":
                result_specs.append(OutSpec("input", self.placeholders.index(node)))
                continue
            val = None
            if isinstance(node, torch.fx.Node):
                val = vals[node] if vals is not None and node in vals else node.meta.get("val")
            source = _viewed_input(node, val) if vals is None and plan is None else None
            if source is not None and specs[self.placeholders.index(source)][0] == "T":
                # A view of an input (a weight's transpose saved for the backward): hand out the
                # view instead of copying the input into a new output buffer.
                result_specs.append(OutSpec("input_view", self.placeholders.index(source),
                                             view_spec(val, source.meta["val"])))
                continue
            base = shared.get(node)
            if base is not None:
                # Views of one intermediate (q, k and v cut from one projection; a softmax saved
                # twice): its buffer is an output once and each view is handed out of it, instead
                # of every view being copied (and transposed) into a buffer of its own.
                k = base_outputs.get(base)
                if k is None:
                    k = base_outputs[base] = len(outputs)
                    bval = base.meta["val"]
                    bstride = tuple(int(d) for d in bval.stride())
                    outputs.append(("new", bval.dtype, tuple(int(d) for d in bval.shape), bstride))
                    out_values.append(dense_to_storage(b, env[base], bstride))
                result_specs.append(OutSpec("output_view", k, view_spec(val, base.meta["val"])))
                continue
            if isinstance(r, Value) and isinstance(val, torch.Tensor):
                shape, stride = output_layout(val)
                v = output_value(b, r, val)
                result_specs.append(OutSpec("tensor", len(outputs)))
                if out_index in compacted:
                    outputs.append(("new", val.dtype, shape, contiguous_strides(shape)))
                    out_values.append(hook.compact(v, plan.output_layouts[out_index]))
                    continue
                outputs.append(("new", val.dtype, shape, stride))
                out_values.append(dense_to_storage(b, v, stride))
            else:
                result_specs.append(OutSpec("value", value=r if not isinstance(r, Value) else None))
        flag_output = None
        if flag_input:
            fs = specs[len(self.placeholders)]  # the flag: the input after the graph's own
            flag = read_view(b, storage_vals[fs[1]], ViewSpec(fs[2], fs[3], fs[4], fs[5]))
            flag_output = len(outputs)
            outputs.append(("new", torch.int64, tuple(flag.shape), (1,)))
            out_values.append(self._fold_bounds(b, flag, env, vals, hook))
        # In-graph input mutations: write the new values back into the inputs' storages.
        written: dict[int, list[tuple[ViewSpec, Value]]] = {}
        host_writes: list[tuple[int, int]] = []
        for pos, value in sorted(mutations.items()):
            s = specs[pos]
            if isinstance(s, tuple) and s and s[0] == "C":
                # A CPU scalar input (e.g. a non-capturable optimizer's step count):
                # return its new value and copy it to the host after the launch.
                host_writes.append((pos, len(outputs)))
                outputs.append(("new", s[2], (), ()))
                out_values.append(dense_to_storage(b, b.reshape(b.convert(value, s[2]), ()), ()))
                continue
            if not (isinstance(s, tuple) and s and s[0] == "T"):
                raise NotImplementedError(f"torchtpu: graph mutates input {pos}, which is not a tensor")
            written.setdefault(s[1], []).append((ViewSpec(s[2], s[3], s[4], s[5]), value))
        for k, value in executor.written_stores(b, storage_vals, skeys, written):
            outputs.append(("store", k))
            out_values.append(value)
        donate = executor.alias_stores(b, col, skeys, outputs)
        text = b.module(out_values, name=self.name)
        exe = compile_cache.compile_program(text, f"the compiled graph {self.name}")
        entry = executor.Entry(exe, outputs, result_specs, donate)
        entry.host_writes = host_writes  # type: ignore[attr-defined]
        entry.flag_output = flag_output  # type: ignore[attr-defined]
        entry.assemble = ResultPlan(result_specs)  # type: ignore[attr-defined]
        self.cache[key] = entry
        self.compiles += 1
        executor.stats.compile_seconds += time.perf_counter() - start
        return entry

    def _fold_bounds(self, b: Builder, flag: Value, env: dict, vals: dict | None,
                     hook: bucketing.MaskHook | None) -> Value:
        """``flag`` with the index checks of every bounded node folded in, in graph order. The
        bounds come from the nodes' example values; each index found among them is lowered.

        A program traced with symbolic shapes is specialized to concrete sizes (``vals``, its
        nodes' values at those sizes) or runs at bucket sizes (``hook``). At bucket sizes the
        padding of an index holds anything, so it is set to a valid index first; a bound that
        depends on a symbolic size (its message names the size) is not checked there, nor one
        that reports a position in an index padded inside.
        """
        examples = vals if vals is not None and hook is None else {
            n: n.meta.get("val") for n in self.graph.nodes if n.meta.get("val") is not None}
        node_of = {id(v): n for n, v in examples.items()}

        def example(a: Any) -> Any:
            return examples.get(a) if isinstance(a, torch.fx.Node) else a

        for node in self.bounded:
            if decompose.is_linalg_check(node):  # info must be 0; raised as PyTorch's own check raises
                bounds = linalg_check_bounds(example(node.args[2]), node.args[3], node.kwargs.get("is_matrix", True))
            else:
                plan = plan_for(node.target)
                values = normalize_args(plan, torch.fx.node.map_aggregate(node.args, example),
                                        torch.fx.node.map_aggregate(node.kwargs, example))
                bounds = plan.index_bounds(*[values[i] for i in plan.func_arg_positions])
            for bound in bounds:
                source = node_of.get(id(bound.index))
                index = env.get(source) if source is not None else None
                if not isinstance(index, Value) or not index.numel:
                    continue
                if hook is not None:
                    index = hook.valid_index(index, source, bound)
                    if index is None:
                        continue
                code = index_checks.code_for(bound.error, bound.message)
                flag = fold_bound(b, flag, index, bound.low, bound.high, bound.exempt, code,
                                  bound.nonzero)
        return flag


def _is_random(node: torch.fx.Node) -> bool:
    """Whether a node draws random numbers (the graph then takes a seed), as its op plan says: ops
    with a generator argument do even when the graph leaves it at its default (normal, poisson,
    _standard_gamma...), and so do dropout and the random factories (engine/opplan.py)."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and plan_for(node.target).random)


def _index_bounds_of(node: torch.fx.Node) -> Any:
    if decompose.is_linalg_check(node):
        return linalg_check_bounds
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return plan_for(node.target).index_bounds


def _first_tpu_device(args: list[Any]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "tpu":
            return a.device
    return torch.device("tpu", 0)


def _viewed_input(node: Any, val: Any) -> torch.fx.Node | None:
    """The placeholder whose storage ``node``'s value views through view ops only, if any."""
    if not isinstance(node, torch.fx.Node) or not isinstance(val, torch.Tensor):
        return None
    n = node
    while n.op == "call_function":
        op = n.target
        schema = getattr(op, "_schema", None)
        alias = schema.returns[0].alias_info if schema is not None and schema.returns else None
        if alias is None or alias.is_write or not n.args or not isinstance(n.args[0], torch.fx.Node):
            return None
        n = n.args[0]
    if n.op != "placeholder":
        return None
    base = n.meta.get("val")
    if not isinstance(base, torch.Tensor) or base.dtype != val.dtype:
        return None
    return n if _same_storage(base, val) else None


def _view_base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose result ``node``'s value views through view ops (itself if none)."""
    n = node
    while n.op == "call_function":
        source = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if source is None:
            break
        op = source.target if n.target is operator.getitem else n.target  # a piece of a split
        schema = getattr(op, "_schema", None)
        alias = schema.returns[0].alias_info if schema is not None and len(schema.returns) == 1 else None
        if alias is None or alias.is_write:
            break
        n = source.args[0] if n.target is operator.getitem else source
        if not isinstance(n, torch.fx.Node):
            return node
    return n


def _shared_bases(out_nodes: list[Any], env: dict | None) -> dict[torch.fx.Node, torch.fx.Node]:
    """Output node -> the intermediate it views, where its views among the outputs cover it.
    ``env``: the nodes' lowered values, where known (a base must be one value)."""
    views: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in out_nodes:
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            continue
        base = _view_base(node)
        if base is not node and base.op == "call_function":
            views.setdefault(base, []).append(node)
    shared = {}
    for base, nodes in views.items():
        bval = base.meta.get("val")
        if not isinstance(bval, torch.Tensor) or (env is not None and not isinstance(env.get(base), Value)):
            continue
        if not is_dense_permutation(tuple(bval.shape), tuple(bval.stride())) or bval.storage_offset() != 0:
            continue
        vals = [n.meta.get("val") for n in nodes]
        if not all(isinstance(v, torch.Tensor) and v.dtype == bval.dtype and _same_storage(v, bval) for v in vals):
            continue
        # Handing out a small slice would keep a whole large intermediate alive.
        if sum(v.numel() for v in vals) < bval.numel():
            continue
        shared.update(dict.fromkeys(nodes, base))
    return shared


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return False


def _is_symbolic(val: Any) -> bool:
    if isinstance(val, torch.Tensor):
        return any(not isinstance(d, int) for d in val.shape)
    if isinstance(val, (list, tuple)):
        return any(_is_symbolic(v) for v in val)
    return isinstance(val, (torch.SymInt, torch.SymFloat))


class _MetaRecorder(torch.fx.Interpreter):
    """Runs a graph on meta tensors, recording every node's concrete value."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[torch.fx.Node, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n] = out
        return out

    def _record(self, gm: torch.fx.GraphModule, inputs: Any) -> Any:
        """Run a control-flow subgraph on meta values, recording its nodes' values too."""
        sub = _MetaRecorder(gm)
        out = sub.run(*inputs)
        self.values.update(sub.values)
        return out

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return value

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target is torch.ops.higher_order.cond:
            # both branches' nodes get values (each is lowered); either gives the result's
            _, true_gm, false_gm, operands = args
            result = self._record(true_gm, operands)
            self._record(false_gm, operands)
            return result
        if target is torch.ops.higher_order.while_loop:
            cond_gm, body_gm, carried, additional = args
            for gm in (cond_gm, body_gm):
                self._record(gm, [*carried, *additional])
            return tuple(carried)  # a loop keeps its state's shapes
        # Factories in the graph name the tpu device: make them on meta too.
        dev = kwargs.get("device")
        if isinstance(dev, torch.device) and dev.type == "tpu":
            kwargs = {**kwargs, "device": torch.device("meta")}
        return super().call_function(target, args, kwargs)


def _meta_input(spec: Any) -> Any:
    kind = spec[0] if isinstance(spec, tuple) and spec else None
    if kind == "T":
        return torch.empty_strided(spec[3], spec[4], dtype=spec[2], device="meta")
    if kind == "C":
        return torch.empty((), dtype=spec[2], device="meta")
    if kind == "V":
        return spec[1]
    return None
