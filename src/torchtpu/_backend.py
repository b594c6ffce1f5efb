"""Registers the ``tpu`` device with PyTorch (run once per process, cheaply)."""

from __future__ import annotations

import sys
import threading

import torch

_lock = threading.Lock()
_installed = False


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        from . import _C
        from ._config import config

        torch.utils.rename_privateuse1_backend("tpu")
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        _C._set_device_count(config.num_devices)
        _C._install()
        from . import device_module

        torch._register_device_module("tpu", device_module)
        sys.modules["torch.tpu"] = device_module
        sys.modules["torch.tpu.amp"] = device_module.amp
        from .backend_config import backend

        torch.backends.tpu = backend
        sys.modules["torch.backends.tpu"] = backend
        from .runtime.errors import DEVICE_FAILURES, RESOURCE_EXHAUSTED, register_error_type

        register_error_type(RESOURCE_EXHAUSTED, device_module.DeviceOutOfMemoryError)
        for code in DEVICE_FAILURES:
            register_error_type(code, device_module.DeviceError)
        from . import _autocast, _kernels, _printing
        from .engine import executor

        _kernels.register_kernels()
        _autocast.register()
        _printing.install()
        from .engine import precision

        precision.track_torch_setting()
        _C._set_synchronize_callback(lambda index: executor.synchronize(index))
        from .streams import GuardEvents

        _C._set_event_callbacks(GuardEvents())
        from . import device_module

        _C._set_memory_info_callback(device_module.mem_get_info)
        # Backward of tpu tensors would otherwise run on an autograd device
        # thread, where an exception raised by a Python kernel can abort the
        # process at exit. On the calling thread it propagates normally.
        torch.autograd.set_multithreading_enabled(False)
        from .compile import route_default_compile

        route_default_compile()
        from . import graphs, packed_state, parallel, step_recording

        parallel.install()
        step_recording.install()
        graphs.install()
        packed_state.install()
        from . import distributed

        # c10d learns the "tpu_dist" backend now, so init_process_group picks it for tpu as it
        # picks nccl for cuda (cheap: import torch has imported torch.distributed already).
        distributed.register()
