"""Whether greedy decoding waits on the host or on the chip: one generation of bench/tpu.py's
decode workload, timed on the host and on the plugin's device timeline ("XLA Modules").

    python3 tools/tpu_suite/probe_decode_timeline.py decode_b8 compiled [--pack-max-bytes N] [--small]

Per decoding step (one token per sequence): the generation's wall; the device's busy time (the
sum of its program runs) and its idle time between runs; the programs; the longest programs. A
generation whose device idles between runs is host-bound (the host's per-call work is the gap to
close); one whose device is busy throughout is bound by its programs (their per-op time:
``steps.sh devprof``). Why: on a v5e (round 25) the compiled step at batch 8 ran 1.22 ms of device
time a step in its program replayed alone, yet the generation took 1.43 ms a step.

The timeline is the PJRT plugin's own profiler (libtpu has one; the CPU plugin has none: there
only the host figures are printed). Run it on the TPU host after ``source .tpu/env.sh``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def summarize(modules: list, steps: int, wall_s: float) -> list[str]:
    """What the module runs of one generation of ``steps`` steps say: busy, idle, programs, the longest."""
    runs = sorted(modules, key=lambda m: m.start_ps)
    busy = sum(m.duration_ps for m in runs) / 1e6  # us
    span = (runs[-1].start_ps + runs[-1].duration_ps - runs[0].start_ps) / 1e6
    gaps = [(b.start_ps - (a.start_ps + a.duration_ps)) / 1e6 for a, b in itertools.pairwise(runs)]
    by_name: dict[str, list[float]] = {}
    for m in runs:
        by_name.setdefault(m.name, []).append(m.duration_ps / 1e6)
    lines = [(f"  device: {len(runs)} program runs ({len(runs) / steps:.2f} a step), busy {busy / steps:.1f} us "
             f"a step, first start to last end {span / steps:.1f} us a step ({100 * busy / span:.0f}% busy)"),
             (f"  idle between runs: median {statistics.median(gaps) if gaps else 0:.1f} us, "
             f"max {max(gaps, default=0):.1f} us, total {sum(gaps) / steps:.1f} us a step"),
             f"  host: {1e6 * wall_s / steps:.1f} us a step (the generation's wall, synchronize included)"]
    for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:5]:
        lines.append(f"    {sum(times) / steps:8.1f} us a step  {len(times):4d} runs  median "
                     f"{statistics.median(times):8.1f} us  {name[:70]}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=["decode_b1", "decode_b8"])
    ap.add_argument("mode", choices=["compiled", "compiled_graph", "compiled_replayed"])
    ap.add_argument("--pack-max-bytes", type=int, default=None, help="as bench/tpu.py's (compiled_graph)")
    ap.add_argument("--small", action="store_true", help="tiny sizes (the CPU emulator)")
    args = ap.parse_args()
    import tpu as bench

    if args.pack_max_bytes is not None:
        bench.PACKED_PARAMETER_MAX_BYTES = args.pack_max_bytes
    p = bench.sizes(args.workload, args.small)
    _torch, generate, _ = bench.torch_decode_generation(p, args.mode)
    from torchtpu import _device_state
    from torchtpu.runtime import plugin_profiler, xspace

    generate()  # compiles (and captures)
    generate()  # warm
    t0 = time.perf_counter()
    generate()
    plain = time.perf_counter() - t0
    tokens = p["batch"] * p["new_tokens"]
    print(f"{args.workload} {args.mode} (pack_max_bytes {bench.PACKED_PARAMETER_MAX_BYTES}): "
          f"{tokens / plain:.0f} tokens/s unprofiled ({1e6 * plain / p['new_tokens']:.1f} us a step)", flush=True)
    api = plugin_profiler.profiler_api(_device_state.client().plugin)
    if api is None:
        print("  (no device timeline in this plugin: host figures only)")
        return
    profiler = plugin_profiler.PluginProfiler(api)
    profiler.start()
    t0 = time.perf_counter()
    generate()
    wall = time.perf_counter() - t0
    profiler.stop()
    modules = xspace.device_events(profiler.collect(), ("XLA Modules",))
    profiler.close()
    if not modules:
        print("  the timeline held no program runs")
        return
    print("\n".join(summarize(modules, p["new_tokens"], wall)))


if __name__ == "__main__":
    main()
