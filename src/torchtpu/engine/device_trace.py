"""Device time of launched programs, for torch.profiler (``torchtpu._profiler``).

While a profile with device activities records, each program launch is timed: from the launch
(or, when the device is still busy, from the end of its previous program, as a TPU core runs one
program at a time) to the completion of its outputs, reported by PJRT's completion event. The
event goes to the Kineto session with the correlation id of the profiled op that launched it, so
``key_averages()`` shows device time per op and the Chrome trace a device row. Times are host
clock readings (ns since the Unix epoch, as the profiler's CPU events): on the CPU emulator they
are the emulated device's execution, on a TPU they include the completion's notification delay.
"""

from __future__ import annotations

import threading
import time
from typing import Any

try:
    from .. import _profiler
except ImportError:  # built without Kineto's headers: no device rows, nothing else changes
    _profiler = None

_lock = threading.Lock()
_last_end: dict[int, int] = {}
_pending = 0
_drained = threading.Condition(_lock)


def active() -> bool:
    """Whether a profile with device activities is recording (one native call)."""
    return _profiler is not None and _profiler.active()


def launch(executable: Any, buffers: list[Any], device: int, donate: Any) -> tuple[list[Any], Any]:
    """``executable.execute`` with its device time reported to the profiler; returns its outputs
    and completion event."""
    global _pending
    correlation = _profiler.correlation_id()
    name = getattr(executable, "label", "program")
    launched = time.time_ns()
    outs, event = executable.execute(buffers, device, donate)
    with _lock:
        _pending += 1

    def done(error: Any) -> None:
        global _pending
        end = time.time_ns()
        with _lock:
            start = max(launched, _last_end.get(device, 0))
            _last_end[device] = end
            _pending -= 1
            _drained.notify_all()
        _profiler.record(name, correlation, device, start, end)

    event.on_ready(done)
    return outs, event


def drain(timeout_s: float = 5.0) -> None:
    """Wait until every timed launch has reported (synchronize() calls it, and torch.profiler
    synchronizes the device before it collects the trace)."""
    with _lock:
        _drained.wait_for(lambda: _pending == 0, timeout_s)
