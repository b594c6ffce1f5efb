"""``torch.tpu.TPUGraph`` and ``torch.tpu.graph``: capture tpu work once, replay it as one program.

They mirror ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``. Capture records every tpu op run
inside the ``with`` block (model forward, ``backward()``, ``optimizer.step()``: eager ops and
``torch.compile`` graphs alike) as DeferAndFuse does, into one graph, and compiles it as one XLA
program; **nothing runs at capture**. ``replay()`` launches that program on the current values of
the tensors the captured ops read, and writes its results into the tensors they wrote, with no
Python, no autograd and no optimizer code: the whole training step is one launch of a few tens of
microseconds of host time, where running the step's Python costs milliseconds (a tiny model's step
is then bound by the device, not the host). As with CUDA graphs:

- the tensors are static: feed new data by copying into the captured inputs
  (``static_x.copy_(batch)``), read results from the tensors the capture produced (the loss, the
  gradients), which replay overwrites; tensors the capture reads must stay alive;
- Python values are fixed at capture (a float learning rate, a loop's trip count); an optimizer
  must be ``capturable=True`` (its step count then lives on the device), and ``optimizer.step()``
  under capture raises otherwise, as on CUDA;
- a read of a value (``.item()``, ``.cpu()``, printing) or a synchronization inside the capture
  raises, since nothing has been computed; so does a copy from the host (a CUDA graph's replay
  copies again from the host memory's current contents, which a tpu program cannot read): copy a
  new batch into the captured input before ``replay()``, outside the capture;
- the tensors the capture updates keep their old values until the first replay; new tensors, and
  tensors it overwrites without reading them, have none until then (reading one raises).

Unlike CUDA graphs, a capture needs no warm-up for its own sake (nothing runs at capture): a
``torch.compile`` function may be called the first time inside it, Dynamo tracing there, and only the
captured program compiles. An optimizer's state still comes from steps run before the capture.

Random ops draw a fresh seed from the device's default generator at every replay.
``make_graphed_callables`` graphs a callable's forward and backward as two graphs inside autograd,
as ``torch.cuda.make_graphed_callables`` does.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from . import _C, runtime
from ._config import config
from .engine import deferred, index_checks

__all__ = ["TPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]


class CaptureError(RuntimeError):
    """An operation that cannot happen while a tpu graph is being captured."""


class TPUGraph:
    """A captured sequence of tpu work (see the module docstring). ``torch.cuda.CUDAGraph``'s
    methods; ``pool``, ``capture_error_mode`` and debug dumps have no meaning here (PJRT owns the
    device memory) and are accepted or refused as noted."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._fused: Any = None
        self._args: list[tuple] = []
        self._buffer_refs: list[weakref.ref] | None = None  # (see _compile)
        self._outputs: list[list[weakref.ref]] = []  # per program result: the storages it is written to
        self._device = 0
        self._empty = False
        self._mode: tuple[bool, bool] = (False, False)  # config's (defer_and_fuse, launch_blocking) before

    # -- capture ---------------------------------------------------------------------------------
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Begin capturing (``torch.tpu.graph`` calls this): what was launched or recorded before
        runs first, then every tpu op is recorded, not run."""
        if deferred.capturing is not None:
            raise CaptureError("torchtpu: a tpu graph is already being captured (captures do not nest)")
        if self._fused is not None or self._empty:
            raise CaptureError("torchtpu: this TPUGraph was captured already; call reset() to capture again")
        torch.tpu.synchronize()  # the graph reads values: they exist before it begins
        index_checks.ready_for_capture(torch.device("tpu", torch.tpu.current_device()))
        with deferred._lock:
            deferred._reset_history()
            deferred.capturing = self
        # recorded in every eager mode: Debug mode (launch_blocking) runs ops one by one otherwise;
        # its replays wait for the device instead
        self._mode = (config.defer_and_fuse, config.launch_blocking)
        config.defer_and_fuse, config.launch_blocking = True, False

    def capture_end(self) -> None:
        """End the capture: compile the captured graph as one program (not run)."""
        if deferred.capturing is not self:
            raise CaptureError("torchtpu: capture_end() without this graph's capture_begin()")
        g, live, holders = self._leave()
        if not live:
            deferred._release(g)
            self._empty = True
            return
        why = "it is written by a captured tpu graph that has not been replayed yet"
        try:
            self._compile(g, live, holders)
        except Exception as e:
            why = f"the tpu graph capture that writes it failed ({type(e).__name__}: {e})"
            raise
        finally:
            _settle(g.args, live, holders, why)
            deferred._release(g)

    def abandon(self, cause: BaseException) -> None:
        """End a capture whose block raised: nothing is compiled (``torch.tpu.graph`` calls this)."""
        g, live, holders = self._leave()
        _settle(g.args, live, holders, f"the tpu graph capture that writes it raised ({type(cause).__name__})")
        deferred._release(g)

    def _leave(self) -> tuple[Any, list[tuple[int, int]], dict]:
        """Leave capture mode: the captured graph, its live outputs and their storages."""
        with deferred._lock:
            g = deferred._graph
            deferred._graph = deferred._Graph()
            deferred.capturing = None
            deferred._reset_history()
            deferred._since_sync = 0
        config.defer_and_fuse, config.launch_blocking = self._mode
        live, holders = deferred._live_outputs(g, g.touched) if g.nodes else ([], {})
        return g, live, holders

    def _compile(self, g: Any, live: list[tuple[int, int]], holders: dict) -> None:
        args = list(g.args)
        freed = [a for a in args if a[0] == "buf" and a[2]() is None]
        if freed:
            raise CaptureError(
                "torchtpu: the captured ops read a tensor that was freed before the capture ended (gradients "
                "set to None inside the capture, for instance): a replay would have nothing to read. Free it "
                "before the capture begins (optimizer.zero_grad(set_to_none=True) before `with torch.tpu.graph`), "
                "or keep it alive")
        key = deferred.graph_key(g, live)
        fused = deferred.fused_program(g, live, key, deferred._cache.get(key), f"the captured graph ({len(g.nodes)} ops)")
        # the arguments without their capture-time buffers (a replay reads the storages' current
        # ones; holding these would keep a copy of every parameter and optimizer state alive)
        self._args = [("buf", None, a[2]) if a[0] == "buf" else a for a in args]
        self._fused, self._device = fused, g.nodes[0].device
        self._outputs = [[weakref.ref(s) for s, _ in holders[k]] for k in live]
        # per program parameter of its own (in order), the storage's weak reference where it is a
        # buffer: a replay reads those storages' current buffers and nothing else of the arguments
        own = [self._args[i] for i in fused.layout.own]
        self._buffer_refs = [a[2] for a in own] if all(a[0] == "buf" for a in own) else None

    def refuse(self, what: str) -> None:
        """Raise for an operation that cannot happen inside the capture (deferred.flush calls it)."""
        raise CaptureError(f"torchtpu: {what} is not permitted while a tpu graph is being captured "
                           "(torch.tpu.graph): nothing runs during a capture; read results after a replay")

    # -- replay ----------------------------------------------------------------------------------
    def replay(self) -> None:
        """Run the captured program once on the captured tensors' current values (asynchronous)."""
        global _replaying
        _replaying = self
        try:
            torch.ops.torchtpu.graph_replay()  # an op: the profiler gives the program's device time to it
        finally:
            _replaying = None

    def _replay(self) -> None:
        if deferred.capturing is not None:
            raise CaptureError("torchtpu: replay() while a tpu graph is being captured")
        if self._empty:
            return
        if self._fused is None:
            raise CaptureError("torchtpu: replay() before the graph was captured")
        if deferred.has_pending():  # recorded work first: it may write what the graph reads
            deferred.flush()
        fused, device = self._fused, self._device
        with runtime.batched_destroys():  # the ~30 buffers a replay replaces: off this thread
            with deferred._lock:
                if self._buffer_refs is not None:  # every parameter a tensor's buffer (no seed)
                    buffers = self._current_buffers()
                    if fused.layout.packed:
                        deferred.append_packed_scalars(fused, self._args, device, buffers)
                    outs = deferred.launch_fused(fused, buffers, device)
                else:
                    outs = deferred.run_fused(fused, self._current_args(), device)
            attr = deferred._ATTR
            for refs, buf in zip(self._outputs, outs):
                for ref in refs:
                    s = ref()
                    if s is not None:
                        setattr(s, attr, buf)
        if config.launch_blocking:  # Debug mode: synchronous, device errors surface here
            torch.tpu.synchronize()

    def _current_buffers(self) -> list:
        """The buffers the captured tensors hold now, one per program parameter of its own."""
        # (natively: None where a storage was freed or holds no Buffer, e.g. a Pending)
        buffers = _C._weak_buffers(self._buffer_refs, runtime.Buffer)
        if buffers is None:
            args = self._current_args()  # raises, naming what is wrong
            return [args[i][1] for i in self._fused.layout.own]
        return buffers

    def _current_args(self) -> list[tuple]:
        """The captured arguments with the tensors' current buffers and a new seed per random draw."""
        args = []
        for a in self._args:
            kind = a[0]
            if kind == "buf":
                s = a[2]()
                buf = None if s is None else getattr(s, deferred._ATTR, None)
                if buf is None or buf.__class__ is deferred.Pending:
                    why = "was freed" if s is None else "holds no value"
                    raise CaptureError(f"torchtpu: a tensor the captured tpu graph reads {why}: keep the "
                                       "tensors a capture reads alive and filled while it is replayed")
                args.append(("buf", buf, a[2]))
            elif kind == "seed":
                args.append(("seed", _C._next_seed(_C._default_generator(self._device))))
            else:
                args.append(a)
        return args

    def reset(self) -> None:
        """Drop the captured program; the graph may be captured again."""
        self._fused, self._args, self._outputs, self._empty = None, [], [], False
        self._buffer_refs = None

    def pool(self) -> tuple[int, int]:
        """A memory-pool handle, as CUDA graphs share pools: PJRT owns tpu memory, so it is opaque."""
        return graph_pool_handle()

    def enable_debug_mode(self) -> None:
        raise NotImplementedError("torchtpu: TPUGraph has no debug dump (the captured program is one XLA "
                                  "program; torch.profiler shows its replays' device time)")

    def debug_dump(self, debug_path: str) -> None:
        self.enable_debug_mode()


