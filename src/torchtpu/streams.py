"""``torch.tpu.Stream`` and ``torch.tpu.Event``, as ``torch.cuda``'s.

A device runs its launches in order (one queue per device, as a single CUDA stream), so a
stream is a placeholder that only orders what it already orders, and an event marks "every
launch so far on this device": it completes when the latest launch does. Timing events take
the host clock when that launch completes (a PJRT completion callback), so ``elapsed_time``
measures device work between two marks, as CUDA's timing events do, not host dispatch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from . import _C
from .engine import deferred, executor


class Stream:
    """A placeholder: the device's one in-order queue."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        from .device_module import _index  # (device_module imports this module)

        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def synchronize(self) -> None:
        executor.synchronize()

    def wait_stream(self, stream: Stream) -> None:
        pass  # one queue: already ordered

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        """Whether everything launched on the device has completed."""
        mark = Event()
        mark.record(self)
        return mark.query()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)


def current_stream(device: Any = None) -> Stream:
    return Stream(device)


def default_stream(device: Any = None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    yield


def set_stream(s: Stream) -> None:
    pass


class Event:
    """Marks the work launched so far on a device; with ``enable_timing``, when it completed."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        if interprocess:
            raise NotImplementedError("torchtpu: interprocess events are not supported on tpu")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._recorded = False
        self._ready: Any = None  # the runtime event of the marked launch; None: nothing was in flight
        self._done = threading.Event()  # set with _completed_at (timing events)
        self._completed_at = 0.0

    def record(self, stream: Stream | None = None) -> None:
        device = stream.device.index if stream is not None else _C._current_device()
        deferred.flush()  # ops recorded in DeferAndFuse launch now: the mark follows them
        self._done = threading.Event()
        self._ready = executor.latest_ready_event(device)
        self._recorded = True
        if not self.enable_timing:
            return
        if self._ready is None:
            self._mark_completed(None)
        else:  # runs on an XLA thread when the launch completes (at once if it already has)
            self._ready.on_ready(self._mark_completed)

    def _mark_completed(self, error: Any) -> None:
        self._completed_at = time.perf_counter()
        self._done.set()

    def query(self) -> bool:
        return self._ready is None or self._ready.is_ready()

    def synchronize(self) -> None:
        if self._ready is not None:
            self._ready.wait()

    def wait(self, stream: Stream | None = None) -> None:
        pass  # one in-order queue per device: later launches already follow the mark

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's completion and ``end_event``'s (waits for both)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if not (self._recorded and end_event._recorded):
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        for e in (self, end_event):
            e.synchronize()
            e._done.wait()  # the completion callback may run just after the wait returns
        return (end_event._completed_at - self._completed_at) * 1e3

    def __repr__(self) -> str:
        state = "recorded" if self._recorded else "unrecorded"
        return f"<torch.tpu.Event {state}, enable_timing={self.enable_timing}>"


class GuardEvents:
    """The events behind ``torch.Event(device="tpu")`` (PyTorch's device-generic events, which
    call the C++ device guard): each handle the guard holds is a key here, so they record, wait
    and time as :class:`Event` does."""

    def __init__(self) -> None:
        self._events: dict[int, Event] = {}
        self._next = 1

    def record(self, key: int, device: int, timing: bool) -> int:
        event = self._events.get(key)  # (a re-recorded event keeps its key and its timing flag)
        if event is None:
            key, self._next = self._next, self._next + 1
            event = self._events[key] = Event(enable_timing=timing)
        event.record(Stream(device))
        return key

    def query(self, key: int) -> bool:
        event = self._events.get(key)
        return event is None or event.query()

    def synchronize(self, key: int) -> bool:
        event = self._events.get(key)
        if event is not None:
            event.synchronize()
        return True

    def elapsed_time(self, start: int, end: int) -> float:
        if start not in self._events or end not in self._events:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return self._events[start].elapsed_time(self._events[end])

    def destroy(self, key: int) -> bool:
        self._events.pop(key, None)
        return True
