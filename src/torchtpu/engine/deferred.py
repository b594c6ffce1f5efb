"""DeferAndFuse eager mode: record ops, run them as one program at a read.

Each op is recorded as a node (its cache key, argument specs and concrete
runtime inputs); the tensors it returns get storages whose data is a
:class:`Pending` value instead of a buffer. At a materialization point (a
host read, ``torch.tpu.synchronize()``, a mode switch, or the graph reaching
its size limit) the recorded nodes are emitted into ONE StableHLO module with
the same per-op emitter Strict mode uses. Only values still held by live
storages become outputs (liveness): dead intermediates are never
materialized. The fused program is cached by the graph's structure (op keys
and wiring, never object identities), so the same training step hits the
cache on the next iteration.

Graphs are also cut every CHUNK_NODES ops counted from the last read, so the
device runs one chunk while the host records the next (early launch).

A graph cut without a read (the repeated-ops heuristic, chunking, the size limit) whose
program is not cached yet compiles on a background thread: recording goes on
meanwhile, the next graph takes the cut graph's results as arguments ("later"
arguments, typed by their Pendings), and the cut graphs launch in order once
their programs are ready: a cut launches those already compiled, a read waits
for all. A cut never waits for an earlier cut's compile, so the programs of a
first step's chunks compile side by side on ``TORCH_TPU_COMPILE_THREADS``
threads (one TPU compile of even a small program takes ~1.3 s, and a process
compiles several at once: 5x faster with 8 threads, measured on the v5e).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import _C, _device_state
from .. import storage as st
from .._config import config
from ..lowering.builder import Builder, Value
from ..lowering.views import dense_buffer_shape
from ..runtime import env
from . import compile_cache, executor
from .bounded import BoundedCache
from .opplan import _MISSING

MAX_NODES = 4096
# Repeated-ops heuristic: once the ops recorded since the last read end in two copies of the
# same sequence (successive steps or blocks, at least MIN_PERIOD ops long), the graph is cut,
# and from then on a graph is cut each time one such period has been recorded, so each period
# compiles once and is reused, and graphs never grow unbounded. Repeats are sought across
# chunk cuts (a training step is longer than a chunk). (After each recorded node, in
# csrc/defer.cpp: _C._after_record reads the settings below, and _since_sync, _period and
# the history, from this module.)
MIN_PERIOD = 8
# graphs cut at a shorter period hold this many ops at least (whole periods): a flush and launch cost
# about as much as recording 10-20 ops on the host; on a device-bound step each launch also ends a fusion
MIN_CUT_NODES = int(env.read("TORCH_TPU_DEFER_MIN_CUT_NODES"))
# Early launch: a graph is also cut every CHUNK_NODES ops counted from the last
# read (or period cut), so the device runs one chunk while the host records the
# next instead of idling until the read. Counting from a read keeps the cut
# points, hence the cached programs, the same every training step. 0 disables.
CHUNK_NODES = int(env.read("TORCH_TPU_DEFER_CHUNK_NODES"))


class Pending:
    """A storage's buffer that a recorded node will produce."""

    __slots__ = ("__weakref__", "dtype", "graph", "index", "node", "resolved", "shape", "torch_dtype")

    def __init__(self, graph: _Graph, node: int, index: int, shape: tuple[int, ...], dtype: torch.dtype,
                 np_dtype: np.dtype) -> None:
        self.graph = graph
        self.resolved: Any = None  # the Buffer, once a background-compiled graph has launched
        self.node = node
        self.index = index
        self.shape = shape  # the buffer's, as runtime.Buffer.shape (part of cache keys)
        self.torch_dtype = dtype
        self.dtype = np_dtype  # same interface as runtime.Buffer for cache keys


class _Node:
    """One recorded op: what varies per call. What its op key fixes is in ``info``."""

    __slots__ = ("device", "info", "inputs", "where")

    def __init__(self, info: _OpInfo, inputs: list, device: int, where: str) -> None:
        self.info = info
        # per collected input: ("buf", Buffer, storage ref) | ("pending", Pending) | ("uninit",)
        # | ("later", Pending, storage ref) | ("scalar", v, dt) | ("host", ndarray) | ("seed", int)
        self.inputs = inputs
        self.device = device
        # The user's source line that issued the op, for errors raised when the fused program
        # is emitted. Empty for an op whose key has been emitted before: it cannot raise then.
        self.where = where


@dataclass(slots=True)  # slots: the native record reads its fields by offset (csrc/record.cpp)
class _Graph:
    nodes: list[_Node] = field(default_factory=list)
    touched: list[weakref.ref] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # op key ids (see _OpInfo)
    # Built while recording (flush then only looks up the program): the program's
    # arguments, id(Buffer) -> argument position (a buffer read twice is one argument),
    # and per node (key id, wires), a wire being ("p", node, output) for a value of this
    # graph, ("a", position) for an argument, or ("u",) for an uninitialized storage.
    args: list[tuple] = field(default_factory=list)
    arg_of: dict[int, int] = field(default_factory=dict)
    wiring: list[tuple] = field(default_factory=list)
    has_later: bool = False  # reads results of a cut graph still compiling (see _rewire)
    in_flight: bool = False  # cut, its program compiling in the background


