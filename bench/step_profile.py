"""Where a GPT training step's time goes, in one mode, on whatever device ``tpu`` is (not a test).

    python bench/step_profile.py --mode compiled [--workload gpt_demo] [--steps 20] [--small] [--top 25]

The step is ``bench/tpu.py``'s (same model, batch, optimizer and mode names: strict, defer,
compiled, compiled_defer). One mode per process, since one process at a time may hold a TPU.
After warm-up windows, per step:

- wall ms: ``steps`` steps ending in one device sync, divided by ``steps``;
- host ms: the main thread's CPU time over the same window (recording, dispatch, Dynamo's guards,
  autograd, launching); on a real TPU, which computes elsewhere, wall close to host means the step
  is host-bound;
- launches per step, and the host ms spent inside PJRT execute calls;
- launched alone, ms: every program of a step run again one at a time, each awaited before the
  next is launched. It bounds what the device needs from above: it holds each launch's own host time
  too (a v5e spends ~0.9 ms launching the captured demo step), so where launches are dear it is
  not the device's time; ``tools/tpu_suite/probe_device_profile.py`` gives that per XLA op;
- device ms: one window under torch.profiler, the device events' total over ``steps``: on a TPU
  libtpu's own device timeline (its PJRT profiler extension), on the emulator completion events;
- the top functions of a cProfile of one window, by own time, for where the host time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tpu as bench_tpu  # bench/tpu.py: the workloads' sizes and step


def build_step(workload: str, mode: str, small: bool) -> tuple[Any, Callable[[], Any]]:
    """torch, and bench/tpu.py's training step of ``workload`` in ``mode``."""
    os.environ["TORCH_TPU_DEFER_AND_FUSE"] = "1" if bench_tpu.TORCH_EAGER_MODE[mode] == "defer_and_fuse" else "0"
    torch, _, step = bench_tpu.torch_gpt_step(bench_tpu.sizes(workload, small), mode, bf16=False)
    return torch, step


class LaunchMeter:
    """Counts PJRT executions and the host time inside them; ``alone`` makes each one wait for
    the device to be idle first and be awaited after, so its time is the program's device time."""

    def __init__(self) -> None:
        from torchtpu.engine import executor
        from torchtpu.runtime import executable

        self._executor = executor
        self._cls = executable.Executable
        self._execute = self._cls.execute
        self.alone = False
        self.count = 0
        self.seconds = 0.0
        self.per_program: dict[int, list[float]] = {}
        meter = self

        def execute(exe: Any, *args: Any, **kwargs: Any) -> Any:
            if meter.alone:
                meter._executor.wait_latest()
            t0 = time.perf_counter()
            result = meter._execute(exe, *args, **kwargs)
            if meter.alone and result[0]:
                result[0][0].block_until_ready()
            dt = time.perf_counter() - t0
            meter.count += 1
            meter.seconds += dt
            if meter.alone:
                meter.per_program.setdefault(id(exe), []).append(dt)
            return result

        self._cls.execute = execute

    def reset(self) -> None:
        self.count, self.seconds, self.per_program = 0, 0.0, {}


def window(step: Callable[[], Any], sync: Callable[[], None], steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - t0


def profiled_device_ms(torch: Any, step: Callable[[], Any], sync: Callable[[], None], steps: int) -> float:
    """The device events' total per step over one window under torch.profiler (device rows)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        window(step, sync, steps)
    on_device = [e for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU]
    return sum(e.time_range.elapsed_us() for e in on_device) / 1e3 / steps


def timeline_source() -> str:
    from torchtpu import _device_state
    from torchtpu.runtime import env, plugin_profiler

    own = plugin_profiler.profiler_api(_device_state.client().plugin) is not None
    return ("the plugin's device timeline" if own and env.read("TORCH_TPU_PROFILER_PLUGIN_TIMELINE")
            else "completion events")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=bench_tpu.MODES[2:], default="compiled")
    p.add_argument("--workload", choices=("gpt_demo", "gpt_100m"), default="gpt_demo")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--small", action="store_true", help="bench/tpu.py's tiny sizes (CPU emulator)")
    p.add_argument("--top", type=int, default=25, help="functions listed from the profile")
    args = p.parse_args()
    torch, step = build_step(args.workload, args.mode, args.small)
    meter = LaunchMeter()
    sync = torch.tpu.synchronize
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(2):
        window(step, sync, args.steps)  # DeferAndFuse compiles a window's programs once it has seen one
    walls, hosts, launches, launch_s = [], [], [], []
    for _ in range(args.windows):
        meter.reset()
        h0 = time.thread_time()
        walls.append(window(step, sync, args.steps) / args.steps)
        hosts.append((time.thread_time() - h0) / args.steps)
        launches.append(meter.count / args.steps)
        launch_s.append(meter.seconds / args.steps)
    meter.reset()
    meter.alone = True
    window(step, sync, args.steps)
    meter.alone = False
    device = sum(statistics.median(ts) * len(ts) for ts in meter.per_program.values()) / args.steps
    device_ms = profiled_device_ms(torch, step, sync, args.steps)
    profiler = cProfile.Profile()
    profiler.enable()
    window(step, sync, args.steps)
    profiler.disable()
    platform = torch.tpu.get_device_name()
    print(f"{args.workload} {args.mode} on {platform}: first step {first:.2f} s")
    print(f"per step (median of {args.windows} windows of {args.steps}): wall {statistics.median(walls) * 1e3:.2f} ms, "
          f"host CPU {statistics.median(hosts) * 1e3:.2f} ms, launches {statistics.median(launches):.2f} "
          f"({statistics.median(launch_s) * 1e3:.2f} ms inside execute), launched alone {device * 1e3:.2f} ms "
          f"in {len(meter.per_program)} distinct programs")
    print(f"device time per step (torch.profiler, {timeline_source()}): {device_ms:.3f} ms")
    for ts in sorted(meter.per_program.values(), key=lambda ts: -statistics.median(ts) * len(ts)):
        print(f"  program: {statistics.median(ts) * 1e3:8.3f} ms x {len(ts) / args.steps:.2f} per step")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
    print(f"cProfile of {args.steps} steps, by own time:")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:8000])


if __name__ == "__main__":
    main()
