"""Where a training step's device time goes, per XLA op, for torchtpu's programs and JAX's step.

Two processes (one at a time may hold a TPU):

    python3 tools/tpu_suite/probe_device_profile.py --dump DIR [--mode compiled_graph] [--workload gpt_demo]
    python3 tools/tpu_suite/probe_device_profile.py --profile DIR [--workload gpt_demo] [--runs 20]

``--dump`` (torch) runs ``bench/tpu.py``'s training step in ``mode`` four times (a ``decode_b*``
workload: one generation) and writes the
StableHLO of every large program it compiled (over 20 kB of text: the step's, the warm-up's, a
capture's) to DIR, in compile order.
``--profile`` (JAX only) compiles each of them with JAX's client, runs it under JAX's profiler
(inputs made from the program's signature: values do not change a step's device time), then JAX's
own step of the same model, and prints per program the device time of one run and its costliest
XLA ops, from the trace's device plane ("XLA Modules" and "XLA Ops" lines on a TPU; on XLA:CPU the
host threads' op events stand in). ``steps.sh devprof`` runs both. Every op's time also goes to a
table beside the programs (``NAME.ops.tsv``: us per run, events per run, the op), with each side's
optimized HLO (``program_NN.opt.hlo``, ``jax_step.opt.hlo``), for ``compare_profiles.py`` to sort
into kinds of work (matrix products, kernels, copies, broadcasts, ...) off the chip.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))


# -- torch side ---------------------------------------------------------------------------------
def dump(out_dir: str, workload: str, mode: str) -> None:
    import tpu as bench_tpu  # bench/tpu.py

    os.environ["TORCH_TPU_DEFER_AND_FUSE"] = "1" if bench_tpu.TORCH_EAGER_MODE[mode] == "defer_and_fuse" else "0"
    small = os.environ.get("DEVPROF_SMALL") == "1"  # the emulator's sizes: a CPU check of the dump itself
    p = bench_tpu.sizes(workload, small)
    if workload.startswith("decode"):  # a generation is the step: the first compiles and captures
        import torch

        p = {**p, "reps": 1}

        def step() -> None:
            bench_tpu.torch_decode(p, mode)
    else:
        torch, _, step = bench_tpu.torch_gpt_step(p, mode, bf16=workload.endswith("bf16"))
    from torchtpu.engine import compile_cache

    texts: list[str] = []
    real = compile_cache.compile

    def keep(text: Any, **kw: Any) -> Any:
        texts.append(text if isinstance(text, str) else bytes(text).decode())
        return real(text, **kw)

    compile_cache.compile = keep
    for _ in range(1 if workload.startswith("decode") else 4):  # the first step, a capture's warm-up
        step()  # and capture, then steady steps
    torch.tpu.synchronize()
    compile_cache.compile = real
    os.makedirs(out_dir, exist_ok=True)
    from torchtpu import _device_state

    with open(os.path.join(out_dir, OPTIONS_FILE), "wb") as f:  # the profile compiles with torchtpu's options
        f.write(compile_cache._default_options(_device_state.client(), 0))
    big = [t for t in texts if len(t) > 20_000] or texts
    for i, t in enumerate(big):
        with open(os.path.join(out_dir, f"program_{i:02d}.mlir"), "w") as f:
            f.write(t)
    print(f"{workload} {mode}: {len(texts)} programs compiled, {len(big)} written to {out_dir} "
          f"({', '.join(str(len(t) // 1000) + ' kB' for t in big)})", flush=True)


# -- JAX side -----------------------------------------------------------------------------------
_TYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i1": "bool", "i8": "int8",
          "i16": "int16", "i32": "int32", "i64": "int64", "ui8": "uint8", "ui16": "uint16", "ui32": "uint32",
          "ui64": "uint64"}


def _main_arguments(text: str) -> str:
    """The text of the public main function's argument list."""
    m = re.search(r"func\.func public @main\((.*?)\)\s*->", text, re.DOTALL)
    if m is None:
        raise ValueError("no public @main")
    return m.group(1)


def _signature(text: str) -> list[tuple[tuple[int, ...], str]]:
    """The main function's argument shapes and element types."""
    args = []
    for t in re.findall(r"%[\w#]+\s*:\s*tensor<([^>]*)>", _main_arguments(text)):
        *dims, elem = t.split("x")
        args.append((tuple(int(d) for d in dims), _TYPES[elem]))
    return args


def _inputs(sig: list[tuple[tuple[int, ...], str]], device: Any) -> list[Any]:
    import jax
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for shape, name in sig:
        dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        if dtype.kind == "f":
            a = (rng.standard_normal(shape) * 0.02).astype(dtype)
        else:
            a = np.zeros(shape, dtype)  # indices 0, flags off, seeds 0: valid everywhere
        out.append(jax.device_put(a, device))
    return out


def _donated(text: str) -> dict[int, int]:
    """Which of main's arguments are donated, and to which output: {argument: output}."""
    args = re.split(r",\s*(?=%[\w#]+\s*:)", _main_arguments(text))
    out = {}
    for i, arg in enumerate(args):
        alias = re.search(r"tf\.aliasing_output = (\d+)", arg)
        if alias:
            out[i] = int(alias.group(1))
    return out


