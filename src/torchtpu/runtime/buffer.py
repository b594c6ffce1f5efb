"""PJRT_Buffer: an immutable on-device array."""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ._pjrt_ffi import ffi
from .dtypes import HOST_PJRT_TYPES, from_pjrt_type
from .errors import PjrtError
from .event import Event
from .plugin import BUFFER_DESTROY_SIZE, BUFFER_DESTROY_T

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .client import Client

_NULL = ffi.NULL
_is_finalizing = sys.is_finalizing
_new = ffi.new
_FAILED_PRECONDITION = 9
_LAYOUT_TILED = 0  # PJRT_Buffer_MemoryLayout_Type_Tiled


_LIVE = [0, 0]  # bytes held by live Buffers: [current, peak]


def live_bytes() -> tuple[int, int]:
    """(current, peak) bytes of device memory held by live Buffer objects in this process."""
    return _LIVE[0], _LIVE[1]


def live_buffers() -> list[dict]:
    """Every live, undonated Buffer of this process: device index, bytes, shape and dtype (a
    debugging view; it walks the garbage collector's objects, ~0.1 s)."""
    import gc

    return [{"device": b._device_index or 0, "nbytes": b._nbytes, "shape": tuple(b._shape), "dtype": str(b._dtype)}
            for b in gc.get_objects() if type(b) is Buffer and not b._donated and b._handle is not None]


def reset_peak_bytes() -> None:
    _LIVE[1] = _LIVE[0]


# Handles of donated buffers whose Python owner died. Destroying a donated
# PJRT buffer blocks until the execution that consumed it has finished (the
# CPU client waits on its usage events), which would serialize every launch
# with the host code that follows it. A donated buffer owns no memory, so its
# handle can wait here and be destroyed later, oldest first, when its
# execution is long done.
_DONATED_HANDLES: list[tuple[Any, Any]] = []
_DONATED_CAP = 512


# Batches of those handles are destroyed on a thread of their own: a training step donates ~100
# buffers (parameters, optimizer state), and their destroys (14 us each, and a wait where the
# execution is still running) took a quarter of the host time of a compiled demo GPT step on the
# main thread. ``destroy_lock`` keeps a client from being destroyed under a batch (Client.close).
destroy_lock = threading.Lock()
_reaper_batches: queue.SimpleQueue[list[tuple[Any, Any]] | threading.Event] = queue.SimpleQueue()
_reaper: list[threading.Thread] = []


def _reap() -> None:
    while True:
        batch = _reaper_batches.get()
        if isinstance(batch, threading.Event):  # drain_reaper's marker: the batches before are done
            batch.set()
            continue
        with destroy_lock:
            for client, h in batch:
                if client._handle and not _is_finalizing():
                    _destroy_handle(client._plugin, h)


def _to_reaper(batch: list[tuple[Any, Any]]) -> None:
    if not _reaper:
        _reaper.append(threading.Thread(target=_reap, name="torchtpu-buffer-reaper", daemon=True))
        _reaper[0].start()
    _reaper_batches.put(batch)


def release_donated(keep: int = 0, wait: bool = False) -> None:
    """Destroy queued donated-buffer handles, all but the ``keep`` most recent: on the reaper
    thread; with ``wait``, return once they are destroyed."""
    n = len(_DONATED_HANDLES) - keep
    if n > 0:
        old = _DONATED_HANDLES[:n]
        del _DONATED_HANDLES[:n]
        _to_reaper(old)
    if wait:
        drain_reaper()


# Per thread, while a batch is open (batched_destroys): the handles of buffers that thread freed
# meanwhile, destroyed together on the reaper thread when it closes. (Per thread: a buffer freed
# on another thread meanwhile cannot land in a batch already handed to the reaper.)
_destroy_batch = threading.local()


class batched_destroys:
    """``with batched_destroys():`` the buffers this thread frees inside are destroyed together on
    the reaper thread as the block ends (their bytes stop counting at once). A launch that
    replaces many buffers (a captured step's ~30 gradients and outputs) otherwise destroys each on
    the calling thread, ~10 us apiece on a TPU."""

    __slots__ = ("_outer",)

    def __enter__(self) -> None:
        self._outer = getattr(_destroy_batch, "handles", None) is not None
        if not self._outer:
            _destroy_batch.handles = []

    def __exit__(self, *exc: object) -> None:
        if not self._outer:
            batch, _destroy_batch.handles = _destroy_batch.handles, None
            if batch:
                _to_reaper(batch)


