"""Index checks: out-of-range indices (and integer division by zero) raise, as on the CPU, in every mode.

Debug mode reads the index to the host as the (synchronous) op returns and raises
there, naming the offending value. Strict and DeferAndFuse must not wait for the
device at every indexing op, so each op's bounds (lowering/index_bounds.py) become
one more small device op that folds the outcome into a per-device flag. The next synchronization
(a read to the host, ``torch.tpu.synchronize()``) reads the flag and raises the
CPU's exception there: asynchronously, as CUDA reports a device-side assert. The
op's own result is already computed (XLA clamps the index), and the error
surfaces before any value reaches the host. Each thread folds its checks into its own flag and
its synchronizations read that one (and those of threads that have ended): an op's error is
raised in the thread that called the op, not in another thread that happened to synchronize
first (a threaded conformance sweep on the TPU saw a scatter's error raised in another op's thread).

Graphs compiled with ``torch.compile`` fold the checks of their indexing nodes into the
same flag (engine/graph_runner.py), and their LAPACK-info checks too (linalg.inv, cholesky,
lu_factor...: ``_linalg_check_errors``, which raises PyTorch's own message). A graph run at bucket sizes (dynamic shapes) checks only
the ranges that do not depend on a symbolic size.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from .. import storage as st
from ..lowering.index_bounds import INDEX_BOUNDS_FLAG, Bound
from ..runtime import Buffer

_ASYNC_NOTE = (" (torchtpu: detected on the device by an earlier op and reported at this synchronization; "
               "run with TORCH_TPU_LAUNCH_BLOCKING=1 to raise at the op itself)")

_lock = threading.Lock()
# (device, the thread whose ops it checks) -> its latest flag, while unread
_FlagKey = tuple[torch.device, threading.Thread]
_flags: dict[_FlagKey, torch.Tensor] = {}
_zeros: dict[torch.device, torch.Tensor] = {}  # device -> a clear flag, the start of each chain
# (device, thread) -> the flag a compiled graph took last (see set_flag)
_graph_inputs: dict[_FlagKey, torch.Tensor] = {}
# code -> (exception type, message); a check's code depends only on what it reports, so the
# same op call records the same program (and hits the same cached executable) every time
_reports: list[tuple[type[Exception], str]] = [(RuntimeError, "")]
_codes: dict[tuple[type[Exception], str], int] = {}


def check_on_host(bounds: Sequence[Bound]) -> None:
    """Debug mode: read each index and raise the CPU's error for the first offending value."""
    for bound in bounds:
        if bound.index.numel() == 0:
            continue
        host = bound.index.cpu().reshape(-1).to(torch.int64)
        bad = host == 0 if bound.nonzero else (host < bound.low) | (host >= bound.high)
        if bound.exempt is not None:
            bad &= host != bound.exempt
        if bool(bad.any()):
            position = int(bad.nonzero()[0, 0])
            raise bound.error(bound.message.format(value=int(host[position]), position=position))


def check_on_device(bounds: Sequence[Bound]) -> None:
    """Strict and DeferAndFuse: fold each bound into its device's flag (no host wait)."""
    for bound in bounds:
        index = bound.index
        if index.numel() == 0:
            continue
        if index.device.type != "tpu":  # a host index: checking it costs no device wait
            check_on_host([bound])
            continue
        code = code_for(bound.error, bound.message)
        with _lock:
            _flags[_key(index.device)] = INDEX_BOUNDS_FLAG(current_flag(index.device), index, bound.low,
                                                           bound.high, bound.exempt, code, bound.nonzero)


def _key(device: torch.device) -> _FlagKey:
    return device, threading.current_thread()


def current_flag(device: torch.device) -> torch.Tensor:
    """This thread's flag on the device to fold the next checks into (a compiled graph takes it
    as an input)."""
    key = _key(device)
    flag = _flags.get(key)
    if flag is not None and _never_computed(flag):
        # the DeferAndFuse graph folding the last checks failed, and raised that: those checks
        # never ran, and chaining onto a value that will never exist would fail every later op
        del _flags[key]
        flag = None
    if flag is None:
        flag = _zero_flag(device)
    return flag


def _zero_flag(device: torch.device) -> torch.Tensor:
    """The device's clear flag, made once. A transfer, not a zeros op: in DeferAndFuse that op would
    join the graph being recorded, and were that graph to fail, this cached flag would never have
    a value."""
    flag = _zeros.get(device)
    if flag is None:
        flag = _zeros[device] = torch.zeros(3, dtype=torch.int64).to(device)
    return flag


def ready_for_capture(device: torch.device) -> None:
    """Make the device's zero flag now: a ``torch.tpu.graph`` capture cannot copy it from the host,
    and its first index check would (after Debug-mode warm-up steps, which check on the host)."""
    with _lock:
        _zero_flag(device)


def _never_computed(flag: torch.Tensor) -> bool:
    from . import deferred

    buf = st.storage_buffer(flag.untyped_storage())
    return isinstance(buf, deferred.Pending) and deferred.failure_of(buf) is not None


def set_flag(device: torch.device, flag: torch.Tensor) -> None:
    """A compiled graph's flag output: ``current_flag(device)`` with the graph's checks folded in."""
    key = _key(device)
    with _lock:
        # The flag the graph took stays held until the next graph's: otherwise it is a dead input
        # (donated) when it came from an earlier graph and a live one when it is the clear flag of
        # _zeros, and a recorded step's program would compile in both variants (step_recording.py).
        _graph_inputs[key] = _flags.get(key, _zeros.get(device))
        _flags[key] = flag


def raise_pending() -> None:
    """At a synchronization: read this thread's unread flags (and those of ended threads), raise
    the first failed check's error."""
    if not _flags:
        return
    from . import deferred  # (imports the executor, which imports this module)

    # Launch everything recorded first. A flag computed by a graph already launched is read
    # as soon as that graph has run: had the rest (an optimizer step's tail, say) waited for
    # the read, the device would idle while the host flushed it, and the next step's
    # recording could not overlap with it.
    deferred.flush()
    me = threading.current_thread()
    with _lock:
        # taken out before reading: the reads below synchronize too
        flags = [_flags.pop(k) for k in list(_flags) if k[1] is me or not k[1].is_alive()]
        for k in [k for k in _graph_inputs if not k[1].is_alive()]:
            del _graph_inputs[k]
    for flag in flags:
        values = _read(flag)
        if values is None:  # its graph failed and raised that already: the check never ran
            continue
        code, value, position = (int(v) for v in values)
        if code:
            error, message = _reports[code]
            raise error(message.format(value=value, position=position) + _ASYNC_NOTE)


def _read(flag: torch.Tensor) -> Any:
    """The flag's values, straight from its buffer (it owns the whole of it); None where the
    DeferAndFuse graph that computes it failed."""
    from . import deferred

    buf = st.storage_buffer(flag.untyped_storage())
    if not isinstance(buf, Buffer):  # recorded by another thread in DeferAndFuse, not run yet
        deferred.flush()
        buf = st.storage_buffer(flag.untyped_storage())
        if isinstance(buf, deferred.Pending):
            return None
    return buf.to_host()


def code_for(error: type[Exception], message: str) -> int:
    """The flag code that reports ``error(message)``."""
    key = (error, message)
    code = _codes.get(key)
    if code is None:
        with _lock:
            code = _codes.setdefault(key, len(_reports))
            if code == len(_reports):
                _reports.append(key)
    return code
