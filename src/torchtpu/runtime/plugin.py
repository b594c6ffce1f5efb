"""Loading a PJRT plugin (.so) and calling its C API function table."""

from __future__ import annotations

import os
import threading
from typing import Any

from ._pjrt_ffi import PJRT_HEADER_VERSION, ffi
from .errors import UNIMPLEMENTED, PjrtError, make_error

# RTLD_NODELETE: cffi dlclose()s libraries when the interpreter exits while
# XLA's worker threads still run code from the .so -> segfault at exit.
# RTLD_LOCAL: two plugins (e.g. CPU + TPU) each bundle their own XLA copy.
_DLOPEN_FLAGS = ffi.RTLD_NOW | ffi.RTLD_LOCAL | ffi.RTLD_NODELETE

_SLOT_SIZE = ffi.sizeof("void*")
_NULL = ffi.NULL

# Tiny args structs of the hot paths are built with one ffi.new(type, [init])
# call: cheaper than new() + attribute stores, and thread-safe unlike a shared
# preallocated struct. Layout: {struct_size, extension_start, handle}.
BUFFER_DESTROY_T = ffi.typeof("PJRT_Buffer_Destroy_Args*")
BUFFER_DESTROY_SIZE = ffi.sizeof("PJRT_Buffer_Destroy_Args")
EVENT_DESTROY_T = ffi.typeof("PJRT_Event_Destroy_Args*")
EVENT_DESTROY_SIZE = ffi.sizeof("PJRT_Event_Destroy_Args")
EVENT_AWAIT_T = ffi.typeof("PJRT_Event_Await_Args*")
EVENT_AWAIT_SIZE = ffi.sizeof("PJRT_Event_Await_Args")

# NamedValue type tags (PJRT_NamedValue_Type)
NV_STRING, NV_INT64, NV_INT64_LIST, NV_FLOAT, NV_BOOL = range(5)


class Plugin:
    """A dlopen()ed PJRT plugin and its ``PJRT_Api`` function table.

    Prefer :func:`load_plugin`, which returns one shared instance per file:
    a plugin must be initialized once per process.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ffi.dlopen(path, _DLOPEN_FLAGS)
        api = self.lib.GetPjrtApi()
        if api == ffi.NULL:
            raise RuntimeError(f"GetPjrtApi() returned NULL in {path}")
        self.api = api
        major = int(api.pjrt_api_version.major_version)
        if major != PJRT_HEADER_VERSION[0]:
            # A major bump means the table layout changed: calling would crash.
            raise RuntimeError(
                f"{path} implements PJRT C API {major}.x; torchtpu is built for {PJRT_HEADER_VERSION[0]}.x"
            )
        # Older plugins have a shorter table than our header declares; slots
        # past this size hold garbage. A test may shrink it to simulate that.
        self.api_size: int = int(api.struct_size)
        self._arg_types: dict[str, tuple[Any, int]] = {}
        self._init_lock = threading.Lock()
        self._initialized = False
        self._attributes: dict[str, Any] | None = None
        # Entry points present in every PJRT C API version (0.x base table).
        self.buffer_destroy_fn = api.PJRT_Buffer_Destroy
        self.event_destroy_fn = api.PJRT_Event_Destroy
        self.event_await_fn = api.PJRT_Event_Await

    # -- function table -------------------------------------------------
    @property
    def api_version(self) -> tuple[int, int]:
        v = self.api.pjrt_api_version
        return int(v.major_version), int(v.minor_version)

    def has(self, fn_name: str) -> bool:
        """True if the plugin's table has a non-NULL entry for ``fn_name``."""
        try:
            offset = ffi.offsetof("PJRT_Api", fn_name)
        except (KeyError, ValueError, TypeError):
            return False  # not even in our header
        if offset + _SLOT_SIZE > self.api_size:
            return False
        return getattr(self.api, fn_name) != ffi.NULL

    def fn(self, fn_name: str) -> Any:
        """The C function pointer for ``fn_name``; raises PjrtError if absent."""
        if not self.has(fn_name):
            raise PjrtError(
                12,
                f"{fn_name} is not provided by {os.path.basename(self.path)} (PJRT C API {self.api_version})",
            )
        return getattr(self.api, fn_name)

    def new_args(self, fn_name: str) -> Any:
        """A zeroed ``<fn_name>_Args`` struct with ``struct_size`` filled in."""
        entry = self._arg_types.get(fn_name)
        if entry is None:
            ctype = ffi.typeof(fn_name + "_Args*")
            entry = (ctype, ffi.sizeof(fn_name + "_Args"))
            self._arg_types[fn_name] = entry
        args = ffi.new(entry[0])
        args.struct_size = entry[1]
        return args

    def call(self, fn_name: str, **fields: Any) -> Any:
        """Fill ``<fn_name>_Args`` from ``fields``, call, raise on error.

        Returns the args struct so callers can read the out fields. Keep any
        cdata you pass in alive until the call returns (cffi does not).
        """
        f = self.fn(fn_name)
        args = self.new_args(fn_name)
        for key, value in fields.items():
            setattr(args, key, value)
        self.check(f(args))
        return args

    def call_if_supported(self, fn_name: str, **fields: Any) -> Any | None:
        """:meth:`call`, or None where the plugin lacks ``fn_name`` or answers UNIMPLEMENTED (an
        optional query: fingerprints, memory statistics)."""
        if not self.has(fn_name):
            return None
        try:
            return self.call(fn_name, **fields)
        except PjrtError as e:
            if e.code == UNIMPLEMENTED:
                return None
            raise

    def check(self, err: Any) -> None:
        """Raise (and free) a returned ``PJRT_Error*``; no-op for NULL."""
        if err:
            raise self.take_error(err)

    def take_error(self, err: Any) -> PjrtError:
        """Convert a ``PJRT_Error*`` into a PjrtError, destroying the C error."""
        api = self.api
        m = ffi.new("PJRT_Error_Message_Args*")
        m.struct_size = ffi.sizeof("PJRT_Error_Message_Args")
        m.error = err
        api.PJRT_Error_Message(m)
        message = ffi.string(m.message, m.message_size).decode("utf-8", "replace")
        c = ffi.new("PJRT_Error_GetCode_Args*")
        c.struct_size = ffi.sizeof("PJRT_Error_GetCode_Args")
        c.error = err
        code_err = api.PJRT_Error_GetCode(c)
        code = int(c.code) if not code_err else 2  # UNKNOWN
        d = ffi.new("PJRT_Error_Destroy_Args*")
        d.struct_size = ffi.sizeof("PJRT_Error_Destroy_Args")
        d.error = err
        api.PJRT_Error_Destroy(d)
        return make_error(code, message)

    def destroy_buffer(self, handle: Any) -> None:
        if handle:
            self.check(
                self.buffer_destroy_fn(ffi.new(BUFFER_DESTROY_T, [BUFFER_DESTROY_SIZE, _NULL, handle]))
            )

    def destroy_event(self, handle: Any) -> None:
        if handle:
            self.check(self.event_destroy_fn(ffi.new(EVENT_DESTROY_T, [EVENT_DESTROY_SIZE, _NULL, handle])))

    def await_and_destroy_event(self, handle: Any) -> None:
        """Block on a PJRT_Event*, free it, raise its error if it carried one."""
        if not handle:
            return
        err = self.event_await_fn(ffi.new(EVENT_AWAIT_T, [EVENT_AWAIT_SIZE, _NULL, handle]))
        self.destroy_event(handle)
        if err:
            raise self.take_error(err)

    # -- plugin-level calls ---------------------------------------------
    def initialize(self) -> None:
        """PJRT_Plugin_Initialize, once per plugin (later calls are no-ops)."""
        with self._init_lock:
            if self._initialized:
                return
            if self.has("PJRT_Plugin_Initialize"):
                self.call("PJRT_Plugin_Initialize")
            self._initialized = True

    @property
    def initialized(self) -> bool:
        return self._initialized

    def attributes(self) -> dict[str, Any]:
        """Plugin attributes (xla_version, stablehlo_current_version, ...).

        Empty if the plugin lacks PJRT_Plugin_Attributes.
        """
        if self._attributes is None:
            if not self.has("PJRT_Plugin_Attributes"):
                self._attributes = {}
            else:
                a = self.call("PJRT_Plugin_Attributes")
                self._attributes = named_values_to_dict(a.attributes, a.num_attributes)
        return dict(self._attributes)

    def __repr__(self) -> str:
        major, minor = self.api_version
        return f"Plugin({self.path!r}, api={major}.{minor})"


