"""Where the time of grid_sampler_3d goes on the device, sample by sample (not a test).

    python3 tools/tpu_suite/probe_grid_sampler.py [--dtype float32]

The 14th round's conformance part 11 saw grid_sampler_3d's forward not finish in 240 s on the v5e,
and after the rewrite (rows of channels gathered by int32 indices) a run of it alone still gave no
line in 110 s, where the emulator checks it in ~15 s. For each OpInfo sample this prints, as it
goes (a cut call keeps what came before): the shapes, then the forward's and the backward's
seconds, split into compiling (the compile cache's seconds) and the rest, and the largest
difference from CPU.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.testing._internal.common_methods_invocations import op_db

import torchtpu  # noqa: F401  (registers the device)


def timed(fn, *args) -> tuple[object, float, float]:
    """(fn(*args), seconds, of which compiling), the device synchronized."""
    before = torch.tpu.compile_cache_stats()["compile_seconds"]
    start = time.perf_counter()
    out = fn(*args)
    torch.tpu.synchronize()
    took = time.perf_counter() - start
    return out, took, torch.tpu.compile_cache_stats()["compile_seconds"] - before


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    op = next(o for o in op_db if o.name == "grid_sampler_3d")
    for n, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=True)):
        grid, *rest = s.args
        print(f"sample {n}: input {list(s.input.shape)} grid {list(grid.shape)} args {rest}", flush=True)
        x = s.input.detach().to("tpu").requires_grad_()
        g = grid.detach().to("tpu").requires_grad_()
        out, fwd, fwd_compile = timed(torch.grid_sampler_3d, x, g, *rest)
        print(f"  forward {fwd:.2f} s (compiling {fwd_compile:.2f} s)", flush=True)
        cot = torch.randn(out.shape, dtype=dtype)
        _, bwd, bwd_compile = timed(out.backward, cot.to("tpu"))
        ref = torch.grid_sampler_3d(s.input, grid, *rest)
        ref.backward(cot)
        err = max((out.detach().cpu() - ref.detach()).abs().max().item(),
                  (x.grad.cpu() - s.input.grad).abs().max().item(), (g.grad.cpu() - grid.grad).abs().max().item())
        print(f"  backward {bwd:.2f} s (compiling {bwd_compile:.2f} s); largest difference from CPU {err:.3g}",
              flush=True)


if __name__ == "__main__":
    main()