OPTIONS_FILE = "compile_options.pb"  # torchtpu's serialized CompileOptionsProto, written by --dump


def _compile(text: str, keep_donation: bool = False, options_path: str = "") -> Any:
    import jax
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    if not keep_donation:  # the same inputs serve every run
        text = re.sub(r",?\s*(tf\.aliasing_output = \d+ : i32|jax\.buffer_donor = true)", "", text)
        text = text.replace("{, ", "{").replace(" {}", "")
    backend = xla_bridge.get_backend()
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        if options_path and os.path.exists(options_path):
            # torchtpu's own (xla_allow_excess_precision off, among others). With JAX's defaults the decode
            # b8 step took 2.0 ms per run here where bench/tpu.py's compiled mode ran it at 1.61 ms per
            # token on the same v5e: a profile of another compile is not the program torchtpu runs
            with open(options_path, "rb") as f:
                options = xc.CompileOptions.ParseFromString(f.read())
        else:
            options = compiler.get_compile_options(1, 1, backend=backend)
        return compiler.backend_compile_and_load(backend, module, xc.DeviceList((jax.devices()[0],)), options, [])


def _trace(run: Any, runs: int) -> Any:
    import jax

    for _ in range(3):
        run()
    trace_dir = tempfile.mkdtemp(prefix="devprof-")
    jax.profiler.start_trace(trace_dir)
    t0 = time.perf_counter()
    for _ in range(runs):
        run()
    wall = (time.perf_counter() - t0) / runs
    jax.profiler.stop_trace()
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    return jax.profiler.ProfileData.from_file(files[0]), wall


def _report(name: str, data: Any, wall: float, runs: int, top: int, table: str = "") -> None:
    modules: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    device_planes = [p for p in data.planes if p.name.startswith("/device:")]
    for plane in device_planes:
        for line in plane.lines:
            if line.name == "XLA Modules":
                for e in line.events:
                    modules[e.name] += e.duration_ns
            elif line.name == "XLA Ops":
                for e in line.events:
                    ops[e.name] += e.duration_ns
                    counts[e.name] += 1
    if not device_planes:  # XLA:CPU: the op events of the host threads that ran the program
        for plane in data.planes:
            for line in plane.lines:
                if line.name.startswith("tf_XLA") or "Eigen" in line.name:
                    for e in line.events:
                        ops[e.name] += e.duration_ns
                        counts[e.name] += 1
    device = sum(modules.values()) / runs / 1e6 if modules else sum(ops.values()) / runs / 1e6
    print(f"== {name}: wall {wall * 1e3:.3f} ms per run, device {device:.3f} ms per run "
          f"({'XLA Modules' if modules else 'sum of op events'}), {len(counts)} distinct ops, "
          f"{sum(counts.values()) / runs:.0f} op events per run", flush=True)
    kinds: collections.Counter = collections.Counter()
    kind_counts: collections.Counter = collections.Counter()
    for op, ns in ops.items():  # "%dynamic-update-slice.81 = f32[...] ..." -> dynamic-update-slice
        kind = re.sub(r"[._]\d+$", "", op.split(" = ")[0].lstrip("%"))
        kinds[kind] += ns
        kind_counts[kind] += counts[op]
    print("   by kind: " + ", ".join(f"{k} {ns / runs / 1e3:.0f} us x{kind_counts[k] / runs:.0f}"
                                     for k, ns in kinds.most_common(12)), flush=True)
    for op, ns in ops.most_common(top):
        print(f"   {ns / runs / 1e3:9.1f} us  x{counts[op] / runs:5.1f}  {op[:110]}", flush=True)
    if table:  # every op, for compare_profiles.py
        with open(table, "w") as f:
            for op, ns in ops.most_common():
                f.write(f"{ns / runs / 1e3:.3f}\t{counts[op] / runs:.2f}\t{' '.join(op.split())[:400]}\n")


def profile(in_dir: str, workload: str, runs: int, top: int) -> None:
    import jax

    print("device:", jax.devices()[0].device_kind, "jax", jax.__version__, flush=True)
    with jax.enable_x64(True):  # s64 arguments stay s64 (JAX's own step runs without)
        for path in sorted(glob.glob(os.path.join(in_dir, "*.mlir"))):
            _profile_program(path, runs, top)
    if workload.startswith("decode"):
        jax_decode_step(workload, runs, top, in_dir)
        return
    jax_step(workload, runs, top, in_dir)
    if workload != "gpt_demo":  # torchtpu's step uses the Pallas flash kernel there: JAX's with it too
        jax_step(workload, runs, top, in_dir, flash=True)


