"""The native argument walk (csrc/collect.cpp) against its Python reference, value for value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtpu import _C
from torchtpu.engine import executor


def _state(col: executor._Collector) -> tuple:
    inputs = [tuple(x.tolist() if isinstance(x, np.ndarray) else x for x in inp) for inp in col.inputs]
    return ([id(s) for s in col.storages], list(col.skeys), dict(col.storage_index), inputs, col.device,
            col.has_f64)


def _both(values: list, flags: list[bool]) -> tuple[tuple, tuple]:
    native, python = executor._Collector(), executor._Collector()
    specs, has_gen = _C._walk_all(native, values, flags)
    ref = [python.walk_python(v, f) for v, f in zip(values, flags)]
    assert has_gen == any(s[0] == "G" for s in ref)
    return (specs, _state(native)), (ref, _state(python))


def _arguments() -> list[tuple[list, list[bool]]]:
    dev = "tpu"
    a = torch.randn(4, 6, device=dev)
    view = a[1:, ::2]  # shares a's storage: one storage slot, two specs
    d = torch.randn(3, dtype=torch.float64, device=dev)  # f64 switches float scalars to f64
    empty = torch.empty(5, dtype=torch.int32, device=dev)  # no buffer yet: a "U" storage key
    as_int = a.view(torch.int32)  # the buffer's dtype differs from the tensor's
    params = [torch.randn(3, device=dev) for _ in range(4)]
    host_scalar = torch.tensor(2.5)
    return [
        ([a, view, 1], [False, False, True]),
        ([a, 2.0, True, 3], [False, True, True, True]),
        ([a, 2.0, 3], [False, False, False]),  # not runtime scalars: static values
        ([d, 0.5], [False, True]),
        ([empty, as_int, a], [False, False, False]),
        ([params, params[:2], [0.1, 0.2, 0.3, 0.4]], [False, False, True]),
        ([[a, None, view], (2, 3), [], ()], [False, False, False, False]),
        ([a, host_scalar], [False, False]),
        ([a, torch.Generator(device=dev)], [False, False]),
        ([a, "mean", None, torch.float16, torch.device("tpu:0")], [False] * 5),
    ]


# the number of _arguments() cases, counted without making device tensors at collection (on a
# TPU host a collection that opens the chip would lock out the suite's fresh processes)
_CASES = 10


def test_argument_cases_are_all_parametrized() -> None:
    assert len(_arguments()) == _CASES


@pytest.mark.parametrize("case", range(_CASES))
def test_native_walk_matches_python(case: int) -> None:
    values, flags = _arguments()[case]
    native, python = _both(values, flags)
    assert native == python
    # graph_runner passes its arguments as they come (a list, or a tuple)
    specs, _ = _C._walk_all(executor._Collector(), tuple(values), flags)
    assert specs == native[0]


def test_native_walk_matches_python_on_recorded_values() -> None:
    """Storages awaiting a DeferAndFuse graph carry a Pending, not a Buffer: same keys."""
    with torch.tpu.eager_mode("defer_and_fuse"):
        a = torch.randn(8, 8, device="tpu")
        b = (a * 2).t()
        native, python = _both([a, b, [b, a]], [False, False, False])
        assert native == python
        torch.tpu.synchronize()


def test_native_walk_raises_what_python_raises() -> None:
    a = torch.randn(3, device="tpu")
    for values in ([a, torch.randn(3)], [torch.randn(3), a]):
        with pytest.raises(RuntimeError) as native:
            _C._walk_all(executor._Collector(), values, [False, False])
        with pytest.raises(RuntimeError) as python:
            col = executor._Collector()
            for v in values:
                col.walk_python(v, False)
        assert str(native.value) == str(python.value)
        assert "Expected all tensors to be on the same device" in str(native.value)
    with pytest.raises(IndexError):
        _C._walk_all(executor._Collector(), [a, a], [False])


def test_native_walk_leaves_lazy_views_to_python() -> None:
    z = torch.randn(3, dtype=torch.complex64, device="tpu")
    native, python = _both([z.conj(), torch.neg(z)._neg_view()], [False, False])
    assert native == python
    assert len(native[0][0]) == 7  # the conj/neg flags ride along in the spec


def test_native_storage_buffers_gather_what_the_launch_loop_gathers() -> None:
    """_C._storage_buffers (execute_and_bind's common case): each storage input's Buffer in order,
    storages the program does not read ("U" keys: written, not read) skipped; None, for the Python
    loop, where an input is not a storage or a storage holds no Buffer."""
    from torchtpu import storage as st
    from torchtpu.runtime import Buffer

    a, b = torch.randn(3, device="tpu"), torch.randn(5, device="tpu")
    col = executor._Collector()
    _C._walk_all(col, [a, a[1:], b], [False, False, False])
    assert len(col.storages) == 2  # a's view shares its storage
    got = _C._storage_buffers(col.inputs, col.storages, tuple(col.skeys), Buffer)
    assert got == [getattr(a.untyped_storage(), st._ATTR), getattr(b.untyped_storage(), st._ATTR)]
    skeys = (("U", 2, torch.float32), *col.skeys[1:])  # the first storage only written
    assert _C._storage_buffers(col.inputs, col.storages, skeys, Buffer) == got[1:]
    assert _C._storage_buffers([*col.inputs, ("scalar", 1.0, None)], col.storages, tuple(col.skeys), Buffer) is None
    assert _C._storage_buffers(col.inputs, col.storages, tuple(col.skeys), type(None)) is None  # not Buffers
