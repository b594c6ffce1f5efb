"""The process's PJRT client, created lazily on first device use.

``import torch`` must stay cheap in every process (DataLoader workers too), so
nothing here runs at import: the plugin is loaded by ``torch.tpu._lazy_init``.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from . import _C, runtime
from ._config import config
from .runtime import cpu_kernels, env, host_memory, host_threads

_log = logging.getLogger("torchtpu")
_lock = threading.Lock()
_client: runtime.Client | None = None
_plugin_path: str | None = None


def client() -> runtime.Client:
    global _client, _plugin_path
    c = _client
    if c is not None:
        return c
    with _lock:
        if _client is None:
            # XLA's INFO lines (device counts, ...) are noise for PyTorch users.
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
            _plugin_path = runtime.resolve_plugin_path(config.plugin)
            plugin = runtime.load_plugin(_plugin_path)  # shared with runtime-level users
            kind = _plugin_kind(_plugin_path)
            if kind == "cpu":  # the CPU-emulated device's decompositions run PyTorch's own LAPACK
                cpu_kernels.set_lapack(_torch_lapack_library())
            options = runtime.default_client_options(kind, config.num_devices)
            _client = runtime.Client(plugin, options)
            if _client.platform_name == "cpu":
                if config.host_memory_pool:  # device memory is malloc memory
                    host_memory.pool_freed_memory()
                host_threads.lower_pool_priority(config.xla_thread_nice)  # 0: left as they are
            for index in range(len(_client.devices)):  # before any tpu storage can be made
                set_memory_fraction(index, 1.0)
            _log.info("torchtpu: the tpu device is %s (PJRT plugin %s, %s %s)", _device_name(kind, _client),
                      _plugin_path, _client.platform_name, _client.platform_version)
        return _client


_memory_fractions: dict[int, float] = {}


def device_memory_total(index: int) -> int:
    """A device's memory size: the chip's, as its plugin reports it (a TPU); on the CPU emulator
    the emulated HBM (TORCH_TPU_EMULATED_HBM_GIB, 16 GiB like a v5e); else the host's memory."""
    c = client()
    stats = c.memory_stats(index)
    if stats is not None and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    if c.platform_name == "cpu":
        return int(env.read("TORCH_TPU_EMULATED_HBM_GIB")) << 30
    return host_memory.available_and_total()[1]


def set_memory_fraction(index: int, fraction: float) -> None:
    """Live tpu storages of device ``index`` may hold ``fraction`` of its memory; more raises
    torch.OutOfMemoryError at the allocation, as CUDA's allocator does."""
    _memory_fractions[index] = fraction
    _C._set_memory_limit(index, int(device_memory_total(index) * fraction))


def memory_fraction(index: int) -> float:
    return _memory_fractions.get(index, 1.0)


def _device_name(kind: str, c: runtime.Client, index: int = 0) -> str:
    if kind == "cpu":
        return "TPU (emulated on XLA CPU: bf16 matrix units with f32 accumulation)"
    if kind == "cuda":
        return "TPU (emulated on an NVIDIA GPU through the XLA CUDA plugin)"
    return c.devices[index].kind


def device_name(index: int = 0) -> str:
    """What the tpu device is: a TPU's own kind ("TPU v5 lite"), or which emulator."""
    return _device_name(plugin_kind(), client(), index)


def _torch_lapack_library() -> str:
    """The library of PyTorch's CPU kernels, which carries the LAPACK its CPU linalg ops call."""
    return os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")


def _plugin_kind(path: str) -> str:
    if "libtpu" in path:
        return "tpu"
    if "cuda" in path:
        return "cuda"
    return "cpu"


def is_initialized() -> bool:
    return _client is not None


def plugin_kind() -> str:
    client()
    return _plugin_kind(_plugin_path or "")
