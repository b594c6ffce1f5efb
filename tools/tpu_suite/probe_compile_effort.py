"""How a TPU's compile time and run time answer XLA's effort options (JAX only: runs before torch is
installed). Strict mode compiles one small program per new op and shape, at 0.15 to 1.35 s each on a
v5e; if a lower effort compiles such programs much faster at a small run-time cost, torchtpu can ask
for it for eager ops (ExecutableBuildOptions: exec_time_optimization_effort, optimization_level).

    python3 tools/tpu_suite/probe_compile_effort.py
"""
from __future__ import annotations

import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

_fresh = itertools.count(1)


def chain(x, k):
    for i in range(12):
        x = jnp.tanh(x * (1.0 + k * 1e-7 + i * 1e-3)) + x
    return x.sum(axis=0)


def mlp_step(params, x, k):
    def loss(ps):
        h = x
        for w in ps:
            h = jax.nn.gelu(h @ w)
        return jnp.mean(h ** 2)
    g = jax.grad(loss)(params)
    return [p - (1e-3 + k * 1e-9) * gi / (jnp.sqrt(gi * gi) + 1e-8) for p, gi in zip(params, g)]


def gather_scatter(table, idx, k):
    rows = table[idx] * (1.0 + k * 1e-7)
    return jnp.zeros_like(table).at[idx].add(rows)


def programs():
    x = jnp.ones((256, 256), jnp.float32)
    params = [jnp.full((128, 128), 0.01, jnp.float32) for _ in range(3)]
    xb = jnp.ones((64, 128), jnp.float32)
    table = jnp.ones((1000, 64), jnp.float32)
    idx = jnp.asarray(np.random.default_rng(0).integers(0, 1000, 512), jnp.int32)
    return [("elementwise chain 256x256", chain, (x,)), ("MLP step 3x128", mlp_step, (params, xb)),
            ("gather + scatter-add", gather_scatter, (table, idx))]


FORMS = [("default", {}), ("exec effort -1", {"exec_time_optimization_effort": -1.0}),
         ("optimization level O0", {"optimization_level": 9}), ("O1", {"optimization_level": 19}),
         ("default, again", {})]  # (the first form of a kind may pay a warm-up the others do not)

print("device:", jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
for name, fn, args in programs():
    for form, opts in FORMS:
        times, runs = [], []
        for _ in range(3):  # a distinct constant each time: a fresh compile
            k = next(_fresh)
            lowered = jax.jit(lambda *a, k=k, fn=fn: fn(*a, k)).lower(*args)
            t = time.perf_counter()
            try:
                exe = lowered.compile(compiler_options=opts) if opts else lowered.compile()
            except Exception as e:  # noqa: BLE001 (an option the plugin refuses: said, and the next form)
                print(f"{name:28s} {form:24s} refused: {str(e).splitlines()[0][:120]}", flush=True)
                break
            times.append(time.perf_counter() - t)
            jax.block_until_ready(exe(*args))
            t = time.perf_counter()
            for _ in range(50):
                out = exe(*args)
            jax.block_until_ready(out)
            runs.append((time.perf_counter() - t) / 50)
        if times:
            print(f"{name:28s} {form:24s} compile {np.median(times) * 1e3:8.1f} ms   run {np.median(runs) * 1e6:8.1f} us",
                  flush=True)
