"""Environment-driven settings, read once at import and changeable from code."""

from __future__ import annotations

import os


def _flag(*names: str) -> bool:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            return value.strip().lower() not in ("", "0", "false", "no", "off")
    return False


class Config:
    """Process-wide switches. Names mirror TorchTPU's public environment variables."""

    def __init__(self) -> None:
        # Debug eager: every op completes before returning, plus host-side checks.
        # TorchTPU's pre-release source used TPU_LAUNCH_BLOCKING; accept both.
        self.launch_blocking = _flag("TORCH_TPU_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING")
        # DeferAndFuse eager: record ops, run them fused at materialization points.
        self.defer_and_fuse = _flag("TORCH_TPU_DEFER_AND_FUSE", "TPU_DEFER_AND_FUSE")
        self.cpu_fallback = _flag("TORCH_TPU_CPU_FALLBACK")
        self.check_nan = _flag("TORCH_TPU_CHECK_NAN")
        self.num_devices = int(os.environ.get("TORCH_TPU_NUM_DEVICES", "1"))
        self.plugin = os.environ.get("TORCH_TPU_PJRT_PLUGIN") or None
        # CPU plugin: keep freed host (= device) memory pooled (runtime.host_memory); on by default.
        self.host_memory_pool = os.environ.get("TORCH_TPU_HOST_MEMORY_POOL") is None or _flag(
            "TORCH_TPU_HOST_MEMORY_POOL")
        # CPU plugin: nice value for XLA's compute threads (runtime.host_threads); 0 leaves them be.
        self.xla_thread_nice = int(os.environ.get("TORCH_TPU_XLA_THREAD_NICE", "0") or 0)
        # Host-side bounds checks run in Debug mode unless explicitly disabled.
        checks = os.environ.get("TORCH_TPU_DEBUG_CHECKS")
        self.debug_checks_override = None if checks is None else _flag("TORCH_TPU_DEBUG_CHECKS")
        # Outside Debug mode, indexing ops' bounds are checked on the device and reported at the
        # next synchronization (engine/index_checks.py); TORCH_TPU_INDEX_CHECKS=0 skips that.
        self.index_checks = os.environ.get("TORCH_TPU_INDEX_CHECKS") is None or _flag("TORCH_TPU_INDEX_CHECKS")

    @property
    def debug_checks(self) -> bool:
        if self.debug_checks_override is not None:
            return self.debug_checks_override
        return self.launch_blocking


config = Config()
