"""Strided nested tensors on tpu: what ``nn.TransformerEncoder``'s fast path needs.

In eval mode without autograd, ``nn.TransformerEncoder`` given a ``src_key_padding_mask``
packs its input into a nested tensor (``_nested_tensor_from_mask``), runs each layer's
fused kernel on it and pads the result back (``to_padded_tensor``). PyTorch registers its
nested kernels for CPU and CUDA only; a nested tensor whose buffer lives on tpu dispatches
to ``NestedTensorPrivateUse1``. The kernels here read a nested tensor's components as
strided views of its buffer (``_C._nested_parts``) and compute with ordinary tpu ops; a
layer runs as the dense fused kernel on the padded batch with a key padding mask, which
gives every real token the same result.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _C
from .lowering.meta_checks import scalar_type_name

aten = torch.ops.aten
_libs: list[torch.library.Library] = []


def components(nt: torch.Tensor) -> list[torch.Tensor]:
    """The component tensors of a strided nested tensor, as views of its buffer."""
    buffer, sizes, strides, offsets = _C._nested_parts(nt)
    return [buffer.as_strided(size, stride, offset)
            for size, stride, offset in zip(sizes.tolist(), strides.tolist(), offsets.tolist())]


def from_components(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch._nested_tensor_from_tensor_list(list(parts))


def _check_padding_mask(t: torch.Tensor, mask: torch.Tensor) -> None:
    """CPU's argument errors for a (N, L) padding mask of an (N, L, D) input."""
    if mask.dtype != torch.bool:
        raise RuntimeError(f"Expected mask to be of ScalarType Bool, but got {scalar_type_name(mask.dtype)} instead.")
    if mask.dim() != 2:
        raise RuntimeError("Padding mask should be 2D")
    if t.dim() != 3:
        raise RuntimeError("Input should be a 3D tensor, N * L * D")
    if tuple(t.shape[:2]) != tuple(mask.shape):
        raise RuntimeError("Mask size should match input size")


def _lengths(mask: torch.Tensor) -> tuple[list[int], bool]:
    """Per row of a keep-mask (True: a real token), its count of real tokens, and whether every
    row is left-aligned (its real tokens first, without gaps). Reads the mask on the host, as
    CPU's kernel does."""
    host = mask.cpu()
    lengths = host.sum(1)
    # the first padding position of each row (L for a row without padding)
    first_pad = torch.cat([host, torch.zeros(host.shape[0], 1, dtype=torch.bool)], 1).to(torch.int32).argmin(1)
    return lengths.tolist(), bool(torch.equal(lengths, first_pad.to(lengths.dtype)))


def nested_tensor_from_mask_left_aligned(t: torch.Tensor, mask: torch.Tensor) -> bool:
    _check_padding_mask(t, mask)
    return _lengths(mask)[1]


def nested_tensor_from_mask(t: torch.Tensor, mask: torch.Tensor, mask_check: bool = True) -> torch.Tensor:
    """The rows of an (N, L, D) batch, each cut to its real tokens, as a nested tensor."""
    _check_padding_mask(t, mask)
    lengths, aligned = _lengths(mask)
    if mask_check and not aligned:
        raise RuntimeError("Mask must be left-aligned without gaps")
    return from_components([t[i, :n] for i, n in enumerate(lengths)])


def to_padded_tensor(nt: torch.Tensor, padding: float, output_size: Sequence[int] | None = None) -> torch.Tensor:
    """The components stacked into one tensor, each padded at the end of every dim with ``padding``."""
    parts = components(nt)
    if not parts:
        return torch.empty(0, dtype=nt.dtype, device=nt.device)
    rank = parts[0].dim()
    target = [max(p.shape[d] for p in parts) for d in range(rank)]
    if output_size is not None:
        if len(output_size) != rank + 1:
            raise RuntimeError("Length of output_size does not match NestedTensor dims. Broadcasting is not "
                               "supported.")
        for d in range(rank):
            if output_size[d + 1] < target[d]:
                raise RuntimeError("Value in output_size is less than NestedTensor padded size. Truncation is "
                                   "not supported.")
        target = list(output_size[1:])
    out = torch.full([len(parts), *target], padding, dtype=nt.dtype, device=nt.device)
    for i, p in enumerate(parts):
        out[(i, *(slice(0, n) for n in p.shape))] = p
    return out


def unbind(nt: torch.Tensor, dim: int = 0) -> list[torch.Tensor]:
    if dim != 0:
        raise RuntimeError(f"unbind(): only supported for NestedTensor on dim=0, got dim={dim}")
    return components(nt)


def _metadata(index: int):
    def kernel(nt: torch.Tensor) -> torch.Tensor:
        return _C._nested_parts(nt)[index].clone()
    return kernel


_LAYER_ARGS = 17  # _transformer_encoder_layer_fwd's arguments after src, up to the mask


def transformer_encoder_layer(src: torch.Tensor, *args: object, mask: torch.Tensor | None = None,
                              mask_type: int | None = None) -> torch.Tensor:
    """The dense fused layer on the padded batch, with its padding as the key padding mask."""
    weights = args[:_LAYER_ARGS]
    if len(args) > _LAYER_ARGS:
        mask = args[_LAYER_ARGS]
    if mask is not None:
        raise RuntimeError("NestedTensor with mask is not supported yet")
    parts = components(src)
    lengths = [p.shape[0] for p in parts]
    padded = to_padded_tensor(src, 0.0)
    positions = torch.arange(padded.shape[1])
    padding = (positions[None, :] >= torch.tensor(lengths)[:, None]).to(src.device)
    out = aten._transformer_encoder_layer_fwd(padded, *weights, padding, 1)
    return from_components([out[i, :n] for i, n in enumerate(lengths)])


def register() -> None:
    """Register the nested kernels (tpu buffers) and the dense ones that make nested tensors."""
    nested = torch.library.Library("aten", "IMPL")
    _libs.append(nested)
    for name, fn in (("to_padded_tensor", to_padded_tensor), ("unbind.int", unbind),
                     ("_nested_tensor_size", _metadata(1)), ("_nested_tensor_strides", _metadata(2)),
                     ("_nested_tensor_storage_offsets", _metadata(3)),
                     ("_transformer_encoder_layer_fwd", transformer_encoder_layer)):
        nested.impl(name, fn, "NestedTensorPrivateUse1")
    for name, fn in (("_nested_tensor_from_mask", nested_tensor_from_mask),
                     ("_nested_tensor_from_mask_left_aligned", nested_tensor_from_mask_left_aligned)):
        nested.impl(name, fn, "PrivateUse1")
