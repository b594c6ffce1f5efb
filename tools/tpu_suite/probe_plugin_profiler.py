"""Whether the PJRT plugin's own profiler (PJRT_Profiler_Extension) gives device events for the
programs torchtpu launches: the path to torch.profiler device rows from libtpu, and to per-op
device times of torchtpu's programs in its own process.

    python3 tools/tpu_suite/probe_plugin_profiler.py [OUT_DIR]   # default $OUT, else .

Opens the plugin through ``torchtpu.runtime`` (no torch), looks for the profiler extension,
creates a profiler (empty options, then ProfileOptions asking for device tracing), runs a small
matrix-product program between start and stop, collects the serialized XSpace and summarizes it
with JAX's parser (``jax.profiler.ProfileData``; parsing only, no JAX backend): planes, lines,
event counts and the longest device events. The XSpace bytes are written to OUT_DIR. The CPU
plugin has no profiler extension: there it says so.
"""

from __future__ import annotations

import os
import sys
import time

import cffi
import numpy as np

from torchtpu.runtime import create_client
from torchtpu.runtime._pjrt_ffi import ffi

PROFILER_EXTENSION = 1  # PJRT_Extension_Type_Profiler

# xla/backends/profiler/plugin/profiler_c_api.h and pjrt_c_api_profiler_extension.h (layouts)
CDEF = """
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
typedef struct { size_t struct_size; int type; void* next; } Base;
typedef struct { Base base; PLUGIN_Profiler_Api* profiler_api; int64_t traceme_context_id; } PJRT_Profiler_Extension;
"""
pffi = cffi.FFI()
pffi.cdef(CDEF)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def profile_options() -> bytes:
    """tensorflow.ProfileOptions: host_tracer_level (2) = 2, device_tracer_level (3) = 1, version (5) = 1."""
    return b"".join(_varint(field << 3) + _varint(value) for field, value in ((2, 2), (3, 1), (5, 1)))


class PluginProfiler:
    def __init__(self, api: object, options: bytes) -> None:
        self.api = api
        args = pffi.new("PLUGIN_Profiler_Create_Args*")
        args.struct_size = pffi.sizeof("PLUGIN_Profiler_Create_Args")
        self._options = pffi.new("char[]", options) if options else pffi.NULL
        args.options, args.options_size = self._options, len(options)
        self.check(api.create(args), "create")
        self.handle = args.profiler

    def check(self, err: object, what: str) -> None:
        if err == pffi.NULL:
            return
        m = pffi.new("PLUGIN_Profiler_Error_Message_Args*")
        m.struct_size = pffi.sizeof("PLUGIN_Profiler_Error_Message_Args")
        m.error = err
        self.api.error_message(m)
        message = pffi.string(m.message, m.message_size).decode("utf-8", "replace")
        d = pffi.new("PLUGIN_Profiler_Error_Destroy_Args*")
        d.struct_size = pffi.sizeof("PLUGIN_Profiler_Error_Destroy_Args")
        d.error = err
        self.api.error_destroy(d)
        raise RuntimeError(f"profiler {what}: {message}")

    def _simple(self, fn: object, kind: str) -> None:
        args = pffi.new(f"PLUGIN_Profiler_{kind}_Args*")
        args.struct_size = pffi.sizeof(f"PLUGIN_Profiler_{kind}_Args")
        args.profiler = self.handle
        self.check(fn(args), kind.lower())

    def start(self) -> None:
        self._simple(self.api.start, "Start")

    def stop(self) -> None:
        self._simple(self.api.stop, "Stop")

    def collect(self) -> bytes:
        args = pffi.new("PLUGIN_Profiler_CollectData_Args*")
        args.struct_size = pffi.sizeof("PLUGIN_Profiler_CollectData_Args")
        args.profiler = self.handle
        args.buffer = pffi.NULL
        self.check(self.api.collect_data(args), "collect_data")
        n = args.buffer_size_in_bytes
        if args.buffer != pffi.NULL:  # the plugin lent its own buffer
            # XLA's CollectData (plugin_tracer_impl.cc) serializes into a vector one byte longer
            # than the XSpace and reports the vector's size: the last byte is not the XSpace's
            # (a v5e's 15038 bytes failed to parse whole, and parsed without their final zero).
            data = bytes(pffi.buffer(args.buffer, n))
            return data[:-1] if data.endswith(b"\0") else data
        buf = pffi.new("uint8_t[]", max(n, 1))
        args.buffer = buf
        self.check(self.api.collect_data(args), "collect_data (fetch)")
        return bytes(pffi.buffer(buf, args.buffer_size_in_bytes))

    def destroy(self) -> None:
        self._simple(self.api.destroy, "Destroy")


PROGRAM = """module @m {
  func.func public @main(%a: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
    %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
    %1 = stablehlo.tanh %0 : tensor<1024x1024xf32>
    %2 = stablehlo.dot_general %1, %a, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
    return %2 : tensor<1024x1024xf32>
  }
}"""


def summarize(xspace: bytes) -> None:
    try:
        from jax.profiler import ProfileData
    except ImportError:
        print("  (no JAX to parse the XSpace)")
        return
    data = ProfileData.from_serialized_xspace(xspace)
    for plane in data.planes:
        lines = list(plane.lines)
        events = sum(len(list(line.events)) for line in lines)
        print(f"  plane {plane.name!r}: {len(lines)} lines, {events} events; lines {[ln.name for ln in lines][:8]}")
        if plane.name.startswith("/device:"):
            for line in lines:
                top = sorted(((e.duration_ns, e.name) for e in line.events), reverse=True)[:5]
                print(f"    {line.name}: " + "; ".join(f"{name[:60]} {ns / 1e3:.1f} us" for ns, name in top))


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
    client = create_client()
    print("platform:", client.platform_name, client.platform_version, flush=True)
    ext = client._plugin.api.extension_start
    found = None
    while ext != ffi.NULL:
        if int(ext.type) == PROFILER_EXTENSION:
            found = pffi.cast("PJRT_Profiler_Extension*", int(ffi.cast("uintptr_t", ext)))
        ext = ext.next
    if found is None or found.profiler_api == pffi.NULL:
        print("no PJRT profiler extension in this plugin")
        return
    print(f"profiler extension: api struct_size {found.profiler_api.struct_size}, "
          f"traceme_context_id {found.traceme_context_id}", flush=True)
    exe = client.compile(PROGRAM)
    x = client.buffer_from_host(np.full((1024, 1024), 0.001, np.float32))
    _, ev = exe.execute([x])
    ev.wait()
    for label, options in (("empty options", b""), ("device tracing asked for", profile_options())):
        try:
            prof = PluginProfiler(found.profiler_api, options)
            prof.start()
            t0 = time.perf_counter()
            for _ in range(10):
                _, ev = exe.execute([x])
            ev.wait()
            wall = time.perf_counter() - t0
            prof.stop()
            data = prof.collect()
            prof.destroy()
        except RuntimeError as e:
            print(f"{label}: {e}", flush=True)
            continue
        path = os.path.join(out_dir, f"xspace_{label.split()[0]}.pb")
        with open(path, "wb") as f:
            f.write(data)
        print(f"{label}: 10 launches in {wall * 1e3:.2f} ms, XSpace {len(data)} bytes -> {path}", flush=True)
        summarize(data)


if __name__ == "__main__":
    main()
