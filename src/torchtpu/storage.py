"""Device data of ``tpu`` storages.

A storage's device data is one immutable PJRT buffer (its *cell*), held as
an attribute of the Python storage object. PyTorch preserves that object for as
long as the C++ StorageImpl lives, so views, ``x.data``, tensors saved for
backward and C++-made aliases all see the same cell. An in-place write builds
a new buffer for the whole storage and rebinds the attribute; the old buffer
is freed when its last reader drops it.

The buffer's row-major elements are the storage. It keeps the dims of the
tensor that made it (an upload, an op's result) rather than being flat: XLA's
CPU backend writes a flattened result much more slowly, and a TPU lays out
1-D arrays badly.

A storage without a buffer is uninitialized (``torch.empty``); reading it
yields zeros. A buffer may be shorter than the storage (after ``resize_``) and
may hold another dtype than the tensor viewing it (``x.view(torch.int32)``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from . import _device_state
from .runtime import Buffer

_ATTR = "_tpu_buffer"

TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    torch.float8_e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
}
NUMPY_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_NUMPY.items()}
# dtypes torch.Tensor.numpy() refuses: they cross to numpy as integers of their width, reinterpreted
_BITS_OF = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8,
            torch.float8_e4m3fnuz: torch.uint8, torch.float8_e5m2fnuz: torch.uint8}
_BITS_OF_NUMPY = {TORCH_TO_NUMPY[t]: np.dtype(str(bits).removeprefix("torch.")) for t, bits in _BITS_OF.items()}


def storage_buffer(storage: torch.UntypedStorage) -> Buffer | None:
    return getattr(storage, _ATTR, None)


def set_storage_buffer(storage: torch.UntypedStorage, buffer: Buffer | None) -> None:
    setattr(storage, _ATTR, buffer)


def buffer_dtype(buffer: Buffer) -> torch.dtype:
    return NUMPY_TO_TORCH[buffer.dtype]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor as a numpy array (bfloat16 and float8 via ml_dtypes), no copy where possible."""
    t = t.detach()
    bits = _BITS_OF.get(t.dtype)
    if bits is not None:
        return t.view(bits).numpy().view(TORCH_TO_NUMPY[t.dtype])
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    bits = _BITS_OF_NUMPY.get(a.dtype)
    if bits is not None:
        return torch.from_numpy(a.view(bits)).view(NUMPY_TO_TORCH[a.dtype])
    return torch.from_numpy(a)


def upload(host: torch.Tensor, device_index: int) -> Buffer:
    """Copy a CPU tensor into a new device buffer of its shape, laid out row-major."""
    from .engine import deferred

    if deferred.capturing is not None:
        # A CUDA graph replays its host-to-device copies from the host memory's current contents;
        # a tpu graph cannot re-read host memory, and a copy frozen at capture would be wrong
        deferred.capturing.refuse("a copy from the host to a tpu tensor")
    host = host.detach()
    if not host.is_contiguous():
        host = host.contiguous()
    if host.dim() > 64:  # numpy caps arrays at 64 dimensions, PyTorch does not
        host = host.reshape(-1)
    return _device_state.client().buffer_from_host(to_numpy(host), device_index)


def zeros_buffer(numel: int, dtype: torch.dtype, device_index: int) -> Buffer:
    return _device_state.client().buffer_from_host(np.zeros((numel,), TORCH_TO_NUMPY[dtype]), device_index)


def storage_numel(storage: torch.UntypedStorage, dtype: torch.dtype) -> int:
    return storage.nbytes() // dtype.itemsize


def read_storage(storage: torch.UntypedStorage, dtype: torch.dtype, device_index: int) -> Buffer:
    """The storage's buffer, creating zeros for an uninitialized storage."""
    buf = storage_buffer(storage)
    if buf is None:
        buf = zeros_buffer(storage_numel(storage, dtype), dtype, device_index)
        set_storage_buffer(storage, buf)
    return buf