def _after_fork_in_child() -> None:
    # the child has no reaper thread, and a lock the reaper held at the fork stays held there
    global destroy_lock, _reaper_batches
    destroy_lock = threading.Lock()
    _reaper_batches = queue.SimpleQueue()
    _reaper.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def drain_reaper() -> None:
    """Return once every batch handed to the reaper so far is destroyed."""
    if _reaper and _reaper[0].is_alive():
        done = threading.Event()
        _reaper_batches.put(done)
        done.wait()


# Row-major host layouts by rank. Without one, PJRT_Buffer_ToHostBuffer copies in the
# buffer's *device* layout, and a TPU may hold an array in any dimension order (a
# compiler-chosen result layout, say): the host always asks for row-major bytes.
_ROW_MAJOR: dict[int, tuple[Any, Any]] = {}


def _row_major_layout(ndim: int) -> Any:
    got = _ROW_MAJOR.get(ndim)
    if got is None:
        minor_to_major = ffi.new("int64_t[]", max(ndim, 1))
        for i in range(ndim):
            minor_to_major[i] = ndim - 1 - i
        layout = ffi.new("PJRT_Buffer_MemoryLayout*")
        layout.struct_size = ffi.sizeof("PJRT_Buffer_MemoryLayout")
        layout.type = _LAYOUT_TILED
        layout.tiled.struct_size = ffi.sizeof("PJRT_Buffer_MemoryLayout_Tiled")
        layout.tiled.minor_to_major = minor_to_major
        layout.tiled.minor_to_major_size = ndim
        layout.tiled.num_tiles = 0
        got = _ROW_MAJOR[ndim] = (layout, minor_to_major)
    return got[0]


# Each thread's PJRT_Buffer_Destroy_Args, filled in per call: a DeferAndFuse training step
# destroys ~150 buffers, and allocating the struct anew cost a third of each destroy. (Per
# thread: the call releases the GIL, so another thread may destroy a buffer meanwhile.)
_destroy_args = threading.local()


def _destroy_handle(plugin: Any, h: Any) -> None:
    try:
        args = _destroy_args.value
    except AttributeError:
        args = _destroy_args.value = _new(BUFFER_DESTROY_T, [BUFFER_DESTROY_SIZE, _NULL, _NULL])
    args.buffer = h
    err = plugin.buffer_destroy_fn(args)
    if err:
        plugin.take_error(err)  # frees it; a finalizer cannot report it


