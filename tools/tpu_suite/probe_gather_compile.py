"""How a TPU's compile time grows with a gather's index count and row width, by form (JAX only: runs
before torch is installed). grid_sampler_3d's rewrite (rows gathered by int32 indices, 8 taps) compiled
for 8.7 s forward and 12.0 s backward on the v5e for 106k-point grids, against 0.9 s for tiny ones
(fifteenth session), with the same op count: which form keeps the compile flat decides its next lowering.

    python3 tools/tpu_suite/probe_gather_compile.py
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


def rows_gather(table, idx):  # (P, C)[K] -> (K, C): grid_sampler_3d's form
    return table[idx]


def rows_scatter_add(table, idx, upd):  # its backward
    return jnp.zeros_like(table).at[idx].add(upd)


def channel_major_gather(table_t, idx):  # (C, P)[:, K] -> (C, K): the index count on the lane axis
    return jnp.take(table_t, idx, axis=1)


def channel_major_scatter_add(table_t, idx, upd_t):
    return jnp.zeros_like(table_t).at[:, idx].add(upd_t)


def compile_s(fn, *args) -> tuple[float, float]:
    lowered = jax.jit(fn).lower(*args)
    t = time.perf_counter()
    exe = lowered.compile()
    dt = time.perf_counter() - t
    jax.block_until_ready(exe(*args))
    t = time.perf_counter()
    for _ in range(10):
        out = exe(*args)
    jax.block_until_ready(out)
    return dt, (time.perf_counter() - t) / 10


print("device:", jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
rng = np.random.default_rng(0)
points = 20 * 21 * 22  # a table of grid points, as grid_sampler_3d's input volume
for c in (1, 3, 16):
    for k in (1_000, 26_000, 106_000):
        idx = jnp.asarray(rng.integers(0, points, k), jnp.int32)
        table = jnp.ones((points, c), jnp.float32)
        upd = jnp.ones((k, c), jnp.float32)
        forms = [("rows gather", rows_gather, (table, idx)), ("rows scatter-add", rows_scatter_add, (table, idx, upd)),
                 ("channel-major gather", channel_major_gather, (table.T, idx)),
                 ("channel-major scatter-add", channel_major_scatter_add, (table.T, idx, upd.T))]
        for name, fn, args in forms:
            dt, run = compile_s(fn, *args)
            print(f"C={c:2d} K={k:7d} {name:26s} compile {dt * 1e3:8.1f} ms  run {run * 1e6:9.1f} us", flush=True)
