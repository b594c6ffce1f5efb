"""The device events of a serialized ``XSpace`` (tsl/profiler/protobuf/xplane.proto).

Only what a device timeline needs is read: each plane named ``/device:<KIND>:<N>``, its lines
(e.g. "XLA Modules": one event per program run; "XLA Ops": one per HLO op) and their events'
names, offsets and durations. The protobuf wire format is read directly: the schema is a handful
of fields, and neither protobuf's runtime nor JAX (which ships a parser) is a torchtpu dependency.
Field numbers, from xplane.proto:
  XSpace: planes 1.  XPlane: id 1, name 2, lines 3, event_metadata 4 (map<int64, XEventMetadata>).
  XLine: id 1, name 2, timestamp_ns 3, events 4.  XEvent: metadata_id 1, offset_ps 2, duration_ps 3.
  XEventMetadata: id 1, name 2, display_name 4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DEVICE_PLANE = re.compile(r"^/device:([A-Z]+):(\d+)$")
Fields = list[tuple[int, int | bytes]]  # one message: (field number, int or bytes) in wire order


@dataclass(frozen=True)
class DeviceEvent:
    device: int       # N of the plane /device:KIND:N
    line: str         # e.g. "XLA Modules", "XLA Ops"
    name: str         # the event metadata's name (a module: "name(program id)"; an op: its HLO)
    start_ps: int     # line timestamp_ns * 1000 + offset_ps: relative to the profiler's own origin
    duration_ps: int


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("XSpace: truncated varint")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> Fields:
    """(field number, value) of one message: an int for varint and fixed fields, bytes for
    length-delimited ones (sub-messages, strings)."""
    out: Fields = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            n, i = _varint(data, i)
            if i + n > len(data):
                raise ValueError("XSpace: a field runs past the end of its message")
            value, i = data[i:i + n], i + n
        elif wire == 1:
            value, i = int.from_bytes(data[i:i + 8], "little"), i + 8
        elif wire == 5:
            value, i = int.from_bytes(data[i:i + 4], "little"), i + 4
        else:
            raise ValueError(f"XSpace: unsupported wire type {wire}")
        out.append((field, value))
    return out


def encode_field(number: int, payload: bytes | int) -> bytes:
    """One protobuf field in the wire format: a varint for an int, length-delimited for bytes (to
    build a ``ProfileOptions`` for the plugin's profiler, or a small XSpace)."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            low, n = n & 0x7F, n >> 7
            out += bytes([low | (0x80 if n else 0)])
            if not n:
                return out

    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _values(fields: Fields, number: int) -> list:
    return [v for f, v in fields if f == number]


def _scalar(fields: Fields, number: int) -> int:
    """An int64 field (the last one, as protobuf reads a repeated scalar); 0 where absent."""
    found = _values(fields, number)
    return _signed(found[-1]) if found else 0


def _text(fields: Fields, number: int) -> str:
    found = _values(fields, number)
    return found[-1].decode("utf-8", "replace") if found else ""


def _metadata_names(plane: Fields) -> dict[int, str]:
    """XPlane.event_metadata: id -> name (or display name)."""
    names: dict[int, str] = {}
    for entry in map(_fields, _values(plane, 4)):  # map entry: key 1, value 2
        value = _values(entry, 2)
        meta = _fields(value[-1]) if value else []
        names[_scalar(entry, 1)] = _text(meta, 2) or _text(meta, 4)
    return names


def device_events(xspace: bytes, lines: tuple[str, ...] = ("XLA Modules",)) -> list[DeviceEvent]:
    """The events of the named lines on every device plane, in (device, line, start) order."""
    events: list[DeviceEvent] = []
    for plane in map(_fields, _values(_fields(xspace), 1)):
        match = _DEVICE_PLANE.match(_text(plane, 2))
        if not match:
            continue
        device, names = int(match.group(2)), _metadata_names(plane)
        for line in map(_fields, _values(plane, 3)):
            line_name = _text(line, 2)
            if line_name not in lines:
                continue
            base_ps = 1000 * _scalar(line, 3)
            events += [DeviceEvent(device, line_name, names.get(_scalar(event, 1), ""),
                                   base_ps + _scalar(event, 2), _scalar(event, 3))
                       for event in map(_fields, _values(line, 4))]
    events.sort(key=lambda e: (e.device, e.line, e.start_ps))
    return events
