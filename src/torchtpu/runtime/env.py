"""Every ``TORCH_TPU_*`` environment variable in one table, read one way.

Each variable has a kind (flag, integer, choice, text), a default and a meaning. :func:`read`
returns its value from the environment at the time of the call; a value that does not parse
gives one ``RuntimeWarning`` naming the variable, the value and the default used instead, so a
typo never makes ``import torch`` fail. :func:`markdown_table` writes ``docs/environment.md``'s
table. This module imports nothing of PyTorch: the runtime reads its variables here too.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str  # "flag", "int", "choice" or "text"
    default: bool | int | str | None  # None: unset means "decided elsewhere" (auto)
    meaning: str
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None


_VARIABLES = (
    Variable("TORCH_TPU_PJRT_PLUGIN", "text", None,
             "the PJRT plugin: `cpu`, `tpu`, `cuda` or a path to a plugin .so; unset: the TPU where a TPU "
             "and libtpu exist, else the CPU emulator"),
    Variable("TORCH_TPU_LAUNCH_BLOCKING", "flag", False,
             "Debug eager mode: every op completes before it returns, with host-side checks",
             aliases=("TPU_LAUNCH_BLOCKING",)),
    Variable("TORCH_TPU_DEFER_AND_FUSE", "flag", False,
             "DeferAndFuse eager mode: ops are recorded and run fused at materialization points",
             aliases=("TPU_DEFER_AND_FUSE",)),
    Variable("TORCH_TPU_CPU_FALLBACK", "flag", False,
             "run ops that have no lowering on the CPU (with one warning per op) instead of raising"),
    Variable("TORCH_TPU_CHECK_NAN", "flag", False, "raise when an op's result has a NaN (slow)"),
    Variable("TORCH_TPU_NUM_DEVICES", "int", 1, "devices the CPU emulator makes (a TPU has its chips)",
             minimum=1),
    Variable("TORCH_TPU_CPU_DEVICE_COUNT", "int", None,
             "devices of a CPU-plugin client made by the runtime alone (`runtime.create_client`); unset: 1",
             minimum=1),
    Variable("TORCH_TPU_EMULATED_HBM_GIB", "int", 16,
             "CPU emulator: the memory size of each emulated device, in GiB (a v5e chip has 16); live tpu "
             "tensors beyond it raise torch.OutOfMemoryError", minimum=1),
    Variable("TORCH_TPU_HOST_MEMORY_POOL", "flag", True,
             "CPU emulator: keep freed device (host) memory pooled instead of returning it to the OS"),
    Variable("TORCH_TPU_XLA_THREAD_NICE", "int", 0,
             "CPU emulator: nice value for XLA's compute threads (0 leaves them as they are)",
             minimum=0, maximum=19),
    Variable("TORCH_TPU_DEBUG_CHECKS", "flag", None,
             "host-side bounds checks of indexing ops; unset: on in Debug mode only"),
    Variable("TORCH_TPU_INDEX_CHECKS", "flag", True,
             "outside Debug mode, check indices on the device and raise at the next synchronization"),
    Variable("TORCH_TPU_CPU_KERNELS", "flag", True,
             "CPU emulator: let XLA:CPU programs call torchtpu's host kernels (LAPACK, sorting)"),
    Variable("TORCH_TPU_DEFER_CHUNK_NODES", "int", 40,
             "DeferAndFuse: launch a program every N recorded ops (0: only at reads, syncs and repeats)",
             minimum=0),
    Variable("TORCH_TPU_DEFER_MIN_CUT_NODES", "int", 24,
             "DeferAndFuse: a graph cut at a repeated sequence of ops (a model's blocks) holds whole repeats of "
             "at least this many ops; larger: fewer, longer programs a step (on the emulator's 12-block GPT: "
             "24 gives ~21 launches a step, 400 gives ~4)", minimum=1),
    Variable("TORCH_TPU_COMPILE_THREADS", "int", None,
             "DeferAndFuse: threads compiling the programs of cut graphs side by side; unset: the host's "
             "cores, at most 8", minimum=1),
    Variable("TORCH_TPU_FUSE_OPTIMIZER_STEPS", "flag", True,
             "Strict mode: record a torch.optim step over tpu parameters and run it as one program"),
    Variable("TORCH_TPU_FUSE_COMPILED_STEPS", "choice", "backward",
             "Strict mode: record a training step from its first torch.compile graph through its backward "
             "(`backward`: the optimizer step is a second program) or through its optimizer step "
             "(`optimizer`: one program, whose first-step and later variants both compile), or `off`; "
             "a read ends the recording", choices=("backward", "optimizer", "off")),
    Variable("TORCH_TPU_MAX_CACHED_PROGRAMS", "int", 1500,
             "compiled programs each in-memory cache keeps (oldest dropped first; 0: no bound): each "
             "costs memory mappings, of which Linux allows 65,530 by default", minimum=0),
    Variable("TORCH_TPU_DYNAMIC_BUCKETS", "text", "pow2",
             "compiled dynamic shapes: `pow2`, `exact` (no padding) or ascending sizes `64,128,512`"),
    Variable("TORCH_TPU_EAGER_BUCKETS", "choice", "pow2",
             "eager modes: a loop over changing lengths runs padded to power-of-two buckets, one program "
             "(Strict) or fused program (DeferAndFuse) per bucket (docs/eager_shapes.md); `exact`: per size",
             choices=("pow2", "exact")),
    Variable("TORCH_TPU_TIER2_COMPILATION_CACHE", "text", None,
             "tier-2 (host-shared memory) compile cache: a name under /dev/shm, or `disabled`; "
             "unset: `torchtpu-<uid>`"),
    Variable("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "text", None,
             "tier-3 (persistent) compile cache: a directory or fsspec URL, or `disabled`; unset: off"),
    Variable("TORCH_TPU_TIER2_CACHE_MAX_MB", "int", 1024,
             "tier-2 size bound in MiB (least recently used entries go first); 0: no bound", minimum=0),
    Variable("TORCH_TPU_TIER3_CACHE_MAX_MB", "int", 0,
             "tier-3 size bound in MiB for a local directory (least recently used go first); 0: no bound",
             minimum=0),
    Variable("TORCH_TPU_COMPILE_CACHE_PLUGIN_ID", "choice", "stat",
             "how cache keys name the plugin: `stat` (size and mtime of its file) or `content` (sha256)",
             choices=("stat", "content")),
    Variable("TORCH_TPU_EAGER_COMPILE_EFFORT", "choice", None,
             "XLA's effort on one op's program (Strict's eager ops): `fast` asks for "
             "exec_time_optimization_effort -1, `o0`/`o1` for optimization level O0/O1, trading run time for "
             "compile time where the backend reads them; unset: `fast` on a TPU (a v5e compiled small programs "
             "33-53% faster at the same run time: `tools/tpu_suite/probe_compile_effort.py`), `default` elsewhere",
             choices=("default", "fast", "o0", "o1")),
    Variable("TORCH_TPU_ACCURATE_TRANSCENDENTALS", "flag", None,
             "ask the compiler for accurate float32 exp, log, tanh, logistic... (`result_accuracy` HIGHEST); "
             "unset: on a TPU, whose default forms are fast approximations (docs/tpu.md), not elsewhere; "
             "off on a TPU trades that accuracy for speed"),
    Variable("TORCH_TPU_FLASH_ATTENTION", "flag", None,
             "F.scaled_dot_product_attention through a Pallas flash-attention kernel where the shapes qualify "
             "(needs JAX); unset: on a TPU, not on the CPU emulator (where it runs in Pallas' slow interpret "
             "mode); `torch.nn.attention.sdpa_kernel(SDPBackend.MATH)` turns it off locally"),
    Variable("TORCH_TPU_FLASH_LANES", "flag", True,
             "flash attention on the model's [B, T, H * D] layout (flash_attention_lanes.py) where q, k and v are "
             "[B, T, H, D] tensors seen as [B, H, T, D] (a transformer's usual transpose), with no mask and a head "
             "dim of 64 or 128: no layout copies around the kernel (on the v5e the bf16 100M GPT step 60.6 ms against 76.6 with "
             "the head-major kernel); off: the head-major kernel for every qualifying call"),
    Variable("TORCH_TPU_PROFILER_PLUGIN_TIMELINE", "flag", True,
             "torch.profiler's device rows from the plugin's own device timeline (its PJRT profiler "
             "extension: libtpu's), where it has one; off, or where it has none (the CPU plugin): from each "
             "launch's completion event, as seen by the host"),
    Variable("TORCH_TPU_LOWER_FOR", "choice", None,
             "build programs for this platform instead of the plugin's (`tpu`: a TPU's programs on the CPU "
             "plugin, for tests)", choices=("cpu", "tpu", "cuda")),
    Variable("TORCH_TPU_PAD_UPLOADS", "flag", False,
             "tests: every host-to-device upload of a tensor of rank >= 1 lands in a buffer longer than its "
             "storage (garbage rows after it, as eager shape buckets would make: docs/eager_shapes.md), to "
             "check that every program reads only its storage"),
    Variable("TORCH_TPU_BF16_DOTS", "flag", None,
             "CPU emulator: bf16 products as bf16 dots (unset: where the CPU has AVX512-BF16)"),
)
VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLES}

_warned: set[tuple[str, str]] = set()


def _bad(name: str, raw: str, why: str, default: object) -> None:
    if (name, raw) not in _warned:
        _warned.add((name, raw))
        used = "unset (automatic)" if default is None else repr(default)
        warnings.warn(f"torchtpu: {name}={raw!r} {why}; using the default, {used}", RuntimeWarning,
                      stacklevel=3)


def raw(name: str) -> tuple[str, str] | None:
    """(the name it was found under, its stripped text), or None when unset or empty."""
    var = VARIABLES[name]
    for key in (var.name, *var.aliases):
        value = os.environ.get(key)
        if value is not None and value.strip():
            return key, value.strip()
    return None


def read(name: str) -> bool | int | str | None:
    """The variable's value now: parsed, or its default when unset, empty or malformed."""
    var = VARIABLES[name]
    found = raw(name)
    if found is None:
        return var.default
    key, text = found
    if var.kind == "flag":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        _bad(key, text, f"is not a flag ({'/'.join(_TRUE)} or {'/'.join(_FALSE)})", var.default)
        return var.default
    if var.kind == "int":
        try:
            value = int(text)
        except ValueError:
            _bad(key, text, "is not an integer", var.default)
            return var.default
        if (var.minimum is not None and value < var.minimum) or (var.maximum is not None and value > var.maximum):
            _bad(key, text, f"is outside {_bounds(var)}", var.default)
            return var.default
        return value
    if var.kind == "choice":
        if text.lower() in var.choices:
            return text.lower()
        _bad(key, text, f"is not one of {', '.join(var.choices)}", var.default)
        return var.default
    return text


def warn_invalid(name: str, text: str, why: str) -> None:
    """For a text variable whose user checks it (e.g. bucket sizes): one warning, default used."""
    _bad(name, text, why, VARIABLES[name].default)


def _bounds(var: Variable) -> str:
    """An integer variable's range as ``lo..hi`` (an open end left empty)."""
    lo = "" if var.minimum is None else var.minimum
    hi = "" if var.maximum is None else var.maximum
    return f"{lo}..{hi}"


def markdown_table() -> str:
    rows = ["| variable | kind | default | meaning |", "|---|---|---|---|"]
    for v in _VARIABLES:
        kind = v.kind if not v.choices else f"one of {', '.join(f'`{c}`' for c in v.choices)}"
        if v.kind == "int" and (v.minimum is not None or v.maximum is not None):
            kind += f" ({_bounds(v)})"
        default = "unset" if v.default is None else f"`{v.default}`"
        name = f"`{v.name}`" + "".join(f" (also `{a}`)" for a in v.aliases)
        rows.append(f"| {name} | {kind} | {default} | {v.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m torchtpu.runtime.env: the table of docs/environment.md
    print(markdown_table(), end="")
