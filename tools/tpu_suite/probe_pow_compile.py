"""How long a TPU's compiler takes for N scalar float32 powers in one program, by formulation (JAX only:
runs before torch is installed). Capturable AdamW's step holds two such powers per parameter
(beta ** step); torchtpu lowered each through a float64 power on a TPU, and a demo GPT's optimizer
program then took tens of seconds to compile there (sixteenth session).

    python3 tools/tpu_suite/probe_pow_compile.py [N ...]
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)


def f64_power(x, y):
    return jnp.power(jnp.abs(x).astype(jnp.float64), y.astype(jnp.float64)).astype(jnp.float32)


def f64_exp_log(x, y):
    return jnp.exp(y.astype(jnp.float64) * jnp.log(jnp.abs(x).astype(jnp.float64))).astype(jnp.float32)


def f32_power(x, y):
    return jnp.power(x, y)


def f32_accurate_exp_log(x, y):
    highest = jax.lax.AccuracyMode.HIGHEST  # what torchtpu asks for its exp and log on a TPU
    return jax.lax.exp(y * jax.lax.log(jnp.abs(x), accuracy=highest), accuracy=highest)


def split(a):
    c = a * np.float32(4097.0)
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_mul(ah, al, bh, bl):
    p, e = two_prod(ah, bh)
    e = e + (ah * bl + al * bh)
    s = p + e
    return s, e - (s - p)


def f32_int_power_dd(x, y):
    """x ** y for integer y in [0, 2**24) by squaring in float32 pairs (about 2^-44 relative)."""
    n = y.astype(jnp.int32)
    rh, rl = jnp.ones_like(x), jnp.zeros_like(x)
    bh, bl = x, jnp.zeros_like(x)
    for bit in range(24):
        take = (n >> bit) & 1 == 1
        th, tl = dd_mul(rh, rl, bh, bl)
        rh, rl = jnp.where(take, th, rh), jnp.where(take, tl, rl)
        bh, bl = dd_mul(bh, bl, bh, bl)
    return rh + rl


def vectorized_f64_power(xs, ys):
    x, y = jnp.stack(xs), jnp.stack(ys)
    r = f64_power(x, y)
    return [r[i] for i in range(len(xs))]


FORMS = {"f64 power": f64_power, "f64 exp(y log x)": f64_exp_log, "f32 power": f32_power,
         "f32 accurate exp/log": f32_accurate_exp_log, "f32 pairs, integer y": f32_int_power_dd}


def compile_s(fn, n):
    xs = [jnp.float32(0.9 + i * 1e-4) for i in range(n)]
    ys = [jnp.float32(3.0 + i) for i in range(n)]
    t = time.perf_counter()
    exe = jax.jit(fn).lower(xs, ys).compile()
    dt = time.perf_counter() - t
    out = exe(xs, ys)
    want = [np.float32(np.float64(np.float32(x)) ** np.float64(np.float32(y))) for x, y in zip(xs, ys)]
    err = max(abs(float(o) - float(w)) / abs(float(w)) for o, w in zip(out, want))
    return dt, err


print("device:", jax.devices()[0].device_kind)
for n in [int(a) for a in sys.argv[1:]] or [8, 58]:
    for name, form in FORMS.items():
        dt, err = compile_s(lambda xs, ys, form=form: [form(x, y) for x, y in zip(xs, ys)], n)
        print(f"N={n:3d} {name:24s} compile {dt:7.2f} s   largest relative error {err:.2e}", flush=True)
    dt, err = compile_s(vectorized_f64_power, n)
    print(f"N={n:3d} {'f64 power, one vector':24s} compile {dt:7.2f} s   largest relative error {err:.2e}", flush=True)
