"""``torch.tpu``: the device module, mirroring ``torch.cuda``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from . import _C, _device_state, amp, step_recording, sync_debug  # noqa: F401  (amp: torch.tpu.amp)
from ._config import config
from .engine import deferred, executor
from .engine import precision as _precision
from .engine.precision import precision  # noqa: F401  (public: torch.tpu.precision)
from .graphs import (  # noqa: F401
    TPUGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from .packed_state import pack_optimizer_state, pack_parameters  # noqa: F401
from .runtime import PjrtError, host_memory
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream  # noqa: F401


class DeviceOutOfMemoryError(torch.OutOfMemoryError, PjrtError):
    """A device allocation failed (PJRT's RESOURCE_EXHAUSTED): caught by ``except
    torch.OutOfMemoryError`` as CUDA's out-of-memory error is (batch-size finders rely on it).
    (PyTorch sets ``torch.tpu.OutOfMemoryError`` to ``torch.OutOfMemoryError`` itself.)"""

    def __init__(self, code: int, message: str) -> None:
        PjrtError.__init__(self, code, message)
        self.args = (f"tpu out of memory. {message}",)


class DeviceError(torch.AcceleratorError, PjrtError):
    """The device failed running launched work (PJRT's INTERNAL, ABORTED, UNAVAILABLE or
    DATA_LOSS): caught by ``except torch.AcceleratorError`` as a CUDA kernel's failure is
    (``torch.tpu.AcceleratorError`` is ``torch.AcceleratorError`` itself), and a RuntimeError."""

    def __init__(self, code: int, message: str) -> None:
        PjrtError.__init__(self, code, message)
        self.args = (f"tpu device error: {message}",)


class StreamContext:
    """``torch.cuda.StreamContext``: makes ``stream`` current within a ``with`` block. A tpu
    device has one stream (PJRT orders each device's work), so every stream is that one."""

    def __init__(self, selected: Stream | None) -> None:
        self.stream = selected

    def __enter__(self) -> Stream | None:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None


def _lazy_init() -> None:
    """Called by PyTorch on first device use: create the PJRT client."""
    _device_state.client()


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _device_state.is_initialized()


def __getattr__(name: str) -> Any:
    # ``torch.cuda._initialized`` is a plain flag that PyTorch code reads directly: activation
    # checkpointing saves and restores the device RNG state only where it is true, so without
    # it a recomputed dropout drew a different mask than the forward did.
    if name == "_initialized":
        return _device_state.is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device: int | str | torch.device) -> None:
    _C._set_current_device(_index(device))


def _index(device: int | str | torch.device | None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"expected a tpu device, got {d}")
    return d.index if d.index is not None else current_device()


class device:
    """Context manager that changes the current tpu device."""

    def __init__(self, device: int | str | torch.device | None) -> None:
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev = current_device()
            set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            set_device(self.prev)


class device_of(device):
    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device if obj.device.type == "tpu" else None)


def synchronize(device: int | str | torch.device | None = None) -> None:
    """Wait for all launched work (device errors surface here)."""
    executor.synchronize(None if device is None else _index(device))


def get_precision() -> str:
    """The precision of float32 matrix products and convolutions in force on this thread:
    "medium" (1 bf16 pass, the TPU default), "high" (3) or "highest" (6, float32-accurate),
    from ``torch.tpu.precision``, ``torch.set_float32_matmul_precision``,
    ``torch.backends.fp32_precision`` or ``torch.backends.tpu.fp32_precision``."""
    return _precision.current()


def get_device_name(device: int | str | torch.device | None = None) -> str:
    return _device_state.device_name(_index(device))


def get_device_properties(device: int | str | torch.device | None = None) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(name=get_device_name(device), type="tpu", index=_index(device),
                           total_memory=mem_get_info(device)[1])


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True  # the matrix units' own format


def is_tf32_supported() -> bool:
    """``torch.backends.fp32_precision = "tf32"`` selects the matrix unit's 3-pass bf16 mode."""
    return True


