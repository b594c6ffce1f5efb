"""``nn.DataParallel`` on tpu: the device-to-device primitives it is built on, and its threads' precision.

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

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._utils import _get_device_index
from torch.nn.parallel import comm

from .engine import precision as precision_mod


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


class _UnderPrecision:
    """A replica called under the precision its caller's thread runs at."""

    def __init__(self, module: Callable[..., Any], precision: str) -> None:
        self.module, self.precision = module, precision

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with precision_mod._override(self.precision, True):
            return self.module(*args, **kwargs)


def _keeping_precision(apply: Callable[..., Any]) -> Callable[..., Any]:
    """``parallel_apply`` that runs each replica at the caller's matmul precision.

    A ``torch.tpu.precision`` block is thread-local, like autocast; ``parallel_apply``
    carries grad mode and autocast into its replica threads, and now this as well, so
    DataParallel computes at the precision its caller asked for."""

    def parallel_apply(modules: Sequence[Any], inputs: Sequence[Any], kwargs_tup: Any = None,
                       devices: Any = None) -> list[Any]:
        wanted = precision_mod.current()
        if wanted != precision_mod.get_global():
            modules = [_UnderPrecision(m, wanted) for m in modules]
        return apply(modules, inputs, kwargs_tup, devices)

    parallel_apply.__doc__ = apply.__doc__
    parallel_apply.__wrapped__ = apply  # type: ignore[attr-defined]
    return parallel_apply


def install() -> None:
    """Route ``torch.nn.parallel.comm``'s primitives for tpu tensors, and carry the caller's
    precision into ``parallel_apply``'s threads (once; callers look these up on their modules
    at each call)."""
    if getattr(comm, "_torchtpu_routed", False):
        return
    for name, ours in (("broadcast", broadcast), ("broadcast_coalesced", broadcast_coalesced),
                       ("scatter", scatter), ("gather", gather)):
        setattr(comm, name, _route(getattr(comm, name), ours))
    comm._torchtpu_routed = True
    # (torch.nn.parallel's attributes of those names are functions, hence the imports by path)
    parallel_apply_mod = importlib.import_module("torch.nn.parallel.parallel_apply")
    data_parallel_mod = importlib.import_module("torch.nn.parallel.data_parallel")
    apply = _keeping_precision(parallel_apply_mod.parallel_apply)
    for module in (parallel_apply_mod, data_parallel_mod, torch.nn.parallel):
        module.parallel_apply = apply
