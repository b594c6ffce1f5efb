from __future__ import annotations

import pytest

from torchtpu.runtime.compile_options import _varint, compile_options, device_assignment


def test_minimal_bytes():
    # executable_build_options { num_replicas: 1 num_partitions: 1 }
    assert compile_options(portable=False) == b"\x1a\x04\x20\x01\x28\x01"
    # ... plus compile_portable_executable: true
    assert compile_options() == b"\x1a\x04\x20\x01\x28\x01\x20\x01"
    # device_ordinal = 1 comes first (field 1)
    assert compile_options(device_ordinal=1, portable=False) == b"\x1a\x06\x08\x01\x20\x01\x28\x01"


def test_varint():
    assert _varint(0) == b"\x00"
    assert _varint(300) == b"\xac\x02"
    assert _varint(-1) == b"\xff" * 9 + b"\x01"


def test_device_assignment():
    # replica_count 1, computation_count 1, computation_devices { replica_device_ids: [3] }
    assert device_assignment([[3]]) == b"\x08\x01\x10\x01\x1a\x03\x0a\x01\x03"


@pytest.mark.emulator_only("the CPU plugin's own compile option")
def test_env_overrides_compile(client, add_source):
    opts = compile_options(env_overrides={"xla_cpu_enable_fast_math": False})
    exe = client.compile(add_source, options=opts)
    assert exe.num_outputs == 1


def test_invalid():
    with pytest.raises(ValueError):
        compile_options(num_replicas=0)
    with pytest.raises(ValueError):
        compile_options(device_ids=[[0]])  # portable + assignment


def test_effort_fields(client, add_source):
    """exec_time_optimization_effort (field 20, a float) and optimization_level (24, an enum) of
    ExecutableBuildOptionsProto, for trading a TPU's compile time against run time; the plugin
    takes them (the CPU plugin ignores them)."""
    opts = compile_options(portable=False, exec_time_effort=-1.0, optimization_level=9)
    # build options: num_replicas, num_partitions, then field 20 (fixed32 -1.0f), field 24 (varint 9)
    assert opts == b"\x1a\x0d\x20\x01\x28\x01\xa5\x01\x00\x00\x80\xbf\xc0\x01\x09"
    exe = client.compile(add_source, options=compile_options(exec_time_effort=-0.5, optimization_level=19))
    assert exe.num_outputs == 1
    with pytest.raises(ValueError):
        compile_options(exec_time_effort=2.0)
