"""The compiler the lowered programs go to.

A few lowerings shape their output around XLA's CPU backend (the CPU-emulated
``tpu``): its emitters are fast for some equivalent forms of an op and slow for
others, where a TPU compiler would not care.
"""

from __future__ import annotations

_XLA_CPU: list[bool] = []


def xla_cpu() -> bool:
    """Whether programs run on XLA's CPU backend."""
    if not _XLA_CPU:
        from .. import _device_state

        _XLA_CPU.append(_device_state.plugin_kind() == "cpu")
    return _XLA_CPU[0]
