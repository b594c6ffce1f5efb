"""``torch.tpu.set_sync_debug_mode``: report the operations that make the host wait for the device.

A device-to-host read (``.cpu()``, ``.item()``, printing, ``bool(t)``, and the size reads of
data-dependent ops such as ``nonzero``, ``unique`` or ``repeat_interleave`` without
``output_size``) waits for the work it reads; in DeferAndFuse it is also where recorded ops are
compiled and launched. As with ``torch.cuda.set_sync_debug_mode``, mode 1 ("warn") warns at each
one and mode 2 ("error") raises, so a training loop can be checked for hidden waits. An explicit
``torch.tpu.synchronize()`` is not reported: it is asked for.
"""

from __future__ import annotations

import warnings

_NAMES = {"default": 0, "warn": 1, "error": 2}
_mode = 0


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """0 or "default": nothing; 1 or "warn": a warning at each synchronizing operation; 2 or
    "error": a RuntimeError instead."""
    global _mode
    if isinstance(debug_mode, str):
        if debug_mode not in _NAMES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _NAMES[debug_mode]
    if not isinstance(debug_mode, int) or isinstance(debug_mode, bool) or debug_mode not in (0, 1, 2):
        raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error` or 0, 1, 2")
    _mode = debug_mode


def get_sync_debug_mode() -> int:
    """The mode set by :func:`set_sync_debug_mode` (0 default, 1 warn, 2 error)."""
    return _mode


def note_sync(what: str) -> None:
    """Called where the host is about to wait for the device (``what``: the operation)."""
    if _mode == 0:
        return
    message = f"called a synchronizing TPU operation: {what}"
    if _mode == 2:
        raise RuntimeError(message)
    warnings.warn(message, UserWarning, stacklevel=3)