@dataclass
class _InFlight:
    """A cut graph waiting for its program: launched by the next flush."""

    future: Future
    key: _C.OpKey  # the graph's key
    args: list[tuple]
    device: int
    # per live output: the (storage, Pending) pairs it must be bound to, the storages held weakly:
    # a storage freed before the launch makes its argument of a later graph dead (donated), as
    # it would be had this graph launched at once (the same program either way)
    bindings: dict[tuple[int, int], list[tuple[weakref.ref, Pending]]]

    def held(self) -> dict[tuple[int, int], list[tuple[Any, Pending]]]:
        """The bindings to make at launch; a freed storage is None (its Pending still resolves)."""
        return {k: [(ref(), p) for ref, p in pairs] for k, pairs in self.bindings.items()}


@dataclass
class _Fused:
    executable: Any
    live: list[tuple[int, int]]
    layout: _ParamLayout
    donate: list[int] = field(default_factory=list)  # parameter positions whose buffers XLA may reuse
    aliases: list[tuple[int, int]] = field(default_factory=list)  # (argument, index into live) per donation
    # per packed scalar dtype: (values' exact key, device, device vector) of the last launch. A step
    # passes the same values most of the time (eps, scales, alpha; not Adam's bias corrections),
    # and a packed vector is never donated, so an unchanged one is reused instead of copied again.
    packed_last: list[tuple[_C.OpKey, int, Any] | None] = field(init=False)

    def __post_init__(self) -> None:
        self.packed_last = [None] * len(self.layout.packed)


@dataclass
class _ParamLayout:
    """How a graph's arguments become its program's parameters.

    Each non-scalar argument (a buffer, a host value, an RNG seed) is one parameter, in
    argument order; the runtime scalars of each dtype travel packed in one vector
    parameter after them. An optimizer step passes ~100 scalars (learning rates, bias
    corrections that change every step): one host-to-device copy per dtype instead of
    one device buffer per scalar.
    """

    own: list[int]  # argument positions passed as parameters of their own
    packed: list[tuple[torch.dtype, list[int]]]  # per scalar dtype: the argument positions it packs
    param_of: dict[int, int]  # argument position -> parameter position, for the own ones

    @staticmethod
    def of(args: list[tuple]) -> _ParamLayout:
        own: list[int] = []
        packed: dict[torch.dtype, list[int]] = {}
        for i, a in enumerate(args):
            if a[0] == "scalar":
                packed.setdefault(a[2], []).append(i)
            else:
                own.append(i)
        return _ParamLayout(own, list(packed.items()), {i: n for n, i in enumerate(own)})


_ATTR = st._ATTR
_new_tensor = executor._new_tensor
_lock = threading.RLock()
_graph = _Graph()
# Called at the start of every flush that is not a cut (a materialization point): Strict mode's
# step recording ends there (step_recording._ended).
on_materialize: Any = None
_in_flight: deque[_InFlight] = deque()
# The torch.tpu.TPUGraph capturing now (graphs.py), if one is: every op is recorded into one graph,
# which capture_end compiles without running it; cuts do nothing and a read is refused.
capturing: Any = None
# graph key -> its program's compile, submitted and not yet launched: the same graph cut again
# meanwhile (the next step, while the first step's programs still compile) waits on it instead of
# compiling again
_compiling: dict[_C.OpKey, Future] = {}
_unreported: list[Exception] = []  # a cut graph's failure, raised at the next read (see _launch_in_flight)
_compiler: ThreadPoolExecutor | None = None
_stats_lock = threading.Lock()
_cache: dict[_C.OpKey, _Fused] = BoundedCache()  # graph key -> its fused program (bounded: engine/bounded.py)
_period: list[int] | None = None
_since_sync = 0  # ops recorded since the last read or period cut (see CHUNK_NODES)
# The op keys recorded since the last read or period cut, across chunk cuts (where repeats are
# sought), each key's positions in it, and whether they are a prefix of the period so far.
_history: list[int] = []
_history_occurrences: dict[int, list[int]] = {}
_on_period = True
stats = {"flushes": 0, "nodes": 0, "compiles": 0, "hits": 0, "period_cuts": 0, "background_compiles": 0}


_OUR_PATHS = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))
_is_ours: dict[Any, bool] = {}  # code object -> whether it lives in torch or torchtpu


def _user_line() -> str:
    """'file:line' of the innermost frame outside torch and torchtpu (cheap: no traceback objects)."""
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        ours = _is_ours.get(code)
        if ours is None:
            ours = _is_ours[code] = code.co_filename.startswith(_OUR_PATHS)
        if not ours:
            return f"{code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


