"""Host time of one PJRT execute by argument count and launch form, against JAX's dispatch of the same
program (sixteenth session: a replayed demo step, ~120 arguments and results, spent ~0.9 ms of host time
inside PJRT execute on the v5e, where JAX's whole step took 0.64 ms).

    python3 tools/tpu_suite/probe_execute_cost.py            # torchtpu's runtime (TORCH_TPU_PJRT_PLUGIN)
    python3 tools/tpu_suite/probe_execute_cost.py --jax      # JAX, in its own process (one client per chip)

Per form: host microseconds per launch (launches not awaited, a sync every 50) and wall microseconds
per launch over the same run; the program takes N f32[64,128] arguments, returns N results, and
aliases each result to its argument where "donated". Then N arguments into one result and one
argument into N results (seventeenth session: which of the two carries a launch's cost).
"""
from __future__ import annotations

import sys
import time

import numpy as np

SHAPE = (64, 128)
LAUNCHES = 400


def module(n: int, donate: bool) -> str:
    t = f"tensor<{SHAPE[0]}x{SHAPE[1]}xf32>"
    attrs = [f"{{tf.aliasing_output = {i} : i32}}" if donate else "" for i in range(n)]
    params = ", ".join(f"%a{i}: {t} {attrs[i]}".rstrip() for i in range(n))
    body = []
    for i in range(n):
        body.append(f"    %c{i} = stablehlo.constant dense<1.0001> : {t}")
        body.append(f"    %r{i} = stablehlo.multiply %a{i}, %c{i} : {t}")
    outs = ", ".join(f"%r{i}" for i in range(n))
    types = ", ".join([t] * n)
    return (f"module @probe {{\n  func.func public @main({params}) -> ({types}) {{\n" + "\n".join(body)
            + f"\n    return {outs} : {types}\n  }}\n}}\n")


def fan_module(n: int, inputs: bool) -> str:
    """N arguments summed into one result (``inputs``), or one argument scaled into N results: what
    an argument costs a launch apart from what a result costs."""
    t = f"tensor<{SHAPE[0]}x{SHAPE[1]}xf32>"
    if inputs:
        params = ", ".join(f"%a{i}: {t}" for i in range(n))
        body = [f"    %s0 = stablehlo.add %a0, %a0 : {t}"]
        body += [f"    %s{i} = stablehlo.add %s{i - 1}, %a{i} : {t}" for i in range(1, n)]
        return (f"module @fan_in {{\n  func.func public @main({params}) -> ({t}) {{\n" + "\n".join(body)
                + f"\n    return %s{n - 1} : {t}\n  }}\n}}\n")
    body = []
    for i in range(n):
        body.append(f"    %c{i} = stablehlo.constant dense<{1.0 + i / 1024}> : {t}")
        body.append(f"    %r{i} = stablehlo.multiply %a, %c{i} : {t}")
    types = ", ".join([t] * n)
    return (f"module @fan_out {{\n  func.func public @main(%a: {t}) -> ({types}) {{\n" + "\n".join(body)
            + f"\n    return {', '.join(f'%r{i}' for i in range(n))} : {types}\n  }}\n}}\n")


def torchtpu_fans(n: int) -> None:
    from torchtpu.runtime.compile_options import compile_options

    c = _torchtpu_client()
    for inputs in (True, False):
        exe = c.compile(fan_module(n, inputs), options=compile_options(portable=False, device_ids=[[0]]))
        exe.bind(0)  # launched without execute_device, as torchtpu's cached programs are
        bufs = [c.buffer_from_host(np.full(SHAPE, 1.0, np.float32)) for _ in range(n if inputs else 1)]
        h, w = timed(lambda exe=exe, bufs=bufs: exe.execute(bufs, with_event=False), lambda bufs=bufs: bufs[0].block_until_ready())
        shape = f"{n} in, 1 out" if inputs else f"1 in, {n} out"
        print(f"torchtpu N={n:4d} {shape:15s} device assigned        host {h:8.1f} us  wall {w:8.1f} us", flush=True)