def can_device_access_peer(device: int | str | torch.device, peer_device: int | str | torch.device) -> bool:
    """Whether ``device`` can read ``peer_device``'s memory directly. Only its own: torchtpu copies
    a tensor between two devices through the host (``_kernels.copy_from``), not device to device."""
    count = device_count()
    indices = []
    for name, d in (("device", device), ("peer", peer_device)):
        index = _index(d)
        if not 0 <= index < count:
            raise RuntimeError(f"Invalid {name} id {index}: this process has {count} tpu device(s)")
        indices.append(index)
    return indices[0] == indices[1]


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Warn (1, "warn") or raise (2, "error") at each operation that makes the host wait for the
    device (a device-to-host read: ``.cpu()``, ``.item()``, ``nonzero``...); 0, "default": neither."""
    sync_debug.set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    return sync_debug.get_sync_debug_mode()


def get_device_capability(device: int | str | torch.device | None = None) -> tuple[int, int]:
    """The TPU generation as ``(major, minor)``, in the place of CUDA's compute capability: (5, 0)
    on a v5e ("TPU v5 lite") or v5p; (0, 0) on the CPU emulator, which is no chip."""
    match = re.search(r"\bv(\d+)", get_device_name(device))
    return (int(match.group(1)), 0) if match else (0, 0)


def init() -> None:
    """Initialize the device now (it is otherwise initialized on first use)."""
    _lazy_init()


OutOfMemoryError = torch.OutOfMemoryError
AcceleratorError = torch.AcceleratorError


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


# -- RNG ---------------------------------------------------------------------
def _generator(device: int | str | torch.device | None = None) -> torch.Generator:
    return _C._default_generator(_index(device))


class _DefaultGenerators:
    def __getitem__(self, i: int) -> torch.Generator:
        return _C._default_generator(i)

    def __len__(self) -> int:
        return device_count()

    def __iter__(self) -> Iterator[torch.Generator]:
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _C._default_generator(i).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for g in default_generators:
        g.seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: int | str | torch.device = "tpu") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "tpu") -> None:
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for g, s in zip(default_generators, new_states):
        g.set_state(s)


# -- memory ------------------------------------------------------------------
def memory_allocated(device: int | str | torch.device | None = None) -> int:
    """Bytes held by live tpu storages on ``device``."""
    return _C._memory_stats(_index(device))["allocated_bytes"]


def max_memory_allocated(device: int | str | torch.device | None = None) -> int:
    return _C._memory_stats(_index(device))["peak_bytes"]


def reset_peak_memory_stats(device: int | str | torch.device | None = None) -> None:
    _C._reset_peak_memory(_index(device))


def memory_stats(device: int | str | torch.device | None = None) -> dict[str, int]:
    from .engine import compile_cache

    index = _index(device)
    s = _C._memory_stats(index)
    held, held_peak = _held_bytes(index)
    return {"allocated_bytes.all.current": s["allocated_bytes"], "allocated_bytes.all.peak": s["peak_bytes"],
            "reserved_bytes.all.current": max(s["allocated_bytes"], held),
            "reserved_bytes.all.peak": max(s["peak_bytes"], held_peak),
            "allocation.all.current": s["allocations"], "allocation.all.allocated": s["total_allocations"],
            "allocation.all.freed": s["total_frees"],
            # torchtpu's own: a program's intermediates are its scratch, not tensors (see memory_reserved)
            "temp_bytes.largest_program": compile_cache.largest_temp_bytes()}


def memory_reserved(device: int | str | torch.device | None = None) -> int:
    """Bytes the device holds for this process, at least :func:`memory_allocated`: every live
    device buffer (tensor storages, and what the engine keeps beside them: scalar operands,
    outputs awaiting donation, DeferAndFuse holders). PJRT owns device memory, so this is its
    allocator's view where it reports one (a TPU: bytes in use on the chip), else the buffers this
    process holds; with several devices on a plugin without a report, the storages alone (the
    process's buffers are not counted per device)."""
    index = _index(device)
    return max(memory_allocated(index), _held_bytes(index)[0])


def max_memory_reserved(device: int | str | torch.device | None = None) -> int:
    index = _index(device)
    return max(max_memory_allocated(index), _held_bytes(index)[1])


def _held_bytes(index: int) -> tuple[int, int]:
    """(current, peak) bytes the device holds for this process, 0 where unknown (see memory_reserved)."""
    stats = _device_state.client().memory_stats(index)
    if stats is not None and "bytes_in_use" in stats:
        return stats["bytes_in_use"], stats.get("peak_bytes_in_use", stats["bytes_in_use"])
    if device_count() == 1:
        return device_memory_in_use()
    return 0, 0


def reset_max_memory_allocated(device: int | str | torch.device | None = None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: int | str | torch.device | None = None) -> None:
    """Zero the allocation and free counts (``allocation.all.allocated`` / ``freed``)."""
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


# torch.cuda's older names for the reserved-memory queries, still called by training scripts
def memory_cached(device: int | str | torch.device | None = None) -> int:
    return memory_reserved(device)


def max_memory_cached(device: int | str | torch.device | None = None) -> int:
    return max_memory_reserved(device)


def reset_max_memory_cached(device: int | str | torch.device | None = None) -> None:
    reset_peak_memory_stats(device)


def memory_stats_as_nested_dict(device: int | str | torch.device | None = None) -> dict[str, Any]:
    """:func:`memory_stats` with its dotted keys as nested dictionaries."""
    return _nested(memory_stats(device))


def _nested(flat: dict[str, int]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        level = nested
        for part in path:
            level = level.setdefault(part, {})
        level[last] = value
    return nested


def host_memory_stats() -> dict[str, int]:
    """Pinned host memory (``pin_memory()``): allocations and bytes, current/peak/allocated/freed."""
    return dict(_C._host_memory_stats())


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    return _nested(host_memory_stats())


def reset_peak_host_memory_stats() -> None:
    _C._reset_host_memory_stats(True)


def reset_accumulated_host_memory_stats() -> None:
    _C._reset_host_memory_stats(False)


def device_memory_used(device: int | str | torch.device | None = None) -> int:
    """Bytes of the device's memory in use: what the plugin's allocator reports on a TPU (every
    process's); on the CPU emulator what this process's live tpu storages hold of its HBM."""
    free, total = mem_get_info(device)
    return total - free


def mem_get_info(device: int | str | torch.device | None = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory: from the plugin's allocator where it reports a
    limit (TPU, GPU); on the CPU emulator its emulated HBM (``TORCH_TPU_EMULATED_HBM_GIB``, 16 GiB
    like a v5e) less what live tpu storages hold."""
    index = _index(device)
    stats = _device_state.client().memory_stats(index)
    if stats is not None and "bytes_limit" in stats:
        return stats["bytes_limit"] - stats["bytes_in_use"], stats["bytes_limit"]
    total = _device_state.device_memory_total(index)
    return max(0, total - memory_allocated(index)), total


def set_per_process_memory_fraction(fraction: float, device: int | str | torch.device | None = None) -> None:
    """Let live tpu tensors of this process hold at most ``fraction`` of the device's memory;
    an allocation beyond raises torch.OutOfMemoryError, as on CUDA."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _lazy_init()
    _device_state.set_memory_fraction(_index(device), fraction)


def get_per_process_memory_fraction(device: int | str | torch.device | None = None) -> float:
    _lazy_init()
    return _device_state.memory_fraction(_index(device))


def memory_summary(device: int | str | torch.device | None = None, abbreviated: bool = False) -> str:
    """A short report of the memory counters (``torch.cuda.memory_summary``'s role)."""
    index = _index(device)
    stats = memory_stats(index)
    buffers, peak_buffers = device_memory_in_use()
    free, total = mem_get_info(index)
    rows = [("tpu storages, current", stats["allocated_bytes.all.current"]),
            ("tpu storages, peak", stats["allocated_bytes.all.peak"]),
            ("device buffers (all devices), current", buffers),
            ("device buffers (all devices), peak", peak_buffers),
            ("device memory free", free), ("device memory total", total)]
    lines = [f"torch.tpu memory summary, device {index}"]
    lines += [f"  {name:<40} {value / 2**20:12.2f} MiB" for name, value in rows]
    lines.append(f"  {'live storages':<40} {stats['allocation.all.current']:12d}")
    return "\n".join(lines)


def device_memory_in_use() -> tuple[int, int]:
    """(current, peak) bytes of PJRT buffers this process holds on its devices.

    Unlike memory_allocated (bytes of live tpu storages), this counts what is
    materialized: in DeferAndFuse mode dead intermediates never are.
    """
    from . import runtime

    return runtime.live_bytes()


def memory_snapshot() -> list[dict[str, Any]]:
    """The device buffers this process holds, one segment per buffer in ``torch.cuda.memory_snapshot``'s
    layout (device, sizes, one active block; PJRT does not expose addresses, so they are 0), plus
    each buffer's ``shape`` and ``dtype``: what is holding device memory, largest first."""
    from . import runtime

    segments = []
    for b in sorted(runtime.live_buffers(), key=lambda b: -b["nbytes"]):
        n = b["nbytes"]
        block = {"address": 0, "size": n, "requested_size": n, "state": "active_allocated", "frames": []}
        segments.append({"device": b["device"], "address": 0, "total_size": n, "allocated_size": n,
                         "active_size": n, "requested_size": n, "stream": 0,
                         "segment_type": "large" if n > 1 << 20 else "small", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": [], "blocks": [block],
                         "shape": list(b["shape"]), "dtype": b["dtype"]})
    return segments


def reset_peak_device_memory() -> None:
    from . import runtime

    runtime.reset_peak_bytes()


def empty_cache() -> None:
    """Free what is kept for reuse: device copies of Python scalars, the output of each device's
    latest launch (held for synchronize(), once it has run), and on the CPU plugin the pooled
    host memory of freed buffers. Live storages are never cached."""
    executor.wait_latest()
    executor.clear_scalar_buffers()
    host_memory.release_freed_memory()


# -- switches ----------------------------------------------------------------
def set_cpu_fallback(enabled: bool) -> None:
    """Opt in to running unsupported ops on the CPU (each warns once)."""
    config.cpu_fallback = bool(enabled)


def cpu_fallback_enabled() -> bool:
    return config.cpu_fallback


def set_dynamic_buckets(spec: str | Sequence[int]) -> None:
    """Padding of dynamic dimensions in ``torch.compile`` graphs: ``"pow2"`` (default: one
    executable per power-of-two size), ``"exact"`` (one per size), or ascending bucket sizes."""
    from .engine import bucketing

    bucketing.set_dynamic_buckets(spec)


def set_eager_buckets(mode: str) -> None:
    """Padding of eager calls on changing lengths: ``"pow2"`` (default: one program, or fused
    program, per power-of-two bucket of the first dim, docs/eager_shapes.md) or ``"exact"``
    (one per size)."""
    from .engine import eager_buckets

    eager_buckets.set_eager_buckets(mode)


@contextlib.contextmanager
def launch_blocking(enabled: bool = True) -> Iterator[None]:
    """Debug mode within a block: synchronous ops and host-side checks."""
    saved = config.launch_blocking
    config.launch_blocking = enabled
    try:
        yield
    finally:
        config.launch_blocking = saved


EAGER_MODES = ("strict", "debug", "defer_and_fuse")


def get_eager_mode() -> str:
    if config.launch_blocking:
        return "debug"
    return "defer_and_fuse" if config.defer_and_fuse and not step_recording.recording() else "strict"


def set_eager_mode(mode: str) -> None:
    """Switch eager mode: 'strict' (default), 'debug' (synchronous, checked) or 'defer_and_fuse'.

    Switching is a materialization point: recorded work runs first.
    """
    if mode not in EAGER_MODES:
        raise ValueError(f"eager mode must be one of {EAGER_MODES}, got {mode!r}")
    # imported at the top: an eager_mode() context left open until interpreter shutdown ends
    # here while imports no longer work
    deferred.flush()
    config.launch_blocking = mode == "debug"
    config.defer_and_fuse = mode == "defer_and_fuse"


@contextlib.contextmanager
def eager_mode(mode: str) -> Iterator[None]:
    saved = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(saved)


def defer_and_fuse() -> contextlib.AbstractContextManager[None]:
    """``with torch.tpu.defer_and_fuse():`` records ops and fuses them at reads."""
    return eager_mode("defer_and_fuse")


def distributed_info(group: Any = None) -> dict[str, Any]:
    """Which backend and transport carry ``group``'s collectives (default: the default group):
    ``{"available", "initialized", "backend", "transport", "world_size", "rank", "group_name"}``;
    a ``tpu_dist`` group's transport is ``"gloo-host-staged"`` (docs/distributed.md)."""
    from .distributed import distributed_info as info

    return info(group)


def compile_cache_stats() -> dict[str, float]:
    """Op-cache hits/misses (every mode) plus per-tier figures of the executable cache.

    ``hits``/``misses``: lookups of eager ops, fused graphs and compiled graphs
    (``graph_misses``: new program variants of ``torch.compile`` graphs);
    ``compiles``: XLA compilations actually run (0 when tier 2/3 supplied them);
    ``tierN_hits``/``tierN_misses``/``tierN_load_seconds``: the three cache tiers.
    """
    from .engine import compile_cache

    ours = executor.stats.as_dict()
    ours["lookup_seconds"] = ours.pop("compile_seconds")
    return {**ours, "entries": executor.cache_size(), **compile_cache.stats()}


def compile_log() -> list[dict[str, Any]]:
    """The process's most recent XLA compiles, oldest first (at most 256): ``what`` (an op with its
    argument layouts, a fused DeferAndFuse program, a compiled graph), ``seconds``, ``started``
    (``time.time()``), ``text_bytes`` and ``thread``; programs loaded from the compile cache are
    not compiles. Where a first step's time went: ``sorted(torch.tpu.compile_log(), key=lambda e:
    -e["seconds"])[:5]``. (Each compile is also logged at DEBUG on the ``torchtpu`` logger.)"""
    from .engine import compile_cache

    return compile_cache.compile_log()


def clear_compile_cache(tier: int | None = None) -> None:
    """Clear tier 1 (process memory), 2 (host-shared) or 3 (persistent); all tiers by default."""
    from .engine import compile_cache

    if tier in (None, 1):
        executor.cache_clear()
        deferred.cache_clear()
    compile_cache.clear(tier)
