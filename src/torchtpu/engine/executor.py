"""Strict and Debug eager execution: one ATen call -> one cached XLA executable.

For each call the engine
1. walks the arguments (by schema) into an exact *key* (``_C.OpKey``: typed, so
   2 and 2.0 or 0.0 and -0.0 never share a program) plus the list of runtime
   inputs: whole storage buffers, runtime scalars, RNG seeds;
2. on a cache miss, infers output metadata with PyTorch's meta kernels (which
   also raise PyTorch's own errors for bad input), builds the StableHLO program
   (view prologues, the lowering, write-backs) and compiles it;
3. launches the executable asynchronously and binds the output buffers to new
   tensors' storages, or rebinds the storages written by in-place / out= ops.
"""

from __future__ import annotations

import math
import re
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _C, _device_state
from .. import storage as st
from .._config import config
from ..lowering import registry
from ..lowering.builder import Builder, Value
from ..lowering.views import (
    ViewSpec,
    contiguous_strides,
    dense_bytes,
    dense_to_storage,
    fit,
    flat,
    is_contiguous,
    is_dense_permutation,
    raise_if_overlapping,
    read_view,
    write_views,
)
from ..runtime import Buffer, release_donated
from . import compile_cache, device_trace, index_checks
from . import eager_buckets as _eager_buckets
from . import precision as precision_mod
from .bounded import BoundedCache
from .opplan import OpPlan, call_op, normalize_args, plan_for

_FLOAT_KIND = torch.float32


class CompileStats:
    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.graph_misses = 0  # of which: torch.compile graph variants
        self.compile_seconds = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"hits": self.hits, "misses": self.misses, "graph_misses": self.graph_misses,
                "compile_seconds": self.compile_seconds}


stats = CompileStats()


@dataclass
class Entry:
    executable: Any
    # per output buffer: ("new", dtype, shape, stride) or ("store", storage_slot)
    outputs: list[tuple]
    # per op return: see OpPlan.returns; "new" indices point into new tensors
    result_metas: list[Any]
    # argument positions donated to the outputs that replace them (in-place writes)
    donate: tuple[int, ...] = ()


_cache: dict[_C.OpKey, Entry] = BoundedCache()  # op key -> its program (the oldest dropped past a bound)
_cache_lock = threading.Lock()
# device index -> an output of its latest launch, held until synchronize(). A device runs its
# launches in order (PJRT's CPU client queues them: a tiny program launched behind a 130 ms one
# is ready when that one is; GPU and TPU plugins use one compute stream), so waiting for the
# latest launch waits for all of them, those whose outputs were all dropped included: the
# timing loop ``for _ in range(n): f(x)`` then ``synchronize()`` keeps no output at all.
_latest: dict[int, Any] = {}
# A launch that donates buffers deletes them, and the buffer _latest holds may be among them
# (the next op of any thread updating that tensor in place): a wait on it then fails ("called on
# deleted or donated buffer"; eight threads of the TPU conformance sweep met it six times). So a
# donating launch swaps _latest under this lock, and a waiter takes its ready event under it.
# Re-entrant: code run inside a launch on its thread (a hook around execute, as bench/step_profile.py's
# meter, waiting for the device) may synchronize.
_latest_lock = threading.RLock()


# ---------------------------------------------------------------------------
# argument walking
# ---------------------------------------------------------------------------
_TPU_INDEX: dict[torch.device, int] = {}  # tpu device -> index (reading device.type costs ~0.7 us)
_F64, _C128 = torch.float64, torch.complex128