def _strip(v: Any) -> Any:
    """Argument values without tensors or generators: an op's info must not keep them alive."""
    if isinstance(v, (torch.Tensor, torch.Generator)):
        return None
    if isinstance(v, (list, tuple)):
        return [_strip(x) for x in v]
    return v


class _OpInfo:
    """What recording and emitting need about one op cache key, computed once per key.

    The key fixes the op, its argument specs, storage keys and output metas, so a
    recorded node only carries its runtime inputs. ``key_id`` stands for the key
    in graph keys: hashing and comparing the nested key tuples at every flush and
    repeat check cost more than the recording itself.
    """

    __slots__ = ("emitted", "func_args", "key", "key_id", "layouts", "metas", "plan", "skeys", "specs", "values",
                 "written")

    def __init__(self, key_id: int, plan: Any, values: list[Any], specs: list, skeys: tuple, key: _C.OpKey) -> None:
        self.key_id = key_id
        self.plan = plan
        self.specs = specs
        self.values = _strip(values)  # the schema values without tensors, for emission
        self.skeys = skeys
        self.key = key
        self.metas, self.func_args = executor.meta_for(plan, values, specs, key)
        self.emitted = False  # emitted into a program once: emitting it again cannot raise
        # per returned new tensor: (shape, stride, dtype, numpy dtype, buffer shape), or None for an
        # absent output
        self.layouts: list[tuple | None] = []
        # per storage an in-place op writes: (slot, buffer shape, dtype, numpy dtype)
        self.written: list[tuple] = []
        if not plan.mutated:
            for m in self.metas:
                if m is None:
                    self.layouts.append(None)
                    continue
                shape = tuple(m.shape)
                stride = tuple(m.stride()) if executor.is_dense_permutation(m.shape, m.stride()) else \
                    tuple(executor.contiguous_strides(m.shape))
                self.layouts.append((shape, stride, m.dtype, st.TORCH_TO_NUMPY[m.dtype],
                                     dense_buffer_shape(shape, stride)))
            return
        for slot, views in executor.written_views(plan, specs, self.metas).items():
            sk = skeys[slot]
            self.written.append((slot, executor.store_shape(sk, views), sk[2], st.TORCH_TO_NUMPY[sk[2]]))


_op_info: dict[_C.OpKey, _OpInfo] = {}  # op key -> what recording needs about it


def record(plan: Any, values: list[Any], specs: list, skeys: tuple, col: Any, key: _C.OpKey) -> Any:
    """Record one op; returns what the op returns, with pending storages."""
    with _lock:
        info = _op_info.get(key)
        if info is None:
            info = _op_info[key] = _OpInfo(len(_op_info), plan, values, specs, skeys, key)
            _C._remember_op_info(key, info)  # for the native record of its next calls (csrc/defer.cpp)
        g = _graph
        node_index = len(g.nodes)
        device = col.device or 0
        layouts = None if plan.mutated else info.layouts
        new_tensors = None
        try:
            if _native_record and info.emitted:
                # recorded natively, node included (it needs no source line); None: an RNG seed
                new_tensors = _record_node(g, info, col, layouts, node_index, device)
            if new_tensors is None:
                io = _record_io(g, col, layouts, info.written, node_index, device) \
                    if _native_record and not info.emitted else None
                if io is None:  # an RNG seed among the inputs (or the native path switched off)
                    io = _record_io_python(g, col, layouts, info.written, node_index, device)
                inputs, wires, new_tensors = io
                _add_node(g, info, inputs, wires, device)
        except AssertionError:
            # the recorders refuse a Pending of an older graph; one whose graph failed is the
            # user's to hear about (the failure's text), not an internal error
            _raise_if_an_input_failed(col)
            raise
        # the repeated-ops heuristic and chunk cuts (csrc/defer.cpp)
        _C._after_record(g, node_index)
    return executor.op_result(plan, values, new_tensors)


def _add_node(g: _Graph, info: _OpInfo, inputs: list[tuple], wires: tuple, device: int) -> None:
    """Append a node recorded in Python (its inputs and wires already in ``g``)."""
    g.wiring.append((info.key_id, wires))
    g.nodes.append(_Node(info, inputs, device, "" if info.emitted else _user_line()))
    g.keys.append(info.key_id)


# op key id -> the masks of a node recorded bucketed (engine/eager_buckets.py), for _emit
_bucket_hooks: dict[int, Any] = {}


