"""tpu execution modes vs native PyTorch CPU, in one run, as ratios.

    python bench/eager.py [--json out.json] [--steps N] [--rounds N] [--skip-inductor]

Measures, each as the best of several repetitions (machines are small and noisy):
- per-op overhead: a chain of 1,000 tiny elementwise ops then one read;
- the demo GPT's training step (forward, backward, AdamW) in Strict, DeferAndFuse,
  ``torch.compile(backend="tpu")``, CPU eager and CPU ``torch.compile`` (inductor),
  timed in interleaved rounds (best round per mode; the DeferAndFuse / Strict and compiled /
  Strict ratios also as the median of per-round ratios, see ``paired_median_ratio``), and
  each step split in two: host ms until ``step`` returns, then ms in the loss read;
- the same training step at batch 1 and 2, Strict vs DeferAndFuse (host overhead weighs more),
  and with tiny sizes at batch 1 (host-bound: each mode's host cost per step);
- GPT inference at batch 1;
- peak device memory (bytes of PJRT buffers held) of a training step, Strict vs DeferAndFuse;
- the device's share of a DeferAndFuse training step (each program timed with the cores to
  itself), and Strict's median step over it: the highest DeferAndFuse / Strict ratio that any
  host-side change could reach on this machine, whose cores also compute the emulated device;
- first-step latency (compile included) per mode;
- per mode, the share of the machine's CPU time the hypervisor stole during its timed rounds
  (``steal_share``): on a shared VM, figures taken with a large share are slower across the board;
- an MLP training step (Strict, DeferAndFuse, compiled, CPU eager);
- cold vs warm start: the first DeferAndFuse training step of a fresh process with an
  empty tier-3 cache, then of a second process with it filled.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from typing import Any

import torch

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch
from torchtpu.runtime import host_memory


def cpu_ticks() -> tuple[int, int]:
    """Machine-wide (busy, stolen) CPU clock ticks so far (Linux ``/proc/stat``; zeros elsewhere).

    Steal is time the hypervisor gave this VM's virtual CPUs to someone else: a share of a few
    percent or more during a round slows it by as much, whatever the mode.
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal


def best_of(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def op_chain(device: str, n: int = 1000) -> float:
    """Seconds per op for n tiny elementwise ops then one read."""
    x0 = torch.ones(16, device=device)

    def run() -> None:
        x = x0
        for _ in range(n // 2):
            x = x * 1.0001
            x = x + 0.0001
        x.sum().item()

    run()  # warm-up (compiles)
    return best_of(run, 7) / n


def _train_step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer):
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def _gpt_loop(base: GPT, device: str, mode: str, batch: int = 8):
    """A function running n training steps (reading the loss each step), and the first step's seconds."""
    cfg = base.cfg
    model = copy.deepcopy(base).to(device)
    capturable = device == "tpu" and mode == "compile"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=capturable)
    step = _train_step_fn(model, opt)
    if mode == "compile":
        step = torch.compile(step, backend="tpu")
    elif mode == "inductor":
        step = torch.compile(step)
    g = torch.Generator().manual_seed(0)
    x, y = make_batch(cfg, batch, g)
    x, y = x.to(device), y.to(device)

    def ctx() -> Any:
        if device != "tpu":
            return contextlib.nullcontext()
        return torch.tpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "strict")

    def run(n: int, split: dict[str, float] | None = None) -> None:
        """``split``: adds the seconds until ``step`` returns (recording, launching) to its
        "host" and the loss read's (the rest of the graph, waiting for the device) to "read"."""
        with ctx():
            for _ in range(n):
                t0 = time.perf_counter()
                loss = step(x, y)
                t1 = time.perf_counter()
                loss.item()
                if split is not None:
                    split["host"] += t1 - t0
                    split["read"] += time.perf_counter() - t1

    t0 = time.perf_counter()
    run(1)
    return run, time.perf_counter() - t0


