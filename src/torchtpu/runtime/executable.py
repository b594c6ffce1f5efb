"""PJRT_LoadedExecutable: a compiled program, and the execute hot path."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import event as _event
from ._pjrt_ffi import ffi
from .buffer import Buffer
from .dtypes import from_pjrt_type
from .errors import PjrtError
from .event import Event

if TYPE_CHECKING:
    from .client import Client

_NULL = ffi.NULL
_is_finalizing = sys.is_finalizing
_INVALID_ARGUMENT = 3
_FAILED_PRECONDITION = 9


class _ExecScratch:
    """Preallocated ``PJRT_LoadedExecutable_Execute`` structs for one executable.

    execute() runs once per PyTorch op, so building the nested cffi arrays on
    every call (~10 allocations) would dominate the dispatch cost. One scratch
    is reused under a lock; a concurrent caller gets a private one. Fields
    that rarely change (arg count, device, donation, event) are only rewritten
    when they differ from the previous launch.
    """

    __slots__ = (
        "_keep",
        "arg_list",
        "arg_lists",
        "args",
        "capacity",
        "events",
        "keep_for",
        "last_device",
        "last_n",
        "last_with_event",
        "no_donation",
        "opts",
        "out_list",
    )

    def __init__(self, plugin: Any, handle: Any, num_outputs: int) -> None:
        self.opts = ffi.new("PJRT_ExecuteOptions*")
        self.opts.struct_size = ffi.sizeof("PJRT_ExecuteOptions")
        args = self.args = plugin.new_args("PJRT_LoadedExecutable_Execute")
        args.executable = handle
        args.options = self.opts
        args.num_devices = 1  # one device per launch; see execute_device
        self.out_list = ffi.new("PJRT_Buffer*[]", max(num_outputs, 1))
        out_lists = ffi.new("PJRT_Buffer**[1]", [self.out_list])
        args.output_lists = out_lists
        self.events = ffi.new("PJRT_Event*[1]")
        self.arg_lists = ffi.new("PJRT_Buffer**[1]")
        args.argument_lists = self.arg_lists
        self._keep = [out_lists]
        self.capacity = 0
        self.arg_list: Any = None
        # non_donatable_input_indices = [0, 1, ..., n-1]: nothing donated
        self.no_donation: Any = None
        self.last_n = -1
        self.last_device = None
        self.last_with_event = None
        # (arg count, donated positions) -> the non-donatable index array: a fused program
        # donates the same positions at every launch
        self.keep_for: dict[tuple, tuple[Any, int]] = {}
        self.grow(8)

    def grow(self, n: int) -> None:
        self.capacity = n
        self.arg_list = ffi.new("PJRT_Buffer*[]", n)
        self.arg_lists[0] = self.arg_list
        self.no_donation = ffi.new("int64_t[]", list(range(n)))
        self.opts.non_donatable_input_indices = self.no_donation
        self.last_n = -1


class Executable:
    """A compiled, loaded program.

    Compiled "portable" (no fixed device assignment), it runs on any of the client's devices:
    each launch names its device through ``execute_device``. Compiled for one device (a fixed
    assignment), it is :meth:`bind`-ed to that device and its launches name none.
    """

    def __init__(self, client: Client, handle: Any) -> None:
        self._client = client
        # what the program computes, for traces (set by whoever compiled it)
        self.label = "program"
        p = self._plugin = client._plugin
        self._handle = handle
        self._exe = p.call("PJRT_LoadedExecutable_GetExecutable", loaded_executable=handle).executable
        r = p.call("PJRT_Executable_NumOutputs", executable=self._exe)
        self.num_outputs: int = int(r.num_outputs)
        self.output_dtypes: list[np.dtype] | None = self._output_dtypes()
        self.output_shapes: list[tuple[int, ...]] | None = self._output_shapes()
        self._execute_fn = p.fn("PJRT_LoadedExecutable_Execute")
        self._scratch = _ExecScratch(p, handle, self.num_outputs)
        self._lock = threading.Lock()
        # bind(): the device index a fixed-assignment executable was compiled for, and how to get
        # the same program for another device (None: a portable executable)
        self.bound_device: int | None = None
        self._sibling: Callable[[int], Executable] | None = None
        self._siblings: dict[int, Executable] = {}
        # Per output: (index, shape, dtype, nbytes) handed to its Buffer; None = ask PJRT.
        if self.output_dtypes is not None and self.output_shapes is not None:
            self._out_meta = [(j, shape, dtype, dtype.itemsize * math.prod(shape))
                              for j, (shape, dtype) in enumerate(zip(self.output_shapes, self.output_dtypes))]
        else:
            self._out_meta = [(j, None, None, 0) for j in range(self.num_outputs)]

    @property
    def plugin(self) -> Any:
        """The plugin that compiled the program (its extensions: e.g. a device profiler)."""
        return self._plugin

    # -- metadata ---------------------------------------------------------
    def _output_dtypes(self) -> list[np.dtype] | None:
        p = self._plugin
        if not p.has("PJRT_Executable_OutputElementTypes"):
            return None
        try:
            r = p.call("PJRT_Executable_OutputElementTypes", executable=self._exe)
            return [from_pjrt_type(r.output_types[i]) for i in range(r.num_output_types)]
        except (PjrtError, TypeError):
            return None  # unimplemented, or a type numpy cannot hold (token)

    def _output_shapes(self) -> list[tuple[int, ...]] | None:
        p = self._plugin
        if not p.has("PJRT_Executable_OutputDimensions"):
            return None
        try:
            r = p.call("PJRT_Executable_OutputDimensions", executable=self._exe)
        except PjrtError:
            return None
        shapes, pos = [], 0
        for i in range(r.num_outputs):
            n = int(r.dim_sizes[i])
            shapes.append(tuple(int(r.dims[pos + j]) for j in range(n)))
            pos += n
        return shapes

    @property
    def name(self) -> str:
        r = self._plugin.call("PJRT_Executable_Name", executable=self._exe)
        return ffi.string(r.executable_name, r.executable_name_size).decode()

    def fingerprint(self) -> str | None:
        """PJRT_Executable_Fingerprint, or None where the plugin has none."""
        r = self._plugin.call_if_supported("PJRT_Executable_Fingerprint", executable=self._exe)
        if r is None or r.executable_fingerprint == _NULL:
            return None
        return ffi.string(r.executable_fingerprint, r.executable_fingerprint_size).decode("utf-8", "replace")

    def compiled_memory_stats(self) -> dict[str, int] | None:
        """PJRT_Executable_GetCompiledMemoryStats in bytes (device side): ``argument``, ``output``,
        ``alias`` (outputs written into donated arguments), ``temp`` (the program's scratch, which no
        buffer outlives) and ``generated_code``; None where the plugin has none."""
        r = self._plugin.call_if_supported("PJRT_Executable_GetCompiledMemoryStats", executable=self._exe)
        if r is None:
            return None
        return {"argument": int(r.argument_size_in_bytes), "output": int(r.output_size_in_bytes),
                "alias": int(r.alias_size_in_bytes), "temp": int(r.temp_size_in_bytes),
                "generated_code": int(r.generated_code_size_in_bytes)}

    def serialize(self) -> bytes:
        """Plugin-specific bytes for Client.deserialize (same plugin build only)."""
        p = self._plugin
        r = p.call("PJRT_Executable_Serialize", executable=self._exe)
        try:
            return bytes(ffi.buffer(r.serialized_bytes, r.serialized_bytes_size))
        finally:
            if r.serialized_executable_deleter != _NULL:
                r.serialized_executable_deleter(r.serialized_executable)

    # -- device binding ---------------------------------------------------
    def bind(self, device_index: int, sibling: Callable[[int], Executable] | None = None) -> None:
        """Mark this executable as compiled for ``client.devices[device_index]`` alone (a fixed
        device assignment): its launches name no ``execute_device``. On a TPU that halves a
        launch's host time (v5e, libtpu 0.0.42.1: ~90 against ~210 us with one argument, 0.80
        against 1.0-1.1 ms with 128 donated ones; ``tools/tpu_suite/probe_execute_cost.py``).
        A launch on another device runs ``sibling(index)``, the same program compiled for that
        device (kept once made); without ``sibling`` such a launch raises."""
        self.bound_device = device_index
        self._sibling = sibling

    def _for_device(self, device_index: int) -> Executable:
        other = self._siblings.get(device_index)
        if other is None:
            if self._sibling is None:
                raise PjrtError(_INVALID_ARGUMENT, f"this executable was compiled for device {self.bound_device} "
                                                   f"alone, not for device {device_index}")
            other = self._siblings[device_index] = self._sibling(device_index)
        return other

    # -- execution --------------------------------------------------------
    def execute(
        self,
        args: Sequence[Buffer],
        device_index: int = 0,
        donate: Sequence[int] = (),
        *,
        with_event: bool = True,
    ) -> tuple[list[Buffer], Event | None]:
        """Launch on ``client.devices[device_index]``; returns without waiting.

        Returns the output buffers (usable right away as inputs of further
        launches) and the event that completes when the device is done.
        ``with_event=False`` skips that event (None; saves ~1.3 us per call):
        outputs still carry readiness and errors (``Buffer.ready_event()``).

        ``donate`` lists argument positions PJRT may reuse for outputs; it
        only has an effect where the module declares aliasing
        (``tf.aliasing_output`` / ``jax.buffer_donor``), and such a donated
        Buffer is deleted afterwards. All other inputs are never donated.
        """
        if _event._deferred:
            _event.drain_deferred()
        if self.bound_device is not None and device_index != self.bound_device:
            return self._for_device(device_index).execute(args, device_index, donate, with_event=with_event)
        if not self._handle:
            raise PjrtError(_FAILED_PRECONDITION, "executable has been closed")
        lock = self._lock
        if lock.acquire(False):
            try:
                return self._run(self._scratch, args, device_index, donate, with_event)
            finally:
                lock.release()
        # Another thread is inside execute() on this executable.
        scratch = _ExecScratch(self._plugin, self._handle, self.num_outputs)
        return self._run(scratch, args, device_index, donate, with_event)

    def _run(
        self,
        s: _ExecScratch,
        args: Sequence[Buffer],
        device_index: int,
        donate: Sequence[int],
        with_event: bool,
    ) -> tuple[list[Buffer], Event | None]:
        client = self._client
        n = len(args)
        if n > s.capacity:
            s.grow(max(n, 2 * s.capacity))
        arg_list = s.arg_list
        for i, b in enumerate(args):
            h = b._handle
            # A NULL or foreign handle would crash inside the plugin.
            if not h or b._client is not client:
                raise PjrtError(_INVALID_ARGUMENT, f"argument {i} is deleted or belongs to another client")
            arg_list[i] = h
        a = s.args
        opts = s.opts
        if n != s.last_n:
            a.num_args = n
            opts.num_non_donatable_input_indices = n
            s.last_n = n
        if device_index != s.last_device:
            # a fixed assignment names its device itself (PJRT takes execute_device as "portable")
            a.execute_device = _NULL if self.bound_device is not None else client._device_handles[device_index]
            s.last_device = device_index
        if with_event is not s.last_with_event:
            a.device_complete_events = s.events if with_event else _NULL
            s.last_with_event = with_event
        if donate:
            donated = tuple(donate)
            kept = s.keep_for.get((n, donated))
            if kept is None:
                donated_set = set(donated)
                keep = [j for j in range(n) if j not in donated_set]
                kept = s.keep_for[(n, donated)] = (ffi.new("int64_t[]", keep or [0]), len(keep))
            opts.non_donatable_input_indices = kept[0]
            opts.num_non_donatable_input_indices = kept[1]
            s.last_n = -1  # restore the no-donation list next time
            err = self._execute_fn(a)
            opts.non_donatable_input_indices = s.no_donation
            if not err:
                for j in donated:
                    args[j]._forget_bytes()  # its memory now belongs to an output
        else:
            err = self._execute_fn(a)
        if err:
            raise self._plugin.take_error(err)
        out_list = s.out_list
        outs = Buffer._outputs(client, out_list, self._out_meta)
        if with_event:
            return outs, Event(self._plugin, s.events[0], client)
        return outs, None

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Free the executable now (idempotent)."""
        if not self._client._handle:  # client destroyed: leak, don't touch
            self._exe = self._handle = _NULL
            return
        p = self._plugin
        exe, self._exe = self._exe, _NULL
        if exe != _NULL:
            p.call("PJRT_Executable_Destroy", executable=exe)
        handle, self._handle = self._handle, _NULL
        if handle != _NULL:
            p.call("PJRT_LoadedExecutable_Destroy", executable=handle)

    def __del__(self) -> None:
        if _is_finalizing():
            return
        with contextlib.suppress(PjrtError):
            self.close()

    def __repr__(self) -> str:
        return f"Executable(num_outputs={self.num_outputs}, outputs={self.output_shapes})"