def record_bucketed(plan: Any, values: list[Any], specs: list, skeys: tuple, col: Any, key: _C.OpKey, hook: Any,
                    shapes: list[tuple[int, ...] | None]) -> list[torch.Tensor | None]:
    """Record a bucketed call (eager_buckets.try_record): as ``record``, with the bucket specs and
    key, the actual sizes among ``col``'s inputs, and new tensors of the exact ``shapes`` on
    bucket-sized Pendings. Returns the new tensors. Always the Python recorder: the native one
    would give every call the shapes of the key's first (its info is not remembered for the
    native path either, whose lookups are by exact keys)."""
    with _lock:
        info = _op_info.get(key)
        if info is None:
            info = _op_info[key] = _OpInfo(len(_op_info), plan, values, specs, skeys, key)
            _bucket_hooks[info.key_id] = hook
        layouts = [lay if lay is None or shape is None else (shape, *lay[1:]) for lay, shape in zip(info.layouts, shapes)]
        g = _graph
        node_index = len(g.nodes)
        device = col.device or 0
        try:
            inputs, wires, new_tensors = _record_io_python(g, col, layouts, info.written, node_index, device)
            _add_node(g, info, inputs, wires, device)
        except AssertionError:
            _raise_if_an_input_failed(col)
            raise
        _C._after_record(g, node_index)
    return new_tensors


def _record_io_python(g: _Graph, col: Any, layouts: list | None, written: list, node_index: int,
                      device: int) -> tuple[list[tuple], tuple, list[torch.Tensor | None]]:
    """A recorded node's inputs and wires (adding its arguments to the graph), and its
    outputs: new tensors (``layouts``; None for an in-place op) or the written storages,
    each holding a Pending. ``_C._record_io`` does the same natively except for RNG seeds.
    """
    storages = col.storages
    inputs: list[tuple] = []
    for inp in col.inputs:
        kind = inp[0]
        if kind == "storage":
            s = storages[inp[1]]
            buf = getattr(s, _ATTR, None)
            if buf is None:
                a = _UNINIT
            elif buf.__class__ is Pending and buf.graph is g:
                a = ("pending", buf)
            elif buf.__class__ is not Pending:
                a = ("buf", buf, weakref.ref(s))
            elif buf.graph.in_flight:
                # a result of a cut graph still compiling: an argument, bound when it launches
                a = ("later", buf, weakref.ref(s))
                g.has_later = True
            else:  # from an older graph: cannot happen after its flush
                raise AssertionError("stale pending storage")
        elif kind == "scalar":
            a = ("scalar", inp[1], inp[2] or (torch.float64 if col.has_f64 else torch.float32))
        elif kind == "host":
            a = ("host", inp[1])
        else:  # seed
            gen = inp[1] if inp[1] is not None else _C._default_generator(device)
            a = ("seed", _C._next_seed(gen))
        inputs.append(a)
    wires = tuple(_wire(g, a) for a in inputs)
    new_tensors: list[torch.Tensor | None] = []
    k = 0
    touched = g.touched
    if layouts is not None:
        for layout in layouts:
            if layout is None:
                new_tensors.append(None)
                continue
            t, s = _new_tensor(layout[0], layout[1], layout[2], device, _ATTR,
                               Pending(g, node_index, k, layout[4], layout[2], layout[3]))
            touched.append(weakref.ref(s))
            new_tensors.append(t)
            k += 1
    else:
        for slot, shape, dtype, np_dtype in written:
            s = storages[slot]
            setattr(s, _ATTR, Pending(g, node_index, k, shape, dtype, np_dtype))
            touched.append(weakref.ref(s))
            k += 1
    return inputs, wires, new_tensors


def has_pending() -> bool:
    return bool(_graph.nodes) or bool(_in_flight)


def _launch_in_flight(wait: bool = True) -> None:
    """Launch the cut graphs, oldest first, as their programs become ready: all of them
    (``wait``), or those whose programs are ready, up to the first still compiling.

    A graph whose program failed to compile or launch, or that reads a result of one that did,
    never runs: its values say why when read (failure_of), and the next read or
    synchronization raises the error (``_unreported``); the graphs after it still run."""
    while _in_flight:
        f = _in_flight[0]
        if not wait and not f.future.done():
            return
        _in_flight.popleft()
        if _compiling.get(f.key) is f.future:
            del _compiling[f.key]
        why = _failed_input(f.args)  # the failure it inherits (already reported), if any
        if why is None:
            try:
                fused = f.future.result()
                _cache[f.key] = fused
                _launch(fused, f.args, f.device, f.held())
                continue
            except Exception as e:  # noqa: BLE001  (kept for the next read)
                why = f"{type(e).__name__}: {e}"
                if not _unreported:
                    _unreported.append(e.with_traceback(None))  # (its frames would hold this graph)
            except BaseException as e:  # an interrupt while waiting: the graph is dropped, so say why
                _mark_failed(f.bindings, f"{type(e).__name__}: {e}")
                raise
        _mark_failed(f.bindings, why)


def _mark_failed(bindings: dict[tuple[int, int], list[tuple[Any, Pending]]], why: str) -> None:
    """A graph's values will never exist: a later read of one says why (see failure_of)."""
    for pairs in bindings.values():
        for _, pending in pairs:
            _failed[pending] = why


