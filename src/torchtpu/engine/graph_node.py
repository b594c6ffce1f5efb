"""A ``torch.compile`` graph as one op, so that DeferAndFuse records it like any other.

In Strict mode a compiled graph (AOTAutograd's forward, backward or inference graph) runs as its
own program (engine/graph_runner.py). In DeferAndFuse mode it is instead called as the op
``torchtpu::compiled_graph``: recorded as one node whose lowering inlines the whole graph, so the
fused program of a training step holds the forward, the backward and the eager optimizer ops
between and after them, and the step is one launch instead of one per graph plus one per
optimizer op.

A graph qualifies when every input is a tpu tensor and it draws no random numbers and has no
symbolic shapes; others run as their own program, as in Strict mode. What a graph program does
besides computing new tensors is done around the op, with recorded ops: an output that is an
input, or a view of one, is handed out as that input or a view of it; an input the graph writes
(``copy_`` into a placeholder: an in-graph optimizer step, BatchNorm's running statistics) gets
its new value as one more result of the op, copied in afterwards; and the graph's index checks
fold into the device's index-check flag, which the op takes and returns.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
import torch.fx

from .._config import config
from ..lowering import decompose, registry
from ..lowering.builder import Builder, Value
from . import deferred, graph_runner, index_checks
from . import precision as precision_mod

_lib = torch.library.Library("torchtpu", "FRAGMENT")
# ``graph``: the graph's number in _GRAPHS. No default (see kernels._define).
_lib.define("compiled_graph(Tensor[] inputs, int graph) -> Tensor[]")
COMPILED_GRAPH = torch.ops.torchtpu.compiled_graph.default


class InlinedGraph:
    """How a graph runs as ``torchtpu::compiled_graph``: its results and the op's outputs."""

    def __init__(self, program: Any, number: int) -> None:
        self.program = program
        self.number = number
        placeholders = program.placeholders
        position = {n: i for i, n in enumerate(placeholders)}
        # The inputs the graph writes, in placeholder order: their new values follow the outputs.
        self.mutated = sorted({position[n.args[0]] for n in program.graph.nodes
                               if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
                               and n.args[0] in position})
        self.results: list[graph_runner.OutSpec] = []
        self.new_nodes: list[torch.fx.Node] = []  # the nodes whose values are the op's outputs
        # Outputs viewing one intermediate that they cover (q, k and v of one projection) are
        # views of one output, as eager's are (see graph_runner._shared_bases).
        shared = graph_runner._shared_bases(program.out_nodes, None)
        output_of: dict[torch.fx.Node, int] = {}

        def output(node: torch.fx.Node) -> int:
            if node not in output_of:
                output_of[node] = len(self.new_nodes)
                self.new_nodes.append(node)
            return output_of[node]

        for node in program.out_nodes:
            if isinstance(node, torch.fx.Node) and node.op == "placeholder":
                self.results.append(graph_runner.OutSpec("input", position[node]))
                continue
            val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(node, torch.fx.Node) or not isinstance(val, torch.Tensor):
                self.results.append(graph_runner.OutSpec("value", value=node))
                continue
            source = graph_runner._viewed_input(node, val)
            if source is not None:
                self.results.append(graph_runner.OutSpec("input_view", position[source],
                                                         graph_runner.view_spec(val, source.meta["val"])))
            elif node in shared:
                self.results.append(graph_runner.OutSpec("output_view", output(shared[node]),
                                                         graph_runner.view_spec(val, shared[node].meta["val"])))
            else:
                self.results.append(graph_runner.OutSpec("tensor", output(node)))
        self.checks = bool(program.bounded)
        self.assemble = graph_runner.ResultPlan(self.results)

    def out_metas(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The op's outputs as meta tensors: the new values, the written inputs' new values, the flag."""
        outs = []
        for node in self.new_nodes:
            val = node.meta["val"]
            outs.append(torch.empty_strided(*graph_runner.output_layout(val), dtype=val.dtype, device="meta"))
        for pos in self.mutated:
            x = inputs[pos]
            outs.append(torch.empty(tuple(x.shape), dtype=x.dtype, device="meta"))
        if self.checks:
            outs.append(torch.empty(3, dtype=torch.int64, device="meta"))
        return outs

    def lower(self, b: Builder, inputs: list[Value], precision: str) -> list[Value]:
        """The graph inlined into the program being built: the op's outputs. Raises
        NotImplementedError where a node has no lowering."""
        graph_inputs = inputs[: len(self.program.placeholders)]
        env: dict[torch.fx.Node, Any] = {}
        mutations: dict[int, Value] = {}
        decompose.lower_graph(b, self.program.graph, graph_inputs, precision, {}, mutations, None, None, env)
        outs = []
        for node in self.new_nodes:
            if not isinstance(env[node], Value):
                raise NotImplementedError(f"torchtpu: graph output {node} is not one value")
            outs.append(graph_runner.output_value(b, env[node], node.meta["val"]))
        for pos in self.mutated:
            outs.append(mutations.get(pos, graph_inputs[pos]))
        if self.checks:
            outs.append(self.program._fold_bounds(b, inputs[-1], env, None, None))
        return outs

    def lowers(self) -> bool:
        """Whether every node lowers (tried once, into a program thrown away): a graph that does
        not runs as its own program, whose fallback runs it op by op."""
        b = Builder()
        inputs = [b.arg(tuple(n.meta["val"].shape), n.meta["val"].dtype) for n in self.program.placeholders]
        if self.checks:
            inputs.append(b.arg((3,), torch.int64))
        try:
            self.lower(b, inputs, precision_mod.current())
        except NotImplementedError:
            return False
        return True

    def __call__(self, args: list[Any]) -> list[Any]:
        if self.program.name == "forward":
            deferred.cut_before_step()
        inputs = list(args)
        device = args[0].device
        if self.checks:
            inputs.append(index_checks.current_flag(device))
        outs = COMPILED_GRAPH(inputs, self.number)
        if self.checks:
            index_checks.set_flag(device, outs[-1])
        written = outs[len(self.new_nodes): len(self.new_nodes) + len(self.mutated)]
        if written:
            # one recorded op for all (an in-graph optimizer step writes ~4 tensors per parameter:
            # a copy_ each cost more host time than the launches the recording saves)
            torch._foreach_copy_([args[pos] for pos in self.mutated], written)
        return self.assemble(outs, args)


_GRAPHS: dict[int, InlinedGraph] = {}


def name_of(values: list[Any]) -> str:
    """The graph's name ("forward", "backward", "inference") from a recorded call's non-tensor values."""
    return _GRAPHS[values[-1]].program.name
_numbers = itertools.count()


def inlined(program: Any) -> InlinedGraph | None:
    """The graph as ``torchtpu::compiled_graph``, or None where it must run as its own program."""
    if program.random or program.symbolic:
        return None
    if not all(isinstance(n.meta.get("val"), torch.Tensor) for n in program.placeholders):
        return None
    number = next(_numbers)
    graph = InlinedGraph(program, number)
    if not graph.lowers():
        return None
    _GRAPHS[number] = graph
    return graph


def recording() -> bool:
    """Whether ops are being recorded (DeferAndFuse mode, not Debug)."""
    return config.defer_and_fuse and not config.launch_blocking


def _never(graph: str) -> bool:
    return False


# Strict mode's step recording (step_recording.py, which installs these): whether a step may begin
# recording at a graph named ``graph`` ("forward", "backward" or "inference"), and its beginning.
may_begin_at: Any = _never
begin_at: Any = _never


def may_record(graph: str) -> bool:
    """Whether a call of ``graph`` would be recorded, were it recordable as one op."""
    return recording() or may_begin_at(graph)


def record(graph: str) -> bool:
    """Before a recordable call of ``graph``: whether it is recorded (Strict mode may begin here)."""
    return recording() or begin_at(graph)


def takes(args: list[Any]) -> bool:
    """Whether a call's arguments suit the op: tpu tensors only, on one device."""
    if not args:
        return False
    device = None
    tensor = torch.Tensor
    for a in args:
        if not isinstance(a, tensor):
            return False
        d = a.device  # (one device object per read: compared once, its type read once)
        if d != device:
            if device is not None or d.type != "tpu":
                return False
            device = d
    return True


def _meta(inputs: list[torch.Tensor], graph: int) -> list[torch.Tensor]:
    return _GRAPHS[graph].out_metas(inputs)


torch.library.register_fake("torchtpu::compiled_graph", _meta, lib=_lib)


@registry.register(COMPILED_GRAPH)
def _lower(ctx: registry.LoweringContext, inputs: list[Value], graph: int) -> list[Value]:
    return _GRAPHS[graph].lower(ctx.b, inputs, ctx.precision)


def register_kernel() -> None:
    """The op's tpu kernel: the native kernel front, as every lowered op has (torchtpu._kernels)."""
    from .. import _C
    from .opplan import plan_for

    _C._register_kernel_front("torchtpu", [("compiled_graph", functools.partial(plan_for, COMPILED_GRAPH))])
