"""torchtpu vs JAX on one TPU host: one command, every workload, ratios to JAX jit in one table.

    python bench/tpu.py [--small] [--only NAME,...] [--modes MODE,...] [--out results.json] [--peak-tflops 197]
                        [--timeout 600]

Each (workload, mode) runs in its own process, one after another (only one process may hold a
TPU chip), started as ``python bench/tpu.py --worker WORKLOAD --mode MODE``; it prints one
``BENCH_RESULT {json}`` line. The driver itself imports neither torch nor JAX. A worker that raises
or runs past ``--timeout`` becomes an error cell holding the last line of its stderr.

Modes: ``jax_jit`` (the JAX peer in ``bench/peers``, jitted), ``jax_eager`` (JAX op by op, no jit),
``strict`` (torchtpu's default eager mode), ``defer`` (DeferAndFuse: ``TORCH_TPU_DEFER_AND_FUSE=1``)
``compiled`` (``torch.compile(..., backend="tpu")``; the optimizer runs in Strict eager) and
``compiled_defer`` (the same in DeferAndFuse mode: the compiled graphs are recorded with the eager
optimizer, one program per step or per few steps), ``compiled_graph`` (the compiled model's train step
captured once with ``torch.tpu.graph`` and replayed: ``TPUGraph.replay()`` per step, one launch and
no Python of the step's; AdamW ``capturable=True``, its state packed by itself after the first step
and the parameters packed by ``torch.tpu.pack_parameters``, so the program takes a few flat storages
instead of a tensor each (those of at most 1 MiB: a packed matrix is copied into the TPU's tiled layout by
each program, which cost decoding 4x when every weight was packed); the first step runs as usual, then
the capture).
For the ``flash_*`` workloads: ``jax_flash``
(the JAX peer with JAX's Pallas TPU flash-attention kernel), ``compiled`` with torchtpu's flash
attention forced on (``TORCH_TPU_FLASH_ATTENTION=1``) and ``compiled_math`` with it off (``=0``,
attention by the math lowering; ``compiled_math`` so in any workload, e.g. ``gpt_100m_bf16``, whose
``compiled`` cell takes the kernel where it is on by default: on a TPU). Run only when ``--modes`` names them,
in the 100M workloads: ``compiled_head_major`` (flash attention by the head-major [B, H, T, D] kernel,
``TORCH_TPU_FLASH_LANES=0``, where ``compiled`` takes the kernels on the model's own layout),
``defer_unchunked`` (DeferAndFuse with ``TORCH_TPU_DEFER_CHUNK_NODES=0``: no early-launched chunks, a
program per repeated block) and ``defer_long_cuts`` (that, with each cut at repeats holding several blocks:
``TORCH_TPU_DEFER_MIN_CUT_NODES``).

Workloads (``--small`` shrinks each to tiny sizes and few steps, for the CPU emulator):
- ``op_chain``: 1,000 tiny dependent elementwise ops then one read, µs per op. Its ratios are to
  JAX op by op (the peer of eager dispatch); the JAX jit cell is the fused floor.
- ``gpt_demo``: the demo GPT (``torchtpu.examples.gpt`` defaults, batch 8, AdamW lr 3e-3 as
  ``torchtpu.demo``) train step: forward, backward, AdamW. Steady-state ms/step (median over
  timing windows, each ending in a device sync) and the first step's seconds (cold compile).
- ``gpt_100m``: the same at vocab 8192, seq 512, d 768, 12 layers, 12 heads, batch 16, AdamW with
  PyTorch's defaults (lr 1e-3), float32; plus MFU against ``--peak-tflops``.
- ``gpt_100m_bf16``: the same under ``torch.autocast("tpu", torch.bfloat16)`` (JAX: bf16 matmul
  operands, float32 LayerNorm, softmax and loss).
- ``decode_b1`` / ``decode_b8``: greedy decoding of the 100M model with a static KV cache at
  batch 1 / 8, tokens/s; torch: one token per ``torch.compile``d step writing the preallocated
  cache in place with ``index_copy_`` (``compiled_graph``: that step captured in a ``torch.tpu.graph``
  and replayed per token, as CUDA-graph decoding does; ``compiled_replayed``: the loop unchanged under
  ``torch.compile(mode="reduce-overhead")``, which replays each call from a TPU graph); JAX: jit and
  ``lax.dynamic_update_slice``.
- ``flash_s512`` / ``flash_s2048``: the 100M GPT train step (float32, AdamW) at seq 512 batch 16
  and at seq 2048 batch 4 (the same tokens per step): flash attention against the math lowering
  and against JAX's own Pallas kernel (torchtpu's block sizes: 512, clipped to the length), plus
  MFU and the process's peak device memory (MiB). Peak memory: on the torch side the PJRT
  allocator's ``peak_bytes_in_use`` where the plugin reports it (a TPU: every buffer and program
  temporary, the math lowering's score matrices included), else torchtpu's own peak of the
  buffers it holds (``torch.tpu.max_memory_reserved()``; the CPU emulator: no program
  temporaries); on the JAX side ``jax.devices()[0].memory_stats()["peak_bytes_in_use"]`` (none on
  CPU). Each cell records its source (``peak_mem_source``). Both are the peak over the worker's
  whole life, first step included: each cell is a process of its own. After the table, the
  ratios of flash to the math lowering and to JAX's kernel.
- ``warm_start``: the demo GPT's first train step in a fresh process with an empty persistent
  compile cache (cold), then in a second process with it filled by the first (warm): seconds and
  XLA compiles (torchtpu: tier 3 under ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``, counted by
  ``torch.tpu.compile_cache_stats()["compiles"]``; JAX: ``jax_compilation_cache_dir``, compiles
  counted as backend compiles less persistent-cache hits via ``jax.monitoring``).

Every worker runs with torchtpu's host-shared tier-2 cache and the tier-3 cache disabled (except
``warm_start``), so that each first step is a cold compile, not a hit on an earlier worker's work.

MFU = model FLOPs per step / step time / peak. Model FLOPs per step are PaLM's estimate (Chowdhery
et al. 2022, appendix B): ``6 * N * B * T + 12 * L * T^2 * d * B`` with N the non-embedding
parameters (every Linear, the untied head included, plus LayerNorms; the token and position
lookups do no matmul) and the attention term counted without the causal half (as PaLM does).

On the CPU emulator, float32 matmuls run at torchtpu's "medium" precision (one bf16 pass, like a
TPU) while JAX on CPU computes them in float32: the JAX cells there are not a like-for-like peer.
On a TPU both use one bf16 pass by default.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "
MODES = ("jax_jit", "jax_eager", "jax_flash", "strict", "defer", "compiled", "compiled_defer", "compiled_graph",
         "compiled_math", "compiled_head_major", "compiled_replayed", "defer_unchunked", "defer_long_cuts")
MODE_LABELS = {"jax_jit": "JAX jit", "jax_eager": "JAX op-by-op", "jax_flash": "JAX flash", "strict": "Strict",
               "defer": "DeferAndFuse", "compiled": "compiled", "compiled_defer": "compiled+Defer",
               "compiled_graph": "compiled, TPUGraph", "compiled_math": "compiled math",
               "compiled_head_major": "compiled head-major", "defer_unchunked": "Defer unchunked",
               "defer_long_cuts": "Defer long cuts",
               "compiled_replayed": "reduce-overhead"}
JAX_MODES = ("jax_jit", "jax_eager", "jax_flash")
TORCH_EAGER_MODE = {"strict": "strict", "defer": "defer_and_fuse", "compiled": "strict",
                    "compiled_defer": "defer_and_fuse", "compiled_graph": "strict", "compiled_math": "strict",
                    "compiled_head_major": "strict", "defer_unchunked": "defer_and_fuse",
                    "defer_long_cuts": "defer_and_fuse",
                    "compiled_replayed": "strict"}
MIB = 2**20
REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# sizes: the single source of truth for both frameworks

DEMO = {"vocab": 256, "seq": 64, "d_model": 128, "heads": 4, "layers": 2}
GPT_100M = {"vocab": 8192, "seq": 512, "d_model": 768, "heads": 12, "layers": 12}
TINY = {"vocab": 64, "seq": 16, "d_model": 32, "heads": 2, "layers": 1}
TINY_100M = {"vocab": 128, "seq": 32, "d_model": 64, "heads": 4, "layers": 2}  # 100M's structure, tiny
# compiled_graph cells pack the parameters up to this size into flat storages (torch.tpu.pack_parameters)
PACKED_PARAMETER_MAX_BYTES = 1 << 20
# flash_* at --small: the smallest shapes the kernel takes (torchtpu.flash_attention.qualifies):
# lengths a multiple of 128, head dim 64
TINY_FLASH = {"vocab": 128, "d_model": 128, "heads": 2, "layers": 1}
FLASH_SHAPES = {"flash_s512": {"seq": 512, "batch": 16}, "flash_s2048": {"seq": 2048, "batch": 4}}
FLASH_SHAPES_SMALL = {"flash_s512": {"seq": 128, "batch": 2}, "flash_s2048": {"seq": 256, "batch": 1}}


def sizes(workload: str, small: bool) -> dict[str, Any]:
    """Model config and step counts of a workload (``small``: for the CPU emulator)."""
    # warmup: untimed windows of ``steps`` steps after the first step (see time_train)
    train = {"warmup": 2, "windows": 5, "steps": 10} if not small else {"warmup": 1, "windows": 3, "steps": 3}
    if workload == "op_chain":
        return {"n": 1000, "shape": [8, 128], "reps": 3 if small else 7}
    if workload in ("gpt_demo", "warm_start"):
        return {"cfg": TINY if small else DEMO, "batch": 2 if small else 8, "lr": 3e-3, **train}
    if workload in ("gpt_100m", "gpt_100m_bf16"):
        big = {"warmup": 1, "windows": 3, "steps": 5}
        return {"cfg": TINY_100M if small else GPT_100M, "batch": 2 if small else 16, "lr": 1e-3,
                **(train if small else big)}
    if workload in FLASH_SHAPES:
        shape = (FLASH_SHAPES_SMALL if small else FLASH_SHAPES)[workload]
        big = {"warmup": 1, "windows": 3, "steps": 5}
        return {"cfg": {**(TINY_FLASH if small else GPT_100M), "seq": shape["seq"]}, "batch": shape["batch"],
                "lr": 1e-3, **(train if small else big)}
    if workload in ("decode_b1", "decode_b8"):
        # generate from one start token: 128 new tokens fit the 100M model's 512 positions
        return {"cfg": TINY_100M if small else GPT_100M, "batch": 1 if workload == "decode_b1" else 8,
                "new_tokens": 8 if small else 128, "reps": 2 if small else 5}
    raise ValueError(f"unknown workload {workload!r}")


def model_flops_per_step(cfg: dict[str, int], batch: int) -> float:
    """PaLM's training FLOPs of one step (see the module docstring)."""
    d, layers, t = cfg["d_model"], cfg["layers"], cfg["seq"]
    per_layer = 12 * d * d + 13 * d  # qkv, proj, fc, out weights and biases; two LayerNorms
    non_embedding = layers * per_layer + 2 * d + cfg["vocab"] * d  # + final LayerNorm + untied head
    return 6.0 * non_embedding * batch * t + 12.0 * layers * t * t * d * batch