def _failed_input(args: list[tuple]) -> str | None:
    """Why a result of a cut graph that this graph reads was never computed, if one was not."""
    for a in args:
        if a[0] == "later":
            why = _failed.get(a[1])
            if why is not None:
                return why
    return None


def _raise_unreported() -> None:
    """At a read or synchronization: the first failure of a cut graph since the last one."""
    if _unreported:
        e = _unreported.pop()
        raise e


def _unresolved_later(args: list[tuple]) -> bool:
    """Whether a graph with these arguments reads a result of a cut graph not launched yet."""
    return any(a[0] == "later" and a[1].resolved is None for a in args)


def _launch(fused: _Fused, args: list[tuple], device: int,
            bindings: dict[tuple[int, int], list[tuple[torch.UntypedStorage, Pending]]]) -> None:
    """Run a fused program and bind each live output to the storages that await it."""
    outs = run_fused(fused, args, device)
    (_bind_outputs if _native_record else _bind_outputs_python)(fused.live, outs, bindings)


def run_fused(fused: _Fused, args: list[tuple], device: int) -> list:
    """Launch a fused program on these arguments (not waited for): its live outputs' buffers."""
    buffers = [_arg_buffer(args[i], device) for i in fused.layout.own]
    if fused.layout.packed:
        append_packed_scalars(fused, args, device, buffers)
    return launch_fused(fused, buffers, device)


def launch_fused(fused: _Fused, buffers: list, device: int) -> list:
    """Launch a fused program on its parameters' buffers (``buffers`` is consumed)."""
    outs = executor.launch(fused.executable, buffers, device, fused.donate)
    buffers.clear()  # (a donated input's Buffer is not kept alive here past the launch)
    return outs


def append_packed_scalars(fused: _Fused, args: list[tuple], device: int, buffers: list) -> None:
    """Append the vectors of the runtime scalars packed per dtype (``_ParamLayout``) to ``buffers``:
    the previous launch's vector again where the values are the same."""
    last = fused.packed_last
    for n, (dtype, members) in enumerate(fused.layout.packed):
        values = [args[i][1] for i in members]
        key = _C._op_key(tuple(values))  # exact: -0.0 is not 0.0, 1 is not 1.0
        hit = last[n]
        if hit is None or hit[1] != device or hit[0] != key:
            vector = _device_state.client().buffer_from_host(
                np.array(values, dtype=st.TORCH_TO_NUMPY[dtype]), device)
            hit = last[n] = (key, device, vector)
        buffers.append(hit[2])


def _live_outputs_python(g: _Graph, touched: list) -> tuple[list[tuple[int, int]], dict]:
    """The graph's live outputs, (node, index) in first-touch order, and per output the
    (storage, Pending) pairs awaiting it. ``_C._live_outputs`` does the same natively."""
    live: list[tuple[int, int]] = []
    holders: dict[tuple[int, int], list[tuple[torch.UntypedStorage, Pending]]] = {}
    seen: set[int] = set()  # a storage written by several nodes is touched more than once
    for ref in touched:
        s = ref()
        if s is None or id(s) in seen:
            continue
        seen.add(id(s))
        v = getattr(s, _ATTR, None)
        if v.__class__ is Pending and v.graph is g:
            k = (v.node, v.index)
            h = holders.get(k)
            if h is None:
                h = holders[k] = []
                live.append(k)
            h.append((s, v))
    return live, holders


def _bind_outputs_python(live: Sequence[tuple[int, int]], outs: list,
                         bindings: dict[tuple[int, int], list[tuple[torch.UntypedStorage, Pending]]]) -> None:
    """Resolve each live output's Pendings to its buffer (``_C._bind_outputs`` natively)."""
    for k, buf in zip(live, outs):
        for storage, pending in bindings[k]:
            pending.resolved = buf
            if getattr(storage, _ATTR, None) is pending:  # not overwritten by a newer graph
                setattr(storage, _ATTR, buf)


