"""Strict-mode eager overhead and a GPT training step: tpu vs native PyTorch CPU, in one run.

    python bench/eager.py [--json out.json] [--steps N]

Figures are ratios taken in the same process; the machines are small and noisy,
so each timing is the best of several repetitions.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


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
    return best_of(run) / n


def gpt_step(device: str, steps: int) -> float:
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x, y = make_batch(cfg, 8, g)
    x, y = x.to(device), y.to(device)

    def step() -> None:
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    loss = model.loss(x, y)
    loss.item()

    def run() -> None:
        for _ in range(steps):
            step()
        model.loss(x, y).item()

    return best_of(run, 3) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(2)
    res = {
        "op_us_cpu": op_chain("cpu") * 1e6,
        "op_us_tpu_strict": op_chain("tpu") * 1e6,
        "gpt_step_ms_cpu": gpt_step("cpu", args.steps) * 1e3,
        "gpt_step_ms_tpu_strict": gpt_step("tpu", args.steps) * 1e3,
    }
    res["op_overhead_ratio_tpu_vs_cpu"] = res["op_us_tpu_strict"] / res["op_us_cpu"]
    res["gpt_steps_per_s_ratio_tpu_vs_cpu"] = res["gpt_step_ms_cpu"] / res["gpt_step_ms_tpu_strict"]
    res["compile_cache"] = torch.tpu.compile_cache_stats()
    for k, v in res.items():
        print(f"{k:40s} {v:.3f}" if isinstance(v, float) else f"{k:40s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
