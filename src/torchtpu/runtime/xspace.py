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


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one message: an int for varint and fixed fields, bytes for
    length-delimited ones (sub-messages, strings)."""
    out: list[tuple[int, int | bytes]] = []
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


def _metadata_names(plane: list[tuple[int, int | bytes]]) -> dict[int, str]:
    names: dict[int, str] = {}
    for field, entry in plane:
        if field != 4:
            continue
        key, meta = 0, b""
        for f, v in _fields(entry):  # map entry: key 1, value 2
            if f == 1:
                key = _signed(v)
            elif f == 2:
                meta = v
        name = display = ""
        for f, v in _fields(meta):
            if f == 2:
                name = v.decode("utf-8", "replace")
            elif f == 4:
                display = v.decode("utf-8", "replace")
        names[key] = name or display
    return names


def device_events(xspace: bytes, lines: tuple[str, ...] = ("XLA Modules",)) -> list[DeviceEvent]:
    """The events of the named lines on every device plane, in (device, line, start) order."""
    events: list[DeviceEvent] = []
    for field, plane_bytes in _fields(xspace):
        if field != 1:
            continue
        plane = _fields(plane_bytes)
        name = next((v.decode("utf-8", "replace") for f, v in plane if f == 2), "")
        match = _DEVICE_PLANE.match(name)
        if not match:
            continue
        device = int(match.group(2))
        names = _metadata_names(plane)
        for f, line_bytes in plane:
            if f != 3:
                continue
            line = _fields(line_bytes)
            line_name = next((v.decode("utf-8", "replace") for lf, v in line if lf == 2), "")
            if line_name not in lines:
                continue
            base_ps = 1000 * next((_signed(v) for lf, v in line if lf == 3), 0)
            for lf, ev in line:
                if lf != 4:
                    continue
                meta = offset = duration = 0
                for ef, v in _fields(ev):
                    if ef == 1:
                        meta = _signed(v)
                    elif ef == 2:
                        offset = _signed(v)
                    elif ef == 3:
                        duration = _signed(v)
                events.append(DeviceEvent(device, line_name, names.get(meta, ""), base_ps + offset, duration))
    events.sort(key=lambda e: (e.device, e.line, e.start_ps))
    return events