def named_values_to_dict(values: Any, count: int) -> dict[str, Any]:
    """Decode a ``PJRT_NamedValue[count]`` array into Python values."""
    out: dict[str, Any] = {}
    for i in range(int(count)):
        nv = values[i]
        name = ffi.string(nv.name, nv.name_size).decode()
        t = int(nv.type)
        if t == NV_STRING:
            value: Any = ffi.string(nv.string_value, nv.value_size).decode("utf-8", "replace")
        elif t == NV_INT64:
            value = int(nv.int64_value)
        elif t == NV_INT64_LIST:
            value = [int(nv.int64_array_value[j]) for j in range(nv.value_size)]
        elif t == NV_FLOAT:
            value = float(nv.float_value)
        elif t == NV_BOOL:
            value = bool(nv.bool_value)
        else:
            continue  # a type newer than our header
        out[name] = value
    return out


class NamedValues:
    """A ``PJRT_NamedValue[]`` built from a dict, keeping its strings alive."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.count = len(options)
        self.array = ffi.new("PJRT_NamedValue[]", max(self.count, 1))
        self._keepalive: list[Any] = []
        size = ffi.sizeof("PJRT_NamedValue")
        for i, (key, value) in enumerate(options.items()):
            nv = self.array[i]
            nv.struct_size = size
            name = key.encode()
            cname = ffi.new("char[]", name)
            self._keepalive.append(cname)
            nv.name = cname
            nv.name_size = len(name)
            # bool before int: bool is a subclass of int in Python.
            if isinstance(value, bool):
                nv.type = NV_BOOL
                nv.bool_value = value
                nv.value_size = 1
            elif isinstance(value, int):
                nv.type = NV_INT64
                nv.int64_value = value
                nv.value_size = 1
            elif isinstance(value, float):
                nv.type = NV_FLOAT
                nv.float_value = value
                nv.value_size = 1
            elif isinstance(value, str):
                data = value.encode()
                cdata = ffi.new("char[]", data)
                self._keepalive.append(cdata)
                nv.type = NV_STRING
                nv.string_value = cdata
                nv.value_size = len(data)
            elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
                carr = ffi.new("int64_t[]", list(value) or [0])
                self._keepalive.append(carr)
                nv.type = NV_INT64_LIST
                nv.int64_array_value = carr
                nv.value_size = len(value)
            else:
                raise TypeError(f"option {key!r}: unsupported value {value!r}")


_PLUGINS: dict[str, Plugin] = {}
_PLUGINS_LOCK = threading.Lock()


def load_plugin(path: str, initialize: bool = True) -> Plugin:
    """The process-wide Plugin for ``path`` (loaded once, initialized once)."""
    key = os.path.realpath(path)
    with _PLUGINS_LOCK:
        plugin = _PLUGINS.get(key)
        if plugin is None:
            plugin = Plugin(path)
            _PLUGINS[key] = plugin
    if initialize:
        plugin.initialize()
    return plugin