def gpt_train(base: GPT, modes: dict[str, tuple[str, str]], steps: int, rounds: int, batch: int = 8,
              memory: bool = True) -> dict[str, Any]:
    """Per mode: ms per training step at ``batch``, and (``memory``) first-step seconds and
    peak device bytes.

    Peak memory is measured one mode at a time (only that mode's model alive). Step
    times are taken in interleaved rounds, best round per mode, so that a slow spell of
    this noisy machine hits every mode alike instead of whichever ran during it. Slow
    spells here last seconds: many short rounds spread each mode's samples over the
    whole run, so that every mode gets a round in a quiet stretch.

    ``main_cpu_ms`` is the CPU this (the recording or launching) thread spends per step, median
    over rounds. Each step is also split in two (medians over rounds): ``host_ms`` until ``step``
    returns (the host recording, or launching, every op) and ``read_ms`` in the loss read
    after it (flushing the rest, waiting for the device). On this emulator both parts share
    the same 2 cores, so a mode with a short host part has its step time set by XLA CPU's
    work; the host part is what a TPU, whose work does not share the host's cores, would
    still cost.
    """
    out: dict[str, Any] = {name: {} for name in modes}
    for name, (device, mode) in modes.items() if memory else ():
        run, first = _gpt_loop(base, device, mode, batch)
        run(2)
        peak = None
        if device == "tpu":
            torch.tpu.synchronize()
            torch.tpu.reset_peak_device_memory()
            run(2)
            peak = torch.tpu.device_memory_in_use()[1]
        out[name] = {"first_step_s": first, "peak_device_bytes": peak}
        del run
    loops = {}
    for name, (device, mode) in modes.items():
        loops[name], _ = _gpt_loop(base, device, mode, batch)
        loops[name](2)
    times: dict[str, list[float]] = {name: [] for name in modes}
    splits: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    ticks: dict[str, list[int]] = {name: [0, 0] for name in modes}  # (busy, stolen) over the timed rounds
    main_cpu: dict[str, list[float]] = {name: [] for name in modes}  # this thread's CPU seconds per step
    for _ in range(rounds):
        for name, run in loops.items():
            run(2)  # untimed: lets the previous mode's worker threads go idle first
            split = {"host": 0.0, "read": 0.0}
            busy0, steal0 = cpu_ticks()
            c0, t0 = time.thread_time(), time.perf_counter()
            run(steps, split)
            times[name].append((time.perf_counter() - t0) / steps)
            main_cpu[name].append((time.thread_time() - c0) / steps)
            busy1, steal1 = cpu_ticks()
            ticks[name][0] += busy1 - busy0
            ticks[name][1] += steal1 - steal0
            splits[name].append(split)
    for name, ts in times.items():
        t = min(ts)
        busy, stolen = ticks[name]
        out[name].update(step_ms=t * 1e3, steps_per_s=1.0 / t, median_step_ms=statistics.median(ts) * 1e3,
                         round_step_ms=[x * 1e3 for x in ts],
                         steal_share=stolen / (busy + stolen) if busy + stolen else 0.0,
                         main_cpu_ms=statistics.median(main_cpu[name]) * 1e3,
                         **{f"{part}_ms": statistics.median(sp[part] for sp in splits[name]) / steps * 1e3
                            for part in ("host", "read")})
    return out


# GPTConfig's structure at sizes where the device work is negligible (bench/step_cpu.py --tiny)
TINY_GPT = GPTConfig(vocab=16, seq=4, d_model=8, heads=2)


def strict_vs_defer(base: GPT, steps: int, rounds: int, batch: int) -> dict[str, Any]:
    """Strict vs DeferAndFuse training steps of ``base`` at ``batch``: step ms and their ratio."""
    modes = {"tpu_strict": ("tpu", "strict"), "tpu_defer_and_fuse": ("tpu", "defer_and_fuse")}
    t = gpt_train(base, modes, steps, rounds, batch=batch, memory=False)
    return {
        "step_ms": {k: v["step_ms"] for k, v in t.items()},
        "defer_and_fuse_vs_strict": t["tpu_strict"]["step_ms"] / t["tpu_defer_and_fuse"]["step_ms"],
        "defer_and_fuse_vs_strict_paired_median": paired_median_ratio(
            t["tpu_strict"]["round_step_ms"], t["tpu_defer_and_fuse"]["round_step_ms"]),
    }


def programs_alone(run: Any, steps: int) -> dict[int, tuple[tuple[int, int], list[float]]]:
    """Each DeferAndFuse program of ``steps`` steps of ``run`` timed with the device to itself.

    Each launch first waits until the device is idle and is awaited before the host goes on,
    so XLA's threads have every core. Per program (by executable identity): its (arguments,
    outputs) and seconds per launch. The sum per step is the device's share of a step: no
    host-side change can bring a DeferAndFuse step below it on this machine.
    """
    from torchtpu.engine import executor

    launch = executor.launch
    out: dict[int, tuple[tuple[int, int], list[float]]] = {}

    def launch_alone(executable: Any, buffers: list, device: int, donate: Any = ()) -> list:
        executor.wait_latest()
        t0 = time.perf_counter()
        outs = launch(executable, buffers, device, donate)
        if outs:
            outs[0].block_until_ready()  # (an execution's outputs are ready together)
        out.setdefault(id(executable), ((len(buffers), len(outs)), []))[1].append(time.perf_counter() - t0)
        return outs

    executor.launch = launch_alone
    try:
        run(steps)
    finally:
        executor.launch = launch
    return out