def _profile_program(path: str, runs: int, top: int) -> None:
    """One program's device time. Donated arguments stay donated (a decode step updates its KV caches
    in place: without the aliases XLA would copy every cache per run), each run's aliased outputs
    becoming the next run's arguments; where JAX's client refuses that, the program runs undonated."""
    import jax

    with open(path) as f:
        text = f.read()
    donated = _donated(text)
    t0 = time.perf_counter()
    try:
        options_path = os.path.join(os.path.dirname(path), OPTIONS_FILE)
        exe = _compile(text, keep_donation=bool(donated), options_path=options_path)
    except Exception as e:  # noqa: BLE001 (a program JAX's client refuses: said, and the next)
        print(f"== {os.path.basename(path)}: not compiled: {str(e).splitlines()[0][:200]}", flush=True)
        return
    compiled = time.perf_counter() - t0
    _write_optimized(exe, path[: -len(".mlir")] + ".opt.hlo")
    args = _inputs(_signature(text), jax.devices()[0])

    def run(exe: Any = exe, args: list = args) -> None:
        outs = exe.execute_sharded(args).disassemble_into_single_device_arrays()
        for arg, out in donated.items():
            args[arg] = outs[out][0]
        jax.block_until_ready(outs)

    try:
        data, wall = _trace(run, runs)
    except Exception as e:
        if not donated:
            raise
        print(f"   (donated run refused: {str(e).splitlines()[0][:160]}; undonated)", flush=True)
        donated.clear()
        exe, args = _compile(text, options_path=options_path), _inputs(_signature(text), jax.devices()[0])
        data, wall = _trace(lambda: run(exe, args), runs)
    _report(f"torchtpu {os.path.basename(path)} ({len(args)} arguments, {len(donated)} donated, compiled in "
            f"{compiled:.1f} s)", data, wall, runs, top, path[: -len(".mlir")] + ".ops.tsv")


def _write_optimized(exe: Any, path: str) -> None:
    """The compiler's optimized HLO of ``exe`` (layouts, fusions, copies: what a profile's op names
    refer to) beside its program."""
    try:
        text = exe.as_text() if hasattr(exe, "as_text") else exe.hlo_modules()[0].to_string()
    except Exception as e:  # noqa: BLE001 (a diagnostic: the profile goes on without it)
        text = f"(no optimized HLO: {e})"
    with open(path, "w") as f:
        f.write(text)


def jax_step(workload: str, runs: int, top: int, out_dir: str = "", flash: bool = False) -> None:
    import jax
    import jax.numpy as jnp
    import tpu as bench_tpu  # bench/tpu.py: the same sizes
    from peers import jax_gpt

    p = bench_tpu.sizes(workload, False)
    cfg = jax_gpt.GPTConfig(**p["cfg"])
    params = jax_gpt.init_params(cfg)
    train_step = jax_gpt.make_train_step(cfg, p["lr"], jnp.bfloat16 if workload.endswith("bf16") else None, flash)
    state = {"s": (params, jax_gpt.adamw_init(params))}
    x, y = jax_gpt.make_batch(cfg, p["batch"])

    def run() -> None:
        out = train_step(*state["s"], x, y)
        state["s"] = out[:2]
        jax.block_until_ready(out)

    data, wall = _trace(run, runs)
    name = "jax_step_flash" if flash else "jax_step"
    _report(f"JAX jit step ({workload}{', flash attention' if flash else ''})", data, wall, runs, top,
            os.path.join(out_dir, name + ".ops.tsv") if out_dir else "")
    if out_dir:
        _write_optimized(train_step.lower(*state["s"], x, y).compile(), os.path.join(out_dir, name + ".opt.hlo"))


def jax_decode_step(workload: str, runs: int, top: int, out_dir: str = "") -> None:
    """JAX's decode step (bench/peers/jax_gpt.py), one token per run, its caches fed back."""
    import jax
    import jax.numpy as jnp
    import tpu as bench_tpu
    from peers import jax_gpt

    p = bench_tpu.sizes(workload, os.environ.get("DEVPROF_SMALL") == "1")
    cfg, b = jax_gpt.GPTConfig(**p["cfg"]), p["batch"]
    params = jax_gpt.init_params(cfg)
    step = jax_gpt.make_decode_step(cfg)
    k, v = jax_gpt.init_cache(cfg, b)
    state = {"s": (k, v, jnp.zeros((b,), jnp.int32), jnp.zeros((), jnp.int32))}

    def run() -> None:
        k, v, tok, pos = state["s"]
        tok, k, v, pos = step(params, k, v, tok, pos % (cfg.seq - 1))
        state["s"] = (k, v, tok, pos)
        jax.block_until_ready(tok)

    data, wall = _trace(run, runs)
    _report(f"JAX jit decode step ({workload})", data, wall, runs, top,
            os.path.join(out_dir, "jax_decode.ops.tsv") if out_dir else "")
    if out_dir:
        k, v, tok, pos = state["s"]
        _write_optimized(step.lower(params, k, v, tok, pos).compile(), os.path.join(out_dir, "jax_decode.opt.hlo"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", metavar="DIR")
    ap.add_argument("--profile", metavar="DIR")
    ap.add_argument("--mode", default="compiled_graph")
    ap.add_argument("--workload", default="gpt_demo")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if args.dump:
        dump(args.dump, args.workload, args.mode)
    if args.profile:
        profile(args.profile, args.workload, args.runs, args.top)


if __name__ == "__main__":
    main()
