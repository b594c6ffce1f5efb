"""Printing tpu tensors formats a host copy.

PyTorch's formatter runs many small ops (and a data-dependent masked_select)
on the tensor; it copies xla/lazy tensors to the CPU first, which is the right
call here too, but its list of such devices is closed, so we wrap the
data-formatting helper. The device suffix is still produced by PyTorch.
"""

from __future__ import annotations

import torch
import torch._tensor_str as tensor_str


def install() -> None:
    original = tensor_str._tensor_str
    if getattr(original, "_torchtpu", False):
        return

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == "tpu":
            self = self.cpu()
        return original(self, indent)

    _tensor_str._torchtpu = True  # type: ignore[attr-defined]
    tensor_str._tensor_str = _tensor_str