def flush(cut: bool = False) -> None:
    """Materialize every recorded node that a live tensor still needs.

    ``cut``: the graph is cut without a read, so an uncached program may compile
    in the background (see the module docstring).
    """
    global _graph, _since_sync
    if capturing is not None:  # a torch.tpu.graph capture: one graph, nothing runs (graphs.py)
        if cut:
            return
        capturing.refuse("a read or synchronization")
    if not cut and on_materialize is not None:
        on_materialize()
    with _lock:
        if not cut:
            _since_sync = 0
            _reset_history()
        _launch_in_flight(wait=not cut)
        g = _graph
        if not g.nodes:
            if not cut:
                _raise_unreported()
            return
        _graph = _Graph()
        stats["flushes"] += 1
        stats["nodes"] += len(g.nodes)
        live, holders = (_live_outputs if _native_record else _live_outputs_python)(g, g.touched)
        if not live:
            _release(g)
            if not cut:
                _raise_unreported()
            return
        failed = _failed_input(g.args) if g.has_later and not cut else None
        if failed is not None:  # it reads a result of a cut graph that failed: it cannot run either
            _mark_failed(holders, failed)
            del holders
            _release(g)
            _raise_unreported()
            raise never_computed(failed)
        if g.has_later and not (cut and _unresolved_later(g.args)):
            _rewire(g)  # the cut graphs it reads from have launched above
        args = g.args
        key = graph_key(g, live)
        fused = _cache.get(key)
        if cut and (fused is None or _in_flight):  # compiles meanwhile, or waits its turn to launch
            if fused is not None:
                future = Future()
                future.set_result(fused)
            else:
                future = _compiling.get(key)  # the same graph, cut before and still compiling
                if future is None:
                    text, layout, aliases = _emit(g, args, live, key)
                    future = _compiling[key] = _background().submit(_compile_fused, text, live, layout, aliases,
                                                                    _label(g))
                    stats["background_compiles"] += 1
            g.in_flight = True
            weak = {k: [(weakref.ref(st_), p) for st_, p in pairs] for k, pairs in holders.items()}
            _in_flight.append(_InFlight(future, key, args, g.nodes[0].device, weak))
            _release(g)
            return
        try:
            fused = fused_program(g, live, key, fused)
            _launch(fused, args, g.nodes[0].device, holders)
        except BaseException as e:
            # BaseException too: an interrupt in a long compile (Ctrl-C, pytest-timeout's alarm)
            # also leaves the graph's values uncomputed, and an unmarked Pending of a dropped graph
            # fails every later op that reads it as an internal error ("stale pending storage").
            # Only the text is kept: the exception's traceback holds this frame, whose storages
            # hold the Pendings, which would then never be freed.
            _mark_failed(holders, f"{type(e).__name__}: {e}")
            del holders
            _release(g)
            raise
        del args
        _release(g)
        if not cut:
            _raise_unreported()


def graph_key(g: _Graph, live: list[tuple[int, int]]) -> _C.OpKey:
    """The key of a graph's fused program: its wiring, its live outputs and its dead arguments."""
    dead = (_dead_arguments if _native_record else _dead_arguments_python)(g, g.args, live)
    # exact and fast to compare: a step's graph has thousands of wires (see csrc/op_key.cpp)
    return _C._op_key((tuple(g.wiring), tuple(live), dead))


def fused_program(g: _Graph, live: list[tuple[int, int]], key: _C.OpKey, cached: _Fused | None,
                  label: str | None = None) -> _Fused:
    """The graph's fused program: ``cached`` (``_cache``'s entry for ``key``), or emitted and
    compiled now (on this thread) and cached."""
    if cached is not None:
        stats["hits"] += 1
        executor.stats.hits += 1
        return cached
    text, layout, aliases = _emit(g, g.args, live, key)
    fused = _cache[key] = _compile_fused(text, live, layout, aliases, label or _label(g))
    return fused


# Pendings whose graph failed to emit, compile or launch, with the error's text (weakly: they go
# with their storages).
_failed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def failure_of(pending: Pending) -> str | None:
    """The error that stopped the graph producing ``pending``, if one did."""
    return _failed.get(pending)


def never_computed(failure: str) -> RuntimeError:
    """The error for using a tensor whose graph failed (``failure``: that graph's error)."""
    return RuntimeError(f"torchtpu: this tensor's value was never computed: the DeferAndFuse graph that makes "
                        f"it failed ({failure})")


def _raise_if_an_input_failed(col: Any) -> None:
    for inp in col.inputs:
        if inp[0] == "storage":
            buf = getattr(col.storages[inp[1]], _ATTR, None)
            failure = _failed.get(buf) if buf.__class__ is Pending else None
            if failure is not None:
                raise never_computed(failure)


def _release(g: _Graph) -> None:
    """Drop a flushed graph's nodes and arguments.

    Nodes reference Pendings that reference the graph: breaking the cycle frees the
    input buffers now, not at the next garbage collection. The argument list is
    replaced, not cleared: a cut graph waiting for its program still holds it.
    """
    g.nodes.clear()
    g.touched.clear()
    g.args, g.arg_of, g.wiring = [], {}, []


def _wire(g: _Graph, inp: tuple) -> tuple:
    """The wire of one recorded input, adding it to the graph's arguments if it is one."""
    kind = inp[0]
    if kind == "pending":
        return ("p", inp[1].node, inp[1].index)
    if kind == "uninit":
        return _UNINIT_WIRE
    if kind in ("buf", "later"):  # a buffer (or a cut graph's result) read twice is one argument
        pos = g.arg_of.get(id(inp[1]))
        if pos is not None:
            return ("a", pos)
        g.arg_of[id(inp[1])] = len(g.args)
    g.args.append(inp)
    return ("a", len(g.args) - 1)


