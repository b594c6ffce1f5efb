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

    @property
    def fp32_precision(self) -> str:
        """The precision of float32 matrix products and convolutions on tpu, in PyTorch's
        per-backend terms: "ieee" (``highest``, 6 bf16 passes), "tf32" (``high``, 3 passes,
        the TPU's analogue of TF32), "bf16" (``medium``, 1 pass, the default)."""
        from .engine import precision

        return {v: k for k, v in precision.FP32_PRECISION.items()}[precision.get_global()]

    @fp32_precision.setter
    def fp32_precision(self, value: str) -> None:
        from .engine import precision

        if value not in (*precision.FP32_PRECISION, "none"):
            raise ValueError(f"fp32_precision must be one of {(*precision.FP32_PRECISION, 'none')}, got {value!r}")
        precision.set_fp32_precision(value)


backend = TpuBackendModule()
