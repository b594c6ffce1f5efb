"""Where the CPU of a GPT training step goes, by thread, per tpu mode (not a test).

    python bench/step_cpu.py [--rounds 10] [--steps 10] [--chunks 25,40,64]

On the CPU-emulated device the host (the Python thread recording or launching ops)
and the device (XLA:CPU's Eigen threads running the programs) share the same cores.
A mode's step time then follows the CPU it spends in all threads together, not the
host's alone. Per mode, in interleaved rounds, this prints:

- wall ms per step (best and median round);
- CPU ms per step, averaged over all timed rounds: the main thread's and the whole
  process's (precise), and how the rest splits between XLA's ``tf_XLAEigen`` threads
  and every other thread (PJRT workers, the background compiler), from ``/proc``
  (in clock ticks, so only the sum over many rounds means anything);
- for DeferAndFuse, the programs launched per step.

``--chunks`` also times DeferAndFuse at other ``CHUNK_NODES`` values in the same
process (each value's programs are compiled before timing starts).

``--tiny`` runs the same model structure (the same ops, in the same order) with tiny
sizes at batch 1, so the device has almost nothing to compute: the main thread's CPU
is then the host cost of each mode, what a real TPU, which computes elsewhere, would
leave on the host. Compared with the default run it also shows how much slower the
same host code runs while XLA's threads compute on the same cores.

``--alone`` then times each DeferAndFuse program of a step run alone: each launch
first waits for the device to be idle and is awaited before the host goes on, so
XLA's threads have both cores to themselves. Their sum is the device's share of a
step; a step cannot take less than it, however cheap the host's recording.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eager import TINY_GPT, _gpt_loop, device_alone_ms, programs_alone

from torchtpu.engine import deferred
from torchtpu.examples.gpt import GPT, GPTConfig
from torchtpu.runtime import host_threads

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds used so far by this process's threads, grouped: main, xla_eigen, other."""
    out = {"main": 0.0, "xla_eigen": 0.0, "other": 0.0}
    pid = os.getpid()
    for tid, stat in host_threads.thread_files("stat").items():
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
        group = "main" if tid == pid else "xla_eigen" if host_threads.XLA_POOL_THREAD_NAME in name else "other"
        out[group] += seconds
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--chunks", default="", help="comma-separated CHUNK_NODES values to time as well")
    p.add_argument("--tiny", action="store_true", help="tiny sizes at batch 1: host cost only")
    p.add_argument("--alone", action="store_true", help="also time each DeferAndFuse program run alone")
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = TINY_GPT if args.tiny else GPTConfig()
    batch = 1 if args.tiny else 8
    base = GPT(cfg)
    default_chunk = deferred.CHUNK_NODES
    # per row: the step loop and the CHUNK_NODES it runs under (only DeferAndFuse reads it)
    loops: dict[str, tuple[Callable[[int], None], int]] = {}
    for mode in ("strict", "defer_and_fuse", "compile"):
        loops[mode] = (_gpt_loop(base, "tpu", mode, batch)[0], default_chunk)
    daf = loops["defer_and_fuse"][0]
    for c in (int(c) for c in args.chunks.split(",") if c):
        loops[f"defer_and_fuse chunk {c}"] = (daf, c)
    flushes: dict[str, float] = {}
    for name, (run, chunk) in loops.items():
        deferred.CHUNK_NODES = chunk
        run(4)  # compiles this configuration's programs
        before = deferred.stats["flushes"]
        run(args.steps)
        flushes[name] = (deferred.stats["flushes"] - before) / args.steps
    walls: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, dict[str, float]] = {name: dict.fromkeys(("main", "process", "xla_eigen", "other"), 0.0)
                                        for name in loops}
    for _ in range(args.rounds):
        for name, (run, chunk) in loops.items():
            deferred.CHUNK_NODES = chunk
            run(2)  # untimed: the previous mode's threads go idle first
            ticks0, main0, proc0 = thread_cpu(), time.thread_time(), time.process_time()
            t0 = time.perf_counter()
            run(args.steps)
            walls[name].append(time.perf_counter() - t0)
            ticks1, main1, proc1 = thread_cpu(), time.thread_time(), time.process_time()
            acc = cpu[name]
            acc["main"] += main1 - main0
            acc["process"] += proc1 - proc0
            for group in ("xla_eigen", "other"):
                acc[group] += ticks1[group] - ticks0[group]
    deferred.CHUNK_NODES = default_chunk
    timed_steps = args.rounds * args.steps
    print(f"{'mode':26s} {'wall ms/step: best':>18s} {'median':>7s} | CPU ms/step: "
          f"{'main':>5s} {'process':>7s} {'(xla':>6s} {'other)':>6s} | programs/step")
    for name, acc in cpu.items():
        ms = {k: v / timed_steps * 1e3 for k, v in acc.items()}
        programs = f"{flushes[name]:.1f}" if "defer" in name else "-"
        print(f"{name:26s} {min(walls[name]) / args.steps * 1e3:18.2f} "
              f"{statistics.median(walls[name]) / args.steps * 1e3:7.2f} | {'':12s} "
              f"{ms['main']:5.2f} {ms['process']:7.2f} {ms['xla_eigen']:6.2f} {ms['other']:6.2f} | {programs}")
    if args.alone:
        print_programs_alone(loops["defer_and_fuse"][0], args.rounds * args.steps)


def print_programs_alone(run: Callable[[int], None], steps: int) -> None:
    """Print the median ms of each DeferAndFuse program of a step, each run with the device to itself."""
    per_program = programs_alone(run, steps)
    print("\nDeferAndFuse programs, each run alone (arguments, outputs: median ms, launches per step)")
    for (n_args, n_outs), ts in per_program.values():
        print(f"  {n_args:4d} args {n_outs:4d} outputs: {statistics.median(ts) * 1e3:6.2f} ms, {len(ts) / steps:.1f}")
    print(f"device's share of a step: {device_alone_ms(per_program, steps):.2f} ms")


if __name__ == "__main__":
    main()
