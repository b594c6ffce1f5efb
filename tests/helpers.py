"""Shared test helpers (imported by name: conftest modules cannot be imported twice)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def assert_matches(tpu_value, cpu_value, rtol=1e-5, atol=1e-6):
    """Compare a tpu result with the CPU one: values, dtype, shape and device."""
    if isinstance(cpu_value, (tuple, list)):
        assert len(tpu_value) == len(cpu_value)
        for a, b in zip(tpu_value, cpu_value):
            assert_matches(a, b, rtol, atol)
        return
    if not isinstance(cpu_value, torch.Tensor):
        assert tpu_value == pytest.approx(cpu_value, rel=rtol, abs=atol)
        return
    assert tpu_value.device.type == "tpu", tpu_value.device
    assert tpu_value.dtype == cpu_value.dtype
    assert tpu_value.shape == cpu_value.shape
    torch.testing.assert_close(tpu_value.cpu(), cpu_value, rtol=rtol, atol=atol, equal_nan=True)


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (autoload, env-var modes, crash checks).

    A test that calls this carries ``@pytest.mark.fresh_process``: on a TPU host such tests run
    before the test process opens the chip, which a child could not open after it."""
    from torchtpu import _device_state
    from torchtpu.runtime import plugins

    if plugins.selected_kind() != "cpu" and _device_state.is_initialized():
        raise RuntimeError("the test process holds the TPU chip, so a child process cannot open it: "
                           "mark the test fresh_process (those run before the chip is opened)")
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True,
                          text=True, env=e, timeout=300)


def device_count_without_opening() -> int:
    """Devices the suite's plugin offers, counted without opening a TPU (the chip would then be
    held by the test process); the CPU emulator makes as many as asked."""
    from torchtpu.runtime import plugins

    return 1 << 16 if plugins.selected_kind() == "cpu" else plugins.tpu_chip_count()


def needs_devices(n: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(device_count_without_opening() < n, reason=f"needs {n} devices; this host has fewer")


def on_tpu() -> bool:
    """Whether the suite runs on a real TPU (``make test-tpu``) rather than the CPU emulator."""
    from torchtpu import _device_state

    return _device_state.plugin_kind() == "tpu"


# float64 on a TPU is XLA's emulation with float32 pairs; docs/tpu.md has the measured bounds
# (transfers 1.8e-15, arithmetic up to 1.3e-14 relative on a v5e). Exact on the emulator.
TPU_FLOAT64_RTOL = 2e-14


# libtpu's own float32 erf (chlo.erf, which takes no accuracy setting) was 2.98e-7 off CPU's on
# [-8, 8] on a v5e (5 ulp just below 1); the emulator's is within 2.5e-7. docs/tpu.md.
TPU_ERF_ATOL = 3.2e-7


# XLA:TPU's own float32 tanh (stablehlo.tanh, which a JAX kernel's jnp.tanh lowers to; torchtpu's
# tanh lowering does not use it) was 2.8e-5 off CPU's, 1.0e-4 in a gradient through it, on a v5e
# (2026-12-04, sixth TPU round). The emulator's is within float32's default tolerance.
def xla_tanh_tolerance() -> dict[str, float]:
    return {"rtol": 2e-4, "atol": 2e-4} if on_tpu() else {}


def float64_rtol(dtype: torch.dtype) -> float:
    """The relative tolerance of a result that must equal the CPU's bit for bit on the emulator."""
    return TPU_FLOAT64_RTOL if on_tpu() and dtype in (torch.float64, torch.complex128) else 0.0


def count_launches(monkeypatch) -> list[int]:
    """A counter of program launches from now on (``[n]``; set it to 0 to restart it)."""
    from torchtpu.runtime import executable

    count = [0]
    execute = executable.Executable.execute

    def counting(self, *args, **kwargs):
        count[0] += 1
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(executable.Executable, "execute", counting)
    return count