# TPUGraph.replay runs as an op, so that torch.profiler shows "torchtpu::graph_replay" with the
# program's device time (Kineto correlates device events with ops, not with Python scopes)
_replaying: TPUGraph | None = None
_lib = torch.library.Library("torchtpu", "FRAGMENT")
_lib.define("graph_replay() -> ()")
_lib.impl("graph_replay", lambda: _replaying._replay(), "CompositeExplicitAutograd")


class graph:
    """``with torch.tpu.graph(g):`` captures the block into ``g`` (``torch.cuda.graph``'s
    signature; ``pool`` and ``stream`` are accepted and have no effect: one device queue, PJRT's
    memory)."""

    def __init__(self, tpu_graph: TPUGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global") -> None:
        self.tpu_graph = tpu_graph

    def __enter__(self) -> None:
        self.tpu_graph.capture_begin()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.tpu_graph.capture_end()
        elif deferred.capturing is self.tpu_graph:
            self.tpu_graph.abandon(exc)  # the block raised: what it recorded never runs


def _settle(args: list[tuple], live: list[tuple[int, int]], holders: dict, why: str) -> None:
    """Nothing ran at the capture: each storage the captured graph wrote goes back to the buffer
    it held before, where the graph read it (a parameter updated in place); one it only wrote (a new
    tensor, a tensor overwritten without being read) has no value until a replay, and a read of it
    says ``why``."""
    before = {id(s): a[1] for a in args if a[0] == "buf" and (s := a[2]()) is not None}
    for k in live:
        for s, pending in holders[k]:
            buf = before.get(id(s))
            if buf is not None:
                setattr(s, deferred._ATTR, buf)
            else:
                deferred._failed[pending] = why


def graph_pool_handle() -> tuple[int, int]:
    """An opaque pool handle (``torch.cuda.graph_pool_handle``): tpu memory is PJRT's, not pooled."""
    return (0, 0)


def is_current_stream_capturing() -> bool:
    """Whether a tpu graph is being captured now."""
    return deferred.capturing is not None


def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: Any = None) -> Any:
    """``torch.cuda.make_graphed_callables`` for tpu: each callable (a function or an ``nn.Module``)
    becomes one whose forward replays a captured forward graph and whose backward replays a captured
    backward graph, inside autograd (the rest of the model runs as usual around it).

    ``sample_args`` (a tuple of tensors per callable) are the static inputs; each call copies its
    arguments into them. As on CUDA: the warm-up iterations run the callable and its backward
    ``num_warmup_iters`` times; a module's training-mode forward is graphed, its eval-mode forward
    is its own; a module must not have hooks. Unlike CUDA, the captured forward is replayed once
    before the backward is captured (a tpu capture reads values, and the forward's had none yet):
    one more forward of the kind the warm-up runs (batch-norm statistics, for instance, move once
    more)."""
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    graphed = tuple(_graph_callable(f, tuple(args), num_warmup_iters, allow_unused_input)
                    for f, args in zip(callables, sample_args))
    return graphed[0] if just_one else graphed


