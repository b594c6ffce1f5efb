"""``torch.compile(fn, backend="tpu", mode="reduce-overhead")``: inference graphs replayed from TPU graphs.

On CUDA this mode records a compiled graph in a CUDA graph and replays it, so a call skips the
host's per-launch work (gpt-fast's decoding loop). Here a compiled graph is one program already;
what a call costs on the host is the runner around it: the walk over its ~180 arguments, its
cache key, binding outputs. A ``torch.tpu.TPUGraph`` replay reads the captured tensors' current
buffers instead (``graphs.py``): on a v5e, greedy decoding of a 100M GPT at batch 1 ran 1,039
tokens/s as compiled calls and 1,572 replayed (JAX 1,634).

Each inference graph (no autograd: training graphs run as compiled) is wrapped:

- its first call runs as usual and notes the storages of its tensors;
- the next call captures the graph for its argument layouts (at most ``MAX_CAPTURES`` captures),
  then each call with those layouts replays it. A tensor on the same storage (at the same offset)
  as at the first call (a parameter, a cache the function updates in place), and any tensor the
  graph writes, is read in place, as CUDA graphs read static addresses, and must be on that
  storage at each replay (another one runs as compiled once and captures again); any other tensor
  is given to a tensor of the capture's own before each replay (its buffer, or a copy). A graph
  whose capture fails (an op that reads a value on the host) runs as compiled calls;
- each replay's results are new tensors on that replay's output buffers, so results of earlier
  calls keep their values (a CUDA graph overwrites them; a PJRT execution makes new buffers); an
  output that is an argument, or a view of one, is that call's argument or its view.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

# (imported when a graph is first compiled with this mode: torchtpu is loaded by then)
from .. import _C, graphs
from ..engine import deferred
from ..engine.graph_runner import view_spec
from ..runtime import Buffer

MAX_CAPTURES = 8  # captures per graph (argument layouts, new static tensors); then compiled calls
_warned: set[str] = set()  # each reason a graph is not replayed, warned once per process
stats = {"captures": 0, "replays": 0, "declined": 0}  # process-wide counts (tests, benchmarks)


def _mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Positions of the placeholders the graph writes in place (AOTAutograd keeps an inference
    graph's input mutations as ``copy_`` into the placeholder)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "_schema", None) is not None:
            schema = node.target._schema.arguments
            given = [*zip(node.args, schema), *((node.kwargs[a.name], a) for a in schema if a.name in node.kwargs)]
            for arg, info in given:
                if info.alias_info is not None and info.alias_info.is_write and arg in placeholders:
                    written.add(placeholders.index(arg))
    return written


def _signature(args: list[Any]) -> tuple:
    """What a capture of a graph with symbolic sizes is specialized to: each tensor's layout, each
    other value itself (a size). (A graph of static sizes has one: Dynamo's guards fix its layouts.)"""
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                 for a in args)


class _Capture:
    """One capture: the graph, the tensors it reads, the outputs it writes."""

    def __init__(self, graph: Any, static_args: list[Any], private: list[int], in_place: list[int],
                 outputs: Any) -> None:
        self.graph = graph
        self.static_args = static_args
        # positions read from tensors of the capture's own, given each call's values: the call's
        # buffer itself where the layouts agree (buffers are immutable, and the graph does not write
        # these), else a copy
        self.private = [(i, static_args[i].untyped_storage(), static_args[i].untyped_storage().nbytes(),
                         static_args[i].stride()) for i in private]
        # positions whose tensor the graph reads (and may write) itself: the storage and offset it reads
        self.in_place = [(i, weakref.ref(static_args[i].untyped_storage()), static_args[i].storage_offset())
                         for i in in_place]
        self.plan = _output_plan(outputs, static_args)
        self.tuple_type = type(outputs) if isinstance(outputs, (list, tuple)) else None
        self._attr = deferred._ATTR

    def matches(self, args: list[Any]) -> bool:
        """Whether the tensors read in place are this call's (the same storage at the same offset; a
        call may pass another tensor object on it, as AOTAutograd does with parameters): a new KV
        cache of the same shape is another storage, which this graph would not read."""
        return _C._same_storages(args, self.in_place)  # (natively: ~180 tensors, 43 us in Python)

    def replay(self, args: list[Any]) -> Any:
        attr = self._attr
        for i, storage, nbytes, stride in self.private:
            a = args[i]
            source = a.untyped_storage()
            buf = getattr(source, attr, None)
            if (buf.__class__ is Buffer and a.storage_offset() == 0 and source.nbytes() == nbytes
                    and a.stride() == stride):
                setattr(storage, attr, buf)
            else:
                self.static_args[i].copy_(a)
        self.graph.replay()
        stats["replays"] += 1
        return _fresh(self.plan, self.tuple_type, args)


def _output_plan(outputs: Any, static_args: list[Any]) -> list[tuple]:
    """How each captured output is handed out after a replay (decided once, at the capture):
    ("input", i) for an argument returned as is, ("view", i, shape, stride, offset) for a view on an
    argument's storage (a view of that call's argument, as eager gives; the offset from the
    argument's own, as a call's argument may sit elsewhere in its storage), ("new", ...) for a result
    of the graph's own (on the replay's buffer), ("value", v) for anything else."""
    by_storage = {}
    for i, a in enumerate(static_args):
        if isinstance(a, torch.Tensor) and a.device.type == "tpu":
            by_storage.setdefault(id(a.untyped_storage()), i)
    plan = []
    for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
            plan.append(("value", t))
            continue
        same = next((i for i, a in enumerate(static_args) if t is a), None)
        storage = t.untyped_storage()
        if same is not None:
            plan.append(("input", same))
        elif id(storage) in by_storage:
            i = by_storage[id(storage)]
            plan.append(("view", i, *view_spec(t, static_args[i])))
        else:
            whole = t.storage_offset() == 0 and t.numel() * t.element_size() == storage.nbytes()
            plan.append(("new", storage, whole, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device))
    return plan