class _Collector:
    __slots__ = ("device", "has_f64", "inputs", "skeys", "storage_index", "storages")

    def __init__(self) -> None:
        self.storages: list[torch.UntypedStorage] = []
        # per storage: ("B", buffer shape, buffer dtype, storage numel), or ("U", numel, dtype)
        # when it has no buffer yet (uninitialized)
        self.skeys: list[tuple] = []
        self.storage_index: dict[int, int] = {}
        self.inputs: list[tuple] = []  # ("storage", k) | ("host", ndarray)
        self.device: int | None = None
        self.has_f64 = False

    def tensor(self, t: torch.Tensor) -> tuple:
        dev = t.device
        idx = _TPU_INDEX.get(dev)
        if idx is None and dev.type == "tpu":
            idx = _TPU_INDEX[dev] = dev.index or 0
        if idx is None:
            if t.dim() == 0 and dev.type == "cpu":
                slot = len(self.inputs)
                # copied: DeferAndFuse reads it when the graph runs, after the caller may have
                # changed it in place (an LR scheduler's tensor lr; regression: fused SGD and
                # Adagrad with a tensor lr stepped with the scheduler's later values)
                self.inputs.append(("host", st.to_numpy(t.detach().reshape(())).copy()))
                return ("C", slot, t.dtype)
            other = self.device if self.device is not None else 0
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"tpu:{other} and {dev}!")
        if idx != self.device:
            if self.device is not None:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{self.device} and tpu:{idx}!")
            self.device = idx
        dtype = t.dtype
        if dtype is _F64 or dtype is _C128:
            self.has_f64 = True
        s = t.untyped_storage()
        sid = s._cdata
        k = self.storage_index.get(sid)
        if k is None:
            storages = self.storages
            k = len(storages)
            self.storage_index[sid] = k
            storages.append(s)
            buf = getattr(s, _BUFFER_ATTR, None)
            if buf is None:
                self.skeys.append(("U", s.nbytes() // dtype.itemsize, dtype))
            else:
                dt = _NUMPY_TO_TORCH[buf.dtype]
                self.skeys.append(("B", buf.shape, dt, s.nbytes() // dt.itemsize))
            self.inputs.append(("storage", k))
        if t.is_conj() or t.is_neg():
            # lazy conj/neg views (e.g. ifft's conj) reach fallthrough ops such as clone as is
            return ("T", k, dtype, tuple(t.shape), t.stride(), t.storage_offset(), (t.is_conj(), t.is_neg()))
        return ("T", k, dtype, tuple(t.shape), t.stride(), t.storage_offset())

    def scalar(self, v: Any) -> tuple:
        slot = len(self.inputs)
        if isinstance(v, bool):
            self.inputs.append(("scalar", v, torch.bool))
            return ("S", slot, bool)
        if isinstance(v, int):
            self.inputs.append(("scalar", v, torch.int64))
            return ("S", slot, int)
        if isinstance(v, float):
            self.inputs.append(("scalar", v, None))
            return ("S", slot, float)
        raise NotImplementedError(f"unsupported scalar {v!r} of type {type(v).__name__} on tpu")

    def generator(self, g: torch.Generator | None) -> tuple:
        slot = len(self.inputs)
        self.inputs.append(("seed", g))
        return ("G", slot)

    def walk(self, v: Any, runtime_scalar: bool) -> Any:
        """The spec of one argument value (the native walk; ``walk_python`` is its reference)."""
        return _C._walk(self, v, runtime_scalar)

    def walk_python(self, v: Any, runtime_scalar: bool) -> Any:
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, (list, tuple)):
            if v and (isinstance(v[0], torch.Tensor) or v[0] is None or runtime_scalar):
                tensor = self.tensor
                # foreach ops pass lists of dozens of tensors: skip walk's dispatch for those
                return ("L", tuple(tensor(x) if isinstance(x, torch.Tensor) else self.walk_python(x, runtime_scalar)
                                   for x in v))
            return ("V", tuple(v))
        if runtime_scalar and isinstance(v, (int, float)) and not isinstance(v, complex):
            return self.scalar(v)
        if isinstance(v, torch.Generator):
            return self.generator(v)
        return ("V", v)


_BUFFER_ATTR = st._ATTR
_NUMPY_TO_TORCH = st.NUMPY_TO_TORCH
# The native walk (csrc/collect.cpp) does what _Collector.walk_python does, ~5x faster; it
# calls back into _Collector.tensor / generator for the cases it leaves to Python.
_C._collect_setup(_NUMPY_TO_TORCH, _BUFFER_ATTR, torch.Generator)
# (shape, stride, dtype, device index, attr, data) -> (tensor, storage): a new output tensor
# whose storage attribute ``attr`` is set to ``data`` (its buffer, or a recorded Pending)
_new_tensor = _C._new_tensor
_op_key = _C._op_key
_devices: dict[int, torch.device] = {}


def _torch_device(index: int) -> torch.device:
    d = _devices.get(index)
    if d is None:
        d = _devices[index] = torch.device("tpu", index)
    return d


# ---------------------------------------------------------------------------
# the call path
# ---------------------------------------------------------------------------
def run(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    return run_plan(plan_for(op), args, kwargs)


def run_plan(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    """Run (or record) one call of ``plan.op``."""
    op = plan.op
    if not _supported(plan):
        return unsupported(op, args, kwargs)
    values = normalize_args(plan, args, kwargs)
    if plan.argument_check is not None:
        plan.argument_check(*[values[i] for i in plan.func_arg_positions])
    if config.debug_checks:
        check = registry.debug_check(plan.functional)
        if check is not None:
            check(*[values[i] for i in plan.func_arg_positions])
    result = _launch_or_record(plan, values, args, kwargs)
    # Index bounds after the op: the op's own argument errors (a dim out of range) come first, as on
    # CPU, and in Strict and DeferAndFuse its launch (or record) does not wait for the check's.
    if plan.index_bounds is not None:
        _check_index_bounds(plan, values)
    return result


def check_recorded_index_bounds(plan: OpPlan, args: tuple, kwargs: dict) -> None:
    """The index checks of a call that the native kernel (csrc/defer.cpp) recorded (it records only
    outside Debug mode), as run_plan makes them for every other call."""
    if config.index_checks:
        _check_index_bounds(plan, normalize_args(plan, args, kwargs))


def _check_index_bounds(plan: OpPlan, values: list[Any]) -> None:
    """Debug mode: on the host, raising now; otherwise on the device, raising at the next sync."""
    if config.debug_checks or config.index_checks:
        bounds = plan.index_bounds(*[values[i] for i in plan.func_arg_positions])
        (index_checks.check_on_host if config.debug_checks else index_checks.check_on_device)(bounds)


def _launch_or_record(plan: OpPlan, values: list[Any], args: tuple, kwargs: dict) -> Any:
    """Launch (Strict, Debug) or record (DeferAndFuse) one call of a supported op."""
    op = plan.op
    col = _Collector()
    specs, has_generator = _C._walk_all(col, values, plan.runtime_scalar)
    if not has_generator and plan.random:
        # Random op called without an explicit generator: use the default one.
        if "generator" in plan.names:
            specs[plan.names.index("generator")] = col.generator(None)
        else:
            specs.append(col.generator(None))
            values.append(None)
    if col.device is None:
        col.device = _device_from_args(values)
    skeys = tuple(col.skeys)
    # The plan stands for the op (by identity: an OpOverload's __hash__ is Python code). The key
    # is exact, 2 != 2.0 and 0.0 != -0.0, and hashes and compares fast (csrc/op_key.cpp).
    key = _op_key((plan, precision_mod.current(), col.has_f64, tuple(specs), skeys))
    if config.defer_and_fuse and not config.launch_blocking:
        if not plan.mutated and _eager_buckets.enabled():
            result = _eager_buckets.try_record(plan, values, specs, skeys, col, key[1])
            if result is not _eager_buckets.EXACT:
                return result
        try:
            return _deferred().record(plan, values, specs, skeys, col, key)
        except _ResizeOutputs as r:
            _resize_outputs(plan, values, r.metas)
            return run(op, args, kwargs)
    if not plan.mutated and _eager_buckets.enabled():
        result = _eager_buckets.try_run(plan, values, specs, skeys, col, key[1])
        if result is not _eager_buckets.EXACT:
            return result
    entry = _cache.get(key)
    if entry is None:
        try:
            entry = _compile(plan, values, specs, skeys, col, key)
        except _ResizeOutputs as r:
            _resize_outputs(plan, values, r.metas)
            return run(op, args, kwargs)
    else:
        stats.hits += 1
    return _launch(plan, values, col, skeys, entry)


def _supported(plan: OpPlan) -> bool:
    """Whether the op has a lowering, or a decomposition into ops that do."""
    return plan.functional is not None and (plan.lowering is not None or _decomposable(plan.functional))


def defer_fast_eligible(plan: OpPlan) -> bool:
    """Whether the native kernel (csrc/defer.cpp) may record calls of ``plan`` (checked once per plan): a
    supported op without random draws, which need run_plan. (It runs the plan's argument check itself,
    before recording; index bounds are checked after the native record: see
    ``check_recorded_index_bounds``.)"""
    return _supported(plan) and not plan.random


_deferred_module: Any = None


def _deferred() -> Any:
    """The DeferAndFuse module (it imports this one; an import statement per op costs ~2 us)."""
    global _deferred_module
    if _deferred_module is None:
        from . import deferred

        _deferred_module = deferred
    return _deferred_module


def _decomposable(op: torch._ops.OpOverload) -> bool:
    from ..lowering import decompose

    return decompose.has_decomposition(op)


def _device_from_args(values: list[Any]) -> int:
    for v in values:
        if isinstance(v, torch.device) and v.type == "tpu":
            return v.index if v.index is not None else _C._current_device()
    return _C._current_device()


class _ResizeOutputs(Exception):
    def __init__(self, metas: list[Any]) -> None:
        self.metas = metas


def _resize_outputs(plan: OpPlan, values: list[Any], metas: list[Any]) -> None:
    """out= tensors of the wrong shape are resized (with PyTorch's warning); the call is then retried."""
    outs = _flat_mutated(plan, values)
    metas = [m for m in metas if m is not None]
    for t, m in zip(outs, metas):
        if tuple(t.shape) != m.shape:
            if t.numel() != 0:
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(t.shape)}, "
                    f"which does not match the required output shape {list(m.shape)}. This behavior is "
                    "deprecated, and in a future PyTorch release outputs will not be resized unless they "
                    "have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                    "to zero elements with t.resize_(0).", UserWarning, stacklevel=4)
            t.resize_(m.shape)


def _flat_mutated(plan: OpPlan, values: list[Any]) -> list[torch.Tensor]:
    out = []
    for i in plan.mutated:
        v = values[i]
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


# ---------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------
def _meta_value(spec: Any, value: Any) -> Any:
    kind = _spec_kind(spec)
    if kind == "T":
        return torch.empty_strided(spec[3], spec[4], dtype=spec[2], device="meta")
    if kind == "C":
        return value
    if kind == "L":
        return [_meta_value(s, v) for s, v in zip(spec[1], value)]
    if kind == "G":
        return None
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("meta")
    return value


def _to_out_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return registry.OutMeta(tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return [_to_out_meta(y) for y in x]
    return None


def _flatten_tensors(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        out = []
        for y in x:
            out.extend(_flatten_tensors(y))
        return out
    return [x]


def check_no_internal_overlap(t: torch.Tensor) -> None:
    """PyTorch's assert_no_internal_overlap: an expanded (stride-0) written tensor is refused.

    An empty tensor has no elements to overlap (CPU writes nothing, and refuses nothing)."""
    if t.numel() and any(size > 1 and stride == 0 for size, stride in zip(t.shape, t.stride())):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location. Please clone() the tensor before performing the operation.")


def _tensor_specs(spec: Any) -> list[tuple]:
    if spec[0] == "T":
        return [spec]
    if spec[0] == "L":
        return [s for s in spec[1] if s[0] == "T"]
    return []


def check_no_input_overlap(plan: OpPlan, specs: list) -> None:
    """PyTorch's assert_no_overlap for out= tensors: an out tensor may not share memory with an input.

    Decided from the specs (storage slot, dtype, shape, stride, offset: all in the op's key).
    """
    outs = [t for t in mutated_specs(plan, specs) if t[0] == "T"]
    mutated = set(plan.mutated)
    ins = [t for i, s in enumerate(specs) if i not in mutated for t in _tensor_specs(s)]
    for o in outs:
        for t in ins:
            if o[1] == t[1]:
                raise_if_overlapping(dense_bytes(*o[2:6]), dense_bytes(*t[2:6]))


def _call_meta(plan: OpPlan, meta_args: list[Any], func_args: list[Any]) -> Any:
    if plan.mutated:
        call_op(plan.op, _args_for(plan.op, meta_args))
    early = registry.meta_outputs(plan.functional)
    if early is not None:
        out = early(*func_args)
        if out is not None:
            return out
    adapt = registry.meta_arguments(plan.functional)
    return call_op(plan.functional, func_args if adapt is None else adapt(*func_args))


def _spec_kind(spec: Any) -> str | None:
    """A spec's kind letter ("T" tensor, "C" CPU 0-dim tensor, "L" list, ...), None for a plain value."""
    return spec[0] if isinstance(spec, tuple) and spec else None


def _cpu_scalar_refused(error: RuntimeError, specs: list) -> bool:
    message = str(error)
    return ("meta" in message and "cpu" in message and "device" in message
            and any(_spec_kind(s) == "C" for s in specs))


def _cpu_scalars_to_meta(spec: Any, value: Any) -> Any:
    return value.to("meta") if _spec_kind(spec) == "C" and isinstance(value, torch.Tensor) else value


def op_metas(plan: OpPlan, values: list[Any], specs: list) -> tuple[list[Any], list[Any]]:
    """Output metadata (and PyTorch's own argument errors) from meta kernels.

    Returns the flattened output metas and the functional op's meta arguments.
    """
    meta_args = [_meta_value(s, v) for s, v in zip(specs, values)]
    if plan.rejects_internal_overlap:
        for t in _flat_mutated(plan, meta_args):
            check_no_internal_overlap(t)
    if plan.rejects_input_overlap:
        check_no_input_overlap(plan, specs)
    if plan.op is not plan.functional:
        check = registry.meta_check(plan.op)
        if check is not None:  # an out= overload's own check (its out tensors' dtypes)
            check(*meta_args)
    func_args = [meta_args[i] for i in plan.func_arg_positions]
    check = registry.meta_check(plan.functional)
    if check is not None:
        check(*func_args)
    try:
        try:
            meta_out = _call_meta(plan, meta_args, func_args)
        except RuntimeError as e:
            if not _cpu_scalar_refused(e, specs):
                raise
            # A decomposition written in Python (copysign, xlogy...) refuses a CPU 0-dim operand next
            # to meta tensors, where the device kernels take it as a scalar: the same call with that
            # operand on meta gives the shapes (its value matters to no meta kernel reached here).
            meta_args = [_cpu_scalars_to_meta(s, v) for s, v in zip(specs, meta_args)]
            func_args = [meta_args[i] for i in plan.func_arg_positions]
            meta_out = _call_meta(plan, meta_args, func_args)
    except RuntimeError as e:
        operands = func_args
        if plan.functional in _MASK_FIRST and not plan.mutated:
            operands = [func_args[1], func_args[0], *func_args[2:]]  # CPU broadcasts the mask first
        message = _cpu_broadcast_message(str(e), operands)
        if message is None:
            raise
        raise RuntimeError(message) from None
    except NotImplementedError as e:
        if "meta" in str(e).lower():
            raise NotImplementedError(
                f"torchtpu: aten::{plan.op.__name__} is not supported yet on tpu: PyTorch has no meta kernel "
                f"for it, which gives torchtpu its output shapes (ops with data-dependent output shapes have "
                f"none) ({e}). Set TORCH_TPU_CPU_FALLBACK=1 to run it on the CPU.") from None
        raise
    is_list_out = isinstance(meta_out, (list, tuple))
    metas = _flatten_tensors(meta_out) if is_list_out else [meta_out]
    layout = registry.output_layout(plan.functional)
    if layout is not None and not plan.mutated:
        metas = layout(metas, *func_args)
    if plan.mutated and any(plan.kwarg_only[i] for i in plan.mutated):
        outs = _flat_mutated(plan, values)
        if any(tuple(t.shape) != tuple(m.shape) for t, m in zip(outs, [m for m in metas if m is not None])):
            raise _ResizeOutputs(metas)
    return metas, func_args


_MASK_FIRST = {torch.ops.aten.masked_fill.Scalar, torch.ops.aten.masked_fill.Tensor}
_SIZES = re.compile(r"torch\.Size\(\[([^\]]*)\]\)|\(([\d, ]*)\)")


def _cpu_broadcast_message(message: str, args: list[Any]) -> str | None:
    """CPU's wording of a broadcasting error that PyTorch's meta kernels word otherwise, or None.

    Operands that do not broadcast: TensorIterator broadcasts the shapes in argument order and
    names the shape so far "tensor a" and the next operand's "tensor b", at the first failing
    dim from the right. An in-place result that cannot hold the broadcast: CPU prints sizes as
    lists."""
    if message.startswith("output with shape"):
        return _SIZES.sub(lambda m: "[" + (m.group(1) if m.group(1) is not None else m.group(2)).rstrip(", ") + "]",
                          message)
    if not message.startswith("Attempting to broadcast a dimension"):
        return None
    shapes = [tuple(a.shape) for a in _flatten_tensors(args) if isinstance(a, torch.Tensor) and a.dim() > 0]
    acc = shapes[0] if shapes else ()
    for shape in shapes[1:]:
        ndim = max(len(acc), len(shape))
        out = [1] * ndim
        for i in range(ndim - 1, -1, -1):
            size_a = acc[i - ndim + len(acc)] if i - ndim + len(acc) >= 0 else 1
            size_b = shape[i - ndim + len(shape)] if i - ndim + len(shape) >= 0 else 1
            if size_a != size_b and size_a != 1 and size_b != 1:
                return (f"The size of tensor a ({size_a}) must match the size of tensor b ({size_b}) "
                        f"at non-singleton dimension {i}")
            out[i] = size_b if size_a == 1 else size_a
        acc = tuple(out)
    return None


def mutated_specs(plan: OpPlan, specs: list) -> list:
    """The specs of the tensors an op writes to, list arguments flattened, in schema order."""
    out = []
    for i in plan.mutated:
        s = specs[i]
        if s[0] == "L":
            out.extend(s[1])
        else:
            out.append(s)
    return out


def emit_op(b: Builder, plan: OpPlan, specs: list, values: list[Any], skeys: tuple, input_values: list[Any],
            storage_vals: dict[int, Value], metas: list[Any], func_args: list[Any], precision: str,
            arg_hook: Any = None) -> tuple[list[tuple], list[Value]]:
    """Emit one op into ``b``: view reads, the lowering, and its outputs (located at the op's name).

    ``arg_hook(args) -> (args, post)``: rewrites the lowering's arguments (the masks of a
    bucketed call, engine/eager_buckets.py), ``post`` (or None) its result.
    Returns the output specs (("new", dtype, shape, stride) | ("store", slot) |
    ("none",)) and the flat storage Values of the non-"none" ones.
    """
    with b.located(str(plan.op)):
        return _emit_op(b, plan, specs, values, skeys, input_values, storage_vals, metas, func_args, precision,
                        arg_hook)


def _emit_op(b: Builder, plan: OpPlan, specs: list, values: list[Any], skeys: tuple, input_values: list[Any],
             storage_vals: dict[int, Value], metas: list[Any], func_args: list[Any], precision: str,
             arg_hook: Any) -> tuple[list[tuple], list[Value]]:

    def lower_arg(s: Any, v: Any) -> Any:
        kind = s[0] if isinstance(s, tuple) and s else None
        if kind == "T":
            val = read_view(b, storage_vals[s[1]], ViewSpec(s[2], s[3], s[4], s[5]))
            if len(s) > 6:
                if s[6][0]:
                    from ..lowering.fft import conj

                    val = conj(b, val)
                if s[6][1]:
                    val = b.neg(val)
            return val
        if kind in ("C", "S", "G"):
            return input_values[s[1]]
        if kind == "L":
            return [lower_arg(x, y) for x, y in zip(s[1], v)]
        if kind == "V":
            return list(s[1]) if isinstance(s[1], tuple) and isinstance(v, list) else s[1]
        return v

    lowered = [lower_arg(s, v) for s, v in zip(specs, values)]
    seed_slot = next((s[1] for s in specs if isinstance(s, tuple) and s and s[0] == "G"), None)
    out_metas = [_to_out_meta(m) for m in metas]
    ctx = registry.LoweringContext(b, plan.functional, out_metas, precision=precision, metas=list(func_args))
    if seed_slot is not None:
        ctx.extras["seed"] = input_values[seed_slot]
    lowering = plan.lowering
    if lowering is None:
        from ..lowering import decompose

        lowering = decompose.lower_by_decomposition
    args = [lowered[i] for i in plan.func_arg_positions]
    post = None
    if arg_hook is not None:
        args, post = arg_hook(args)
    result = lowering(ctx, *args)
    if post is not None:
        result = post(result)
    results = _flatten_tensors(result) if isinstance(result, (list, tuple)) else [result]
    if len(results) != len(metas):
        raise AssertionError(f"lowering of {plan.functional} returned {len(results)} values, expected {len(metas)}")

    outputs: list[tuple] = []
    out_values: list[Value] = []
    if not plan.mutated:
        for r, m in zip(results, metas):
            if m is None or r is None:
                outputs.append(("none",))
                continue
            r = _conform(b, r, m)
            stride = m.stride() if is_dense_permutation(m.shape, m.stride()) else contiguous_strides(m.shape)
            outputs.append(("new", m.dtype, tuple(m.shape), tuple(stride)))
            out_values.append(dense_to_storage(b, r, stride))
        return outputs, out_values
    writes: dict[int, list[tuple[ViewSpec, Value]]] = {}  # (the slots and views of written_views)
    for s, r, m in zip(mutated_specs(plan, specs), results, metas):
        if s[0] != "T" or m is None:
            continue
        view = ViewSpec(s[2], s[3], s[4], s[5])
        writes.setdefault(s[1], []).append((view, _conform(b, r, m, dtype=view.dtype, shape=view.shape)))
    for k, value in written_stores(b, storage_vals, skeys, writes):
        outputs.append(("store", k))
        out_values.append(value)
    return outputs, out_values


def written_stores(b: Builder, storage_vals: dict[int, Value], skeys: tuple,
                   writes: dict[int, list[tuple[ViewSpec, Value]]]) -> list[tuple[int, Value]]:
    """Per written storage slot (in ``writes``' order), its new buffer's value: its (view, value)
    writes, in order, into its old value (views of different storages never overlap)."""
    return [(k, stored(b, write_views(b, storage_vals[k], storage_numel(skeys[k]), pairs), skeys[k],
                       [view for view, _ in pairs]))
            for k, pairs in writes.items()]


def storage_numel(sk: tuple) -> int:
    """Elements of the storage a storage key describes (in the key's dtype)."""
    return sk[1] if sk[0] == "U" else sk[3]


def buffer_holds_storage(sk: tuple) -> bool:
    """Whether the storage's buffer holds all of it (exactly, or as the prefix of a longer buffer,
    as eager shape buckets would make: docs/eager_shapes.md): a write then keeps the buffer's
    shape, so that the old buffer can be donated to the new one (XLA aliases equal shapes only)."""
    return sk[0] == "B" and math.prod(sk[1]) >= sk[3]


def stored(b: Builder, storage: Value, sk: tuple, views: Sequence[ViewSpec]) -> Value:
    """A written storage's flat value as its new buffer (``store_shape``): a longer buffer's
    elements past the storage are zeros (they are no tensor's)."""
    shape = store_shape(sk, views)
    return b.reshape(fit(b, storage, math.prod(shape)), shape)


def storage_value(b: Builder, buffer: Value | None, sk: tuple) -> Value:
    """The flat value of the storage ``sk`` describes, from its buffer's value (None: uninitialized)."""
    if buffer is None:
        return b.constant(0, sk[2], (sk[1],))
    return fit(b, flat(b, buffer), sk[3])


def written_views(plan: OpPlan, specs: list, metas: list[Any]) -> dict[int, list[ViewSpec]]:
    """The views an in-place op writes, by storage slot, in the order it first writes each."""
    views: dict[int, list[ViewSpec]] = {}
    for s, m in zip(mutated_specs(plan, specs), metas):
        if s[0] == "T" and m is not None:
            views.setdefault(s[1], []).append(ViewSpec(s[2], s[3], s[4], s[5]))
    return views


def store_shape(sk: tuple, views: Sequence[ViewSpec]) -> tuple[int, ...]:
    """The shape of the new buffer of a storage that ``views`` are written into.

    A storage whose buffer holds all of it keeps that buffer's shape (see
    :func:`buffer_holds_storage`). A storage written whole by one contiguous view
    takes the view's shape (see :func:`dense_to_storage` for why a buffer has
    dims); any other the flat one.
    """
    if buffer_holds_storage(sk):
        return sk[1]
    numel = storage_numel(sk)
    if len(views) == 1:
        v = views[0]
        if v.offset == 0 and v.numel == numel and v.dtype == sk[2] and is_contiguous(v.shape, v.stride):
            return v.shape
    return (numel,)


def _compile(plan: OpPlan, values: list[Any], specs: list, skeys: tuple, col: _Collector, key: _C.OpKey) -> Entry:
    start = time.perf_counter()
    metas, func_args = op_metas(plan, values, specs)
    stats.misses += 1
    b = Builder()
    input_values, storage_vals = program_inputs(b, col, skeys)
    outputs, out_values = emit_op(b, plan, specs, values, skeys, input_values, storage_vals, metas, func_args,
                                  key[1])
    donate = alias_stores(b, col, skeys, outputs)
    text = b.module(out_values)
    exe = compile_cache.compile_program(text, f"aten::{plan.op.__name__}({describe_arguments(values)})",
                                       eager=True)
    entry = Entry(exe, outputs, [_to_out_meta(m) for m in metas], donate)
    with _cache_lock:
        _cache[key] = entry
    stats.compile_seconds += time.perf_counter() - start
    return entry


def describe_arguments(values: Sequence[Any]) -> str:
    """An op's arguments for a message: tensors as dtype[shape], the rest as written."""
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return repr(v)
    return ", ".join(one(v) for v in values)


def alias_stores(b: Builder, col: _Collector, skeys: tuple, outputs: list[tuple]) -> tuple[int, ...]:
    """Donate each written storage's old buffer to the output that replaces it.

    A storage's buffer is referenced by that storage alone, and the storage is
    rebound to the new buffer right after the launch, so XLA may update it in
    place (no second copy of a parameter during an in-place op).
    """
    arg_of_slot: dict[int, int] = {}
    pos = 0
    for inp in col.inputs:
        if inp[0] == "storage":
            if skeys[inp[1]][0] == "U":
                continue
            arg_of_slot[inp[1]] = pos
        pos += 1
    donate = []
    k = 0
    for spec in outputs:
        if spec[0] == "none":
            continue
        if spec[0] == "store":
            arg = arg_of_slot.get(spec[1])
            if arg is not None and buffer_holds_storage(skeys[spec[1]]):  # the output keeps the buffer's shape
                b.arg_attrs[arg] = f"tf.aliasing_output = {k} : i32"
                donate.append(arg)
        k += 1
    return tuple(donate)


def program_inputs(b: Builder, col: _Collector, skeys: tuple) -> tuple[list[Any], dict[int, Value]]:
    """Declare the program's arguments for the collected inputs.

    Returns one entry per collected input (a Value, or a Value of zeros for an
    uninitialized storage) and the flat value of every storage by slot.
    """
    input_values: list[Any] = []
    for inp in col.inputs:
        if inp[0] == "storage":
            sk = skeys[inp[1]]
            if sk[0] == "U":
                input_values.append(("U", sk[1], sk[2]))
            else:
                input_values.append(b.arg(sk[1], sk[2]))
        elif inp[0] == "host":
            input_values.append(b.arg(inp[1].shape, st.NUMPY_TO_TORCH[inp[1].dtype]))
        elif inp[0] == "scalar":
            dt = inp[2] or (torch.float64 if col.has_f64 else torch.float32)
            input_values.append(b.arg((), dt))
        elif inp[0] == "seed":
            input_values.append(b.arg((2,), torch.uint64))
    storage_vals: dict[int, Value] = {}
    for slot, inp in enumerate(col.inputs):
        if inp[0] == "storage":
            iv = input_values[slot]
            storage_vals[inp[1]] = storage_value(b, None if isinstance(iv, tuple) else iv, skeys[inp[1]])
    return input_values, storage_vals


def _args_for(op: torch._ops.OpOverload, meta_args: list[Any]) -> list[Any]:
    # Meta copies of written-to arguments, so the meta in-place call cannot
    # disturb the metas used for the functional call.
    return [a.clone() if isinstance(a, torch.Tensor) and a.device.type == "meta" else a for a in meta_args]


def _conform(b: Builder, r: Value, m: Any, dtype: torch.dtype | None = None,
             shape: tuple[int, ...] | None = None) -> Value:
    dtype = dtype or m.dtype
    shape = tuple(shape if shape is not None else m.shape)
    if not isinstance(r, Value):
        raise TypeError(f"lowering returned {r!r} where a tensor was expected")
    if r.shape != shape:
        if math.prod(r.shape) == math.prod(shape) and r.shape == tuple(m.shape):
            r = b.reshape(r, shape)
        else:
            r = b.broadcast_to(r, shape)
    return b.convert(r, dtype)


# ---------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------
_scalar_buffers: dict[tuple, Any] = {}


def _scalar_buffer(value: Any, dtype: torch.dtype, device: int) -> Any:
    k = (value, type(value), dtype, device)
    if value == 0 and type(value) is float:
        # -0.0 == 0.0 as a dict key, but x / -0.0 is -inf: key zeros by their sign too
        k = (value, math.copysign(1.0, value), dtype, device)
    buf = _scalar_buffers.get(k)
    if buf is None:
        if len(_scalar_buffers) > 4096:
            _scalar_buffers.clear()
        arr = np.asarray(value, dtype=st.TORCH_TO_NUMPY[dtype])
        buf = _device_state.client().buffer_from_host(arr, device)
        _scalar_buffers[k] = buf
    return buf


def clear_scalar_buffers() -> None:
    """Drop the cached device copies of runtime scalars (``torch.tpu.empty_cache``)."""
    _scalar_buffers.clear()


def _launch(plan: OpPlan, values: list[Any], col: _Collector, skeys: tuple, entry: Entry) -> Any:
    new_tensors = execute_and_bind(col, skeys, entry)
    if config.check_nan:
        _check_nan(plan, new_tensors)
    return op_result(plan, values, new_tensors)


def op_result(plan: OpPlan, values: list[Any], new_tensors: list[Any]) -> Any:
    """The op's return value: new tensors and/or the arguments it wrote to."""
    if plan.returns_list:
        if plan.mutated:
            return values[plan.returns[0][1]]
        return new_tensors
    returns = plan.returns
    if len(returns) == 1:  # the common case, without building a list
        kind, i = returns[0]
        return values[i] if kind == "arg" else new_tensors[i]
    rets = []
    for kind, i in returns:
        rets.append(values[i] if kind == "arg" else new_tensors[i])
    if not rets:
        return None
    return rets[0] if len(rets) == 1 else tuple(rets)


_meta_cache: dict[_C.OpKey, tuple[list[Any], list[Any]]] = {}


def meta_for(plan: OpPlan, values: list[Any], specs: list, key: _C.OpKey) -> tuple[list[Any], list[Any]]:
    """op_metas, cached by the op's cache key (used by DeferAndFuse recording)."""
    m = _meta_cache.get(key)
    if m is None:
        m = _meta_cache[key] = op_metas(plan, values, specs)
    return m


def execute_and_bind(col: _Collector, skeys: tuple, entry: Entry,
                     shapes: Sequence[tuple[int, ...] | None] | None = None) -> list[torch.Tensor | None]:
    """Launch ``entry`` on the collected inputs; bind outputs to new tensors or written storages.

    ``shapes``: per output, the shape of its new tensor where not the buffer's (a bucketed
    call's exact-size result on its bucket-sized buffer, engine/eager_buckets.py)."""
    device = col.device or 0
    # natively where every input is a storage holding a Buffer (a compiled graph's ~180 parameters and
    # caches); None otherwise, and the Python loop
    buffers = _C._storage_buffers(col.inputs, col.storages, skeys, Buffer)
    if buffers is None:
        buffers = _input_buffers(col, skeys, device)
    outs = launch(entry.executable, buffers, device, entry.donate)
    new_tensors = []
    bufs = iter(outs)
    for i, spec in enumerate(entry.outputs):
        if spec[0] == "none":
            new_tensors.append(None)
            continue
        buf = next(bufs)
        if spec[0] == "new":
            shape = spec[2] if shapes is None or shapes[i] is None else shapes[i]
            new_tensors.append(_new_tensor(shape, spec[3], spec[1], device, _BUFFER_ATTR, buf)[0])
        else:
            st.set_storage_buffer(col.storages[spec[1]], buf)
    return new_tensors


def _input_buffers(col: _Collector, skeys: tuple, device: int) -> list[Any]:
    """The launch's parameter buffers from the collected inputs: storages' buffers (materialized
    first where DeferAndFuse recorded them), scalars, host values and seeds moved to the device."""
    client = _device_state.client()
    buffers = []
    for inp in col.inputs:
        kind = inp[0]
        if kind == "storage":
            if skeys[inp[1]][0] == "U":
                continue
            buf = getattr(col.storages[inp[1]], _BUFFER_ATTR)
            if not isinstance(buf, Buffer):  # recorded by DeferAndFuse: materialize first
                _deferred().flush()
                buf = getattr(col.storages[inp[1]], _BUFFER_ATTR)
            buffers.append(buf)
        elif kind == "scalar":
            dt = inp[2] or (torch.float64 if col.has_f64 else torch.float32)
            buffers.append(_scalar_buffer(inp[1], dt, device))
        elif kind == "host":
            buffers.append(client.buffer_from_host(np.ascontiguousarray(inp[1]), device))
        elif kind == "seed":
            gen = inp[1] if inp[1] is not None else _C._default_generator(device)
            seed = _C._next_seed(gen)
            buffers.append(client.buffer_from_host(np.array([seed, 0], dtype=np.uint64), device))
    return buffers


def launch(executable: Any, buffers: list[Any], device: int, donate: Any = ()) -> list[Any]:
    """Execute asynchronously (Strict) or to completion (Debug); returns the output buffers.

    Strict mode asks PJRT for no completion event (it costs ~1.5 us a launch):
    synchronize() waits on the output of the device's latest launch instead.
    """
    if not donate:
        outs, event = _execute(executable, buffers, device, donate)
    else:
        with _latest_lock:
            outs, event = _execute(executable, buffers, device, donate)
    if event is not None:
        event.wait()
    return outs


def _execute(executable: Any, buffers: list[Any], device: int, donate: Any) -> tuple[list[Any], Any]:
    """Launch; the completion event where the launch must be awaited (Debug mode), else None."""
    if device_trace.active():
        outs, event = device_trace.launch(executable, buffers, device, donate)
        if config.launch_blocking:
            return outs, event
    elif config.launch_blocking:
        return executable.execute(buffers, device, donate)
    else:
        outs, _ = executable.execute(buffers, device, donate, with_event=False)
    if outs:
        _latest[device] = outs[0]  # (an execution's outputs are ready together)
    return outs, None


def latest_ready_event(device: int) -> Any:
    """The ready event of the device's latest launch not yet synchronized, or None (see ``_latest``)."""
    with _latest_lock:
        return _ready_event(_latest.get(device))


def _ready_event(buf: Any) -> Any:
    """A latest output's ready event; None for none, or for one donated to a later launch (which
    is then the latest). Called under _latest_lock."""
    return None if buf is None or buf.is_deleted else buf.ready_event()


def wait_latest() -> None:
    """Wait for each device's latest launch, then stop holding its output (see ``_latest``)."""
    while _latest:
        with _latest_lock:
            try:
                _, buf = _latest.popitem()
            except KeyError:  # (another thread's synchronize took the last one)
                return
            event = _ready_event(buf)
        if event is not None:
            event.wait()


def synchronize(device: int | None = None) -> None:
    """Wait for every launched op (errors raised by the device surface here)."""
    _deferred().flush()
    wait_latest()
    device_trace.drain()
    release_donated()  # everything has finished: their destroys no longer wait
    index_checks.raise_pending()


def _check_nan(plan: OpPlan, tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        if t.is_floating_point() and t.numel():
            host = t.cpu()
            if not torch.isfinite(host).all():
                raise RuntimeError(f"torchtpu: aten::{plan.op.__name__} produced NaN or Inf (TORCH_TPU_CHECK_NAN=1)")


def cache_clear() -> None:
    with _cache_lock:
        _cache.clear()


def cache_size() -> int:
    return len(_cache)


# ---------------------------------------------------------------------------
# unsupported ops and the opt-in CPU fallback
# ---------------------------------------------------------------------------
_warned_fallback: set[str] = set()


def unsupported(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    name = f"aten::{op._schema.name.split('::')[-1]}" + (f".{op._overloadname}" if op._overloadname != "default"
                                                          else "")
    if not config.cpu_fallback:
        raise NotImplementedError(
            f"torchtpu: the operator '{name}' is not implemented for the tpu device. "
            "Set TORCH_TPU_CPU_FALLBACK=1 (or call torch.tpu.set_cpu_fallback(True)) to run it on the CPU "
            "with a warning, or file an issue naming this operator.")
    if name not in _warned_fallback:
        _warned_fallback.add(name)
        warnings.warn(f"torchtpu: '{name}' is not lowered for tpu; running it on the CPU (slow).",
                      stacklevel=3)
    from . import cpu_fallback

    return cpu_fallback.run_on_cpu(op, args, kwargs)