# ---------------------------------------------------------------------------------------------
# the table's layout


@dataclass(frozen=True)
class Row:
    metric: str
    label: str
    better: str | None  # "lower", "higher" or None (no ratio)
    fmt: str = "{:.3g}"


@dataclass(frozen=True)
class Workload:
    modes: tuple[str, ...]
    rows: tuple[Row, ...]
    ref: str = "jax_jit"
    phases: tuple[str, ...] = ("",)  # warm_start: ("cold", "warm"), sharing one cache directory
    pairs: tuple[tuple[str, str], ...] = ()  # (mode, against): ratios printed after the table too
    # modes run only when --modes names them (attention variants of a training workload)
    on_request: tuple[str, ...] = ()


TRAIN_ROWS = (Row("step_ms", "train step ms", "lower"), Row("first_step_s", "first step s", "lower"))
MFU_ROW = Row("mfu_pct", "MFU %", "higher")
PEAK_MEM_ROW = Row("peak_mem_mib", "peak device MiB", "lower", "{:.0f}")
TEMP_ROW = Row("temp_mib", "largest program scratch MiB", "lower", "{:.0f}")
# the two together: what one step needs at most, where the allocator's peak leaves scratch out
PEAK_TOTAL_ROW = Row("peak_total_mib", "peak + scratch MiB", "lower", "{:.0f}")
FLASH_ROWS = (*TRAIN_ROWS, MFU_ROW, PEAK_MEM_ROW, TEMP_ROW, PEAK_TOTAL_ROW)
FLASH_MODES = ("jax_jit", "jax_flash", "compiled", "compiled_math", "compiled_head_major")
FLASH_PAIRS = (("compiled", "compiled_math"), ("compiled", "jax_flash"))
PAIR_METRICS = ("step_ms", "peak_mem_mib", "temp_mib", "peak_total_mib")  # the rows a workload's pairs are given for
TRAIN_MODES = ("jax_jit", "strict", "defer", "compiled", "compiled_defer", "compiled_graph")
WARM_START_MODES = ("jax_jit", "strict", "defer", "compiled", "compiled_defer")
# variants of the 100M step, run when --modes names them: the compiled step with attention by the math
# lowering, and by the head-major flash kernel (JAX's, with the layout copies around it); DeferAndFuse
# without early-launch chunks (TORCH_TPU_DEFER_CHUNK_NODES=0: cuts at reads, step boundaries and repeated
# blocks only, where chunks trade fusion across their cuts for overlapping the host's recording), and that
# with each cut at repeats holding at least LONG_CUT_NODES ops (several of a 12-layer GPT's blocks: ~4
# programs a step on the emulator, where the default 24 gives ~21)
LONG_CUT_NODES = 400
ON_REQUEST_MODES = ("compiled_math", "compiled_head_major", "defer_unchunked", "defer_long_cuts")
WORKLOADS: dict[str, Workload] = {
    "op_chain": Workload(("jax_jit", "jax_eager", "strict", "defer"),
                         (Row("us_per_op", "µs/op", "lower"),), ref="jax_eager"),
    "gpt_demo": Workload(TRAIN_MODES, TRAIN_ROWS),
    "gpt_100m": Workload((*TRAIN_MODES, *ON_REQUEST_MODES), (*TRAIN_ROWS, MFU_ROW), on_request=ON_REQUEST_MODES),
    "gpt_100m_bf16": Workload((*TRAIN_MODES, *ON_REQUEST_MODES), (*TRAIN_ROWS, MFU_ROW), on_request=ON_REQUEST_MODES),
    "flash_s512": Workload(FLASH_MODES, FLASH_ROWS, pairs=FLASH_PAIRS, on_request=("compiled_head_major",)),
    "flash_s2048": Workload(FLASH_MODES, FLASH_ROWS, pairs=FLASH_PAIRS, on_request=("compiled_head_major",)),
    "decode_b1": Workload(("jax_jit", "compiled", "compiled_graph", "compiled_replayed"), (Row("tokens_per_s", "tokens/s", "higher", "{:.4g}"),
                                                    Row("first_gen_s", "first generation s", "lower"))),
    "decode_b8": Workload(("jax_jit", "compiled", "compiled_graph", "compiled_replayed"), (Row("tokens_per_s", "tokens/s", "higher", "{:.4g}"),
                                                    Row("first_gen_s", "first generation s", "lower"))),
    "warm_start": Workload(WARM_START_MODES, (Row("warm_first_step_s", "warm first step s", "lower"),
                                         Row("cold_first_step_s", "cold first step s", "lower"),
                                         Row("warm_compiles", "warm XLA compiles", None, "{:.0f}"),
                                         Row("cold_compiles", "cold XLA compiles", None, "{:.0f}")),
                           phases=("cold", "warm")),
}


