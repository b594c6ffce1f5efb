"""Do compiles of independent programs overlap in one process? To study off the TPU host (not a test).

    python3 tools/tpu_suite/probe_compile_parallel.py [--programs 12]

Compiles dominate a cold TPU run (the conformance sweep: ~9 s per op, mostly compiles; the test
suite; a model's first step), and the tenth round saw no gain from checking ops in threads, as if
libtpu compiled one program at a time. This compiles sets of distinct small programs (a chain of
elementwise ops and a reduction, each with its own constants, so no cache can serve them) one
after another, then from 2, 4 and 8 threads, and prints each set's wall time and the speedup
over one thread. A speedup near 1 means the compiles are serialized inside the process.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import torchtpu  # noqa: F401  (registers the device)
from torchtpu import _device_state
from torchtpu.lowering.builder import Builder

_serial = 0


def program(tag: int) -> str:
    """A program no other call builds (its constants carry ``tag``)."""
    b = Builder()
    x = b.arg((256, 256), torch.float32)
    v = x
    for k in range(12):
        c = b.constant(1.0 + tag * 1e-3 + k * 1e-6, torch.float32, v.shape)
        v = b.add(b.mul(v, c), b.unary("tanh", v))
    return b.module([v, b.reduce(v, [1], b.constant(0.0, torch.float32), "stablehlo.add")])


def compile_set(threads: int, count: int) -> float:
    global _serial
    texts = [program(_serial + i) for i in range(count)]
    _serial += count
    client = _device_state.client()
    start = time.perf_counter()
    if threads == 1:
        for t in texts:
            client.compile(t)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(client.compile, texts))
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--programs", type=int, default=12)
    a = p.parse_args()
    torch.ones(1, device="tpu").cpu()  # open the device first
    compile_set(1, 2)  # warm-up: first compiles pay one-time costs
    one = compile_set(1, a.programs)
    print(f"{_device_state.client().platform_name}: {a.programs} programs, 1 thread: {one:.2f} s "
          f"({one / a.programs * 1000:.0f} ms each)")
    for threads in (2, 4, 8):
        t = compile_set(threads, a.programs)
        print(f"  {threads} threads: {t:.2f} s, speedup {one / t:.2f}x")


if __name__ == "__main__":
    main()
