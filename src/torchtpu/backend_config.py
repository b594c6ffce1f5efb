"""``torch.backends.tpu``: switches that change how the tpu backend compiles programs.

``allow_excess_precision`` (default False, as TorchTPU's switch of the same name): whether
XLA may keep values in a wider type than the program asks for, dropping a round trip such
as f32 -> bf16 -> f32. PyTorch rounds at every cast and every low-precision op, so by
default torchtpu does not let the compiler skip them (a TPU's compiler otherwise does:
``x.bfloat16().float()`` inside one fused program came back unrounded). Changing it
recompiles what runs next.
"""

from __future__ import annotations

import types


class TpuBackendModule(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("torch.backends.tpu", __doc__)
        self._allow_excess_precision = False

    @property
    def allow_excess_precision(self) -> bool:
        return self._allow_excess_precision

    @allow_excess_precision.setter
    def allow_excess_precision(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"allow_excess_precision must be a bool, got {type(value).__name__}")
        self._allow_excess_precision = value


backend = TpuBackendModule()
