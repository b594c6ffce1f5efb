"""Device time of launched programs, for torch.profiler (``torchtpu._profiler``).

While a profile with device activities records, each program launch is timed and reported to the
Kineto session with the correlation id of the profiled op that launched it, so ``key_averages()``
shows device time per op and the Chrome trace a device row. Two sources of the times:

* **the plugin's device timeline** where the plugin has a profiler (libtpu's PJRT profiler
  extension; ``TORCH_TPU_PROFILER_PLUGIN_TIMELINE``, on by default): at the first timed launch the
  plugin's profiler starts; at ``drain()`` (``torch.tpu.synchronize()``, which torch.profiler calls
  before it collects) it stops, and each launch gets the device start and duration of its program
  from the timeline's "XLA Modules" line: the k-th launch on a device is the k-th module run there
  (a TPU core runs its programs in launch order). The timeline's clock has its own origin; it is
  placed on the host clock at the profiler's start, or later where that would put a program's
  start before its launch. Where the launches and the module runs do not pair up one to one, the
  completion-event times below are used for that device, with a warning.
* **completion events** elsewhere (the CPU emulator): from the launch (or, when the device is still
  busy, from the end of its previous program) to the completion of its outputs, reported by PJRT's
  completion event: host clock readings, which on a TPU include the notification's delay.

Times are ns since the Unix epoch, as the profiler's CPU events.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..runtime import env, plugin_profiler, xspace

try:
    from .. import _profiler
except ImportError:  # built without Kineto's headers: no device rows, nothing else changes
    _profiler = None

_lock = threading.Lock()
_last_end: dict[int, int] = {}
_pending = 0
_drained = threading.Condition(_lock)


@dataclass
class _Timed:
    name: str
    correlation: int
    device: int
    launched_ns: int
    start_ns: int = 0  # completion-event times, set when the outputs are ready
    end_ns: int = 0


@dataclass
class _TimelineSession:
    """One run of the plugin's profiler, and the launches made while it ran."""
    profiler: Any
    started_ns: int
    launches: list[_Timed] = field(default_factory=list)


_session: _TimelineSession | None = None
_warned: set[str] = set()


def active() -> bool:
    """Whether a profile with device activities is recording (one native call)."""
    return _profiler is not None and _profiler.active()


@functools.cache
def _timeline_api(plugin: Any) -> Any | None:
    return plugin_profiler.profiler_api(plugin)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"torchtpu profiler: {message}", RuntimeWarning, stacklevel=3)


def _timeline_session(executable: Any) -> _TimelineSession | None:
    """The running plugin profiler session, started now if this plugin has one and none runs."""
    global _session
    if _session is not None:
        return _session
    if not env.read("TORCH_TPU_PROFILER_PLUGIN_TIMELINE"):
        return None
    plugin = getattr(executable, "plugin", None)
    api = _timeline_api(plugin) if plugin is not None else None
    if api is None:
        return None
    started = time.time_ns()
    try:
        profiler = plugin_profiler.PluginProfiler(api)
        profiler.start()
    except plugin_profiler.PluginProfilerError as e:  # e.g. another profiler (JAX's) holds the device
        _warn_once("start", f"the plugin's device timeline did not start ({e}); device times come from "
                   "completion events")
        return None
    _session = _TimelineSession(profiler, started)
    return _session


def launch(executable: Any, buffers: list[Any], device: int, donate: Any) -> tuple[list[Any], Any]:
    """``executable.execute`` with its device time reported to the profiler; returns its outputs
    and completion event."""
    global _pending
    timed = _Timed(getattr(executable, "label", "program"), _profiler.correlation_id(), device, 0)
    with _lock:
        session = _timeline_session(executable)
    timed.launched_ns = time.time_ns()
    outs, event = executable.execute(buffers, device, donate)
    with _lock:
        _pending += 1
        if session is not None:
            session.launches.append(timed)

    def done(error: Any) -> None:
        global _pending
        end = time.time_ns()
        with _lock:
            timed.start_ns, timed.end_ns = max(timed.launched_ns, _last_end.get(device, 0)), end
            _last_end[device] = end
            _pending -= 1
            _drained.notify_all()
        if session is None:
            _profiler.record(timed.name, timed.correlation, device, timed.start_ns, timed.end_ns)

    event.on_ready(done)
    return outs, event


def drain(timeout_s: float = 5.0) -> None:
    """Wait until every timed launch has reported (synchronize() calls it, and torch.profiler
    synchronizes the device before it collects the trace); a running plugin timeline is collected
    and its launches reported."""
    global _session
    with _lock:
        _drained.wait_for(lambda: _pending == 0, timeout_s)
        session = _session
    if session is None:
        return
    try:
        session.profiler.stop()
        data = session.profiler.collect()
        session.profiler.close()
        modules = xspace.device_events(data, ("XLA Modules",))
    except (plugin_profiler.PluginProfilerError, ValueError) as e:
        _warn_once("collect", f"the plugin's device timeline could not be read ({e}); device times come "
                   "from completion events")
        modules = None
    finally:
        with _lock:
            _session = None
    for event in device_times(session.launches, modules, session.started_ns):
        _profiler.record(*event)


def device_times(launches: list[_Timed], modules: list[xspace.DeviceEvent] | None,
                 started_ns: int) -> list[tuple[str, int, int, int, int]]:
    """(name, correlation, device, start ns, end ns) per launch: from the plugin timeline's module
    runs where they pair up with the launches of a device, else from its completion events."""
    out: list[tuple[str, int, int, int, int]] = []
    for device in sorted({t.device for t in launches}):
        mine = [t for t in launches if t.device == device]
        runs = [m for m in modules or () if m.device == device]
        if modules is not None and len(runs) != len(mine):
            _warn_once(f"pair{device}", f"tpu:{device}'s device timeline has {len(runs)} program runs for "
                       f"{len(mine)} launches; device times come from completion events")
        if modules is None or len(runs) != len(mine):
            out += [(t.name, t.correlation, device, t.start_ns, t.end_ns) for t in mine]
            continue
        # the timeline's origin on the host clock: no program starts before its launch
        origin = max([started_ns] + [t.launched_ns - m.start_ps // 1000 for t, m in zip(mine, runs)])
        out += [(t.name, t.correlation, device, origin + m.start_ps // 1000,
                 origin + (m.start_ps + m.duration_ps) // 1000) for t, m in zip(mine, runs)]
    return out
