"""Host-CPU kernels that XLA:CPU programs call as custom calls.

The native library (``torchtpu/_cpu_kernels*.so``, built from
``csrc/cpu_kernels.cpp`` and ``csrc/cpu_linalg.cpp``) holds a transpose that
XLA's CPU backend otherwise emits as a strided elemental loop, and LAPACK's
symmetric eigendecomposition, SVD, LU, QR and Cholesky, which the portable lowerings
build from Jacobi sweeps and column loops that XLA:CPU runs 7-1000x slower (see the
C++ files). They are
registered with the CPU plugin through the PJRT FFI extension when a client is
created; lowerings ask :func:`transpose_target` and :func:`linalg_targets`
whether they may emit them. The LAPACK drivers come from whoever calls
:func:`set_lapack` before the client is created (torchtpu passes PyTorch's).

``TORCH_TPU_CPU_KERNELS=0`` turns the kernels off (programs then use XLA's own
transpose and the Jacobi lowerings). Loaded with ctypes; knows nothing of PyTorch.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import warnings
from typing import Any, NamedTuple

import numpy as np

from . import env

ENV_VAR = "TORCH_TPU_CPU_KERNELS"
# The custom-call target. The suffix is the kernel's calling convention: a cached
# executable that names it only ever meets a handler that speaks it.
TRANSPOSE_TARGET = "torchtpu_transpose_v1"
EIGH_TARGET = "torchtpu_eigh_v1"
SVD_TARGET = "torchtpu_svd_v1"
LU_TARGET = "torchtpu_lu_v1"
GEQRF_TARGET = "torchtpu_geqrf_v1"
ORGQR_TARGET = "torchtpu_orgqr_v1"
CHOLESKY_TARGET = "torchtpu_cholesky_v1"
# in the order torchtpu_set_lapack takes them: single precision, then double
LAPACK_DRIVERS = tuple(f"{p}{kind}_" for p in "sd" for kind in ("syevd", "gesdd", "getrf", "geqrf", "orgqr", "potrf"))
_TRANSPOSE, _LINALG = 1, 2  # what torchtpu_register_cpu_kernels reports it registered

_lock = threading.Lock()
_lib: list[Any] = []  # [] not loaded yet, [None] unavailable, [CDLL] loaded
_registered: dict[int, int] = {}  # address of a PJRT_Api table -> what was registered with it (bits)


def _library() -> Any:
    with _lock:
        if not _lib:
            _lib.append(_load())
        return _lib[0]


def _load() -> Any:
    if not env.read(ENV_VAR):
        return None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(glob.glob(os.path.join(here, "_cpu_kernels*.so")))
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    lib.torchtpu_cpu_kernels_available.restype = ctypes.c_int
    lib.torchtpu_register_cpu_kernels.restype = ctypes.c_int
    lib.torchtpu_register_cpu_kernels.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.torchtpu_transpose_host.restype = ctypes.c_int
    lib.torchtpu_transpose_host.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.torchtpu_lapack_available.restype = ctypes.c_int
    lib.torchtpu_set_lapack.restype = ctypes.c_int
    lib.torchtpu_set_lapack.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    return lib


def available() -> bool:
    """Whether this process can run the transpose (library built, x86-64 CPU with AVX2, not disabled)."""
    lib = _library()
    return lib is not None and bool(lib.torchtpu_cpu_kernels_available())


def set_lapack(library_path: str) -> bool:
    """Take LAPACK's drivers (``LAPACK_DRIVERS``: Fortran ABI, 32-bit integers) from a shared
    library already loaded in this process, for the eigh and svd kernels of clients created
    from now on. False where the kernels are off or the library lacks a driver."""
    lib = _library()
    if lib is None:
        return False
    try:
        lapack = ctypes.CDLL(library_path)
        drivers = [ctypes.cast(getattr(lapack, name), ctypes.c_void_p).value for name in LAPACK_DRIVERS]
    except (OSError, AttributeError):
        return False
    if lib.torchtpu_set_lapack((ctypes.c_void_p * len(drivers))(*drivers), len(drivers)) != 0:
        return False
    return bool(lib.torchtpu_lapack_available())


def register(plugin: Any) -> bool:
    """Register the kernels with an XLA:CPU plugin; False (with a warning) when that fails."""
    lib = _library()
    if lib is None:
        return False
    from ._pjrt_ffi import ffi

    key = int(ffi.cast("uintptr_t", plugin.api))
    with _lock:
        have = _registered.get(key, 0)
        # The LAPACK kernels come once set_lapack has run: a plugin whose first client came before
        # (a runtime-level client, then the tpu device's) gets them with its next client
        # (regression: the device then ran without them for the whole process).
        missing = (_TRANSPOSE | _LINALG) & ~have
        if not (missing & _TRANSPOSE and lib.torchtpu_cpu_kernels_available()
                or missing & _LINALG and lib.torchtpu_lapack_available()):
            return bool(have)
        err = ctypes.c_void_p()
        rc = lib.torchtpu_register_cpu_kernels(ctypes.c_void_p(key), missing, ctypes.byref(err))
        if err.value:
            message = str(plugin.take_error(ffi.cast("PJRT_Error*", err.value)))
            warnings.warn(f"torchtpu: CPU kernels not registered ({message}); using XLA's own", stacklevel=2)
        if rc > 0:
            _registered[key] = have | rc
        return bool(_registered.get(key, 0))


def _registered_with_all(kind: int) -> bool:
    return bool(_registered) and all(bits & kind for bits in _registered.values())


def transpose_target() -> str | None:
    """The custom-call target of the transpose, if registered with the CPU plugin in this process."""
    return TRANSPOSE_TARGET if _registered_with_all(_TRANSPOSE) else None


class LinalgTargets(NamedTuple):
    eigh: str
    svd: str
    lu: str
    geqrf: str
    orgqr: str
    cholesky: str


def linalg_targets() -> LinalgTargets | None:
    """The custom-call targets of the LAPACK kernels, if registered with the CPU plugin."""
    if not _registered_with_all(_LINALG):
        return None
    return LinalgTargets(EIGH_TARGET, SVD_TARGET, LU_TARGET, GEQRF_TARGET, ORGQR_TARGET, CHOLESKY_TARGET)


def transpose_host(x: np.ndarray, out_dtype: Any, avx2_only: bool = False) -> np.ndarray:
    """The kernel on host arrays: x[..., R, C] (f32 or bf16) -> [..., C, R] in ``out_dtype`` (for tests).

    ``avx2_only``: the AVX2 code even on a CPU where the kernel uses AVX-512.
    """
    import ml_dtypes

    lib = _library()
    if not available():
        raise RuntimeError("torchtpu CPU kernels are not available in this process")
    x = np.ascontiguousarray(x)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    if x.ndim < 2 or x.dtype not in (np.float32, bf16) or np.dtype(out_dtype) not in (np.float32, bf16):
        raise ValueError("expected an f32 or bf16 array of rank >= 2 and an f32 or bf16 result")
    rows, cols = x.shape[-2:]
    out = np.empty((*x.shape[:-2], cols, rows), out_dtype)
    batch = int(np.prod(x.shape[:-2], dtype=np.int64))
    lib.torchtpu_transpose_host(x.ctypes.data, int(x.dtype == bf16), out.ctypes.data,
                                int(out.dtype == bf16), batch, rows, cols, int(avx2_only))
    return out
