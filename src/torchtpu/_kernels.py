"""Dispatcher glue: the PyTorch kernels of the ``tpu`` key that are not lowerings.

Copies between devices, ``.item()``, and the registration of the engine's
kernel for every lowered op (per op, so PyTorch's composite kernels do not split
``add`` into ``empty`` + ``add.out``; the kernel is native, csrc/kernel_front.cpp),
with a boxed fallback that names unsupported ops.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np
import torch

from . import _C, flash_attention, math_attention, nested, sync_debug
from . import storage as st
from .engine import deferred, eager_buckets, executor, graph_node, index_checks
from .engine.opplan import plan_for
from .lowering import registry
from .lowering.index_bounds import INDEX_BOUNDS_FLAG
from .lowering.views import is_contiguous
from .runtime import Buffer, env

_aten = torch.ops.aten
_libs: list[torch.library.Library] = []


def dispatch(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    positions = _tensor_positions(op)
    if positions and any(type(args[i]) in _NUMBERS for i in positions if i < len(args)):
        args = _wrap_numbers(args, positions)
    return executor.run(op, args, kwargs)


# A Scalar overload that ATen implements through its Tensor out= overload (copysign.Scalar and
# xlogy.Scalar_Other call copysign.out / xlogy.OutTensor with a wrapped-number tensor) reaches
# this Python fallback with that tensor turned back into a Python number. It goes in again as a
# 0-dim tensor on the op's device, of the dtype a wrapped number promotes as (a float: the default
# dtype; a 0-dim tensor promotes as a wrapped number does against tensors with dimensions).
_NUMBERS = (float, int, bool, complex)


@functools.cache
def _tensor_positions(op: torch._ops.OpOverload) -> tuple[int, ...]:
    # Only out= overloads, whose meta pass calls the out= op itself, which refuses a number for a
    # Tensor; functional ops take numbers as host scalars, which keeps their host-side checks (an
    # integer division by a zero number raises at the op).
    plan = plan_for(op)
    if plan.op is plan.functional:
        return ()
    return tuple(i for i, a in enumerate(op._schema.arguments) if not a.kwarg_only and str(a.type) == "Tensor")


def _number_dtype(v: complex) -> torch.dtype:
    if type(v) is bool:
        return torch.bool
    if type(v) is int:
        return torch.int64
    if type(v) is float:
        return torch.get_default_dtype()
    return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64


def _wrap_numbers(args: tuple, positions: tuple[int, ...]) -> tuple:
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "tpu"), "tpu")
    out = list(args)
    for i in positions:
        if i < len(out) and type(out[i]) in _NUMBERS:
            out[i] = torch.tensor(out[i], dtype=_number_dtype(out[i]), device=device)
    return tuple(out)


def _covers_storage(t: torch.Tensor) -> bool:
    """True when ``t`` is exactly its whole storage, densely, in its own dtype."""
    if t.storage_offset() != 0 or not is_contiguous(t.shape, t.stride()):
        return False
    return t.numel() * t.element_size() == t.untyped_storage().nbytes()


# A view is read by copying its whole storage and cutting it on the host when
# the storage is at most this much larger: no device program per view shape
# (printing a slice, reading a bucketed program's trimmed output).
_HOST_CUT_SLACK_BYTES = 1 << 20


def _strided_from_whole_buffer(t: torch.Tensor, buf: Any) -> torch.Tensor | None:
    if not isinstance(buf, Buffer) or t.is_conj() or t.is_neg() or st.buffer_dtype(buf) != t.dtype:
        return None
    item = t.element_size()
    last = t.storage_offset() + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    if last >= buf.size or buf.size * item > 4 * t.numel() * item + _HOST_CUT_SLACK_BYTES:
        return None
    whole = np.asarray(buf.to_host()).reshape(-1)
    cut = np.lib.stride_tricks.as_strided(whole[t.storage_offset():], tuple(t.shape),
                                          tuple(s * whole.itemsize for s in t.stride()))
    return st.from_numpy(np.ascontiguousarray(cut)).reshape(t.shape)


def device_to_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of a tpu tensor (waits for the device)."""
    index_checks.raise_pending()  # a synchronization: earlier ops' index errors surface here
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype)
    sync_debug.note_sync(f"a device-to-host copy of {t.dtype} {list(t.shape)}")
    src = t
    buf = st.storage_buffer(src.untyped_storage())
    if deferred.has_pending() or isinstance(buf, deferred.Pending):
        # A read is a materialization point: run everything recorded so far, not only what this
        # tensor needs, so the next graph starts at the same op every step and hits the cache.
        # (A Pending with nothing pending: another thread is flushing its graph; flush() waits
        # for that under the engine's lock.)
        deferred.flush()
        buf = st.storage_buffer(src.untyped_storage())
        failure = deferred.failure_of(buf) if isinstance(buf, deferred.Pending) else None
        if failure is not None:
            raise deferred.never_computed(failure)
    if not (_covers_storage(src) and buf is not None and st.buffer_dtype(buf) == src.dtype
            and buf.size == src.numel()):
        host_view = _strided_from_whole_buffer(t, buf)
        if host_view is not None:
            return host_view
        src = executor.run(_aten.clone.default, (t,), {"memory_format": torch.contiguous_format})
        buf = st.storage_buffer(src.untyped_storage())
        if not isinstance(buf, Buffer):  # the clone was recorded (DeferAndFuse)
            deferred.flush()
            buf = st.storage_buffer(src.untyped_storage())
    host = buf.to_host()
    return st.from_numpy(np.asarray(host)).reshape(t.shape)


