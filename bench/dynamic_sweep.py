"""Sequence-length sweep on a compiled GPT forward: executables compiled and results.

    python bench/dynamic_sweep.py [--max-len 512] [--buckets pow2|exact|16,64,...]

Runs ``torch.compile(GPT, backend="tpu", dynamic=True)`` at batch 1 on every
sequence length 1..max-len and reports the program variants compiled for the
compiled graph (``graph_misses``), the XLA compilations, and the largest
difference from CPU eager (at ``highest`` precision, so the comparison measures
the padding and masking, not bf16 rounding).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from torchtpu.examples.gpt import GPT, GPTConfig


def sweep(max_len: int, buckets: str) -> dict:
    torch.tpu.set_dynamic_buckets(buckets)
    torch.manual_seed(0)
    cpu_model = GPT(GPTConfig(seq=max_len, layers=2)).eval()
    model = torch.compile(copy.deepcopy(cpu_model).to("tpu"), backend="tpu", dynamic=True)
    stats0 = torch.tpu.compile_cache_stats()
    worst = 0.0
    t0 = time.perf_counter()
    with torch.no_grad(), torch.tpu.precision("highest"):
        for t in range(1, max_len + 1):
            idx = torch.randint(0, 256, (1, t))
            out = model(idx.to("tpu")).cpu()
            if out.shape != (1, t, 256):
                raise AssertionError(f"length {t}: shape {tuple(out.shape)}")
            worst = max(worst, (out - cpu_model(idx)).abs().max().item())
    stats = torch.tpu.compile_cache_stats()
    return {"lengths": max_len, "buckets": buckets,
            "graph_variants": stats["graph_misses"] - stats0["graph_misses"],
            "xla_compiles": stats["compiles"] - stats0["compiles"],
            "max_abs_diff_vs_cpu": worst, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--buckets", default="pow2")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    r = sweep(a.max_len, a.buckets)
    print(json.dumps(r, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