def _graph_callable(func: Any, sample_args: tuple, warmup: int, allow_unused: bool) -> Any:
    from torch.utils._pytree import tree_flatten, tree_unflatten

    module = func if isinstance(func, torch.nn.Module) else None
    if module is not None and (module._backward_hooks or module._forward_hooks or module._forward_pre_hooks):
        raise RuntimeError("torchtpu: make_graphed_callables: a module with hooks cannot be graphed "
                           "(the hooks would not run in a replay)")
    params = tuple(p for p in module.parameters() if p.requires_grad) if module is not None else ()
    static_inputs = sample_args + params
    if not all(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in static_inputs):
        raise TypeError("torchtpu: make_graphed_callables takes tpu tensors as sample arguments")
    wrt = [t for t in static_inputs if t.requires_grad]

    def grads_of(outputs: list[torch.Tensor], grad_outputs: list[torch.Tensor], retain: bool = False) -> tuple:
        return torch.autograd.grad(outputs, wrt, grad_outputs=grad_outputs, allow_unused=allow_unused,
                                   retain_graph=retain)

    for _ in range(warmup):
        outs = [o for o in tree_flatten(func(*sample_args))[0] if o.requires_grad]
        grads_of(outs, [torch.ones_like(o) for o in outs])
    del outs
    forward_graph = TPUGraph()
    with graph(forward_graph):
        static_outputs = func(*sample_args)
    flat_outputs, spec = tree_flatten(static_outputs)
    forward_graph.replay()  # the backward's capture reads the forward's values (see the docstring)
    differentiable = [o for o in flat_outputs if o.requires_grad]
    # real buffers (zeros), not empty_like's uninitialized storages: the capture reads them, so a
    # replay reads what backward copies in
    static_grad_outputs = [torch.zeros_like(o) for o in differentiable]
    backward_graph = TPUGraph()
    with graph(backward_graph):
        # the forward's saved tensors stay alive (retained): every backward replay reads them, as the
        # forward's replays write them (CUDA keeps their memory in the graphs' pool instead)
        static_grads = grads_of(differentiable, static_grad_outputs, retain=True)
    needs_grad = [t.requires_grad for t in static_inputs]
    n_args = len(sample_args)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> tuple:
            for static, given in zip(static_inputs[:n_args], inputs[:n_args]):
                if static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            forward_graph.replay()
            return tuple(o.detach() for o in flat_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
            given = iter(g for g, o in zip(grads, flat_outputs) if o.requires_grad)
            for static, g in zip(static_grad_outputs, given):
                if g is None:
                    static.zero_()
                elif static.data_ptr() != g.data_ptr():
                    static.copy_(g)
            backward_graph.replay()
            out = iter(static_grads)
            return tuple((None if (g := next(out)) is None else g.detach()) if rg else None for rg in needs_grad)

    def graphed_call(*args: torch.Tensor) -> Any:
        return tree_unflatten(list(Graphed.apply(*args, *params)), spec)

    if module is None:
        return graphed_call
    eager_forward = module.forward
    training = module.training

    def forward(*args: torch.Tensor) -> Any:
        return graphed_call(*args) if module.training == training else eager_forward(*args)

    module.forward = forward
    return module


def _check_capturable(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """As CUDA's capture health check: a step under capture must keep its step count on the
    device (``capturable=True``), or every replay would use the capture's bias corrections."""
    if deferred.capturing is None or torch.compiler.is_compiling():
        return
    if "capturable" in optimizer.defaults and not all(g.get("capturable") for g in optimizer.param_groups):
        raise CaptureError(f"torchtpu: capture of {type(optimizer).__name__}.step() in a tpu graph needs "
                           "capturable=True in every param group (its step count then lives on the device; "
                           "with capturable=False each replay would repeat the captured step's bias corrections)")


def install() -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_check_capturable)
