"""Per-call overhead of the PJRT runtime layer (not a test).

    .venv/bin/python bench/runtime_overhead.py [--n 20000]

Prints min / median microseconds per call for a 16-float add, with inputs
already on the device: execute dispatch alone, execute + wait, put (host ->
device), fetch (device -> host), and the end-to-end put, put, execute, fetch.
The machine is shared: trust the minimum more than the median.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from torchtpu.runtime import Client, load_plugin, resolve_plugin_path

ADD = """module @m {
  func.func public @main(%a: tensor<16xf32>, %b: tensor<16xf32>) -> (tensor<16xf32>) {
    %0 = stablehlo.add %a, %b : tensor<16xf32>
    return %0 : tensor<16xf32>
  }
}"""


def measure(cases: dict, n: int, rounds: int = 30) -> dict[str, tuple[float, float]]:
    """(min, median) us per call. Cases run round-robin, `n // rounds` calls
    per turn, so that load from other processes hits all of them alike."""
    per_turn = max(n // rounds, 1)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(per_turn):
                fn()
            samples[name].append((time.perf_counter() - t0) / per_turn * 1e6)
    return {name: (min(v), sorted(v)[len(v) // 2]) for name, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--plugin", default=None)
    ns = ap.parse_args()

    client = Client(load_plugin(resolve_plugin_path(ns.plugin)), {"cpu_device_count": 1})
    exe = client.compile(ADD)
    x = np.arange(16, dtype=np.float32)
    a, b = client.buffer_from_host(x), client.buffer_from_host(x)
    host_out = np.empty(16, np.float32)

    def dispatch() -> None:
        exe.execute((a, b))

    def execute_wait() -> None:
        exe.execute((a, b))[1].wait()

    def put() -> None:
        client.buffer_from_host(x)

    out = exe.execute((a, b))[0][0]
    out.block_until_ready()

    def fetch() -> None:
        out.to_host(host_out)

    def end_to_end() -> None:
        pa, pb = client.buffer_from_host(x), client.buffer_from_host(x)
        outs, _ = exe.execute((pa, pb))
        outs[0].to_host(host_out)

    def dispatch_no_event() -> None:
        exe.execute((a, b), with_event=False)

    cases = {
        "execute dispatch (no wait)": dispatch,
        "execute dispatch, with_event=False": dispatch_no_event,
        "execute + wait": execute_wait,
        "put 16 f32": put,
        "fetch 16 f32 (ToHostBuffer+await)": fetch,
        "put+put+execute+fetch": end_to_end,
    }
    for fn in cases.values():
        for _ in range(200):
            fn()  # warm-up
    print(f"plugin {client.plugin}  platform {client.platform_name}")
    for name, (lo, med) in measure(cases, ns.n).items():
        print(f"{name:36s} min {lo:7.2f} us   median {med:7.2f} us")


if __name__ == "__main__":
    main()
