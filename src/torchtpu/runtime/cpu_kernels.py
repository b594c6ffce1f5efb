"""Host-CPU kernels that XLA:CPU programs call as custom calls.

The native library (``torchtpu/_cpu_kernels*.so``, built from
``csrc/cpu_kernels.cpp``) holds a transpose that XLA's CPU backend otherwise
emits as a strided elemental loop (see the C++ file). It is registered with the
CPU plugin through the PJRT FFI extension when a client is created; lowerings
ask :func:`transpose_target` whether they may emit it.

``TORCH_TPU_CPU_KERNELS=0`` turns the kernels off (programs then use XLA's own
transpose). Loaded with ctypes; knows nothing of PyTorch.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import warnings
from typing import Any

import numpy as np

ENV_VAR = "TORCH_TPU_CPU_KERNELS"
# The custom-call target. The suffix is the kernel's calling convention: a cached
# executable that names it only ever meets a handler that speaks it.
TRANSPOSE_TARGET = "torchtpu_transpose_v1"

_lock = threading.Lock()
_lib: list[Any] = []  # [] not loaded yet, [None] unavailable, [CDLL] loaded
_registered: set[int] = set()  # addresses of the PJRT_Api tables the kernels were registered with


def _library() -> Any:
    with _lock:
        if not _lib:
            _lib.append(_load())
        return _lib[0]


def _load() -> Any:
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(glob.glob(os.path.join(here, "_cpu_kernels*.so")))
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    lib.torchtpu_cpu_kernels_available.restype = ctypes.c_int
    lib.torchtpu_register_cpu_kernels.restype = ctypes.c_int
    lib.torchtpu_register_cpu_kernels.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.torchtpu_transpose_host.restype = ctypes.c_int
    lib.torchtpu_transpose_host.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    if not lib.torchtpu_cpu_kernels_available():
        return None
    return lib


def available() -> bool:
    """Whether this process can run the kernels (library built, CPU has AVX-512 BF16, not disabled)."""
    return _library() is not None


def register(plugin: Any) -> bool:
    """Register the kernels with an XLA:CPU plugin; False (with a warning) when that fails."""
    lib = _library()
    if lib is None:
        return False
    from ._pjrt_ffi import ffi

    key = int(ffi.cast("uintptr_t", plugin.api))
    with _lock:
        if key in _registered:
            return True
        err = ctypes.c_void_p()
        rc = lib.torchtpu_register_cpu_kernels(ctypes.c_void_p(key), ctypes.byref(err))
        if err.value:
            message = str(plugin.take_error(ffi.cast("PJRT_Error*", err.value)))
            warnings.warn(f"torchtpu: CPU kernels not registered ({message}); using XLA's own", stacklevel=2)
            return False
        if rc != 0:
            return False
        _registered.add(key)
        return True


def transpose_target() -> str | None:
    """The custom-call target of the transpose, if registered with a CPU plugin in this process."""
    return TRANSPOSE_TARGET if _registered else None


def transpose_host(x: np.ndarray, out_dtype: Any) -> np.ndarray:
    """The kernel on host arrays: x[..., R, C] (f32 or bf16) -> [..., C, R] in ``out_dtype`` (for tests)."""
    import ml_dtypes

    lib = _library()
    if lib is None:
        raise RuntimeError("torchtpu CPU kernels are not available in this process")
    x = np.ascontiguousarray(x)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    if x.ndim < 2 or x.dtype not in (np.float32, bf16) or np.dtype(out_dtype) not in (np.float32, bf16):
        raise ValueError("expected an f32 or bf16 array of rank >= 2 and an f32 or bf16 result")
    rows, cols = x.shape[-2:]
    out = np.empty((*x.shape[:-2], cols, rows), out_dtype)
    batch = int(np.prod(x.shape[:-2], dtype=np.int64))
    lib.torchtpu_transpose_host(x.ctypes.data, int(x.dtype == bf16), out.ctypes.data,
                                int(out.dtype == bf16), batch, rows, cols)
    return out