def device_alone_ms(per_program: dict[int, tuple[tuple[int, int], list[float]]], steps: int) -> float:
    """The device's ms per step from ``programs_alone``: each program's median times its launches."""
    return sum(statistics.median(ts) * len(ts) / steps for _, ts in per_program.values()) * 1e3


def paired_median_ratio(slow: list[float], fast: list[float]) -> float:
    """Median over rounds of slow/fast step time, each pair timed in the same round.

    A second estimate beside the best-round ratio: a slow spell of the machine that
    hits one round hits both modes of that round, so each pair's ratio is little
    affected by it, while a best round may come from a quiet moment of one mode only.
    """
    return statistics.median(s / f for s, f in zip(slow, fast))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                       torch.nn.GELU(), torch.nn.Linear(1024, 1024))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(x), y)


def mlp_train(device: str, mode: str, steps: int) -> float:
    torch.manual_seed(0)
    model = MLP().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=device == "tpu" and mode == "compile")
    step = _train_step_fn(model, opt)
    if mode == "compile":
        step = torch.compile(step, backend="tpu")
    x, y = torch.randn(64, 1024).to(device), torch.randn(64, 1024).to(device)
    ctx = torch.tpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "strict") \
        if device == "tpu" else contextlib.nullcontext()
    with ctx:
        for _ in range(3):
            step(x, y).item()

        def run() -> None:
            for _ in range(steps):
                step(x, y).item()

        return best_of(run, 3) / steps * 1e3


_COLD_WARM = """
import time, torch
from torchtpu.examples.gpt import GPT, GPTConfig, make_batch
torch.manual_seed(0)
cfg = GPTConfig()
m = GPT(cfg).to("tpu")
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
x, y = make_batch(cfg, 8, torch.Generator().manual_seed(0))
t0 = time.perf_counter()
loss = m.loss(x.to("tpu"), y.to("tpu")); opt.zero_grad(); loss.backward(); opt.step(); loss.item()
print(time.perf_counter() - t0, torch.tpu.compile_cache_stats()["compiles"])
"""


