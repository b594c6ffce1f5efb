"""PJRT_Event: completion of asynchronous work (execute, transfers)."""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._pjrt_ffi import ffi
from .errors import PjrtError
from .plugin import EVENT_AWAIT_SIZE, EVENT_AWAIT_T, EVENT_DESTROY_SIZE, EVENT_DESTROY_T, Plugin

if TYPE_CHECKING:
    from .client import Client

_log = logging.getLogger(__name__)

OnReadyCallback = Callable[[PjrtError | None], None]

# One C callback for every event, created once and never freed: a per-event
# ffi.callback would have to outlive its own invocation, which is awkward to
# guarantee. user_arg carries an integer key into _pending instead.
_pending: dict[int, tuple[Event, OnReadyCallback]] = {}
_keys = itertools.count(1)
_pending_lock = threading.Lock()
# Entries whose callback already ran, kept so that the Event (and whatever the
# user's callback captured) is not destroyed on the XLA thread while PJRT is
# still inside the notification; freed from a Python-side call later.
_deferred: list[Any] = []


def _dispatch(error: Any, user_arg: Any) -> None:
    key = int(ffi.cast("uintptr_t", user_arg))
    with _pending_lock:
        entry = _pending.pop(key, None)
    if entry is None:  # cannot happen unless PJRT fires twice
        return
    event, callback = entry
    try:
        callback(event._plugin.take_error(error) if error else None)
    finally:
        _deferred.append(entry)


def _callback_failed(exc_type: type, exc: BaseException, tb: object) -> None:
    # cffi calls this instead of letting the exception unwind into XLA.
    _log.error("exception in a PJRT on_ready callback", exc_info=(exc_type, exc, tb))


_ON_READY = ffi.callback("void(PJRT_Error*, void*)", _dispatch, onerror=_callback_failed)


def drain_deferred() -> None:
    """Release events whose on_ready callback has run (call from Python code)."""
    while _deferred:
        try:
            _deferred.pop()
        except IndexError:
            break


_is_finalizing = sys.is_finalizing
_NULL = ffi.NULL
_new = ffi.new


class Event:
    """Owns one ``PJRT_Event*``; destroys it exactly once.

    ``client`` (if given) is kept alive as long as the event; once it is
    closed the event is leaked instead of destroyed. A NULL handle stands for
    an event that is already ready.
    """

    __slots__ = ("__weakref__", "_client", "_handle", "_plugin")

    def __init__(self, plugin: Plugin, handle: Any, client: Client | None = None) -> None:
        self._plugin = plugin
        self._handle = handle
        self._client = client

    def wait(self) -> None:
        """Block until ready; raise PjrtError if the work failed."""
        handle = self._handle
        if handle == _NULL:
            return
        p = self._plugin
        # cffi releases the GIL for the duration of the call.
        err = p.event_await_fn(_new(EVENT_AWAIT_T, [EVENT_AWAIT_SIZE, _NULL, handle]))
        if err:
            raise p.take_error(err)

    def is_ready(self) -> bool:
        handle = self._handle
        if handle == _NULL:
            return True
        p = self._plugin
        args = p.new_args("PJRT_Event_IsReady")
        args.event = handle
        p.check(p.api.PJRT_Event_IsReady(args))
        return bool(args.is_ready)

    def error(self) -> PjrtError | None:
        """The event's error once it is ready (None if it succeeded)."""
        handle = self._handle
        if handle == _NULL:
            return None
        if not self.is_ready():
            raise RuntimeError("Event.error() called before the event is ready")
        p = self._plugin
        args = p.new_args("PJRT_Event_Error")
        args.event = handle
        err = p.api.PJRT_Event_Error(args)
        return p.take_error(err) if err else None

    def on_ready(self, callback: OnReadyCallback) -> None:
        """Call ``callback(error_or_None)`` once the event is ready.

        The callback runs on an XLA worker thread (or right here if the event
        is already ready); it must be quick and must not block on other events.
        """
        drain_deferred()
        handle = self._handle
        if handle == _NULL:
            callback(None)
            return
        key = next(_keys)
        with _pending_lock:
            _pending[key] = (self, callback)
        p = self._plugin
        args = p.new_args("PJRT_Event_OnReady")
        args.event = handle
        args.callback = _ON_READY
        args.user_arg = ffi.cast("void*", key)
        err = p.api.PJRT_Event_OnReady(args)
        if err:
            with _pending_lock:
                _pending.pop(key, None)
            raise p.take_error(err)

    def destroy(self) -> None:
        """Free the PJRT event now (idempotent). Pending on_ready still fires."""
        handle = self._handle
        if handle:
            self._handle = _NULL
            client = self._client
            if client is None or client._handle:  # else leaked: client is gone
                self._plugin.destroy_event(handle)

    def __del__(self) -> None:
        # Inlined destroy(): one of these runs per execute. At interpreter
        # shutdown leak instead (the plugin stays mapped, RTLD_NODELETE).
        handle = self._handle
        client = self._client
        if handle and (client is None or client._handle) and not _is_finalizing():
            self._handle = _NULL
            p = self._plugin
            err = p.event_destroy_fn(_new(EVENT_DESTROY_T, [EVENT_DESTROY_SIZE, _NULL, handle]))
            if err:
                p.take_error(err)  # frees it; a finalizer cannot report it

    def __repr__(self) -> str:
        if self._handle == _NULL:
            return "Event(ready)"
        return f"Event(ready={self.is_ready()})"
