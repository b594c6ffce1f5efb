"""PJRT_Client: devices, host->device transfers, compilation."""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import warnings
import weakref
from typing import Any

import numpy as np

from . import cpu_kernels
from ._pjrt_ffi import ffi
from .buffer import Buffer
from .compile_options import compile_options
from .device import Device
from .dtypes import HOST_PJRT_TYPES
from .errors import PjrtError, UnsupportedDtypeError
from .executable import Executable
from .plugin import NamedValues, Plugin, load_plugin
from .plugins import default_client_options, plugin_kind, resolve_plugin_path

_NULL = ffi.NULL
_is_finalizing = sys.is_finalizing
_IMMUTABLE_ONLY_DURING_CALL = 0  # PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
_MAX_RANK = 64

_MEMORY_STATS_OPTIONAL = (
    "peak_bytes_in_use",
    "num_allocs",
    "largest_alloc_size",
    "bytes_limit",
    "bytes_reserved",
    "peak_bytes_reserved",
    "bytes_reservable_limit",
    "largest_free_block_bytes",
    "pool_bytes",
    "peak_pool_bytes",
)


# Exiting while XLA still runs launched work segfaults (the plugin's static
# destructors race its worker threads). Destroying the clients at exit joins
# that work first; every later destroy of a buffer/executable/event of a
# closed client is skipped (see the liveness checks in their finalizers).
_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_clients_at_exit() -> None:
    for client in list(_live_clients):
        with contextlib.suppress(PjrtError):
            client.close()


_F64 = np.dtype(np.float64)
_C128 = np.dtype(np.complex128)
_warned_float64: list[bool] = []

FLOAT64_ON_TPU = (
    "torchtpu: float64 on a TPU is XLA's emulation with pairs of float32 (the chip has no float64 "
    "units): about 48 significant bits (a transfer keeps ~1.8e-15 relative, arithmetic ~2e-14, log and "
    "other functions ~5e-11 to 2e-9), and float32's exponent range (magnitudes above ~3.4e38 become inf, "
    "below ~1.2e-38 flush to zero). Use float32 on the TPU, or keep float64 work on the CPU where it must "
    "be exact (docs/tpu.md)."
)


COMPLEX128_ON_TPU = (
    "torchtpu: complex128 is not supported on a TPU: libtpu cannot compile 128-bit complex numbers "
    "(its float64 emulation has no complex form, and it stops the process instead of refusing the "
    "program). Use complex64 on the TPU, or keep complex128 work on the CPU (docs/tpu.md)."
)


def _warn_float64_emulated() -> None:
    if not _warned_float64:
        _warned_float64.append(True)
        warnings.warn(FLOAT64_ON_TPU, stacklevel=3)


def _signature_has_float64(code: bytes) -> bool:
    """Whether a module's entry takes or returns 64-bit floats (its body may use them
    internally, as a TPU's f32 power does, without the user's data being float64)."""
    start = code.find(b"@main(")
    if start < 0:
        return False
    end = code.find(b"{\n", start)
    return b"f64>" in code[start:end if end >= 0 else len(code)]


def _ptr_key(ptr: Any) -> int:
    return int(ffi.cast("uintptr_t", ptr))


class _PutScratch:
    """Preallocated BufferFromHostBuffer args: put() is on the eager hot path."""

    def __init__(self, plugin: Plugin, client_handle: Any) -> None:
        self.args = plugin.new_args("PJRT_Client_BufferFromHostBuffer")
        self.args.client = client_handle
        self.args.host_buffer_semantics = _IMMUTABLE_ONLY_DURING_CALL
        self.dims = ffi.new("int64_t[]", _MAX_RANK)
        self.args.dims = self.dims


# XLA:CPU hands float32 dots to XNNPACK, which keeps the right-hand operand packed between
# calls, keyed by its address. A buffer updated in place (its donated memory reused for the
# result, as every in-place op and optimizer step does) keeps its address, so the next product
# with it used the old values: measured with a 256x128 weight updated by add_ and then
# multiplied (TORCH_TPU_LOWER_FOR=tpu, whose products take the weight as it is; the emulator's
# own products multiply rounded copies). Without XNNPACK XLA:CPU's own dot kernels run them.
_PLATFORM_COMPILE_OVERRIDES: dict[str, dict[str, bool]] = {"cpu": {"xla_cpu_use_xnnpack": False}}