class Buffer:
    """Owns one ``PJRT_Buffer*``. Immutable: ops produce new buffers.

    Shape and dtype are passed in when the creator knows them (host transfer,
    executable output metadata), otherwise read from PJRT on first use.
    """

    __slots__ = ("__weakref__", "_client", "_device_index", "_donated", "_dtype", "_handle", "_nbytes", "_shape")

    def __init__(
        self,
        client: Client,
        handle: Any,
        shape: tuple[int, ...] | None = None,
        dtype: np.dtype | None = None,
        device_index: int | None = None,
    ) -> None:
        self._client = client
        self._handle = handle
        self._shape = shape
        self._dtype = dtype
        self._device_index = device_index
        # Live device bytes held through Buffer objects (what a backend keeps
        # resident between launches; executables' temporaries excluded).
        n = 0
        if shape is not None and dtype is not None:
            n = dtype.itemsize
            for d in shape:
                n *= d
        self._nbytes = n
        self._donated = False
        _LIVE[0] += n
        _LIVE[1] = max(_LIVE[1], _LIVE[0])

    @classmethod
    def _outputs(cls, client: Client, handles: Any, metas: Sequence[tuple]) -> list[Buffer]:
        """The Buffers of one execution's outputs; ``metas`` holds (index into ``handles``,
        shape, dtype, nbytes) per output, computed once per executable.

        An op's outputs are wrapped on every launch: setting the slots directly, and the
        live-byte count once, costs about half of calling the constructor per output.
        """
        new = cls.__new__
        outs = []
        total = 0
        for j, shape, dtype, nbytes in metas:
            b = new(cls)
            b._client = client
            b._handle = handles[j]
            b._shape = shape
            b._dtype = dtype
            b._device_index = None
            b._nbytes = nbytes
            b._donated = False
            outs.append(b)
            total += nbytes
        _LIVE[0] += total
        _LIVE[1] = max(_LIVE[1], _LIVE[0])
        return outs

    def _forget_bytes(self) -> None:
        """Stop counting this buffer's bytes (it was donated to an executable's output)."""
        _LIVE[0] -= self._nbytes
        self._nbytes = 0
        self._donated = True

    # -- metadata ---------------------------------------------------------
    @property
    def handle(self) -> Any:
        """The raw ``PJRT_Buffer*``; raises if the buffer was deleted."""
        h = self._handle
        if h == _NULL:
            raise PjrtError(_FAILED_PRECONDITION, "buffer has been deleted")
        return h

    @property
    def shape(self) -> tuple[int, ...]:
        s = self._shape
        if s is None:
            r = self._client._plugin.call("PJRT_Buffer_Dimensions", buffer=self.handle)
            s = self._shape = tuple(int(r.dims[i]) for i in range(r.num_dims))
        return s

    @property
    def dtype(self) -> np.dtype:
        d = self._dtype
        if d is None:
            r = self._client._plugin.call("PJRT_Buffer_ElementType", buffer=self.handle)
            d = self._dtype = from_pjrt_type(r.type)
        return d

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def device_index(self) -> int:
        """Index (into ``client.devices``) of the device PJRT placed this on."""
        i = self._device_index
        if i is None:
            r = self._client._plugin.call("PJRT_Buffer_Device", buffer=self.handle)
            i = self._device_index = self._client.device_index_of(r.device)
        return i

    @property
    def nbytes(self) -> int:
        """On-device size in bytes (padding included) if the plugin reports it."""
        p = self._client._plugin
        if p.has("PJRT_Buffer_OnDeviceSizeInBytes"):
            r = p.call("PJRT_Buffer_OnDeviceSizeInBytes", buffer=self.handle)
            return int(r.on_device_size_in_bytes)
        return self.size * self.dtype.itemsize

    # -- data -------------------------------------------------------------
    def to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        """Copy to host memory and wait for the copy (and the producer)."""
        shape, dtype = self.shape, self.dtype
        if dtype not in HOST_PJRT_TYPES:
            raise TypeError(f"cannot copy {dtype} buffers to numpy (sub-byte type)")
        if out is None:
            out = np.empty(shape, dtype)
        elif (
            out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable
        ):
            raise ValueError(
                f"out must be a writeable C-contiguous {dtype} array of shape {shape}, "
                f"got {out.dtype} {out.shape}"
            )
        handle = self.handle
        nbytes = out.nbytes
        if nbytes == 0:
            return out  # PJRT rejects a NULL/empty destination; nothing to copy
        p = self._client._plugin
        args = p.new_args("PJRT_Buffer_ToHostBuffer")
        args.src = handle
        # from_buffer: ~0.5 us, vs ~2.5 us for ndarray.ctypes.data
        args.dst = ffi.from_buffer(out, require_writable=True)
        args.dst_size = nbytes
        args.host_layout = _row_major_layout(len(shape))
        p.check(p.api.PJRT_Buffer_ToHostBuffer(args))
        p.await_and_destroy_event(args.event)
        return out

    def ready_event(self) -> Event:
        """Event that completes when the buffer's contents are computed."""
        p = self._client._plugin
        r = p.call("PJRT_Buffer_ReadyEvent", buffer=self.handle)
        return Event(p, r.event, self._client)

    def block_until_ready(self) -> Buffer:
        self.ready_event().wait()
        return self

    def unsafe_pointer(self) -> int:
        """Device address (host-addressable only on CPU); keep self alive."""
        r = self._client._plugin.call("PJRT_Buffer_UnsafePointer", buffer=self.handle)
        return int(r.buffer_pointer)

    # -- lifetime ---------------------------------------------------------
    @property
    def is_deleted(self) -> bool:
        """True after delete(), or after PJRT consumed it (input donation)."""
        h = self._handle
        if h == _NULL:
            return True
        r = self._client._plugin.call("PJRT_Buffer_IsDeleted", buffer=h)
        return bool(r.is_deleted)

    def delete(self) -> None:
        """Free the device memory now (idempotent)."""
        h = self._handle
        if h:
            self._handle = _NULL
            _LIVE[0] -= self._nbytes
            if self._client._handle:  # else leaked: its client is gone
                self._client._plugin.destroy_buffer(h)

    def __del__(self) -> None:
        # Inlined delete(): runs for every temporary of every op. At
        # interpreter shutdown leak instead: the plugin stays mapped
        # (RTLD_NODELETE) and the process is about to exit anyway.
        h = self._handle
        if h and self._client._handle and not _is_finalizing():
            self._handle = _NULL
            if self._donated:
                _DONATED_HANDLES.append((self._client, h))
                if len(_DONATED_HANDLES) > _DONATED_CAP:
                    release_donated(keep=_DONATED_CAP // 2)
                return
            _LIVE[0] -= self._nbytes
            batch = getattr(_destroy_batch, "handles", None)
            if batch is not None:
                batch.append((self._client, h))
                return
            _destroy_handle(self._client._plugin, h)

    def __repr__(self) -> str:
        if self._handle == _NULL:
            return "Buffer(deleted)"
        return f"Buffer(shape={self.shape}, dtype={self.dtype}, device={self.device_index})"
