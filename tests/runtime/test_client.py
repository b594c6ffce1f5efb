from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torchtpu.runtime import SUPPORTED_DTYPES, Buffer, PjrtError, plugins
from torchtpu.runtime.errors import UnsupportedDtypeError


def test_devices(client):
    kind = plugins.selected_kind()
    assert client.platform_name == kind
    assert isinstance(client.platform_version, str)
    n = len(client.devices)
    assert n == 2 if kind == "cpu" else n >= 1
    assert [d.index for d in client.devices] == list(range(n))
    assert len({d.id for d in client.devices}) == n
    if kind == "cpu":
        assert all(d.kind == "cpu" for d in client.devices)
    stats = client.memory_stats(0)
    assert stats is None or "bytes_in_use" in stats


ROUND_TRIPS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    (np.arange(8, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16),
    np.array([-(2**62), 0, 2**62 + 5], dtype=np.int64),
    np.array([[True, False], [False, True]]),
    np.array(3.5, dtype=np.float32),  # 0-d
    np.zeros((0, 3), dtype=np.float32),  # zero-size
    np.zeros((2, 0), dtype=ml_dtypes.bfloat16),
    np.array(7, dtype=np.int64),
]


@pytest.mark.parametrize("array", ROUND_TRIPS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
@pytest.mark.parametrize("which", ["first", "last"])
def test_round_trip(client, array, which):
    device = 0 if which == "first" else len(client.devices) - 1
    buf = client.buffer_from_host(array, device)
    assert isinstance(buf, Buffer)
    assert buf.shape == array.shape
    assert buf.dtype == array.dtype
    assert buf.device_index == device
    back = buf.to_host()
    assert back.shape == array.shape and back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_round_trip_every_dtype(client, dtype):
    array = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    if np.dtype(dtype) == np.complex128 and not client.supports_complex128:
        # a TPU has no complex128: refused at the transfer, before libtpu sees it (docs/tpu.md)
        with pytest.raises(UnsupportedDtypeError, match="complex128 is not supported on a TPU"):
            client.buffer_from_host(array)
        return
    back = client.buffer_from_host(array).to_host()
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


def test_metadata_from_pjrt(client):
    # A Buffer that knows nothing asks PJRT for shape, dtype and device.
    last = len(client.devices) - 1
    b = client.buffer_from_host(np.ones((2, 5), np.int16), last)
    raw = Buffer(client, b._handle)
    assert raw.shape == (2, 5)
    assert raw.dtype == np.int16
    assert raw.device_index == last
    raw._handle = None  # not the owner
    assert b.nbytes >= 20


def test_non_contiguous_and_byte_order(client):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(client.buffer_from_host(a.T).to_host(), a.T)
    np.testing.assert_array_equal(client.buffer_from_host(a[:, ::2]).to_host(), a[:, ::2])
    big = np.arange(5, dtype=">i4")
    np.testing.assert_array_equal(client.buffer_from_host(big).to_host(), big)


def test_host_copy_semantics(client):
    a = np.arange(4, dtype=np.float32)
    b = client.buffer_from_host(a)
    a[:] = -1  # the device copy must not see later host writes
    np.testing.assert_array_equal(b.to_host(), [0, 1, 2, 3])


def test_to_host_out(client):
    b = client.buffer_from_host(np.arange(6, dtype=np.float64).reshape(2, 3))
    out = np.empty((2, 3), np.float64)
    assert b.to_host(out) is out
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError):
        b.to_host(np.empty((3, 2), np.float64))
    with pytest.raises(ValueError):
        b.to_host(np.empty((2, 3), np.float32))


def test_delete(client):
    b = client.buffer_from_host(np.ones(3, np.float32))
    assert not b.is_deleted
    b.delete()
    assert b.is_deleted
    b.delete()  # idempotent
    with pytest.raises(PjrtError):
        b.to_host()


def test_unsupported_dtype(client):
    with pytest.raises(TypeError):
        client.buffer_from_host(np.array(["a"]))
    with pytest.raises(TypeError):
        client.buffer_from_host(np.zeros(2, ml_dtypes.int4))


def test_ready_event(client):
    b = client.buffer_from_host(np.ones(3, np.float32))
    ev = b.ready_event()
    ev.wait()
    assert ev.is_ready()
    assert ev.error() is None
    ev.destroy()
    ev.destroy()  # idempotent
