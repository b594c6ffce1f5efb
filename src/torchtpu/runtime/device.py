"""Addressable devices of a client."""

from __future__ import annotations

from typing import Any

from ._pjrt_ffi import ffi
from .plugin import Plugin


class Device:
    """One addressable PJRT device.

    ``index`` is the position in ``Client.devices`` (what the rest of the
    runtime calls a device index, e.g. ``tpu:1``); ``id`` is PJRT's global id.
    """

    __slots__ = ("handle", "id", "index", "kind", "local_hardware_id")

    def __init__(self, plugin: Plugin, handle: Any, index: int) -> None:
        self.handle = handle
        self.index = index
        desc = plugin.call("PJRT_Device_GetDescription", device=handle).device_description
        self.id: int = int(plugin.call("PJRT_DeviceDescription_Id", device_description=desc).id)
        k = plugin.call("PJRT_DeviceDescription_Kind", device_description=desc)
        self.kind: str = ffi.string(k.device_kind, k.device_kind_size).decode()
        self.local_hardware_id: int | None = None
        if plugin.has("PJRT_Device_LocalHardwareId"):
            r = plugin.call("PJRT_Device_LocalHardwareId", device=handle)
            self.local_hardware_id = int(r.local_hardware_id)

    def __repr__(self) -> str:
        return f"Device(index={self.index}, id={self.id}, kind={self.kind!r})"
