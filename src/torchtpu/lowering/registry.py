"""The lowering registry: ATen op -> function that emits StableHLO.

A lowering is ``fn(ctx, *args)`` where ``args`` follow the op's schema
(defaults filled in). Tensor arguments arrive as dense :class:`Value`\\ s;
``Scalar``/``float`` arguments arrive as 0-d Values (they are runtime inputs,
so a changing learning rate does not recompile) or, when called from a
decomposition, as Python numbers; every other argument is a Python value.
It returns a Value, or a tuple/list matching the op's returns.

Lowerings are registered for *functional* overloads; in-place and ``out=``
variants reuse them (the engine writes the result back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .builder import Builder, Value

Lowering = Callable[..., Any]

_LOWERINGS: dict[Any, Lowering] = {}
# Host-side argument checks run in Debug mode (e.g. index bounds).
_DEBUG_CHECKS: dict[Any, Callable[..., None]] = {}
# Metadata checks that PyTorch's meta kernel misses (it raises the wrong error), run on the meta
# arguments before the meta kernel, i.e. whenever an op call's key is not cached yet.
_META_CHECKS: dict[Any, Callable[..., None]] = {}
# Checks of argument values that CPU kernels make and meta kernels cannot (a distribution's
# parameters, which travel as runtime scalars): run on every call of the op.
_ARGUMENT_CHECKS: dict[Any, Callable[..., None]] = {}
# Index arguments' valid ranges (lowering/index_bounds.py): checked on the host in Debug mode,
# on the device otherwise, where XLA would clamp an out-of-range index without a word.
_INDEX_BOUNDS: dict[Any, Callable[..., list]] = {}
# Output memory formats that PyTorch's meta kernel does not give but its CPU and CUDA kernels do
# (a convolution of a channels-last input is channels-last): ``fn(metas, *meta_args)`` returns
# the output metas to use, restrided.
_OUTPUT_LAYOUTS: dict[Any, Callable[..., list]] = {}
# Arguments that CPU's kernel converts itself and PyTorch's meta kernel refuses (a uint8 mask of
# ``where``, a uint8 target of ``nll_loss``): ``fn(*meta_args)`` returns the meta arguments to
# call the meta kernel with. The lowering gets the original arguments.
_META_ARGUMENTS: dict[Any, Callable[..., list]] = {}
# Calls that CPU's kernel answers before its type checks and PyTorch's meta kernel refuses (the
# softmax of an empty bool tensor: CPU returns it as it is, the decomposition subtracts bools):
# ``fn(*meta_args)`` returns the output meta(s), or None to call the meta kernel as usual.
_META_OUTPUTS: dict[Any, Callable[..., Any]] = {}
# Higher-order ops of compiled graphs (torch.cond, while_loop): ``fn(b, args, val, precision,
# extras, vals)`` lowers the node (``val``: its example value), its subgraphs included, into the
# builder (``vals``: concrete values of the graph's nodes, subgraphs' too, for symbolic graphs).
_HIGHER_ORDER: dict[Any, Callable[..., Any]] = {}


def register(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register a lowering for OpOverloads or whole OpOverloadPackets."""

    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            _LOWERINGS[op] = fn
        return fn

    return deco


# Lowerings used only inside graphs (view ops): in eager mode these ops stay
# metadata-only views on the C++ side and must not get a computing kernel.
GRAPH_ONLY: set[Any] = set()


def register_graph_only(*ops: Any) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            _LOWERINGS[op] = fn
            GRAPH_ONLY.add(op)
        return fn

    return deco


# Kernels that must talk to the host between device programs: ops whose output
# shape depends on the data (nonzero, masked_select, unique, boolean-mask
# indexing) or that write to an argument their schema does not mark as written
# (native_batch_norm's running stats). ``fn(*args, **kwargs)`` replaces the
# engine call for that OpOverload.
_HOST_KERNELS: dict[Any, Callable[..., Any]] = {}