def jax_fans(n: int) -> None:
    import jax
    import jax.numpy as jnp

    xs = [jnp.full(SHAPE, 1.0, jnp.float32) for _ in range(n)]
    for inputs in (True, False):
        if inputs:
            f, arg = jax.jit(lambda xs: sum(xs[1:], xs[0])), xs
        else:
            f, arg = jax.jit(lambda x: [x * np.float32(1.0 + i / 1024) for i in range(n)]), xs[0]
        h, w = timed(lambda f=f, arg=arg: f(arg), lambda: jax.block_until_ready(xs))
        shape = f"{n} in, 1 out" if inputs else f"1 in, {n} out"
        print(f"jax      N={n:4d} {shape:15s} jit dispatch           host {h:8.1f} us  wall {w:8.1f} us", flush=True)


def timed(launch, sync) -> tuple[float, float]:
    for _ in range(20):
        launch()
    sync()
    host, t0 = 0.0, time.perf_counter()
    for i in range(LAUNCHES):
        h = time.perf_counter()
        launch()
        host += time.perf_counter() - h
        if i % 50 == 49:
            sync()
    sync()
    wall = time.perf_counter() - t0
    return host / LAUNCHES * 1e6, wall / LAUNCHES * 1e6


_client = []


def _torchtpu_client():
    from torchtpu.runtime import client as client_mod

    if not _client:  # one client per process (a TPU takes one)
        _client.append(client_mod.create_client())
    return _client[0]


def torchtpu_forms(n: int) -> None:
    from torchtpu.runtime.compile_options import compile_options

    c = _torchtpu_client()
    host = [np.full(SHAPE, 1.0, np.float32) for _ in range(n)]
    for donate in (False, True):
        portable = c.compile(module(n, donate))
        fixed = c.compile(module(n, donate), options=compile_options(portable=False, device_ids=[[0]]))
        fixed.bind(0)  # a fixed assignment takes no execute_device
        for name, exe, with_event in (("portable, event", portable, True), ("portable, no event", portable, False),
                                      ("device assigned, no event", fixed, False)):
            bufs = [c.buffer_from_host(h) for h in host]
            state = {"bufs": bufs}

            def launch(exe=exe, with_event=with_event, state=state, donate=donate):
                outs, _ = exe.execute(state["bufs"], donate=range(n) if donate else (), with_event=with_event)
                if donate:
                    state["bufs"] = outs

            def sync(state=state):
                state["bufs"][0].block_until_ready()

            h, w = timed(launch, sync)
            print(f"torchtpu N={n:4d} {'donated' if donate else 'kept':7s} {name:26s} host {h:8.1f} us  wall {w:8.1f} us",
                  flush=True)


def jax_forms(n: int) -> None:
    import jax
    import jax.numpy as jnp

    xs = [jnp.full(SHAPE, 1.0, jnp.float32) for _ in range(n)]
    for donate in (False, True):
        f = jax.jit(lambda xs: [x * np.float32(1.0001) for x in xs], donate_argnums=(0,) if donate else ())
        state = {"xs": [x + 0 for x in xs]}

        def launch(f=f, state=state, donate=donate):
            out = f(state["xs"])
            if donate:
                state["xs"] = out

        def sync(state=state):
            jax.block_until_ready(state["xs"])

        h, w = timed(launch, sync)
        print(f"jax      N={n:4d} {'donated' if donate else 'kept':7s} {'jit dispatch':26s} host {h:8.1f} us  wall {w:8.1f} us",
              flush=True)


if __name__ == "__main__":
    use_jax = "--jax" in sys.argv
    for n in (1, 8, 32, 128):
        (jax_forms if use_jax else torchtpu_forms)(n)
    for n in (8, 32, 128):  # arguments apart from results
        (jax_fans if use_jax else torchtpu_fans)(n)
