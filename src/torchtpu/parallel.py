"""``nn.DataParallel`` on tpu: the device-to-device primitives it is built on.

DataParallel scatters inputs across devices, broadcasts the module's parameters to
replicas, runs them on threads and gathers the outputs (``torch.nn.parallel.comm``).
``parallel_apply`` is device-generic, but the four primitives call C++ functions
that only CUDA builds of PyTorch have (``torch._C._scatter``...), so on tpu even a
one-device ``DataParallel(model)`` failed. For tpu tensors they are plain device
copies here; any other tensor still goes to PyTorch's own function. Gradients flow
back through PyTorch's autograd functions around them (``Broadcast`` sums replica
gradients with ``reduce_add``, which is already device-generic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._utils import _get_device_index
from torch.nn.parallel import comm


def _device(d: Any) -> torch.device:
    return torch.device("tpu", _get_device_index(d, True))


def _on_tpu(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def broadcast(tensor: torch.Tensor, devices: Sequence[Any] | None = None, *,
              out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    if out is not None:
        for o in out:
            o.copy_(tensor)
        return tuple(out)
    # the tensor's own device gets the tensor itself, as CUDA's broadcast returns it
    return tuple(tensor if _device(d) == tensor.device else tensor.to(_device(d)) for d in devices or [])


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[Any],
                        buffer_size: int = 10485760) -> list[list[torch.Tensor]]:
    return [[broadcast(t, [d])[0] for t in tensors] for d in devices]


def scatter(tensor: torch.Tensor, devices: Sequence[Any] | None = None, chunk_sizes: Sequence[int] | None = None,
            dim: int = 0, streams: Any = None, *, out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    if out is not None:
        chunks = tensor.split([o.shape[dim] for o in out], dim)
        for o, c in zip(out, chunks):
            o.copy_(c)
        return tuple(out)
    devices = list(devices or [])
    chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(devices), dim)
    return tuple(c.to(_device(d)) for c, d in zip(chunks, devices))


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    if out is not None:
        return torch.cat([t.to(out.device) for t in tensors], dim, out=out)
    # -1 (or "cpu") gathers on the host; None on the current device
    if destination == -1 or (isinstance(destination, (str, torch.device)) and torch.device(destination).type == "cpu"):
        target = torch.device("cpu")
    else:
        target = _device(destination)
    return torch.cat([t.to(target) for t in tensors], dim)


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, (list, tuple)):
        first = first[0] if first else None
    return first


def _route(original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    def primitive(*args: Any, **kwargs: Any) -> Any:
        if _on_tpu(_first_tensor(args, kwargs)):
            return ours(*args, **kwargs)
        return original(*args, **kwargs)

    primitive.__doc__ = original.__doc__
    primitive.__wrapped__ = original  # type: ignore[attr-defined]
    return primitive


def install() -> None:
    """Route ``torch.nn.parallel.comm``'s primitives for tpu tensors (once; callers look them up
    on the module at each call)."""
    if getattr(comm, "_torchtpu_routed", False):
        return
    for name, ours in (("broadcast", broadcast), ("broadcast_coalesced", broadcast_coalesced),
                       ("scatter", scatter), ("gather", gather)):
        setattr(comm, name, _route(getattr(comm, name), ours))
    comm._torchtpu_routed = True
