"""Do compiles of independent programs overlap in one process? To study off the TPU host (not a test).

    python3 tools/tpu_suite/probe_compile_parallel.py [--programs 12]

Compiles dominate a cold TPU run (the conformance sweep: ~9 s per op, mostly compiles; the test
suite; a model's first step), and the tenth round saw no gain from checking ops in threads, as if
libtpu compiled one program at a time. This compiles sets of distinct small programs (a chain of
elementwise ops and a reduction, each with its own constants, so no cache can serve them) one
after another, then from 2, 4 and 8 threads, and prints each set's wall time and the speedup
over one thread. A speedup near 1 means the compiles are serialized inside the process.

Then, on a TPU, whether other processes can compile for the chip while this one holds it (a
compile-only topology, as JAX's ahead-of-time compilation uses: no client, no chip): one child
compiling 8 programs alone, then 4 such children at once. If they can, and at once is about as fast
as alone, compiles could run in helper processes in parallel.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
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


_AOT_CHILD = r"""
import os, sys, time
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
t0 = time.perf_counter()
import jax, jax.numpy as jnp
jax.config.update("jax_platforms", "cpu")  # never open the chip: the parent holds it
from jax.experimental import topologies
try:
    topo = topologies.get_topology_desc("v5e:1x1", "tpu", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1, wrap=(False, False, False))
except Exception as e:
    print("with options:", type(e).__name__, str(e)[:200])
    topo = topologies.get_topology_desc("v5e:1x1", "tpu")
arg = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(topo.devices[0]))
tag, n = int(sys.argv[1]), int(sys.argv[2])
t1 = time.perf_counter()
for i in range(n):
    c0 = 1.0 + (tag * 1000 + i) * 1e-3
    def f(x, c0=c0):
        for k in range(12):
            x = x * (c0 + k * 1e-6) + jnp.tanh(x)
        return x, x.sum(1)
    jax.jit(f).lower(arg).compile()
print(f"child {tag}: start {t1 - t0:.2f} s, {n} compiles {time.perf_counter() - t1:.2f} s")
"""


def compile_in_children(children: int, each: int, first_tag: int) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _AOT_CHILD, str(first_tag + i), str(each)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(children)]
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=80)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = "timed out after 80 s"
        lines = out.strip().splitlines()
        print("   ", " | ".join(ln for ln in lines if ln.startswith(("child", "with"))) or lines[-3:])
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
    if _device_state.client().platform_name != "tpu":
        return
    print("compile-only topology in other processes, while this one holds the chip:")
    alone = compile_in_children(1, 8, 1)
    print(f"  1 child, 8 programs: {alone:.1f} s wall")
    together = compile_in_children(4, 8, 2)
    print(f"  4 children at once, 8 programs each: {together:.1f} s wall")


if __name__ == "__main__":
    main()