def _registrar(table: dict[Any, Callable[..., Any]]) -> Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """``register_x(*ops)``: a decorator that files a function under each op in ``table``.

    An op gets one function per table: a second registration would replace the first without
    a word (two meta checks of one op, each written for one of its errors), so it raises.
    """

    def register_for(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            for op in ops:
                existing = table.get(op)
                if existing is not None and existing is not fn:
                    raise ValueError(f"torchtpu: {op} is registered twice in one table ({existing.__qualname__} "
                                     f"and {fn.__qualname__}): merge the two")
                table[op] = fn
            return fn

        return deco

    return register_for


register_host_kernel = _registrar(_HOST_KERNELS)
register_debug_check = _registrar(_DEBUG_CHECKS)
register_meta_check = _registrar(_META_CHECKS)
register_argument_check = _registrar(_ARGUMENT_CHECKS)
register_index_bounds = _registrar(_INDEX_BOUNDS)
register_output_layout = _registrar(_OUTPUT_LAYOUTS)
register_meta_arguments = _registrar(_META_ARGUMENTS)
register_meta_outputs = _registrar(_META_OUTPUTS)
register_higher_order = _registrar(_HIGHER_ORDER)


def host_kernel(op: torch._ops.OpOverload) -> Callable[..., Any] | None:
    return _HOST_KERNELS.get(op)


def host_kernel_ops() -> list[Any]:
    return list(_HOST_KERNELS)


def meta_check(op: torch._ops.OpOverload) -> Callable[..., None] | None:
    return _META_CHECKS.get(op)


def argument_check(op: torch._ops.OpOverload) -> Callable[..., None] | None:
    return _ARGUMENT_CHECKS.get(op)


def index_bounds(op: torch._ops.OpOverload) -> Callable[..., list] | None:
    return _INDEX_BOUNDS.get(op)


def output_layout(op: torch._ops.OpOverload) -> Callable[..., list] | None:
    return _OUTPUT_LAYOUTS.get(op)


def meta_arguments(op: torch._ops.OpOverload) -> Callable[..., list] | None:
    return _META_ARGUMENTS.get(op)


def meta_outputs(op: torch._ops.OpOverload) -> Callable[..., Any] | None:
    return _META_OUTPUTS.get(op)


def higher_order(op: Any) -> Callable[..., Any] | None:
    return _HIGHER_ORDER.get(op)


def lookup(op: torch._ops.OpOverload) -> Lowering | None:
    fn = _LOWERINGS.get(op)
    if fn is None:
        fn = _LOWERINGS.get(op.overloadpacket)
    return fn


def debug_check(op: torch._ops.OpOverload) -> Callable[..., None] | None:
    fn = _DEBUG_CHECKS.get(op)
    if fn is None:
        fn = _DEBUG_CHECKS.get(op.overloadpacket)
    return fn


def registered_ops() -> list[Any]:
    return list(_LOWERINGS)


@dataclass
class OutMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class LoweringContext:
    """What a lowering may use besides its arguments."""

    b: Builder
    op: torch._ops.OpOverload
    out: list[OutMeta | None]
    precision: str = "medium"
    extras: dict[str, Any] = field(default_factory=dict)
    # The lowering's arguments with tensors as meta tensors (for dtype rules
    # such as torch.result_type); None where unavailable.
    metas: list[Any] | None = None

    def result_type(self, *positions: int) -> torch.dtype:
        assert self.metas is not None
        return torch.result_type(*[self.metas[i] for i in positions])

    def out_dtype(self, i: int = 0) -> torch.dtype:
        meta = self.out[i]
        assert meta is not None
        return meta.dtype

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        meta = self.out[i]
        assert meta is not None
        return meta.shape

    def scalar(self, x: Value | bool | float, dtype: torch.dtype, shape: Sequence[int] = ()) -> Value:
        """A runtime or constant scalar as a Value of ``dtype`` broadcast to ``shape``. A one-element
        tensor of any rank counts as a scalar (an optimizer's 0-d step, GradScaler's (1,) scale)."""
        b = self.b
        if isinstance(x, Value):
            if x.numel == 1 and x.shape != tuple(shape):
                x = b.reshape(x, ())
            v = b.convert(x, dtype)
            if v.shape != tuple(shape):
                v = b.broadcast_to(v, shape)
            return v
        return b.constant(x, dtype, shape)


def as_list(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]