def _fresh(plan: list[tuple], tuple_type: type | None, args: list[Any]) -> Any:
    """The replay's results (see ``_output_plan``): its own as new tensors on its immutable output
    buffers, outputs that shared a storage sharing a new one, so earlier calls' results keep their
    values."""
    attr = deferred._ATTR
    storages: dict[int, torch.UntypedStorage] = {}
    out = []
    for step in plan:
        kind = step[0]
        if kind == "value":
            out.append(step[1])
        elif kind == "input":
            out.append(args[step[1]])
        elif kind == "view":
            base = args[step[1]]
            out.append(base.as_strided(step[2], step[3], base.storage_offset() + step[4]))
        else:
            _, static, whole, shape, stride, offset, dtype, device = step
            buf = getattr(static, attr)
            storage = storages.get(id(static))
            if storage is None and whole:  # the common case: a result on a storage of its own
                t, storages[id(static)] = _C._new_tensor(shape, stride, dtype, device.index or 0, attr, buf)
                out.append(t)
                continue
            if storage is None:
                storage = storages[id(static)] = torch.UntypedStorage(static.nbytes(), device=device)
                setattr(storage, attr, buf)
            out.append(torch.empty(0, dtype=dtype, device=device).set_(storage, offset, shape, stride))
    return out[0] if tuple_type is None else tuple_type(out)


class ReplayedRunner:
    """An inference graph's runner under ``mode="reduce-overhead"`` (see the module docstring)."""

    def __init__(self, run: Any, gm: torch.fx.GraphModule) -> None:
        self._run = run
        self._mutated = _mutated_inputs(gm)
        self._symbolic = bool(getattr(getattr(run, "program", None), "symbolic", True))
        self._previous: list[tuple | None] | None = None  # the first call's storages and offsets
        self._captures: dict[tuple, _Capture | None] = {}
        self._n_captured = 0
        self._boxed_call = True
        self.program = getattr(run, "program", None)

    def __call__(self, args: list[Any]) -> Any:
        if deferred.capturing is not None or torch.is_grad_enabled():  # a user's own capture; autograd
            return self._run(args)
        try:
            key = _signature(args) if self._symbolic else ()
            capture = self._captures.get(key, False)
        except TypeError:  # an argument that is not hashable
            return self._run(args)
        if capture is not None and capture is not False and not capture.matches(args):
            # another storage where one was read in place (a new model, a new KV cache): as compiled
            # once more, and captured again at the next call, from this call's storages
            del self._captures[key]
            self._previous = None
            capture = False
        if capture is False:
            if self._previous is None:  # a first call: as compiled, noting which storages it read
                self._previous = [(weakref.ref(a.untyped_storage()), a.storage_offset())
                                  if isinstance(a, torch.Tensor) else None for a in args]
                return self._run(args)
            previous = self._previous

            def same(i: int, a: torch.Tensor) -> bool:
                p = previous[i] if i < len(previous) else None
                return p is not None and p[0]() is a.untyped_storage() and p[1] == a.storage_offset()

            capture = self._captures[key] = self._capture(args, same)
        if capture is None:
            return self._run(args)
        return capture.replay(args)

    def _capture(self, args: list[Any], same: Any) -> _Capture | None:
        """Capture the graph on these arguments: a tensor it writes, or one ``same(i, tensor)`` says
        was passed before, read in place; any other read from a tensor of its own."""
        if self._n_captured >= MAX_CAPTURES:
            return self._decline(f"{MAX_CAPTURES} captures made (argument layouts, or new tensors it writes)")
        static_args, private, in_place = list(args), [], []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or a.device.type != "tpu":
                continue
            if i in self._mutated or same(i, a):  # (the same storage at the same offset)
                in_place.append(i)
                continue
            own = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            own.copy_(a)
            static_args[i] = own
            private.append(i)
        # what each tensor argument holds now: a failed capture puts it back (graphs._settle leaves a
        # tensor the capture only wrote without a value)
        storages = [a.untyped_storage() for a in args if isinstance(a, torch.Tensor) and a.device.type == "tpu"]
        before = [(s, getattr(s, deferred._ATTR, None)) for s in storages]
        graph = graphs.TPUGraph()
        self._n_captured += 1
        try:
            with graphs.graph(graph):
                outputs = self._run(static_args)
        except graphs.CaptureError as e:
            for s, buf in before:
                setattr(s, deferred._ATTR, buf)
            return self._decline(f"its capture was refused ({e})")
        stats["captures"] += 1
        return _Capture(graph, static_args, private, in_place, outputs)

    def _decline(self, why: str) -> None:
        stats["declined"] += 1
        name = getattr(self.program, "name", "graph")
        if why not in _warned:
            _warned.add(why)
            warnings.warn(f"torchtpu: mode='reduce-overhead': a compiled {name} graph runs as compiled calls, "
                          f"not replayed: {why}", stacklevel=3)
