"""``torch.compile(model, backend="tpu")``.

Dynamo's graph goes through AOTAutograd (forward and backward graphs, core
ATen after decomposition); each graph is lowered with the eager lowering
registry into ONE StableHLO module and compiled by XLA. Graph breaks run in
the current eager mode.
"""

from __future__ import annotations

from typing import Any

import torch

_backend = None


def _graph_compiler(name: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from ..engine.graph_runner import GraphProgram

        program = GraphProgram(gm, name)

        def run(args: list[Any]) -> Any:
            return program(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        run.program = program  # type: ignore[attr-defined]
        return run

    return compile_graph


def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # Keep ops we lower directly (one fused program either way, fewer nodes).
    from ..lowering import registry

    for op in list(table):
        if registry.lookup(op) is not None:
            del table[op]
    return table


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """The Dynamo backend registered as ``"tpu"``."""
    global _backend
    if _backend is None:
        from torch._dynamo.backends.common import aot_autograd

        _backend = aot_autograd(fw_compiler=_graph_compiler("forward"), bw_compiler=_graph_compiler("backward"),
                                inference_compiler=_graph_compiler("inference"),
                                decompositions=_decompositions(),
                                # Optimizer steps mutate their inputs: keep the copies in the
                                # graph, where they become storage write-backs of one program.
                                keep_inference_input_mutations=True)
    return _backend(gm, example_inputs, **kwargs)
