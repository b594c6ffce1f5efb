"""``torch.autocast("tpu")``: per-op casts on the AutocastPrivateUse1 key.

Matrix-unit ops run in the autocast dtype; numerically sensitive ops run in
float32 (PyTorch's CUDA policy); everything else falls through.
"""

from __future__ import annotations

from typing import Any

import torch

_LOWER_PRECISION = ["mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d",
                    "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                    "addmv", "mv", "dot", "einsum", "prelu", "scaled_dot_product_attention", "chain_matmul",
                    "multi_dot", "_scaled_dot_product_attention_math"]
_FP32 = ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
         "sinh", "tan", "pow", "softplus", "layer_norm", "group_norm", "norm", "nll_loss", "cross_entropy_loss",
         "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits", "kl_div", "cosine_similarity",
         "cumsum", "cumprod", "prod", "sum", "softmax", "log_softmax", "dist", "pdist", "cdist", "renorm",
         "logsumexp", "native_layer_norm", "rms_norm"]
_libs: list[torch.library.Library] = []
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == "tpu" and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _make(op: torch._ops.OpOverload, fp32: bool):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.float32 if fp32 else torch.get_autocast_dtype("tpu")
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast(list(args), dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def register() -> None:
    # PyTorch defaults a new device's autocast dtype to float16 (CUDA's); TPU matrix units take
    # bfloat16, so a bare torch.autocast("tpu") casts to that.
    torch.set_autocast_dtype("tpu", torch.bfloat16)
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    _libs.extend([fb, lib])
    for names, fp32 in ((_LOWER_PRECISION, False), (_FP32, True)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                    continue
                qual = name + ("." + overload if overload != "default" else "")
                lib.impl(qual, _make(op, fp32), "AutocastPrivateUse1")
