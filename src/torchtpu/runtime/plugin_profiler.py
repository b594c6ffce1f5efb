"""The PJRT plugin's own profiler (``PJRT_Profiler_Extension``): device timelines from the plugin.

libtpu exposes XLA's plugin profiler API (xla/backends/profiler/plugin/profiler_c_api.h) as a PJRT
extension: create a profiler, start, stop, collect the serialized ``XSpace`` (tsl's xplane.proto:
one plane per device, with the lines "XLA Modules" and "XLA Ops"), destroy. The CPU plugin has no
such extension; ``profiler_api`` returns None there.
"""

from __future__ import annotations

from typing import Any

import cffi

from ._pjrt_ffi import ffi

PROFILER_EXTENSION = 1  # PJRT_Extension_Type_Profiler (the second of PJRT_Extension_Type)

# The layouts of profiler_c_api.h and pjrt_c_api_profiler_extension.h.
_CDEF = """
typedef struct PLUGIN_Profiler PLUGIN_Profiler;
typedef struct PLUGIN_Profiler_Error PLUGIN_Profiler_Error;
typedef struct { size_t struct_size; void* priv; PLUGIN_Profiler_Error* error; } PLUGIN_Profiler_Error_Destroy_Args;
typedef struct { size_t struct_size; void* priv; const PLUGIN_Profiler_Error* error; const char* message;
                 size_t message_size; } PLUGIN_Profiler_Error_Message_Args;
typedef struct { size_t struct_size; void* priv; const PLUGIN_Profiler_Error* error; int code; }
    PLUGIN_Profiler_Error_GetCode_Args;
typedef struct { size_t struct_size; const char* options; size_t options_size; PLUGIN_Profiler* profiler; }
    PLUGIN_Profiler_Create_Args;
typedef struct { size_t struct_size; PLUGIN_Profiler* profiler; } PLUGIN_Profiler_Destroy_Args;
typedef struct { size_t struct_size; PLUGIN_Profiler* profiler; } PLUGIN_Profiler_Start_Args;
typedef struct { size_t struct_size; PLUGIN_Profiler* profiler; } PLUGIN_Profiler_Stop_Args;
typedef struct { size_t struct_size; PLUGIN_Profiler* profiler; uint8_t* buffer; size_t buffer_size_in_bytes; }
    PLUGIN_Profiler_CollectData_Args;
typedef struct {
  size_t struct_size;
  void* priv;
  void (*error_destroy)(PLUGIN_Profiler_Error_Destroy_Args*);
  void (*error_message)(PLUGIN_Profiler_Error_Message_Args*);
  PLUGIN_Profiler_Error* (*error_get_code)(PLUGIN_Profiler_Error_GetCode_Args*);
  PLUGIN_Profiler_Error* (*create)(PLUGIN_Profiler_Create_Args*);
  PLUGIN_Profiler_Error* (*destroy)(PLUGIN_Profiler_Destroy_Args*);
  PLUGIN_Profiler_Error* (*start)(PLUGIN_Profiler_Start_Args*);
  PLUGIN_Profiler_Error* (*stop)(PLUGIN_Profiler_Stop_Args*);
  PLUGIN_Profiler_Error* (*collect_data)(PLUGIN_Profiler_CollectData_Args*);
} PLUGIN_Profiler_Api;
typedef struct { size_t struct_size; int type; void* next; } Profiler_Extension_Base;
typedef struct { Profiler_Extension_Base base; PLUGIN_Profiler_Api* profiler_api; int64_t traceme_context_id; }
    PJRT_Profiler_Extension;
"""
pffi = cffi.FFI()
pffi.cdef(_CDEF)


class PluginProfilerError(RuntimeError):
    """An error the plugin's profiler returned."""


def profiler_api(plugin: Any) -> Any | None:
    """The plugin's ``PLUGIN_Profiler_Api``, or None where it has no profiler extension."""
    ext = plugin.api.extension_start
    while ext != ffi.NULL:
        if int(ext.type) == PROFILER_EXTENSION:
            found = pffi.cast("PJRT_Profiler_Extension*", int(ffi.cast("uintptr_t", ext)))
            return found.profiler_api if found.profiler_api != pffi.NULL else None
        ext = ext.next
    return None


class PluginProfiler:
    """One profiling session of the plugin: ``start()``, the work, ``stop()``, ``collect()`` (the
    XSpace bytes), ``close()``. ``options``: a serialized ``tensorflow.ProfileOptions`` (empty: the
    plugin's defaults, which on a v5e trace the device's modules and ops)."""

    def __init__(self, api: Any, options: bytes = b"") -> None:
        self._api = api
        args = pffi.new("PLUGIN_Profiler_Create_Args*")
        args.struct_size = pffi.sizeof("PLUGIN_Profiler_Create_Args")
        self._options = pffi.new("char[]", options) if options else pffi.NULL
        args.options, args.options_size = self._options, len(options)
        self._check(api.create(args), "create")
        self._handle = args.profiler

    def _check(self, err: Any, what: str) -> None:
        if err == pffi.NULL:
            return
        m = pffi.new("PLUGIN_Profiler_Error_Message_Args*")
        m.struct_size = pffi.sizeof("PLUGIN_Profiler_Error_Message_Args")
        m.error = err
        self._api.error_message(m)
        message = pffi.string(m.message, m.message_size).decode("utf-8", "replace")
        d = pffi.new("PLUGIN_Profiler_Error_Destroy_Args*")
        d.struct_size = pffi.sizeof("PLUGIN_Profiler_Error_Destroy_Args")
        d.error = err
        self._api.error_destroy(d)
        raise PluginProfilerError(f"plugin profiler {what}: {message}")

    def _simple(self, fn: Any, kind: str) -> None:
        args = pffi.new(f"PLUGIN_Profiler_{kind}_Args*")
        args.struct_size = pffi.sizeof(f"PLUGIN_Profiler_{kind}_Args")
        args.profiler = self._handle
        self._check(fn(args), kind.lower())

    def start(self) -> None:
        self._simple(self._api.start, "Start")

    def stop(self) -> None:
        self._simple(self._api.stop, "Stop")

    def collect(self) -> bytes:
        """The serialized XSpace of the session (after ``stop()``)."""
        args = pffi.new("PLUGIN_Profiler_CollectData_Args*")
        args.struct_size = pffi.sizeof("PLUGIN_Profiler_CollectData_Args")
        args.profiler = self._handle
        args.buffer = pffi.NULL
        self._check(self._api.collect_data(args), "collect_data")
        n = args.buffer_size_in_bytes
        if args.buffer != pffi.NULL:  # the plugin lent its own buffer
            # XLA's CollectData (plugin_tracer_impl.cc) serializes into a vector one byte longer
            # than the XSpace and reports the vector's size: that last byte (zero) is not the
            # XSpace's (a v5e's 15038 bytes failed to parse whole, and parsed without it).
            data = bytes(pffi.buffer(args.buffer, n))
            return data[:-1] if data.endswith(b"\0") else data
        buf = pffi.new("uint8_t[]", max(n, 1))
        args.buffer = buf
        self._check(self._api.collect_data(args), "collect_data (fetch)")
        return bytes(pffi.buffer(buf, args.buffer_size_in_bytes))

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            args = pffi.new("PLUGIN_Profiler_Destroy_Args*")
            args.struct_size = pffi.sizeof("PLUGIN_Profiler_Destroy_Args")
            args.profiler = handle
            self._check(self._api.destroy(args), "destroy")
