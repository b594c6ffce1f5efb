"""The exact op cache key (csrc/op_key.cpp): equal means the same typed values."""

from __future__ import annotations

import enum
import pickle

import numpy as np
import pytest
import torch

from torchtpu import _C


def key(*items: object) -> _C.OpKey:
    return _C._op_key(items)


class _Color(enum.IntEnum):
    RED = 1


class _ByIdentity:
    pass


class _ByValue:
    def __init__(self, v: int) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByValue) and other.v == self.v

    def __hash__(self) -> int:
        return hash(self.v)


SAME = [
    (1, "medium", False, (("T", 0, torch.float32, (384, 128), (128, 1), 0),)),
    (None, True, 2.5, float("nan"), 1 + 2j, -(2**40), 2**70, "a longer string than six", "é"),
    (torch.channels_last, torch.strided, torch.device("tpu", 1), int, ["list"], torch.Size([2, 3])),
    (np.float64(-0.0), np.float32(1.5), np.int64(3), _Color.RED),
]

DIFFERENT = [
    (2, 2.0), (1, True), (0, False), (0.0, -0.0), (1.0, 1 + 0j), ((1, 2), [1, 2]), ("ab", "ab\x00"),
    (2**30 - 1, 2**30), (2**70, 2**70 + 1), (torch.float32, torch.bfloat16),
    (torch.device("tpu", 0), torch.device("tpu", 1)), (torch.device("tpu", 0), torch.device("cpu", 0)),
    (torch.contiguous_format, torch.channels_last), (int, float), (None, ()),
    (np.float64(0.0), np.float64(-0.0)), (np.float64(2.0), 2.0), (np.float32(2.0), np.float64(2.0)),
    (_Color.RED, 1),
]


@pytest.mark.parametrize("items", SAME)
def test_equal_values_make_equal_keys(items):
    copy = pickle.loads(pickle.dumps(items))  # equal values, other objects
    a, b = key(*items), key(*copy)
    assert a == b
    assert (a != b) is False  # __ne__ is its own slot
    assert hash(a) == hash(b)
    assert {a: 1}.get(b) == 1


@pytest.mark.parametrize("pair", DIFFERENT, ids=repr)
def test_values_python_may_conflate_make_different_keys(pair):
    x, y = pair
    assert key(x) != key(y)
    assert key((x, 1)) != key((y, 1))


def test_keys_index_like_their_items():
    k = key("plan", "medium", False)
    assert len(k) == 3 and k[1] == "medium"
    assert "medium" in repr(k)
    with pytest.raises(IndexError):
        k[3]


def test_identity_objects_compare_by_identity_and_stay_alive():
    a, b = _ByIdentity(), _ByIdentity()
    ka = key(a)
    assert ka == key(a) and ka != key(b)
    del a  # the key holds it: its address cannot be reused by another object meanwhile
    assert ka[0].__class__ is _ByIdentity


def test_other_objects_keep_python_equality():
    assert key(_ByValue(3), 1) == key(_ByValue(3), 1)
    assert hash(key(_ByValue(3), 1)) == hash(key(_ByValue(3), 1))
    assert key(_ByValue(3), 1) != key(_ByValue(4), 1)
    assert key(_ByValue(3)) != key(3)


def test_only_tuples_make_keys():
    with pytest.raises(TypeError):
        _C._op_key([1, 2])
