"""Environment-driven settings, read once at import and changeable from code."""

from __future__ import annotations

from .runtime import env


class Config:
    """Process-wide switches. Names mirror TorchTPU's public environment variables (runtime/env.py
    has them all: a malformed value warns and leaves the default)."""

    def __init__(self) -> None:
        # Debug eager: every op completes before returning, plus host-side checks.
        # TorchTPU's pre-release source used TPU_LAUNCH_BLOCKING; env accepts both.
        self.launch_blocking = bool(env.read("TORCH_TPU_LAUNCH_BLOCKING"))
        # DeferAndFuse eager: record ops, run them fused at materialization points.
        self.defer_and_fuse = bool(env.read("TORCH_TPU_DEFER_AND_FUSE"))
        self.cpu_fallback = bool(env.read("TORCH_TPU_CPU_FALLBACK"))
        self.check_nan = bool(env.read("TORCH_TPU_CHECK_NAN"))
        self.num_devices = int(env.read("TORCH_TPU_NUM_DEVICES"))
        self.plugin = env.read("TORCH_TPU_PJRT_PLUGIN")
        # CPU plugin: keep freed host (= device) memory pooled (runtime.host_memory); on by default.
        self.host_memory_pool = bool(env.read("TORCH_TPU_HOST_MEMORY_POOL"))
        # CPU plugin: nice value for XLA's compute threads (runtime.host_threads); 0 leaves them be.
        self.xla_thread_nice = int(env.read("TORCH_TPU_XLA_THREAD_NICE"))
        # Host-side bounds checks run in Debug mode unless explicitly set.
        self.debug_checks_override = env.read("TORCH_TPU_DEBUG_CHECKS")
        # Outside Debug mode, indexing ops' bounds are checked on the device and reported at the
        # next synchronization (engine/index_checks.py); TORCH_TPU_INDEX_CHECKS=0 skips that.
        self.index_checks = bool(env.read("TORCH_TPU_INDEX_CHECKS"))

    @property
    def debug_checks(self) -> bool:
        if self.debug_checks_override is not None:
            return self.debug_checks_override
        return self.launch_blocking


config = Config()
