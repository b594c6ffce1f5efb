"""How long the demo GPT's first DeferAndFuse steps take, compiles included (not a test).

    TORCH_TPU_COMPILE_THREADS=1 python bench/defer_first_steps.py    # cut graphs compiled one at a time
    TORCH_TPU_COMPILE_THREADS=8 python bench/defer_first_steps.py    # side by side

The demo's model, batch 8 and AdamW; each step ends in ``loss.item()``. The tier-2 cache is off (and
tier 3 unless ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` is set), so every program compiles in this
process. Prints each step's seconds, the loss, and the fused programs compiled so far (``bg``: those
compiled on the background threads).
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TORCH_TPU_DEFER_AND_FUSE", "1")
os.environ["TORCH_TPU_TIER2_COMPILATION_CACHE"] = "disabled"

import torch

from torchtpu.engine import deferred
from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


def main(steps: int = 12) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg).to("tpu")
    x, y = (t.to("tpu") for t in make_batch(cfg, 8, torch.Generator().manual_seed(0)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    t0 = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        print(f"step {i}: {time.perf_counter() - t:.2f}s loss {value:.6f} compiles {deferred.stats['compiles']} "
              f"bg {deferred.stats['background_compiles']}", flush=True)
    print(f"total {time.perf_counter() - t0:.2f}s")


if __name__ == "__main__":
    main()