def _rewire(g: _Graph) -> None:
    """Rebuild a graph's arguments and wiring once the cut graphs it reads have launched.

    Results of such graphs were recorded as "later" arguments; they become the Buffers
    they resolved to, deduplicated like any other buffer argument.
    """
    key_ids = [key_id for key_id, _ in g.wiring]
    g.args, g.arg_of, g.wiring = [], {}, []
    for node, key_id in zip(g.nodes, key_ids):
        node.inputs = [("buf", inp[1].resolved, inp[2]) if inp[0] == "later" else inp for inp in node.inputs]
        g.wiring.append((key_id, tuple(_wire(g, inp) for inp in node.inputs)))
    g.has_later = False


_UNINIT = ("uninit",)
_UNINIT_WIRE = ("u",)
# The native twins of _record_io_python and of the node bookkeeping in record() (csrc/record.cpp);
# tests switch them off to compare.
_C._record_setup(Pending, _Node, _Graph, _OpInfo, executor._Collector, _ATTR, _UNINIT, _UNINIT_WIRE, torch.float32,
                 torch.float64)
_record_io = _C._record_io
_record_node = _C._record_node
_live_outputs = _C._live_outputs
_dead_arguments = _C._dead_arguments
# The per-op fast path of kernels in DeferAndFuse (csrc/defer.cpp): record() and the parts of
# executor.run_plan before it, for op keys recorded before.
_C._defer_setup(sys.modules[__name__], config, _MISSING, executor.defer_fast_eligible)
_bind_outputs = _C._bind_outputs
_native_record = True


def _arg_buffer(a: tuple, device: int) -> Any:
    """The buffer of a non-scalar argument (scalars are packed: see _ParamLayout)."""
    kind = a[0]
    if kind == "buf":
        return a[1]
    if kind == "later":  # a cut graph's result: launched (in order) before any graph reading it
        return a[1].resolved
    client = _device_state.client()
    if kind == "host":
        return client.buffer_from_host(np.ascontiguousarray(a[1]), device)
    return client.buffer_from_host(np.array([a[1], 0], dtype=np.uint64), device)


def _arg_value(b: Builder, a: tuple) -> Value:
    kind = a[0]
    if kind == "buf":
        return b.arg(a[1].shape, st.NUMPY_TO_TORCH[a[1].dtype])
    if kind in ("host", "later"):  # a CPU 0-dim tensor, a bucketed node's actual sizes (a vector), a Pending
        return b.arg(a[1].shape, st.NUMPY_TO_TORCH[a[1].dtype])
    return b.arg((2,), torch.uint64)


def _background() -> ThreadPoolExecutor:
    global _compiler
    if _compiler is None:
        threads = env.read("TORCH_TPU_COMPILE_THREADS") or min(8, os.cpu_count() or 1)
        _compiler = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="torchtpu-compile")
    return _compiler


def _label(g: _Graph) -> str:
    """The program's name on the profiler's device row: the compiled graphs it holds, if any."""
    from . import graph_node  # (it imports graph_runner, which imports this module)

    names = [graph_node.name_of(n.info.values) for n in g.nodes if n.info.plan.op is graph_node.COMPILED_GRAPH]
    if not names:
        return "a fused DeferAndFuse graph"
    return f"the compiled graphs {', '.join(names)} fused with {len(g.nodes) - len(names)} ops"


def _compile_fused(text: str, live: list[tuple[int, int]], layout: _ParamLayout,
                   aliases: list[tuple[int, int]], label: str) -> _Fused:
    start = time.perf_counter()
    exe = compile_cache.compile_program(text, label)
    with _stats_lock:  # compile threads finish side by side
        stats["compiles"] += 1
        executor.stats.misses += 1
        executor.stats.compile_seconds += time.perf_counter() - start
    return _Fused(exe, live, layout, [layout.param_of[i] for i, _ in aliases], aliases)