_PAD_UPLOADS = bool(env.read("TORCH_TPU_PAD_UPLOADS"))


def _padded_rows(host: torch.Tensor) -> torch.Tensor:
    """``host`` with garbage rows after its own (NaN, or the type's largest value), to the next
    power of two above its first dim: a storage's buffer longer than the storage."""
    rows = host.shape[0]
    pad = torch.empty(((1 << rows.bit_length()) - rows, *host.shape[1:]), dtype=host.dtype)
    if host.dtype.is_floating_point or host.dtype.is_complex:
        pad.fill_(float("nan"))
    else:
        pad.fill_(True if host.dtype == torch.bool else torch.iinfo(host.dtype).max)
    return torch.cat([host.contiguous(), pad])


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if dst.numel() == 0:
        return dst
    if src.device.type == "tpu" and dst.device.type == "tpu":
        if src.device != dst.device:
            host = device_to_host(src)
            return copy_from(host, dst)
        executor.run(_aten.copy_.default, (dst, src), {})
        return dst
    if dst.device.type == "tpu":
        device = dst.device.index or 0
        host = src.to(dst.dtype)
        if tuple(host.shape) != tuple(dst.shape):
            host = host.expand(dst.shape)
        if _covers_storage(dst):
            rows = eager_buckets.upload_rows(host, sys._getframe(1)) if host.dim() and host.numel() else None
            if _PAD_UPLOADS and host.dim() and host.numel():
                host = _padded_rows(host)
            elif rows is not None:  # a loop over lengths: a bucket-sized buffer (engine/eager_buckets.py)
                host = eager_buckets.pad_rows(host, rows)
            st.set_storage_buffer(dst.untyped_storage(), st.upload(host, device))
            if rows is not None:
                eager_buckets.mark(dst.untyped_storage())
            return dst
        staged = torch.empty(host.shape, dtype=host.dtype, device=dst.device)
        st.set_storage_buffer(staged.untyped_storage(), st.upload(host, device))
        executor.run(_aten.copy_.default, (dst, staged), {})
        return dst
    # tpu -> cpu (or another host device)
    host = device_to_host(src)
    dst.copy_(host)
    return dst


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    dst.resize_(src.shape)
    return copy_from(src, dst)


def local_scalar_dense(t: torch.Tensor) -> Any:
    return device_to_host(t).item()


def _sdp_choice_math(*args: Any, **kwargs: Any) -> int:
    return int(torch.nn.attention.SDPBackend.MATH)


def _fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    host = registry.host_kernel(op)
    if host is not None:
        return host(*args, **kwargs)
    return dispatch(op, *args, **kwargs)


