"""``torch.compile(model, backend="tpu")``, and ``torch.compile(model)`` on tpu tensors.

Dynamo's graph goes through AOTAutograd (forward and backward graphs, core
ATen after decomposition); each graph is lowered with the eager lowering
registry into ONE StableHLO module and compiled by XLA. Graph breaks run in
the current eager mode.

The default backend, Inductor, has no code generator for this device (its "tpu"
entry is a Pallas generator that needs JAX), so a CUDA script's plain
``torch.compile(model)`` would fail on tpu tensors: graphs holding tpu tensors are
routed to this backend instead (``route_default_compile``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

_backends: dict[bool, Any] = {}  # replayed (mode="reduce-overhead") -> the AOTAutograd backend


def _tensor_values(node: torch.fx.Node) -> list[torch.Tensor]:
    """The tensors a node holds, without AOTAutograd's effect tokens (empty CPU tensors)."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [v for v in vals if isinstance(v, torch.Tensor) and not (v.device.type == "cpu" and v.numel() == 0)]


def crosses_devices(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph is more than one tpu program can run: it has no tpu tensor at all, holds a
    CPU tensor with dimensions, or copies a tensor between devices (``.to("tpu")``, ``.cpu()``).
    CPU scalars (0-dim tensors, e.g. an optimizer's step count) ride along in tpu programs."""
    on_tpu = False
    for node in gm.graph.nodes:
        tensors = _tensor_values(node)
        if any(t.device.type != "tpu" and t.dim() > 0 for t in tensors):
            return True
        on_tpu = on_tpu or any(t.device.type == "tpu" for t in tensors)
        if node.op == "call_function" and tensors:
            inputs = [v for a in node.all_input_nodes for v in _tensor_values(a)]
            if {t.device.type for t in inputs} - {t.device.type for t in tensors} and \
                    any(t.device.type != "tpu" for t in tensors):
                return True  # a tpu value becomes a CPU one
    return not on_tpu


_warned_eager: set[str] = set()


def _eager_runner(gm: torch.fx.GraphModule, name: str) -> Any:
    """Run the graph op by op in the current eager mode: each op on its own device."""
    if name not in _warned_eager:
        _warned_eager.add(name)
        warnings.warn(f"torchtpu: a compiled {name} graph moves tensors between devices or has no tpu tensor; "
                      "it runs op by op in the current eager mode", stacklevel=2)

    eager = torch.compiler.disable(gm)  # not traced by Dynamo as a frame of its own (see GraphProgram)

    def run(args: list[Any]) -> Any:
        return eager(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _graph_compiler(name: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from ..engine.graph_runner import GraphProgram
        from .collectives import has_collectives, split_at_collectives

        if crosses_devices(gm):
            return _eager_runner(gm, name)
        if has_collectives(gm):
            return split_at_collectives(gm, lambda part: compile_graph(part, example_inputs))
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
    # Keep ops we lower directly (one fused program either way, fewer nodes), and ops with checks of
    # CPU's kernels (their dims, dtypes, scalars, index ranges): decomposed, the graph lost them, and
    # index_copy(x, 1, tensor([-1])) wrote the last column where CPU refuses a negative index, and
    # celu of uint8 gave a result (regression). Kept, they lower through their decomposition as in eager.
    from ..lowering import registry

    for op in list(table):
        if (registry.lookup(op) is not None or registry.meta_check(op) is not None
                or registry.argument_check(op) is not None or registry.index_bounds(op) is not None):
            del table[op]
    return table


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """The Dynamo backend registered as ``"tpu"``. ``mode="reduce-overhead"`` replays inference graphs
    from TPU graphs (compile/replayed.py); other modes are Inductor's and change nothing here."""
    mode = kwargs.pop("mode", None)
    if mode not in (None, "default", "reduce-overhead"):
        _warn_inductor_settings()
    replayed = mode == "reduce-overhead"
    backend = _backends.get(replayed)
    if backend is None:
        from torch._dynamo.backends.common import aot_autograd

        inference = _graph_compiler("inference")
        if replayed:
            inference = _replayed(inference)
        backend = _backends[replayed] = aot_autograd(
            fw_compiler=_graph_compiler("forward"), bw_compiler=_graph_compiler("backward"),
            inference_compiler=inference, decompositions=_decompositions(),
            # Optimizer steps mutate their inputs: keep the copies in the
            # graph, where they become storage write-backs of one program.
            keep_inference_input_mutations=True)
    from ..lowering.decompose import tracing_lock

    with tracing_lock:  # AOTAutograd traces with make_fx, whose state is global (decompose.py)
        return backend(gm, example_inputs, **kwargs)


def _replayed(compile_graph: Any) -> Any:
    def compile_replayed(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from .replayed import ReplayedRunner

        return ReplayedRunner(compile_graph(gm, example_inputs), gm)

    return compile_replayed


def holds_tpu_tensors(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether a Dynamo graph takes or makes a tpu tensor."""
    if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in example_inputs):
        return True
    return any(t.device.type == "tpu" for node in gm.graph.nodes for t in _tensor_values(node))


_warned_inductor_settings = False


def _warn_inductor_settings() -> None:
    global _warned_inductor_settings
    if not _warned_inductor_settings:
        _warned_inductor_settings = True
        warnings.warn("torchtpu: torch.compile's mode and options are Inductor settings; tpu graphs compile "
                      "with the 'tpu' backend (XLA), which does not read them (mode='reduce-overhead' "
                      "replays inference graphs from TPU graphs)", stacklevel=3)


def route_default_compile() -> None:
    """Send graphs holding tpu tensors that reach Inductor (``torch.compile``'s default backend)
    to the ``"tpu"`` backend, so ``torch.compile(model)`` works unchanged after ``.to("tpu")``.

    ``torch.compile`` calls its Inductor wrapper directly, not through Dynamo's backend
    registry, so the wrapper's ``__call__`` is the one place to route from (torch is pinned,
    so its shape is known). Graphs without tpu tensors still go to Inductor.
    """
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper, "_torchtpu_routed", False):
        return
    inductor_call = wrapper.__call__

    def __call__(self: Any, model_: torch.fx.GraphModule, inputs_: list[Any], *, config_patches: Any = None) -> Any:
        if not holds_tpu_tensors(model_, inputs_):
            return inductor_call(self, model_, inputs_, config_patches=config_patches)
        settings = {**(self.config or {}), **(config_patches or {})}
        # mode="reduce-overhead" is Inductor's CUDA graphs: on tpu, TPU graphs (compile/replayed.py)
        replayed = settings.pop("triton.cudagraphs", False)
        if settings:
            _warn_inductor_settings()
        return tpu_backend(model_, inputs_, **({"mode": "reduce-overhead"} if replayed else {}))

    wrapper.__call__ = __call__
    wrapper._torchtpu_routed = True
