"""``torch.distributed`` on tpu tensors: the ``tpu_dist`` c10d backend.

``import torch`` registers the backend (:func:`register`), so that
``dist.init_process_group("tpu_dist")``, ``init_process_group(device_id=torch.device("tpu", r))``,
``init_process_group()`` on a tpu host and ``init_device_mesh("tpu", ...)`` all pick it, as
``nccl`` is picked for cuda. A group of this backend is a :class:`TpuProcessGroup`
(``process_group.py``); in this first version every collective is staged through host memory and
run by Gloo over the group's own store (``staging.py``). docs/distributed.md says what exists and
what does not yet.
"""

from __future__ import annotations

from typing import Any

import torch

BACKEND_NAME = "tpu_dist"
# How the data of a collective travels: copied to host memory, exchanged by Gloo, copied back.
TRANSPORT = "gloo-host-staged"


def register() -> bool:
    """Register ``tpu_dist`` with c10d (idempotent); False where PyTorch has no distributed package.

    Cheap at ``import torch``: ``torch.distributed`` is already imported by then, and the process
    group's own module is imported only when a group is created."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed import Backend

    if BACKEND_NAME.upper() in Backend._plugins:
        return True
    # extended_api: the creator gets c10d's DistributedBackendOptions (store, group rank and size,
    # timeout, group id, global ranks). "cpu" too: a tpu_dist group also takes CPU tensors (handed
    # to Gloo as they are), as a gloo group takes cuda ones; cpu's default backend stays gloo.
    Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["tpu", "cpu"])
    return True


def _create(dist_options: Any, backend_options: Any) -> Any:
    from .process_group import TpuProcessGroup

    return TpuProcessGroup.from_backend_options(dist_options, backend_options)


def distributed_info(group: Any = None) -> dict[str, Any]:
    """What carries the collectives of ``group`` (default: the default group).

    ``{"available", "initialized", "backend", "transport", "world_size", "rank", "group_name"}``:
    for a ``tpu_dist`` group the transport is ``"gloo-host-staged"``; for a group of another
    backend it is that backend's name; with no process group, backend and transport are None."""
    info: dict[str, Any] = {"available": torch.distributed.is_available(), "initialized": False,
                            "backend": None, "transport": None, "world_size": 1, "rank": 0,
                            "group_name": None}
    if not info["available"]:
        return info
    import torch.distributed as dist

    if not dist.is_initialized():
        return info
    group = group if group is not None else dist.group.WORLD
    transport = getattr(group, "transport", None)
    if transport == TRANSPORT:  # a tpu_dist group, whichever name c10d recorded ("undefined" when
        backend = BACKEND_NAME  # init_process_group() chose it for the accelerator)
    else:
        backend = str(dist.get_backend(group))
        transport = backend
    info.update(initialized=True, backend=backend, transport=transport, world_size=dist.get_world_size(group),
                rank=dist.get_rank(group), group_name=getattr(group, "group_name", None))
    return info