def _emit(g: _Graph, args: list[tuple], live: list[tuple[int, int]],
          key: _C.OpKey) -> tuple[str, _ParamLayout, list[tuple[int, int]]]:
    """The fused module's text, its parameter layout and its (argument, result) donation pairs."""
    b = Builder()
    layout = _ParamLayout.of(args)
    arg_values: list[Value] = [None] * len(args)  # type: ignore[list-item]
    for i in layout.own:
        arg_values[i] = _arg_value(b, args[i])
    for dtype, members in layout.packed:
        vector = b.arg((len(members),), dtype)
        for k, i in enumerate(members):
            arg_values[i] = b.reshape(b.slice(vector, [k], [k + 1]), ())
    produced: dict[tuple[int, int], Value] = {}
    for ni, (node, (_, wires)) in enumerate(zip(g.nodes, key[0])):
        info = node.info
        skeys = info.skeys
        input_values: list[Any] = []
        storage_vals: dict[int, Value] = {}
        for inp, wire, col_inp in zip(node.inputs, wires, _collected_kinds(node)):
            if wire[0] == "a":
                v = arg_values[wire[1]]
            elif wire[0] == "p":
                v = produced[(wire[1], wire[2])]
            else:
                v = None
            input_values.append(v)
            if col_inp is not None:  # a storage slot
                storage_vals[col_inp] = executor.storage_value(b, v, skeys[col_inp])
        hook = _bucket_hooks.get(info.key_id)
        try:
            # the precision the op was recorded under (part of its key), not the one at the flush
            _, out_values = executor.emit_op(b, info.plan, info.specs, info.values, skeys, input_values,
                                             storage_vals, info.metas, info.func_args, info.key[1],
                                             None if hook is None else hook.arg_hook(b, input_values))
        except Exception as e:
            # Fused errors surface at a read, far from their cause: name the op's own line.
            raise type(e)(f"{e}\n  (torchtpu DeferAndFuse: raised by aten::{info.plan.op.__name__} "
                          f"recorded at {node.where or '<unknown>'})") from e
        for k, v in enumerate(out_values):
            produced[(ni, k)] = v
    results = [produced[k] for k in live]
    aliases = _pair_donations(arg_values, results, key[2])
    for i, j in aliases:
        b.arg_attrs[layout.param_of[i]] = f"tf.aliasing_output = {j} : i32"
    stats["donated"] = stats.get("donated", 0) + len(aliases)
    text = b.module(results, name="fused")
    for node in g.nodes:
        node.info.emitted = True
    return text, layout, aliases


def _dead_arguments_python(g: _Graph, args: list[tuple],
                           live: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """(argument position, index into ``live`` or -1) per buffer argument dead after the graph
    (``_C._dead_arguments`` natively).

    An argument is dead when its storage was freed or overwritten; such inputs may be
    donated, so an optimizer step updates parameters in place. Where the storage now
    holds one of this graph's results (an in-place update), that result's index comes
    along: aliasing the two lets XLA write the update over its own input. Pairing by
    shape alone can cross two same-shaped updates (a weight's and its moment's), and
    XLA then copies both inputs first to keep them readable.
    """
    position = None
    dead = []
    for i, a in enumerate(args):
        if a[0] != "buf" and a[0] != "later":
            continue
        s = a[2]()
        v = getattr(s, _ATTR, None) if s is not None else None
        if v is a[1] or (a[0] == "later" and v is not None and v is a[1].resolved):
            continue  # still holds the argument (a later one's Pending, or the buffer it became)
        j = -1
        if v.__class__ is Pending and v.graph is g:
            if position is None:
                position = {k: n for n, k in enumerate(live)}
            j = position.get((v.node, v.index), -1)
        dead.append((i, j))
    return tuple(dead)


def _pair_donations(arg_values: list[Value], results: list[Value],
                    dead: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """(argument, result) pairs XLA may alias: each dead argument with the result that replaced
    it in its storage, then the remaining dead arguments with any free result of the same type."""
    free = set(range(len(results)))
    pairs: dict[int, int] = {}

    def fits(i: int, j: int) -> bool:
        return results[j].shape == arg_values[i].shape and results[j].dtype == arg_values[i].dtype

    for i, j in dead:
        if j >= 0 and j in free and fits(i, j):
            pairs[i] = j
            free.discard(j)
    for i, _ in dead:
        if i not in pairs:
            match = next((j for j in sorted(free) if fits(i, j)), None)
            if match is not None:
                pairs[i] = match
                free.discard(match)
    return sorted(pairs.items())


def _collected_kinds(node: _Node) -> list[int | None]:
    """For each collected input of a node: its storage slot, or None for non-storage inputs."""
    slots: list[int | None] = []
    k = 0
    for inp in node.inputs:
        if inp[0] in ("buf", "pending", "uninit", "later"):
            slots.append(k)
            k += 1
        else:
            slots.append(None)
    return slots


def cut_before_step() -> None:
    """A training step's first compiled graph is about to be recorded: cut the graph here, and
    count chunks from here. Without a read between steps, chunk cuts counted from the last read
    fell at other ops of each step until its period was found, and each new cut point made a new
    program holding whole graphs (a 12-layer GPT: two windows of ~45 s of compiles)."""
    global _since_sync
    with _lock:
        if _graph.nodes:
            flush(cut=True)
        _since_sync = 0
        _reset_history()  # the steps' cuts are these: repeats found elsewhere would cut again


def _reset_history() -> None:
    global _on_period
    _history.clear()
    _history_occurrences.clear()
    _on_period = True


def cache_clear() -> None:
    global _period
    with _lock:
        _cache.clear()
        _period = None
        _reset_history()