# ---------------------------------------------------------------------------------------------
# timing, shared by both frameworks so that they are measured the same way


def time_train(step: Callable[[], Any], sync: Callable[[], None], compiles: Callable[[], int], warmup: int,
               windows: int, steps: int) -> dict[str, Any]:
    """The first step's seconds (compile included); then ``warmup`` untimed windows and ``windows``
    timed ones, each of ``steps`` steps ending in ``sync``: ms/step is the median window's.

    Warm-up runs whole windows, not single steps, because DeferAndFuse records across steps until
    a sync: a window's programs are only compiled once a window of that length has run.
    ``timed_compiles`` counts XLA compiles during the timed windows (0 in a steady state)."""
    t0 = time.perf_counter()
    loss = step()
    sync()
    first = time.perf_counter() - t0
    loss0 = float(loss)

    def window() -> float:
        nonlocal loss
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step()
        sync()
        return (time.perf_counter() - t0) / steps

    for _ in range(warmup):
        window()
    compiles0 = compiles()
    per_step = [window() for _ in range(windows)]
    out = {"first_step_s": first, "window_step_ms": [t * 1e3 for t in per_step], "loss0": loss0,
           "loss_last": float(loss), "timed_compiles": compiles() - compiles0}
    if per_step:
        out["step_ms"] = statistics.median(per_step) * 1e3
    return out


def time_runs(run: Callable[[], None], reps: int) -> tuple[float, list[float]]:
    """Seconds of a first (compiling) run, then of ``reps`` more."""
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return first, times


def add_mfu(out: dict[str, Any], workload: str, p: dict[str, Any], peak_tflops: float) -> None:
    if workload.startswith(("gpt_100m", "flash_")):
        flops = model_flops_per_step(p["cfg"], p["batch"])
        out["model_flops_per_step"] = flops
        out["mfu_pct"] = 100.0 * flops / (out["step_ms"] * 1e-3) / (peak_tflops * 1e12)


# ---------------------------------------------------------------------------------------------
# torchtpu workers


def _torch() -> Any:
    import torch

    import torchtpu  # noqa: F401  (registers the tpu device even without backend autoload)

    return torch