def cold_warm() -> dict[str, float]:
    """First-step seconds and XLA compiles: fresh process (empty cache), then a second one (tier 3 filled)."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        env = dict(os.environ, TORCH_TPU_DEFER_AND_FUSE="1", TORCH_TPU_TIER2_COMPILATION_CACHE="disabled",
                   TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=root)
        out = {}
        for name in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", _COLD_WARM], env=env, capture_output=True, text=True,
                               check=True)
            secs, compiles = r.stdout.split()[-2:]
            out[f"{name}_first_step_s"] = float(secs)
            out[f"{name}_compiles"] = int(compiles)
        return out


def gpt_infer(base: GPT, device: str, mode: str) -> float:
    model = copy.deepcopy(base).to(device).eval()
    fwd = model
    if mode == "compile":
        fwd = torch.compile(model, backend="tpu")
    elif mode == "inductor":
        fwd = torch.compile(model)
    x, _ = make_batch(base.cfg, 1, torch.Generator().manual_seed(1))
    x = x.to(device)
    ctx = torch.tpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "strict") \
        if device == "tpu" else contextlib.nullcontext()
    with ctx, torch.no_grad():
        for _ in range(3):
            fwd(x).sum().item()
        return best_of(lambda: fwd(x).sum().item(), 7) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the GPT training step")
    p.add_argument("--skip-inductor", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    base = GPT(GPTConfig())
    res: dict[str, Any] = {
        "op_us": {"cpu": op_chain("cpu") * 1e6, "tpu_strict": op_chain("tpu") * 1e6},
    }
    with torch.tpu.eager_mode("defer_and_fuse"):
        res["op_us"]["tpu_defer_and_fuse"] = op_chain("tpu") * 1e6
    train_modes = {"cpu_eager": ("cpu", "eager"), "tpu_strict": ("tpu", "strict"),
                   "tpu_defer_and_fuse": ("tpu", "defer_and_fuse"), "tpu_compile": ("tpu", "compile")}
    if not args.skip_inductor:
        train_modes["cpu_inductor"] = ("cpu", "inductor")
    train = gpt_train(base, train_modes, args.steps, args.rounds)
    infer = {m: gpt_infer(base, "tpu", m) for m in ("strict", "defer_and_fuse", "compile")}
    infer["cpu_eager"] = gpt_infer(base, "cpu", "eager")
    if not args.skip_inductor:
        infer["cpu_inductor"] = gpt_infer(base, "cpu", "inductor")
    res["gpt_train"] = train
    # The device's share of a DeferAndFuse step (each program run with the cores to itself): on
    # this emulator the device computes on the host's cores, so Strict's median over it is the
    # most any host-side change to DeferAndFuse could reach here.
    daf_run, _ = _gpt_loop(base, "tpu", "defer_and_fuse")
    daf_run(2)
    train["tpu_defer_and_fuse"]["device_alone_ms"] = device_alone_ms(programs_alone(daf_run, args.steps), args.steps)
    # The same step at smaller batches: less device work per step, so host overhead (what
    # DeferAndFuse removes) weighs more, as on a TPU, whose device work does not share the
    # host's cores. At batch 8 this emulator spends more CPU in XLA than in the host.
    res["gpt_train_small_batch"] = {f"batch_{batch}": strict_vs_defer(base, args.steps, args.rounds // 2, batch)
                                    for batch in (1, 2)}
    # The same model structure (the same ops in the same order) with tiny sizes at batch 1: the
    # device computes next to nothing, so each mode's step is its host cost, what a device
    # that does not share the host's cores (a TPU, a GPU) would leave on the host.
    res["gpt_train_host_bound"] = strict_vs_defer(GPT(TINY_GPT), args.steps, args.rounds // 2, 1)
    res["mlp_train_step_ms"] = {"cpu_eager": mlp_train("cpu", "eager", args.steps),
                                **{f"tpu_{m}": mlp_train("tpu", m, args.steps)
                                   for m in ("strict", "defer_and_fuse", "compile")}}
    res["start"] = cold_warm()
    res["gpt_infer_batch1_ms"] = infer
    cpu = train["cpu_eager"]["steps_per_s"]
    res["ratios"] = {
        "op_overhead_strict_vs_cpu": res["op_us"]["tpu_strict"] / res["op_us"]["cpu"],
        "train_steps_per_s_vs_cpu_eager": {k: v["steps_per_s"] / cpu for k, v in train.items()},
        "train_defer_and_fuse_vs_strict": train["tpu_defer_and_fuse"]["steps_per_s"]
        / train["tpu_strict"]["steps_per_s"],
        "train_defer_and_fuse_vs_strict_paired_median": paired_median_ratio(
            train["tpu_strict"]["round_step_ms"], train["tpu_defer_and_fuse"]["round_step_ms"]),
        "train_compile_vs_defer_and_fuse": train["tpu_compile"]["steps_per_s"]
        / train["tpu_defer_and_fuse"]["steps_per_s"],
        # What a whole-step program gains over Strict on this device: a ceiling for DeferAndFuse,
        # which runs the same device work plus eager PyTorch (autograd, modules, optimizer) per step.
        "train_compile_vs_strict": train["tpu_compile"]["steps_per_s"] / train["tpu_strict"]["steps_per_s"],
        "train_compile_vs_strict_paired_median": paired_median_ratio(
            train["tpu_strict"]["round_step_ms"], train["tpu_compile"]["round_step_ms"]),
        "train_defer_and_fuse_vs_strict_device_bound_ceiling": train["tpu_strict"]["median_step_ms"]
        / train["tpu_defer_and_fuse"]["device_alone_ms"],
        "host_strict_vs_defer_and_fuse": train["tpu_strict"]["host_ms"] / train["tpu_defer_and_fuse"]["host_ms"],
        "peak_memory_defer_and_fuse_vs_strict": train["tpu_defer_and_fuse"]["peak_device_bytes"]
        / train["tpu_strict"]["peak_device_bytes"],
    }
    res["compile_cache"] = torch.tpu.compile_cache_stats()
    # Process-wide: once a tpu device exists, CPU eager in this process reuses freed memory too.
    res["host_memory_pool"] = host_memory.is_pooled()
    print(json.dumps(res, indent=2, default=float))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=float)


if __name__ == "__main__":
    main()
