"""Optimizer state (and, on request, parameters) packed into one flat storage per device and dtype.

A launch costs a TPU host time per argument and result (about 5.4 us per donated pair on a v5e,
docs/tpu.md): a captured AdamW step of a model with P parameters passes 3P state tensors (two
moments and a step count each), which for the demo GPT was 87 of the replay's 121 arguments. Packed,
the same tensors are views of one storage, which a program takes and returns as one buffer.

The tensors keep their identity (``Tensor.set_`` rebinds each to its place in the flat storage), so
``optimizer.state``, ``state_dict()`` and in-place updates work as before; only a view taken of a
state tensor before the packing keeps the old storage. State is packed after an optimizer step
outside a capture, for optimizers whose every group is ``capturable`` (the ones CUDA-graph style
code captures), or on request (``torch.tpu.pack_optimizer_state``).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["pack_optimizer_state", "pack_parameters"]

# optimizer -> the state dict it packed (a load_state_dict replaces it) and how many entries it had
_packed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _packable(t: Any) -> bool:
    """A plain tpu tensor that is alone in its storage and covers it, so rebinding it loses no
    alias the packing can see."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "tpu"
            and t.storage_offset() == 0 and t.is_contiguous()
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


# Bytes of one flat storage at most: packing copies the state, and a chunk at a time bounds the
# extra device memory that needs (a 100M-parameter AdamW's moments are 800 MB).
CHUNK_BYTES = 256 << 20


def _chunks(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    chunks: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if chunks[-1] and size + n > CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(t)
        size += n
    return chunks


def _pack(tensors: list[torch.Tensor]) -> int:
    """Rebind ``tensors`` (packable ones, each once) as views of one flat storage per (device,
    dtype) and ``CHUNK_BYTES``; returns how many moved. Tensors sharing a storage with another of
    them, and groups of one, are left as they are."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    moved = 0
    with torch.no_grad():
        for group in groups.values():
            owners: dict[int, int] = {}
            for t in group:
                key = t.untyped_storage()._cdata
                owners[key] = owners.get(key, 0) + 1
            group = [t for t in group if owners[t.untyped_storage()._cdata] == 1]
            for chunk in _chunks(group):
                if len(chunk) < 2:
                    continue
                storage = torch.cat([t.detach().reshape(-1) for t in chunk]).untyped_storage()
                offset = 0
                for t in chunk:
                    t.set_(storage, offset, t.shape, t.stride())
                    offset += t.numel()
                moved += len(chunk)
    return moved


# The largest state tensor the automatic packing (after a capturable optimizer's step) moves. Packing
# saves a launch argument and result per tensor (~5.4 us of host time a pair on a v5e) and costs
# device time per byte: a TPU tiles a matrix in two dimensions, a flat storage is one-dimensional, so
# each step copies a packed matrix into its tiled layout and its update back (about the same time as
# the ~5 us saved at 1-2 MB). Small tensors (biases, norms, step counts) are where the arguments
# are; a 100M model's matrix moments are 800 MB, whose copies outweigh ~100 arguments (the 100M GPT's
# replayed step on the v5e: 106 ms with all its AdamW state and its parameters up to 1 MiB packed,
# 89 ms before either was packed; the two causes not yet measured apart).
AUTO_PACK_MAX_BYTES = 1 << 20


def pack_optimizer_state(optimizer: torch.optim.Optimizer, max_bytes: int | None = None) -> int:
    """Move ``optimizer``'s tpu state tensors (those of at most ``max_bytes`` each, if given) into one
    flat storage per (device, dtype) (one per ``CHUNK_BYTES`` of it); returns how many tensors moved.
    Tensors sharing a storage with another (already packed, or aliased by the user) and groups of one
    are left as they are. After a capturable optimizer's step this runs by itself with
    ``max_bytes=AUTO_PACK_MAX_BYTES``."""
    state = [t for st in optimizer.state.values() for t in st.values() if _packable(t) and not t.requires_grad]
    if max_bytes is not None:
        state = [t for t in state if t.numel() * t.element_size() <= max_bytes]
    moved = _pack(state)
    _packed[optimizer] = (optimizer.state, len(optimizer.state))
    return moved


def pack_parameters(module: torch.nn.Module, max_bytes: int | None = None) -> int:
    """Move ``module``'s tpu parameters (those of at most ``max_bytes`` each, if given) into one flat
    storage per (device, dtype) (one per ``CHUNK_BYTES``), as views of it; returns how many moved.
    For steps captured in a ``torch.tpu.graph``: a program then takes the parameters as one argument
    (and an optimizer step returns them as one result) instead of one per tensor.

    What it costs on a TPU (measured on a v5e): a training step of small parameters gains (the demo
    GPT's replayed step: 0.416 ms packed, 0.566 ms not), but decoding a 100M model token by token
    lost 4x (335 against 1,323 tokens/s at batch 1). The likely reason (not yet profiled): a flat
    storage is a one-dimensional buffer and a TPU keeps matrices in tiled two-dimensional layouts, so
    a program that reads a packed matrix copies it into that layout, here every weight at every
    token. There, pack only the small parameters (biases and norms: ``max_bytes=1 << 20``), which are
    many arguments and few bytes.

    Not automatic, unlike optimizer state: code may hold another tensor on a parameter's storage
    (``p.data`` kept from before, weights tied through ``.data``), which would then stop seeing the
    parameter's updates. Parameters already sharing a storage stay as they are. Call it before a
    capture: a captured graph reads the storages it was captured with."""
    params = [p for p in module.parameters() if _packable(p)]  # (parameters() lists a tied one once)
    if max_bytes is not None:
        params = [p for p in params if p.numel() * p.element_size() <= max_bytes]
    return _pack(params)


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Optimizer step post-hook: pack a capturable optimizer's state once it exists (its first step),
    and again after its state was replaced or grew; never inside a capture or a compiled region."""
    from .engine import deferred

    if deferred.capturing is not None or torch.compiler.is_compiling():
        return
    seen = _packed.get(optimizer)
    if seen is not None and seen[0] is optimizer.state and seen[1] == len(optimizer.state):
        return
    groups = optimizer.param_groups
    if not groups or not all(g.get("capturable") for g in groups):
        return
    if not any(p.device.type == "tpu" for g in groups for p in g["params"]):
        return
    pack_optimizer_state(optimizer, max_bytes=AUTO_PACK_MAX_BYTES)


def install() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_step)
