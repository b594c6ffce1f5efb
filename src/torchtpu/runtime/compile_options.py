"""A minimal encoder for xla.CompileOptionsProto (serialized protobuf).

PJRT_Client_Compile takes the options as protobuf bytes. Pulling in protobuf
and XLA's .proto files for the handful of fields we set is not worth it, so
this writes the wire format by hand. Field numbers come from
xla/pjrt/proto/compile_options.proto and xla/xla_data.proto.

Never pass empty options: the CPU plugin then CHECK-fails
(``replica_count > 0``) and aborts the whole process.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 -> two's complement, 10 bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _int_field(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + _varint(int(value))


def _float_field(field: int, value: float) -> bytes:
    return _key(field, _I32) + struct.pack("<f", float(value))


def _bytes_field(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(payload)) + payload


def _packed_ints(field: int, values: Sequence[int]) -> bytes:
    return _bytes_field(field, b"".join(_varint(int(v)) for v in values))


def device_assignment(devices: Sequence[Sequence[int]]) -> bytes:
    """xla.DeviceAssignmentProto for ``devices[replica][partition]`` = device id."""
    replicas = len(devices)
    partitions = len(devices[0]) if replicas else 0
    out = _int_field(1, replicas) + _int_field(2, partitions)
    for p in range(partitions):
        # ComputationDevice { repeated int64 replica_device_ids = 1; }
        out += _bytes_field(3, _packed_ints(1, [devices[r][p] for r in range(replicas)]))
    return out


def _option_override(value: str | float) -> bytes:
    # OptionOverrideProto: oneof string=1, bool=2, int64=3, double=4
    if isinstance(value, bool):
        return _int_field(2, int(value))
    if isinstance(value, int):
        return _int_field(3, value)
    if isinstance(value, float):
        return _key(4, _I64) + struct.pack("<d", value)
    if isinstance(value, str):
        return _bytes_field(1, value.encode())
    raise TypeError(f"unsupported option override value {value!r}")


def compile_options(
    *,
    device_ordinal: int = -1,
    num_replicas: int = 1,
    num_partitions: int = 1,
    portable: bool = True,
    device_ids: Sequence[Sequence[int]] | None = None,
    env_overrides: Mapping[str, str | float] | None = None,
    exec_time_effort: float | None = None,
    optimization_level: int | None = None,
) -> bytes:
    """Serialized CompileOptionsProto.

    ``portable`` (compile_portable_executable) builds an executable without a
    fixed device assignment, so one compilation can run on any addressable
    device via ``execute_device``. ``device_ids`` fixes the assignment instead
    (then ``portable`` must be False). ``env_overrides`` are per-compile
    XLA debug options, e.g. ``{"xla_cpu_enable_fast_math": False}``. ``exec_time_effort`` (in
    [-1, 1], XLA's baseline 0) and ``optimization_level`` (ExecutionOptions.EffortLevel: 9, 19, 29,
    39 for O0..O3) trade run time for compile time where the backend reads them.
    """
    if num_replicas < 1 or num_partitions < 1:
        raise ValueError("num_replicas and num_partitions must be >= 1")
    if portable and device_ids is not None:
        raise ValueError("a portable executable cannot have a device assignment")
    # ExecutableBuildOptionsProto
    build = b""
    if device_ordinal != -1:
        build += _int_field(1, device_ordinal)
    build += _int_field(4, num_replicas) + _int_field(5, num_partitions)
    if device_ids is not None:
        build += _bytes_field(9, device_assignment(device_ids))
    if exec_time_effort is not None:
        if not -1.0 <= exec_time_effort <= 1.0:
            raise ValueError(f"exec_time_effort must be in [-1, 1], not {exec_time_effort}")
        build += _float_field(20, exec_time_effort)
    if optimization_level is not None:
        build += _int_field(24, optimization_level)
    out = _bytes_field(3, build)
    if portable:
        out += _int_field(4, 1)
    for name, value in (env_overrides or {}).items():
        # map<string, OptionOverrideProto> = repeated entry {key=1, value=2}
        entry = _bytes_field(1, name.encode()) + _bytes_field(2, _option_override(value))
        out += _bytes_field(7, entry)
    return out
