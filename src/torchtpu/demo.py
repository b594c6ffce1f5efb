"""The README's demo: train a small GPT on the ``tpu`` device.

Checks the first loss against the same model on the CPU, then trains for a
few hundred steps with a progress bar showing loss, steps/s and compile-cache
hits. ``python -m torchtpu.demo --steps 300``
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from tqdm import tqdm

from .examples.gpt import GPT, GPTConfig, make_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mode", choices=["strict", "debug", "defer_and_fuse"], default=None,
                        help="eager mode (default: from the environment, else strict)")
    args = parser.parse_args(argv)
    if args.mode:
        torch.tpu.set_eager_mode(args.mode)

    torch.manual_seed(0)
    cfg = GPTConfig()
    cpu_model = GPT(cfg)
    model = copy.deepcopy(cpu_model).to("tpu")
    print(f"device: {torch.tpu.get_device_name()}")
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, {cfg}")

    data = torch.Generator().manual_seed(0)
    x, y = make_batch(cfg, args.batch, data)
    with torch.no_grad():
        ref = cpu_model.loss(x, y).item()
        first = model.loss(x.to("tpu"), y.to("tpu")).item()
    rel = abs(first - ref) / abs(ref)
    print(f"first loss: tpu {first:.6f}  cpu {ref:.6f}  relative difference {rel:.2e}")
    # medium precision rounds matmul operands to bf16, like a TPU: allow that.
    if rel > 1e-2:
        print("FAIL: the tpu loss does not match the CPU")
        return 1

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    loss_value = float("nan")
    for step in bar:
        x, y = make_batch(cfg, args.batch, data)
        loss = model.loss(x.to("tpu"), y.to("tpu"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            loss_value = loss.item()
            stats = torch.tpu.compile_cache_stats()
            rate = (step + 1) / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss_value:.4f}", steps_s=f"{rate:.2f}", cache_hits=stats["hits"],
                            compiles=stats["compiles"])
    elapsed = time.perf_counter() - start
    stats = torch.tpu.compile_cache_stats()
    print(f"final loss {loss_value:.4f} after {args.steps} steps, {args.steps / elapsed:.2f} steps/s")
    print(f"compile cache: {stats['hits']} hits, {stats['misses']} misses; {stats['compiles']} XLA compiles "
          f"({stats['compile_seconds']:.1f} s), tier-2 hits {stats.get('tier2_hits', 0)}, "
          f"tier-3 hits {stats.get('tier3_hits', 0)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
