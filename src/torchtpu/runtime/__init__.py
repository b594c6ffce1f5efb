"""torchtpu.runtime: PJRT C API through cffi. Knows nothing about PyTorch.

Only numpy, ml_dtypes and cffi are imported here (never torch).
"""

from .buffer import Buffer, batched_destroys, live_buffers, live_bytes, release_donated, reset_peak_bytes
from .client import Client, create_client
from .compile_options import compile_options
from .device import Device
from .dtypes import (
    SUPPORTED_DTYPES,
    from_pjrt_type,
    from_stablehlo,
    to_pjrt_type,
    to_stablehlo,
)
from .errors import PjrtError, UnsupportedDtypeError
from .event import Event
from .executable import Executable
from .plugin import Plugin, load_plugin
from .plugins import default_client_options, resolve_plugin_path, tpu_present

__all__ = [
    "SUPPORTED_DTYPES",
    "Buffer",
    "Client",
    "Device",
    "Event",
    "Executable",
    "PjrtError",
    "Plugin",
    "UnsupportedDtypeError",
    "batched_destroys",
    "compile_options",
    "create_client",
    "default_client_options",
    "from_pjrt_type",
    "from_stablehlo",
    "live_buffers",
    "live_bytes",
    "load_plugin",
    "release_donated",
    "reset_peak_bytes",
    "resolve_plugin_path",
    "to_pjrt_type",
    "to_stablehlo",
    "tpu_present",
]
