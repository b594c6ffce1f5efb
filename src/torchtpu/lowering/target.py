"""The compiler the lowered programs go to.

A few lowerings shape their output around XLA's CPU backend (the CPU-emulated
``tpu``): its emitters are fast for some equivalent forms of an op and slow for
others, where a TPU compiler would not care.
"""

from __future__ import annotations

import os

from ..runtime import host_cpu

_XLA_CPU: list[bool] = []


def xla_cpu() -> bool:
    """Whether programs run on XLA's CPU backend."""
    if not _XLA_CPU:
        from .. import _device_state

        _XLA_CPU.append(_device_state.plugin_kind() == "cpu")
    return _XLA_CPU[0]


BF16_DOTS_ENV = "TORCH_TPU_BF16_DOTS"
_BF16_DOTS: list[bool] = []
# Host CPU flags (/proc/cpuinfo) of instructions that multiply bf16 pairs natively.
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def bf16_dots() -> bool:
    """Whether matrix products take their bf16-rounded operands as bf16, or widened to f32.

    Both compute the same numbers: a product of two bf16 values is exact in f32, and
    both accumulate in f32. On a TPU the matrix unit takes bf16. XLA:CPU hands a bf16
    dot to YNNPACK, whose kernels on a CPU without bf16 multiply instructions (x86
    without AVX512_BF16 or AMX, arm64 without BF16) widen every pair of values in the
    inner loop: there an f32 dot of the already rounded values runs 1.2-1.9x faster
    (512x128x384 products and their weight gradients, measured on an AVX2 EPYC).
    ``TORCH_TPU_BF16_DOTS=1`` or ``0`` overrides the choice.
    """
    if not _BF16_DOTS:
        forced = os.environ.get(BF16_DOTS_ENV, "").strip().lower()
        if forced in ("1", "true", "on", "yes"):
            _BF16_DOTS.append(True)
        elif forced in ("0", "false", "off", "no"):
            _BF16_DOTS.append(False)
        else:
            _BF16_DOTS.append(not xla_cpu() or _host_multiplies_bf16())
    return _BF16_DOTS[0]


def _host_multiplies_bf16() -> bool:
    flags = host_cpu.cpu_flags()
    if not flags:
        return True  # unknown: keep the TPU's operand type
    return any(flag in flags for flag in _NATIVE_BF16_FLAGS)