class Client:
    """A PJRT client: the plugin's view of its devices.

    ``options`` become PJRT_Client_Create's named values; the CPU plugin wants
    ``{"cpu_device_count": n}`` (it makes 4 devices otherwise).
    """

    def __init__(self, plugin: Plugin, options: dict[str, int | str | bool | float] | None = None):
        plugin.initialize()
        self._plugin = plugin
        nv = NamedValues(dict(options or {}))
        r = plugin.call("PJRT_Client_Create", create_options=nv.array, num_options=nv.count)
        self._handle = r.client
        self.options = dict(options or {})
        r = plugin.call("PJRT_Client_PlatformName", client=self._handle)
        self.platform_name: str = ffi.string(r.platform_name, r.platform_name_size).decode()
        r = plugin.call("PJRT_Client_PlatformVersion", client=self._handle)
        self.platform_version: str = ffi.string(r.platform_version, r.platform_version_size).decode()
        if self.platform_name == "cpu":  # XLA:CPU programs may call the host kernels
            cpu_kernels.register(plugin)
        # A TPU emulates 64-bit floats with float32 pairs: said once, where such data arrives.
        self.emulates_float64 = self.platform_name == "tpu"
        # ... but has no complex128 at all: libtpu aborts compiling it (measured on a v5e, JAX's
        # programs too), so such data and programs are refused before they reach the plugin.
        self.supports_complex128 = self.platform_name != "tpu"
        # XLA debug options every compile for this plugin takes (compile_options' env_overrides).
        self.compile_overrides: dict[str, bool] = dict(_PLATFORM_COMPILE_OVERRIDES.get(self.platform_name, {}))
        r = plugin.call("PJRT_Client_AddressableDevices", client=self._handle)
        self.devices: list[Device] = [
            Device(plugin, r.addressable_devices[i], i) for i in range(r.num_addressable_devices)
        ]
        # Execute takes the raw PJRT_Device*; buffers report one back.
        self._device_handles = [d.handle for d in self.devices]
        self._device_index = {_ptr_key(d.handle): d.index for d in self.devices}
        self._put = _PutScratch(plugin, self._handle)
        self._put_lock = threading.Lock()
        self._put_fn = plugin.fn("PJRT_Client_BufferFromHostBuffer")
        _live_clients.add(self)

    @property
    def plugin(self) -> Plugin:
        return self._plugin

    def device_index_of(self, device_handle: Any) -> int:
        """Position in ``devices`` of a ``PJRT_Device*``."""
        try:
            return self._device_index[_ptr_key(device_handle)]
        except KeyError:
            raise PjrtError(5, "device is not addressable by this client") from None

    def memory_stats(self, device: Device | int = 0) -> dict[str, int] | None:
        """Allocator statistics of a device, or None where unsupported (CPU)."""
        d = self.devices[device] if isinstance(device, int) else device
        r = self._plugin.call_if_supported("PJRT_Device_MemoryStats", device=d.handle)
        if r is None:
            return None
        stats = {"bytes_in_use": int(r.bytes_in_use)}
        for name in _MEMORY_STATS_OPTIONAL:
            if getattr(r, name + "_is_set"):
                stats[name] = int(getattr(r, name))
        return stats

    # -- host -> device -------------------------------------------------
    def buffer_from_host(self, array: np.ndarray, device_index: int = 0) -> Buffer:
        """Copy ``array`` to a device; returns once the host copy is done."""
        a = array if type(array) is np.ndarray else np.asarray(array)
        if not a.flags.c_contiguous or not a.dtype.isnative:
            # np.array (not ascontiguousarray) keeps 0-d arrays 0-d.
            a = np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
        dtype = a.dtype
        if dtype == _C128 and not self.supports_complex128:
            raise UnsupportedDtypeError(COMPLEX128_ON_TPU)
        if self.emulates_float64 and dtype == _F64:
            _warn_float64_emulated()
        try:
            pjrt_type = HOST_PJRT_TYPES[dtype]
        except KeyError:
            raise TypeError(f"cannot transfer {dtype} arrays to a PJRT device") from None
        shape = a.shape
        ndim = len(shape)
        if ndim > _MAX_RANK:
            raise ValueError(f"rank {ndim} exceeds {_MAX_RANK}")
        device = self._device_handles[device_index]
        p = self._plugin
        lock = self._put_lock
        s = self._put if lock.acquire(False) else _PutScratch(p, self._handle)
        try:
            args = s.args
            if ndim:
                s.dims[0:ndim] = shape
            args.num_dims = ndim
            args.type = pjrt_type
            # from_buffer: ~0.5 us, vs ~2.5 us for ndarray.ctypes.data
            args.data = ffi.from_buffer(a)
            args.device = device
            err = self._put_fn(args)
            if err:
                raise p.take_error(err)
            handle, done = args.buffer, args.done_with_host_buffer
        finally:
            if s is self._put:
                lock.release()
        buf = Buffer(self, handle, shape, dtype, device_index)
        # kImmutableOnlyDuringCall: the copy is normally complete on return,
        # but the contract is this event (which must be freed anyway).
        p.await_and_destroy_event(done)
        return buf

    # -- compilation ------------------------------------------------------
    def compile(
        self,
        mlir: str | bytes,
        device_index: int = 0,
        options: bytes | None = None,
    ) -> Executable:
        """Compile StableHLO (text or bytecode) into an Executable.

        The default options build a portable executable (no fixed device
        assignment): it runs on any device, chosen per execute() call.
        ``device_index`` is the device it is compiled for (device_ordinal).
        ``options`` overrides with raw CompileOptionsProto bytes (never empty).
        """
        code = mlir.encode() if isinstance(mlir, str) else bytes(mlir)
        self.note_program(code)
        if options is None:
            # StreamExecutor-style ordinal = the device's local hardware id.
            device = self.devices[device_index]
            ordinal = device.local_hardware_id
            options = compile_options(device_ordinal=device_index if ordinal is None else ordinal,
                                      env_overrides=self.compile_overrides)
        if not options:
            raise ValueError("empty compile options abort the plugin; pass real options")
        p = self._plugin
        c_code = ffi.new("char[]", code)
        c_fmt = ffi.new("char[]", b"mlir")
        program = ffi.new("PJRT_Program*")
        program.struct_size = ffi.sizeof("PJRT_Program")
        program.code = c_code
        program.code_size = len(code)
        program.format = c_fmt
        program.format_size = 4
        c_opts = ffi.new("char[]", options)
        r = p.call(
            "PJRT_Client_Compile",
            client=self._handle,
            program=program,
            compile_options=c_opts,
            compile_options_size=len(options),
        )
        return Executable(self, r.executable)

    def note_program(self, code: bytes) -> None:
        """Refuse a complex128 program where the plugin cannot compile it, and say once, on a
        plugin that emulates float64, that a program takes or makes float64 data (called for
        every new program, cached or compiled: a cached one is refused as a compiled one)."""
        if not self.supports_complex128 and b"complex<f64>" in code:
            raise UnsupportedDtypeError(COMPLEX128_ON_TPU)
        if self.emulates_float64 and _signature_has_float64(code):
            _warn_float64_emulated()

    def deserialize(self, blob: bytes, options: bytes | None = None) -> Executable:
        """Load bytes from Executable.serialize() (same plugin build only:
        other builds may load them and silently compute wrong results). ``options``: the
        compile options it was built with, given again (the CPU plugin loads an executable
        without its device assignment otherwise)."""
        c_blob = ffi.new("char[]", blob)
        extra = {}
        if options is not None:
            c_options = ffi.new("char[]", options)
            extra = {"overridden_serialized_compile_options": c_options,
                     "overridden_serialized_compile_options_size": len(options)}
        r = self._plugin.call(
            "PJRT_Executable_DeserializeAndLoad",
            client=self._handle,
            serialized_executable=c_blob,
            serialized_executable_size=len(blob),
            **extra,
        )
        return Executable(self, r.loaded_executable)

    # -- lifetime ---------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return not self._handle

    def close(self) -> None:
        """Destroy the PJRT client now; waits for launched work to finish.

        Buffers, executables and events keep their Client alive, so normally
        just drop references. After close() they are unusable, and their
        PJRT objects are leaked rather than freed into a destroyed client.
        """
        from .buffer import destroy_lock

        with destroy_lock:  # (not under a batch of the buffer reaper's destroys)
            handle, self._handle = self._handle, _NULL
        if handle != _NULL:
            self._plugin.call("PJRT_Client_Destroy", client=handle)

    def __del__(self) -> None:
        if _is_finalizing():
            return
        with contextlib.suppress(PjrtError):
            self.close()

    def __repr__(self) -> str:
        return (
            f"Client(platform={self.platform_name!r}, version={self.platform_version!r}, "
            f"devices={len(self.devices)})"
        )


def create_client(
    choice: str | None = None,
    num_devices: int | None = None,
    options: dict[str, int | str | bool | float] | None = None,
) -> Client:
    """Client for a plugin name/path (see resolve_plugin_path) with the
    default options of its kind, updated by ``options``."""
    path = resolve_plugin_path(choice)
    merged = default_client_options(plugin_kind(path), num_devices)
    merged.update(options or {})
    return Client(load_plugin(path), merged)
