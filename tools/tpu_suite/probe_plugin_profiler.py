"""Whether the PJRT plugin's own profiler (PJRT_Profiler_Extension) gives device events for the
programs torchtpu launches: the path to torch.profiler device rows from libtpu, and to per-op
device times of torchtpu's programs in its own process.

    python3 tools/tpu_suite/probe_plugin_profiler.py [OUT_DIR]   # default $OUT, else .

Opens the plugin through ``torchtpu.runtime`` (no torch), looks for the profiler extension,
creates a profiler (empty options, then ProfileOptions asking for device tracing), runs a small
matrix-product program between start and stop, collects the serialized XSpace and summarizes it
with torchtpu.runtime.xspace: per device line, event counts and the longest events. The XSpace bytes are written to OUT_DIR. The CPU
plugin has no profiler extension: there it says so.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from torchtpu.runtime import create_client, xspace
from torchtpu.runtime.plugin_profiler import PluginProfiler, PluginProfilerError, profiler_api


def profile_options() -> bytes:
    """tensorflow.ProfileOptions: host_tracer_level (2) = 2, device_tracer_level (3) = 1, version (5) = 1."""
    return b"".join(xspace.encode_field(field, value) for field, value in ((2, 2), (3, 1), (5, 1)))


PROGRAM = """module @m {
  func.func public @main(%a: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
    %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
    %1 = stablehlo.tanh %0 : tensor<1024x1024xf32>
    %2 = stablehlo.dot_general %1, %a, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
    return %2 : tensor<1024x1024xf32>
  }
}"""


def summarize(data: bytes) -> None:
    """Per device line (torchtpu.runtime.xspace): event count and the longest events."""
    events = xspace.device_events(data, ("XLA Modules", "XLA Ops", "Async XLA Ops"))
    for key in sorted({(e.device, e.line) for e in events}):
        mine = [e for e in events if (e.device, e.line) == key]
        top = sorted(mine, key=lambda e: -e.duration_ps)[:5]
        print(f"  tpu {key[0]} {key[1]!r}: {len(mine)} events; longest: "
              + "; ".join(f"{e.name[:60]} {e.duration_ps / 1e6:.1f} us" for e in top))


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
    client = create_client()
    print("platform:", client.platform_name, client.platform_version, flush=True)
    api = profiler_api(client.plugin)
    if api is None:
        print("no PJRT profiler extension in this plugin")
        return
    print(f"profiler extension: api struct_size {api.struct_size}", flush=True)
    exe = client.compile(PROGRAM)
    x = client.buffer_from_host(np.full((1024, 1024), 0.001, np.float32))
    _, ev = exe.execute([x])
    ev.wait()
    for label, options in (("empty options", b""), ("device tracing asked for", profile_options())):
        try:
            prof = PluginProfiler(api, options)
            prof.start()
            t0 = time.perf_counter()
            for _ in range(10):
                _, ev = exe.execute([x])
            ev.wait()
            wall = time.perf_counter() - t0
            prof.stop()
            data = prof.collect()
            prof.close()
        except PluginProfilerError as e:
            print(f"{label}: {e}", flush=True)
            continue
        path = os.path.join(out_dir, f"xspace_{label.split()[0]}.pb")
        with open(path, "wb") as f:
            f.write(data)
        print(f"{label}: 10 launches in {wall * 1e3:.2f} ms, XSpace {len(data)} bytes -> {path}", flush=True)
        summarize(data)


if __name__ == "__main__":
    main()
