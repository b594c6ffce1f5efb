"""Functional collectives in compiled graphs: graph breaks around them.

A graph traced from code that calls ``torch.distributed._functional_collectives`` (DTensor,
FSDP2 and tensor parallelism trace these) holds ``_c10d_functional`` nodes. The transport of a
``tpu_dist`` group is Gloo on host memory (see ``torchtpu.distributed``), which an XLA program
cannot call: lowering such a graph as one program fails, and the whole graph would then run op by
op. Instead the graph is split at its collectives: each stretch of compute between them is one
compiled program, and each run of collectives is called eagerly in between, on the group's
process group, as a graph break would. One warning says so, once per process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

# Namespaces of the traceable collectives (the autograd variants are what FSDP2 and DTensor trace
# in training graphs).
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd"})

_warned = False


def is_collective(node: torch.fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
        target.namespace in COLLECTIVE_NAMESPACES


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    return any(is_collective(n) for n in gm.graph.nodes)


class _Part(torch.nn.Module):
    """One compiled stretch of the split graph, callable as the submodule it replaces."""

    def __init__(self, sub: torch.fx.GraphModule, run: Callable[[list[Any]], Any]) -> None:
        super().__init__()
        self._run = run
        # the compiled runner returns a list of outputs, as AOTAutograd's do; the split module
        # reads a submodule of one output as that value
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        self._single = not isinstance(out, (list, tuple))

    def forward(self, *args: Any) -> Any:
        out = self._run(list(args))
        if self._single and isinstance(out, (list, tuple)):
            (out,) = out
        return out


def split_at_collectives(gm: torch.fx.GraphModule,
                         compile_part: Callable[[torch.fx.GraphModule], Callable[[list[Any]], Any]]) -> Any:
    """A boxed runner of ``gm``: its compute stretches compiled by ``compile_part``, its
    collectives run eagerly between them."""
    global _warned
    part_of: dict[torch.fx.Node, int] = {}
    part, previous = 0, None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        collective = is_collective(node)
        if previous is not None and collective != previous:
            part += 1
        part_of[node] = part
        previous = collective
    collective_parts = {part_of[n] for n in part_of if is_collective(n)}
    split = split_module(gm, None, lambda n: part_of[n], keep_original_order=True)
    for i in range(part + 1):
        sub = getattr(split, f"submod_{i}", None)
        if sub is None or i in collective_parts:
            continue  # collectives: run by the split module's own (eager) code
        setattr(split, f"submod_{i}", _Part(sub, compile_part(sub)))
    if not _warned:
        _warned = True
        ops = sorted({n.target.__name__ for n in part_of if is_collective(n)})
        warnings.warn(f"torchtpu: functional collectives in a compiled graph ({', '.join(ops)}) run eagerly "
                      "between the graph's compiled parts (graph breaks): a tpu_dist group's transport "
                      "is outside XLA programs", stacklevel=2)
    # Not traced by Dynamo as a frame of its own (see GraphProgram)
    eager = torch.compiler.disable(split)

    def run(args: list[Any]) -> Any:
        return eager(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