def torch_op_chain(p: dict[str, Any]) -> dict[str, Any]:
    torch = _torch()
    x0 = torch.ones(*p["shape"], device="tpu")

    def run() -> None:
        x = x0
        for _ in range(p["n"] // 2):
            x = x * 1.0001
            x = x + 0.0001
        x.cpu()  # the materialization: DeferAndFuse runs the recorded ops here

    first, times = time_runs(run, p["reps"])
    return {"us_per_op": statistics.median(times) / p["n"] * 1e6, "first_run_s": first}


def _torch_gpt(p: dict[str, Any], train: bool) -> tuple[Any, Any]:
    torch = _torch()
    from torchtpu.examples.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**p["cfg"])).to("tpu")
    return torch, model if train else model.eval()


def torch_gpt_step(p: dict[str, Any], mode: str, bf16: bool) -> tuple[Any, Any, Callable[[], Any]]:
    """torch, the model, and one training step of it in ``mode`` (forward, backward, AdamW)."""
    torch, model = _torch_gpt(p, train=True)
    from torchtpu.examples.gpt import make_batch

    if mode == "compiled_graph":
        # one launch argument for the parameters, not one each; a matrix over 1 MiB stays apart (each
        # program would copy it into the TPU's tiled layout: see torch.tpu.pack_parameters). The demo
        # GPT's all fit (its packed step measured 1.61x JAX on a v5e); the 100M's biases and norms do
        torch.tpu.pack_parameters(model, max_bytes=PACKED_PARAMETER_MAX_BYTES)
    # a captured step keeps AdamW's step count on the device (as CUDA graphs need)
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], capturable=mode == "compiled_graph")
    loss_fn = torch.compile(model.loss, backend="tpu") if mode.startswith("compiled") else model.loss
    x, y = (t.to("tpu") for t in make_batch(model.cfg, p["batch"], torch.Generator().manual_seed(0)))

    def forward_backward() -> Any:
        ctx = torch.autocast("tpu", torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(x, y)
        loss.backward()
        return loss

    def step() -> Any:
        loss = forward_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if mode != "compiled_graph":
        return torch, model, step
    captured: dict[str, Any] = {}

    def replayed_step() -> Any:
        if not captured:  # the first step as usual (it creates AdamW's state), then the capture
            loss = step()
            graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(graph):  # the same step: its gradients die inside, as JAX's do
                captured["loss"] = forward_backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            captured["graph"] = graph
            return loss
        captured["graph"].replay()
        return captured["loss"]

    return torch, model, replayed_step


def torch_gpt_train(p: dict[str, Any], mode: str, bf16: bool) -> dict[str, Any]:
    torch, model, step = torch_gpt_step(p, mode, bf16)
    out = time_train(step, torch.tpu.synchronize, lambda: torch.tpu.compile_cache_stats()["compiles"],
                     p["warmup"], p["windows"], p["steps"])
    out["params"] = sum(t.numel() for t in model.parameters())
    return out


def torch_peak_memory(torch: Any) -> dict[str, Any]:
    """The process's peak device memory (see the module docstring) and where it came from."""
    from torchtpu import _device_state

    stats = _device_state.client().memory_stats(0)
    out = {"peak_storage_mib": torch.tpu.max_memory_allocated() / MIB,  # live tpu storages only
           "temp_mib": torch.tpu.memory_stats()["temp_bytes.largest_program"] / MIB}
    if stats and "peak_bytes_in_use" in stats:
        out.update(peak_mem_mib=stats["peak_bytes_in_use"] / MIB, peak_mem_source="pjrt peak_bytes_in_use")
    else:
        out.update(peak_mem_mib=torch.tpu.max_memory_reserved() / MIB, peak_mem_source="torchtpu max_memory_reserved")
    return with_peak_total(out)


def with_peak_total(out: dict[str, Any]) -> dict[str, Any]:
    """``peak_total_mib``: the allocator's peak plus the largest program scratch. On a TPU v5e the
    allocator's peak_bytes_in_use left a program's scratch out (the 15th round: the math lowering's
    2 GiB of score matrices, inside the step's programs, did not show in it), so one step's need is
    at most their sum (a bound: the peak need not coincide with that program)."""
    known = out.get("peak_mem_mib") is not None and out.get("temp_mib") is not None
    out["peak_total_mib"] = out["peak_mem_mib"] + out["temp_mib"] if known else None  # None: n/a (JAX on CPU)
    return out


def torch_flash_check(torch: Any, p: dict[str, Any], mode: str) -> None:
    """Raise unless the GPT's attention takes the path the mode is meant to measure (``compiled``:
    the flash kernel; ``compiled_math``: the math lowering), e.g. the kernel not taking a shape,
    or its being off at a float32 precision other than "medium" on a TPU."""
    from torchtpu import flash_attention

    cfg = p["cfg"]
    q = torch.empty(p["batch"], cfg["heads"], cfg["seq"], cfg["d_model"] // cfg["heads"], device="meta")
    flash = flash_attention.enabled() and flash_attention.qualifies(q, q, q, None, 0.0, True)
    if flash != (mode in ("compiled", "compiled_head_major")):
        raise RuntimeError(f"mode {mode} but flash attention {'on' if flash else 'off'} for {tuple(q.shape)}")
    seen = q.transpose(1, 2).contiguous().transpose(1, 2)  # the GPT's q: [B, T, H, D] seen as [B, H, T, D]
    if flash and flash_attention.takes_lanes(seen, seen, seen, None) == (mode == "compiled_head_major"):
        raise RuntimeError(f"mode {mode} but the lane-layout kernels {'on' if mode == 'compiled_head_major' else 'off'}")


def torch_first_step(p: dict[str, Any], mode: str) -> dict[str, Any]:
    """warm_start: one train step in this fresh process, and the XLA compiles it took."""
    one = {**p, "warmup": 0, "windows": 0}
    out = torch_gpt_train(one, mode, bf16=False)
    stats = _torch().tpu.compile_cache_stats()
    return {"first_step_s": out["first_step_s"], "compiles": stats["compiles"],
            "tier3_hits": stats.get("tier3_hits", 0), "loss0": out["loss0"]}


def torch_decode(p: dict[str, Any], mode: str) -> dict[str, Any]:
    torch, generate, generated = torch_decode_generation(p, mode)
    compiles0 = torch.tpu.compile_cache_stats()["compiles"]
    first, times = time_runs(generate, p["reps"])
    return {"tokens_per_s": p["batch"] * p["new_tokens"] / statistics.median(times), "first_gen_s": first,
            "compiles": torch.tpu.compile_cache_stats()["compiles"] - compiles0,
            "tokens_seq0": torch.cat(generated, 1)[0].tolist()}


def torch_decode_generation(p: dict[str, Any], mode: str) -> tuple[Any, Callable[[], None], list[Any]]:
    """torch, one greedy generation of ``p["new_tokens"]`` tokens in ``mode`` (a call), and the list
    it leaves its tokens in (tools/tpu_suite/probe_decode_timeline.py times the same generation)."""
    torch, model = _torch_gpt(p, train=False)
    import torch.nn.functional as F

    if mode == "compiled_graph":
        # the small parameters only: a packed matrix is copied into the TPU's tiled layout by every
        # program that reads it, once per token here (all packed: 0.21x JAX at batch 1 on a v5e,
        # where none packed gave 0.81x; torch.tpu.pack_parameters says more)
        torch.tpu.pack_parameters(model, max_bytes=PACKED_PARAMETER_MAX_BYTES)
    cfg, b = model.cfg, p["batch"]
    hd = cfg.d_model // cfg.heads
    ks = [torch.zeros(b, cfg.heads, cfg.seq, hd, device="tpu") for _ in range(cfg.layers)]
    vs = [torch.zeros(b, cfg.heads, cfg.seq, hd, device="tpu") for _ in range(cfg.layers)]
    positions = torch.arange(cfg.seq, device="tpu")

    def split(z: Any) -> Any:
        return z.view(b, 1, cfg.heads, hd).transpose(1, 2)

    def step(tok: Any, pos: Any) -> tuple[Any, Any]:
        """One token per sequence: write its K/V at ``pos`` in place, attend over the static cache."""
        x = model.tok(tok) + model.pos(pos)  # (b, 1, d)
        mask = positions <= pos  # True: attend (positions after pos hold stale or zero K/V)
        for blk, k_cache, v_cache in zip(model.blocks, ks, vs):
            q, k, v = (split(z) for z in blk.qkv(blk.ln1(x)).split(cfg.d_model, dim=-1))
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
            x = x + blk.proj(a.transpose(1, 2).reshape(b, 1, cfg.d_model))
            x = x + blk.out(F.gelu(blk.fc(blk.ln2(x))))
        return model.head(model.ln(x)).argmax(-1), pos + 1

    # compiled_replayed: torch.compile's mode="reduce-overhead", each call replayed from a TPU graph
    # (compile/replayed.py) as CUDA graphs do for gpt-fast; the loop below unchanged
    compiled = torch.compile(step, backend="tpu", **({"mode": "reduce-overhead"} if mode == "compiled_replayed" else {}))
    generated: list[Any] = []

    def generate() -> None:
        tok = torch.zeros(b, 1, dtype=torch.long, device="tpu")
        pos = torch.zeros(1, dtype=torch.long, device="tpu")
        generated.clear()
        with torch.no_grad():
            for _ in range(p["new_tokens"]):
                tok, pos = compiled(tok, pos)  # tokens stay on the device: no host round trip
                generated.append(tok)
        torch.tpu.synchronize()

    if mode == "compiled_graph":
        generate = _graphed_generation(torch, compiled, b, cfg.seq, p["new_tokens"], generated)
    return torch, generate, generated


def _graphed_generation(torch: Any, compiled: Any, b: int, seq: int, new_tokens: int,
                        generated: list[Any]) -> Any:
    """Greedy generation as CUDA-graph decoding does it (``torch.compile(mode="reduce-overhead")``,
    gpt-fast): the compiled step captured once in a ``torch.tpu.graph`` with static token and
    position tensors, the new token written into a preallocated output at its position, then one
    ``replay()`` per token: no Dynamo guards, wrappers or argument walks per token. The first
    generation includes the capture (Dynamo's trace inside it) and its compile."""
    tok = torch.zeros(b, 1, dtype=torch.long, device="tpu")
    pos = torch.zeros(1, dtype=torch.long, device="tpu")
    out = torch.zeros(b, seq, dtype=torch.long, device="tpu")
    graph: list[Any] = []

    def capture() -> None:
        with torch.no_grad():
            # no warm-up call: nothing runs at capture, so Dynamo traces inside it and only the captured
            # program compiles (with a warm-up, the step's own program compiled first: 5-7 s on a v5e)
            g = torch.tpu.TPUGraph()
            with torch.tpu.graph(g):
                new_tok, new_pos = compiled(tok, pos)
                out.index_copy_(1, pos, new_tok)
                tok.copy_(new_tok)
                pos.copy_(new_pos)
        graph.append(g)

    def generate() -> None:
        if not graph:
            capture()
        tok.zero_()
        pos.zero_()
        for _ in range(new_tokens):
            graph[0].replay()
        torch.tpu.synchronize()
        generated[:] = [out[:, :new_tokens]]

    return generate


def torch_worker(workload: str, mode: str, p: dict[str, Any], peak_tflops: float) -> dict[str, Any]:
    torch = _torch()
    want = TORCH_EAGER_MODE[mode]
    if torch.tpu.get_eager_mode() != want:  # the driver sets the mode through the environment
        raise RuntimeError(f"eager mode is {torch.tpu.get_eager_mode()!r}, expected {want!r}")
    if workload == "op_chain":
        out = torch_op_chain(p)
    elif workload == "warm_start":
        out = torch_first_step(p, mode)
    elif workload.startswith("decode"):
        out = torch_decode(p, mode)
    else:
        if workload in FLASH_SHAPES or mode == "compiled_head_major":
            torch_flash_check(torch, p, mode)
        compiles0 = torch.tpu.compile_cache_stats()["compiles"]
        out = torch_gpt_train(p, mode, bf16=workload.endswith("bf16"))
        out["compiles"] = torch.tpu.compile_cache_stats()["compiles"] - compiles0
        add_mfu(out, workload, p, peak_tflops)
        out.update(torch_peak_memory(torch))
    out.update(platform=torch.tpu.get_device_name(), eager_mode=torch.tpu.get_eager_mode(),
               torch=torch.__version__, slowest_compiles=slowest_compiles(torch.tpu.compile_log()))
    return out


def slowest_compiles(log: list[dict[str, Any]], n: int = 5) -> list[list]:
    """[what, seconds] of a cell's ``n`` longest XLA compiles (torch.tpu.compile_log()): what a
    cold first step waited on, for the JSON (side-by-side compiles overlap; their sum is not wall)."""
    return [[e["what"][:120], round(e["seconds"], 2)] for e in sorted(log, key=lambda e: -e["seconds"])[:n]]


# ---------------------------------------------------------------------------------------------
# JAX workers


def _jax_compile_counter() -> dict[str, int]:
    """Counts of backend compiles and persistent-cache hits, from ``jax.monitoring`` events (a hit
    still passes through the backend-compile span, so XLA compiles = spans - hits)."""
    import jax

    counts = {"spans": 0, "hits": 0}

    def on_duration(event: str, _secs: float, **_kw: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            counts["spans"] += 1

    def on_event(event: str, **_kw: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    return counts


def jax_peak_memory(jax: Any, temp_bytes: int | None) -> dict[str, Any]:
    """The process's peak device memory per JAX's device, None where it reports none (CPU), and the
    train step's scratch (its compiled ``memory_analysis``)."""
    stats = jax.devices()[0].memory_stats()
    out = {"temp_mib": None if temp_bytes is None else temp_bytes / MIB}
    if stats and "peak_bytes_in_use" in stats:
        out.update(peak_mem_mib=stats["peak_bytes_in_use"] / MIB, peak_mem_source="jax peak_bytes_in_use")
    else:
        out.update(peak_mem_mib=None, peak_mem_source=f"none: no memory_stats on {jax.devices()[0].platform}")
    return with_peak_total(out)


def jax_gpt_train(p: dict[str, Any], bf16: bool, flash: bool = False, flash_memory: bool = False) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from peers import jax_gpt

    cfg = jax_gpt.GPTConfig(**p["cfg"])
    state = {"params": jax_gpt.init_params(cfg)}
    n_params = jax_gpt.param_count(state["params"])
    state["opt"] = jax_gpt.adamw_init(state["params"])
    train_step = jax_gpt.make_train_step(cfg, p["lr"], jnp.bfloat16 if bf16 else None, flash)
    x, y = jax_gpt.make_batch(cfg, p["batch"])
    compiled: list[Any] = []

    def compiled_ahead(*args: Any) -> Any:  # flash_*: compiled at the first step, for its memory_analysis
        if not compiled:
            compiled.append(train_step.lower(*args).compile())
        return compiled[0](*args)

    run = compiled_ahead if flash_memory else train_step

    def step() -> Any:
        state["params"], state["opt"], loss = run(state["params"], state["opt"], x, y)
        return loss

    counts = _jax_compile_counter()
    out = time_train(step, lambda: jax.block_until_ready(state), lambda: counts["spans"] - counts["hits"],
                     p["warmup"], p["windows"], p["steps"])
    out.update(params=n_params, compiles=counts["spans"] - counts["hits"])
    if compiled:
        analysis = compiled[0].memory_analysis()
        out["temp_bytes"] = None if analysis is None else int(analysis.temp_size_in_bytes)
    return out


def jax_decode(p: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from peers import jax_gpt

    cfg, b = jax_gpt.GPTConfig(**p["cfg"]), p["batch"]
    params = jax_gpt.init_params(cfg)
    step = jax_gpt.make_decode_step(cfg)
    cache = {}
    cache["k"], cache["v"] = jax_gpt.init_cache(cfg, b)

    generated: list[Any] = []

    def generate() -> None:
        tok, pos = jnp.zeros((b,), jnp.int32), jnp.zeros((), jnp.int32)
        generated.clear()
        for _ in range(p["new_tokens"]):
            tok, cache["k"], cache["v"], pos = step(params, cache["k"], cache["v"], tok, pos)
            generated.append(tok)
        jax.block_until_ready(tok)

    counts = _jax_compile_counter()
    first, times = time_runs(generate, p["reps"])
    return {"tokens_per_s": b * p["new_tokens"] / statistics.median(times), "first_gen_s": first,
            "compiles": counts["spans"] - counts["hits"], "tokens_seq0": [int(t[0]) for t in generated]}


def jax_worker(workload: str, mode: str, p: dict[str, Any], peak_tflops: float) -> dict[str, Any]:
    import jax

    if workload == "op_chain":
        from peers import jax_ops

        make = jax_ops.jitted if mode == "jax_jit" else jax_ops.op_by_op
        first, times = time_runs(make(tuple(p["shape"]), p["n"]), p["reps"])
        out = {"us_per_op": statistics.median(times) / p["n"] * 1e6, "first_run_s": first}
    elif workload == "warm_start":
        jax.config.update("jax_compilation_cache_dir", os.environ["BENCH_JAX_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # cache every program
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        counts = _jax_compile_counter()
        one = jax_gpt_train({**p, "warmup": 0, "windows": 0}, bf16=False)
        out = {"first_step_s": one["first_step_s"], "compiles": counts["spans"] - counts["hits"],
               "cache_hits": counts["hits"], "loss0": one["loss0"]}
    elif workload.startswith("decode"):
        out = jax_decode(p)
    else:
        out = jax_gpt_train(p, bf16=workload.endswith("bf16"), flash=mode == "jax_flash",
                            flash_memory=workload in FLASH_SHAPES)
        add_mfu(out, workload, p, peak_tflops)
        out.update(jax_peak_memory(jax, out.pop("temp_bytes", None)))
    out.update(platform=jax.devices()[0].device_kind, jax=jax.__version__)
    return out


def worker_main(workload: str, mode: str, small: bool, peak_tflops: float) -> None:
    p = sizes(workload, small)
    run = jax_worker if mode in JAX_MODES else torch_worker
    out = run(workload, mode, p, peak_tflops)
    print(RESULT_PREFIX + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# the driver


def worker_env(mode: str, tmp: str, persistent: bool, workload: str = "") -> dict[str, str]:
    """The worker's environment: its eager mode, flash attention on or off for the ``flash_*``
    workloads (forced on: unset, it is on only on a TPU), and only the compile caches it is meant to use:
    the persistent ones (torchtpu's tier 3, JAX's cache dir) under ``tmp`` when ``persistent``.
    PyTorch's own on-disk caches (dynamo/AOTAutograd, under TORCHINDUCTOR_CACHE_DIR) always go
    under ``tmp``, which is fresh per (workload, mode), so no first step hits an earlier run's work."""
    cache_dir = os.path.join(tmp, "compile-cache") if persistent else None
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "torchinductor")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    env["TORCH_TPU_DEFER_AND_FUSE"] = "1" if TORCH_EAGER_MODE.get(mode) == "defer_and_fuse" else "0"
    env.pop("TPU_DEFER_AND_FUSE", None)  # the alias would override nothing, but keep it unambiguous
    env["TORCH_TPU_TIER2_COMPILATION_CACHE"] = "disabled"
    env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = cache_dir or "disabled"
    env.pop("BENCH_JAX_CACHE_DIR", None)
    if mode == "compiled_math":  # any workload: attention by the math lowering
        env["TORCH_TPU_FLASH_ATTENTION"] = "0"
    elif mode == "compiled_head_major":  # any workload: the kernel on [B, H, T, D], with the layout copies
        env["TORCH_TPU_FLASH_ATTENTION"], env["TORCH_TPU_FLASH_LANES"] = "1", "0"
    elif workload in FLASH_SHAPES:
        env["TORCH_TPU_FLASH_ATTENTION"] = "1"
    if mode in ("defer_unchunked", "defer_long_cuts"):
        env["TORCH_TPU_DEFER_CHUNK_NODES"] = "0"
    if mode == "defer_long_cuts":  # a period cut of several blocks: a few programs a step (deferred.MIN_CUT_NODES)
        env["TORCH_TPU_DEFER_MIN_CUT_NODES"] = str(LONG_CUT_NODES)
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        env["BENCH_JAX_CACHE_DIR"] = cache_dir
    return env


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no stderr)"


def run_worker(workload: str, mode: str, args: argparse.Namespace, tmp: str, persistent: bool) -> dict[str, Any]:
    """Run one worker process; its metrics, or ``{"error": ...}``. Never raises."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", workload, "--mode", mode,
           "--peak-tflops", str(args.peak_tflops), "--pack-max-bytes", str(args.pack_max_bytes),
           "--flash-dq-block", str(args.flash_dq_block)] + (
               ["--small"] if args.small else [])
    t0 = time.perf_counter()
    # its own session: on a timeout the whole process group goes, children included
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=worker_env(mode, tmp, persistent, workload), cwd=REPO, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return {"error": f"timeout after {args.timeout:g} s; last stderr: {last_line(stderr)}",
                "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    results = [ln[len(RESULT_PREFIX):] for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not results:
        return {"error": f"exit {proc.returncode}: {last_line(stderr)}", "wall_s": wall}
    return {**json.loads(results[-1]), "wall_s": wall}


def jax_missing() -> str | None:
    """None when JAX imports; else why not, for the JAX cells. Tried in a subprocess: the driver
    itself loads neither framework, so that it never holds the chip its workers need."""
    if importlib.util.find_spec("jax") is None:
        return "jax not installed"
    r = subprocess.run([sys.executable, "-c", "import jax"], check=False, capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        return None
    why = last_line(r.stderr)
    return "jax not installed" if "No module named 'jax" in why else f"jax not importable: {why}"


def selected_modes(wl: Workload, asked: Sequence[str] | None) -> list[str]:
    """The modes of a workload a run measures: those ``--modes`` names, else all but its on-request ones."""
    return [m for m in wl.modes if m in asked] if asked else [m for m in wl.modes if m not in wl.on_request]


def run_workload(name: str, args: argparse.Namespace, no_jax: str | None,
                 on_cell: Callable[[dict[str, dict[str, Any]]], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every selected mode of one workload, a worker process each; on_cell sees the cells so far after each."""
    wl = WORKLOADS[name]
    out: dict[str, dict[str, Any]] = {}
    for mode in selected_modes(wl, args.modes):
        if mode in JAX_MODES and no_jax:
            out[mode] = {"error": no_jax}
            continue
        with tempfile.TemporaryDirectory(prefix="bench-tpu-") as tmp:
            merged: dict[str, Any] = {}
            for phase in wl.phases:
                r = run_worker(name, mode, args, tmp, persistent=bool(phase))
                print(f"  {name:14} {MODE_LABELS[mode]:18} {phase:5} {r['wall_s']:6.1f} s  "
                      f"{'ERROR ' + r['error'] if 'error' in r else 'ok'}", file=sys.stderr, flush=True)
                if "error" in r:
                    merged = {"error": (f"{phase}: " if phase else "") + r["error"]}
                    break
                merged.update({f"{phase}_{k}" if phase else k: v for k, v in r.items()})
            if wl.phases != ("",) and "error" not in merged:
                merged["platform"] = merged.get(f"{wl.phases[-1]}_platform")
            out[mode] = merged
        if on_cell:
            on_cell(out)
    return out


def ratio(row: Row, value: float, ref: float | None) -> float | None:
    if row.better is None or ref is None or not value or not ref:
        return None
    return ref / value if row.better == "lower" else value / ref


def build_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per (workload, row): per mode the value, its ratio to the row's reference, or an error."""
    table = []
    for name, by_mode in results.items():
        wl = WORKLOADS[name]
        for row in wl.rows:
            ref_val = by_mode.get(wl.ref, {}).get(row.metric)
            cells = {}
            for mode, r in by_mode.items():
                if "error" in r:
                    cells[mode] = {"error": r["error"]}
                elif row.metric in r:
                    cells[mode] = {"value": r[row.metric], "ratio": ratio(row, r[row.metric], ref_val)}
                    if row.metric == "step_ms" and r.get("timed_compiles"):
                        cells[mode]["timed_compiles"] = r["timed_compiles"]
                else:
                    cells[mode] = {"error": f"no {row.metric}"}
            entry = {"workload": name, "row": row.label, "ref": wl.ref, "cells": cells}
            if wl.pairs and row.metric in PAIR_METRICS:
                value = {m: r.get(row.metric) for m, r in by_mode.items() if "error" not in r}
                entry["pairs"] = {f"{m}/{a}": ratio(row, value[m], value[a]) if m in value and a in value else None
                                  for m, a in wl.pairs}
            table.append(entry)
    return table


def format_cell(cell: dict[str, Any] | None, row: Row, width: int) -> str:
    if cell is None:
        return ""
    if "error" in cell:
        text = cell["error"]
        return text if len(text) <= width else text[: width - 1] + "…"
    if cell["value"] is None:
        return "n/a"  # not measured there (JAX's peak memory on CPU)
    s = row.fmt.format(cell["value"])
    s += f" ({cell['ratio']:.2f}x)" if cell["ratio"] is not None else ""
    return s + (" *" if cell.get("timed_compiles") else "")


def format_table(table: list[dict[str, Any]], cell_width: int = 28) -> str:
    modes = [m for m in MODES if any(m in e["cells"] for e in table)]
    rows_by_label = {(n, r.label): r for n, wl in WORKLOADS.items() for r in wl.rows}
    head = ["workload", "metric"] + [MODE_LABELS[m] for m in modes]
    body = []
    for e in table:
        row = rows_by_label[(e["workload"], e["row"])]
        body.append([e["workload"], e["row"]] + [format_cell(e["cells"].get(m), row, cell_width) for m in modes])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *body]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    pairs = []
    for e in table:
        if e.get("pairs"):
            ratios = [(*key.split("/"), r) for key, r in e["pairs"].items()]
            pairs.append(f"  {e['workload']} {e['row']}: " + ", ".join(
                f"{MODE_LABELS[m]} vs {MODE_LABELS[a]} " + ("n/a" if r is None else f"{r:.2f}x") for m, a, r in ratios))
    if pairs:
        lines += ["", "flash against the math lowering and JAX's kernel (>1: the first is better):", *pairs]
    return "\n".join(lines)


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def meta(args: argparse.Namespace, have_jax: bool) -> dict[str, Any]:
    """Where and what ran: commit, versions, date and the flags."""
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(), "libtpu": version_of("libtpu"), "jax": version_of("jax") if have_jax else None,
            "jaxlib": version_of("jaxlib") if have_jax else None, "torch": version_of("torch"),
            "python": platform.python_version(), "host": platform.node(), "small": args.small,
            "peak_tflops": args.peak_tflops, "timeout_s": args.timeout,
            "pjrt_plugin": os.environ.get("TORCH_TPU_PJRT_PLUGIN"), "argv": sys.argv[1:],
            # the workers inherit these (A/B runs: TORCH_TPU_ACCURATE_TRANSCENDENTALS=0 python bench/tpu.py ...)
            "torch_tpu_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCH_TPU_")}}


def platforms(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, list[str]]:
    """Distinct platforms each side ran on (torchtpu's device name; JAX's device_kind)."""
    seen: dict[str, set[str]] = {"torchtpu": set(), "jax": set()}
    for by_mode in results.values():
        for mode, r in by_mode.items():
            if r.get("platform"):
                seen["jax" if mode in JAX_MODES else "torchtpu"].add(r["platform"])
    return {k: sorted(v) for k, v in seen.items()}


def write_results(path: str, info: dict[str, Any], results: dict[str, dict[str, dict[str, Any]]],
                  total_s: float) -> None:
    info = {**info, "total_s": total_s, "platforms": platforms(results)}
    Path(path).write_text(json.dumps({"meta": info, "results": results, "table": build_table(results)}, indent=1) + "\n")


def driver_main(args: argparse.Namespace) -> int:
    names = list(WORKLOADS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    no_jax = jax_missing()
    info = meta(args, no_jax is None)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    def keep(name: str, cells: dict[str, dict[str, Any]]) -> None:
        # written after each cell: a run cut short (a TPU lease's call limit) keeps what finished
        results[name] = dict(cells)
        write_results(args.out, info, results, time.perf_counter() - t0)

    for name in names:
        results[name] = run_workload(name, args, no_jax, on_cell=lambda cells, name=name: keep(name, cells))
    table = build_table(results)
    info["total_s"] = time.perf_counter() - t0
    info["platforms"] = platforms(results)
    print(format_table(table))
    print(f"\nratio: JAX jit time / mode time for times, mode / JAX jit for rates and MFU (>1: better than JAX);"
          f" op_chain's ratios are to JAX op-by-op. MFU peak {args.peak_tflops:g} TFLOP/s."
          "\n*: XLA compiled during the timed windows (not a steady state; see timed_compiles in the JSON).")
    print(f"platforms: {info['platforms']}; commit {info['commit']}; libtpu {info['libtpu']}; "
          f"jax {info['jax']}; {info['total_s']:.0f} s in all")
    write_results(args.out, info, results, info["total_s"])
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    global PACKED_PARAMETER_MAX_BYTES  # a worker's, from --pack-max-bytes
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="tiny sizes and few steps (CPU emulator)")
    p.add_argument("--only", default="", help=f"comma-separated workloads of {','.join(WORKLOADS)}")
    p.add_argument("--out", default="tpu_bench.json", help="the JSON results file")
    p.add_argument("--peak-tflops", type=float, default=197.0, help="MFU's peak (v5e bf16: 197)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per worker process")
    p.add_argument("--modes", type=lambda v: [m.strip() for m in v.split(",") if m.strip()], default=[],
                   help=f"comma-separated modes of {','.join(MODES)} (default: each workload's all)")
    p.add_argument("--pack-max-bytes", type=int, default=PACKED_PARAMETER_MAX_BYTES,
                   help="compiled_graph cells pack the parameters up to this size (bytes; 0: none packed)")
    p.add_argument("--flash-dq-block", type=int, default=0,
                   help="the flash backward's dq key block (torchtpu.flash_attention.BLOCK_K_DQ; 0: its default)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if unknown := [m for m in args.modes if m not in MODES]:
        p.error(f"unknown modes {unknown}; choose from {list(MODES)}")
    if args.worker:
        PACKED_PARAMETER_MAX_BYTES = args.pack_max_bytes
        if args.flash_dq_block and args.mode not in JAX_MODES:
            # torch first: importing torchtpu before torch, with backend autoload on, loads it twice
            _torch()
            from torchtpu import flash_attention

            flash_attention.BLOCK_K_DQ = args.flash_dq_block
        worker_main(args.worker, args.mode, args.small, args.peak_tflops)
        return 0
    return driver_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
