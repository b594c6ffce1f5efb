"""``torch.tpu.amp``: what ``torch.cuda.amp`` offers, for the tpu device.

A script written for CUDA uses ``torch.cuda.amp.autocast()`` and
``torch.cuda.amp.GradScaler()``; renamed to ``torch.tpu.amp`` they work
unchanged. Each is PyTorch's device-generic class with the device fixed.
``autocast``'s default dtype is the device's autocast dtype (bfloat16, what
TPU matrix units take), not CUDA's float16.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


class autocast(torch.amp.autocast_mode.autocast):  # the name torch.cuda.amp uses
    def __init__(self, enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> None:
        super().__init__("tpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd: Any = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    """``torch.amp.custom_fwd`` for tpu autocast."""
    return torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=cast_inputs)


custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="tpu")