def _is_implicit(op: torch._ops.OpOverload) -> bool | None:
    """Whether the op decomposes above autograd; None for TorchScript-only overloads."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    except RuntimeError:
        return None


_STRUCTURAL = {"empty", "empty_strided", "as_strided", "view", "_reshape_alias", "unfold", "resize_", "set_",
               "_copy_from", "_copy_from_and_resize", "_local_scalar_dense", "copy_", "_to_copy"}


def _host_kernels_behind_composites(registered: set[str]) -> list[torch._ops.OpOverload]:
    """Host kernels of ops that also have a CompositeExplicitAutograd kernel.

    Other host kernels are reached through the boxed fallback; a composite kernel wins
    over a backend fallback, so these must be registered for PrivateUse1 by name (unless
    ``registered`` already names them, or PyTorch has a PrivateUse1 kernel of its own).
    """
    ops = []
    for op in registry.host_kernel_ops():
        name = op.name()
        if name in registered or torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in (
                "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")):
            ops.append(op)
    return ops


def _overloads_to_register() -> list[torch._ops.OpOverload]:
    ops: list[torch._ops.OpOverload] = []
    seen: set[str] = set()
    for key in registry.registered_ops():
        if key in registry.GRAPH_ONLY:
            continue
        packets = []
        if isinstance(key, torch._ops.OpOverloadPacket):
            name = key.__name__
        else:
            name = key.overloadpacket.__name__
        for n in (name, name + "_"):
            p = getattr(_aten, n, None)
            if p is not None and n not in _STRUCTURAL:
                packets.append(p)
        for p in packets:
            for overload in p.overloads():
                op = getattr(p, overload)
                if op.name() in seen or _is_implicit(op) is not False:
                    continue
                seen.add(op.name())
                ops.append(op)
    return ops


def _hide_from_dynamo(*fns: Any) -> None:
    """Dynamo must never trace into kernel frames (they run under compiled code too).

    Marking the code objects SKIP, recursively, costs nothing per call, unlike
    wrapping every kernel in ``torch.compiler.disable`` (~8 us per op).
    """
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    for fn in fns:
        set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


def register_kernels() -> None:
    from . import lowering  # noqa: F401  (fills the registry)

    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    lib.impl("_copy_from", copy_from, "PrivateUse1")
    lib.impl("_copy_from_and_resize", copy_from_and_resize, "PrivateUse1")
    lib.impl("_local_scalar_dense", local_scalar_dense, "PrivateUse1")
    # scaled_dot_product_attention: the math path (matmul + softmax), which
    # lowers to plain dot_general/reduce programs with autograd for free.
    lib.impl("_fused_sdp_choice", _sdp_choice_math, "PrivateUse1")
    # ...except where a Pallas flash-attention kernel takes the call (flash_attention.py).
    flash_attention.register(lib)
    # The math path itself, arranged for XLA (math_attention.py: the shorter operand scaled, GQA by
    # grouping queries instead of repeating keys and values).
    math_attention.register(lib)
    # Module.to("tpu") keeps Parameter identity (tied weights, optimizers built
    # before the move) only if CPU and tpu tensors may shallow-copy into each
    # other, as CPU and CUDA may; c10 lists no PrivateUse1 among dense backends.
    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        lib.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type, key)
    ops = _overloads_to_register()
    # Lowered ops get the native kernel front (csrc/kernel_front.cpp); host kernels stay Python.
    fronts: list[tuple[str, Any]] = []
    for op in ops + _host_kernels_behind_composites({op.name() for op in ops}):
        qual = op._schema.name.split("::")[1] + ("." + op._overloadname if op._overloadname != "default" else "")
        host = registry.host_kernel(op)
        if host is not None:
            lib.impl(qual, host, "PrivateUse1")
        else:
            fronts.append((qual, functools.partial(plan_for, op)))
    _C._kernel_front_setup(executor)
    _C._register_kernel_front("aten", fronts)
    # the library's own ops (lowering/index_bounds.py)
    _C._register_kernel_front("torchtpu", [("index_bounds_flag", functools.partial(plan_for, INDEX_BOUNDS_FLAG))])
    graph_node.register_kernel()
    nested.register()
    fb = torch.library.Library("_", "IMPL")
    _libs.append(fb)
    fb.fallback(_fallback, "PrivateUse1")
    # Host kernels registered by name (not reached through _fallback) are entered straight from
    # the dispatcher: a host kernel under compiled code (x[x > 0] after a graph break) was traced.
    # The kernel front calls executor.run_plan and its index check, and plan_for once per op.
    _hide_from_dynamo(dispatch, copy_from, copy_from_and_resize, local_scalar_dense, _fallback,
                      executor.run_plan, executor.check_recorded_index_bounds, plan_for.__wrapped__,
                      _sdp_choice_math, flash_attention.scaled_dot_product_attention,
                      math_attention.scaled_dot_product_attention_math, has_compatible_shallow_copy_type,
                      *{registry.host_kernel(op) for op in registry.host_kernel_ops()})


_SHALLOW_COPY_DEVICES = frozenset({"cpu", "tpu"})


def has_compatible_shallow_copy_type(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Dense strided CPU and tpu tensors can take each other's data (``p.data = ...``)."""
    if self.layout != torch.strided or other.layout != torch.strided:
        return False
    return {self.device.type, other.device.type} <= _SHALLOW_COPY_DEVICES
