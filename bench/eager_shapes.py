"""Eager code that meets many shapes: compiles and seconds against CPU, per eager mode (not a test).

    python bench/eager_shapes.py [--sizes 100] [--modes strict,defer_and_fuse] [--json out.json]

Two loops a user writes without thinking of shapes, each over ``--sizes`` different lengths:

- ``sort_index``: sort a vector of length n, gather half of it by the sort's indices, scale and
  sum it, read the sum (4 ops and a read per length);
- ``varlen_mlp``: a small MLP's forward and backward on a batch of n rows (variable-length
  batches), reading the loss.

Every new length is a new program per op (Strict) or per fused region (DeferAndFuse), and a TPU
compile costs 0.15 s or more, so the loop's time is its compiles. Reported per mode: seconds,
XLA compiles, and the ratio to the same loop on CPU tensors. Each mode runs in its own process
(the eager mode is process-wide), one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def sort_index(torch: Any, device: str, sizes: int) -> None:
    g = torch.Generator().manual_seed(0)
    for n in range(1, sizes + 1):
        x = torch.randn(n, generator=g).to(device)
        _, order = torch.sort(x)
        picked = x[order[: max(1, n // 2)]]
        float((picked * 2.0).sum())


def varlen_mlp(torch: Any, device: str, sizes: int) -> None:
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
    for n in range(1, sizes + 1):
        x = torch.randn(n, 16, generator=g).to(device)
        y = torch.randint(0, 4, (n,), generator=g).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        float(loss)


WORKLOADS = {"sort_index": sort_index, "varlen_mlp": varlen_mlp}


def run_one(mode: str, sizes: int) -> dict[str, Any]:
    """This process: every workload on ``mode`` (``cpu`` for CPU tensors)."""
    if mode == "defer_and_fuse":
        os.environ["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    import torch

    device = "cpu" if mode == "cpu" else "tpu"
    out: dict[str, Any] = {}
    for name, fn in WORKLOADS.items():
        before = torch.tpu.compile_cache_stats()["compiles"] if device == "tpu" else 0
        t0 = time.perf_counter()
        fn(torch, device, sizes)
        if device == "tpu":
            torch.tpu.synchronize()
        seconds = time.perf_counter() - t0
        compiles = torch.tpu.compile_cache_stats()["compiles"] - before if device == "tpu" else 0
        out[name] = {"seconds": round(seconds, 3), "compiles": compiles}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, default=100)
    p.add_argument("--modes", default="strict,defer_and_fuse")
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: run this mode, print JSON
    a = p.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.sizes)))
        return
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1", TORCH_TPU_TIER2_COMPILATION_CACHE="disabled",
               TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="")
    results = {}
    for mode in ["cpu", *a.modes.split(",")]:
        r = subprocess.run([sys.executable, __file__, "--one", mode, "--sizes", str(a.sizes)], env=env,
                           capture_output=True, text=True, check=True)
        results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{a.sizes} sizes per loop; seconds (compiles), ratio to CPU")
    for name in WORKLOADS:
        cpu = results["cpu"][name]["seconds"]
        cells = [f"cpu {cpu:.2f} s"]
        for mode in a.modes.split(","):
            cell = results[mode][name]
            cells.append(f"{mode} {cell['seconds']:.2f} s ({cell['compiles']} compiles, {cell['seconds'] / cpu:.0f}x)")
        print(f"  {name}: " + "; ".join(cells))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"sizes": a.sizes, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
