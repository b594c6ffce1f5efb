"""Matmul precision: which TPU pass count f32 matrix products emulate.

``medium`` (default): operands rounded to bf16, f32 accumulation (1 pass);
``high``: bf16x3; ``highest``: bf16x6. ``torch.set_float32_matmul_precision``
selects it globally and ``torch.tpu.precision(...)`` overrides it locally.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator

import torch

from .. import _C

PRECISIONS = ("medium", "high", "highest")


class _Local(threading.local):
    # a class default: reading an unset attribute of a plain threading.local raises and
    # catches AttributeError, which costs ~1 us, and current() runs for every op
    override: str | None = None
    quiet = False  # set by full_precision(): the library's own exact products warn no one


_local = _Local()
_warned: set[str] = set()
# TPU default. PyTorch's own default reads "highest", so the global value
# follows torch.set_float32_matmul_precision only once the user calls it.
_global = "medium"
# Whether the user chose the global precision (through any of PyTorch's knobs); until then
# products run at the TPU default, which differs from PyTorch's, and the first one says so.
_chosen = False
_said_default = False

# PyTorch's fp32_precision values -> the tpu precision ("none": no choice made there).
FP32_PRECISION = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def set_global(value: str) -> None:
    global _global, _chosen
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {value!r}")
    _global = value
    _chosen = True
    _C._precision_set_global(value)


def get_global() -> str:
    return _global


def set_fp32_precision(value: str) -> None:
    """Select the tpu precision from one of PyTorch's fp32_precision values ("none" keeps it)."""
    if value in FP32_PRECISION:
        set_global(FP32_PRECISION[value])


def note_float32_product(p: str) -> None:
    """Called by the lowering of each new float32 matrix product: at the TPU default, say once
    that it is not PyTorch's, and how to choose."""
    global _said_default
    if _chosen or _said_default or p != "medium":
        return
    _said_default = True
    warnings.warn("torchtpu: float32 matrix products on tpu run at precision 'medium' (one bf16 pass, the TPU "
                  "default), not PyTorch's 'highest'. torch.set_float32_matmul_precision('highest') or "
                  "torch.backends.fp32_precision = 'ieee' makes them float32-accurate (6 passes); "
                  "torch.tpu.get_precision() shows the precision in force.", stacklevel=2)


def track_torch_setting() -> None:
    """Make PyTorch's precision knobs also select the tpu precision: torch.set_float32_matmul_precision,
    torch.backends.fp32_precision (read now, and on every later assignment) and
    torch.backends.tpu.fp32_precision."""
    original = torch.set_float32_matmul_precision
    if getattr(original, "_torchtpu", False):
        return

    def set_float32_matmul_precision(precision: str) -> None:
        original(precision)
        set_global(precision)

    set_float32_matmul_precision._torchtpu = True  # type: ignore[attr-defined]
    set_float32_matmul_precision.__doc__ = original.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision

    generic = type(torch.backends)
    prop = generic.__dict__.get("fp32_precision")
    if prop is not None and hasattr(prop, "setter") and hasattr(prop, "getter"):
        def set_generic(value: str) -> None:
            prop.setter(value)
            set_fp32_precision(value)

        generic.fp32_precision = type(prop)(prop.getter, set_generic)
        set_fp32_precision(prop.getter())


# Whether any thread ever entered an override: until then, no thread can run under a propagated
# one, and current() skips asking for it.
_pushed = False


# current() -> str: the matmul precision ops of this thread run at now. Every op's cache key
# includes it, so it runs once per op: csrc/precision_tls.cpp answers the default ("medium", no
# override) natively, without a Python frame, and calls _current_slow for anything else.
current = _C._precision_current


def _current_slow() -> str:
    p = _local.override
    quiet = _local.quiet
    if p is None and _pushed:
        # An override this thread did not enter itself: autograd runs a backward pass on its own
        # threads, under the state of the thread that called backward() (csrc/precision_tls.cpp).
        inherited = _C._precision_propagated()
        if inherited is not None:
            p, quiet = inherited
    if p is None:
        p = _global
    if p != "medium" and p not in _warned and not quiet:
        _warned.add(p)
        cost = {"high": "about 3x", "highest": "about 6x"}[p]
        passes = {"high": 3, "highest": 6}[p]
        warnings.warn(f"torchtpu: float32 matmul precision '{p}' takes {passes} bf16 passes per product (the "
                      f"TPU matrix unit's multi-pass mode) and costs {cost} the default 'medium'.", stacklevel=4)
    return p


_C._precision_setup(_current_slow)
_C._precision_set_global(_global)


@contextlib.contextmanager
def precision(value: str) -> Iterator[None]:
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {value!r}")
    with _override(value, _local.quiet):
        yield


@contextlib.contextmanager
def _override(value: str, quiet: bool) -> Iterator[None]:
    """This thread's override, also pushed where PyTorch propagates its thread-local state."""
    global _pushed
    saved = _local.override, _local.quiet
    _local.override, _local.quiet = value, quiet
    _pushed = True
    _C._precision_push(value, quiet)
    try:
        yield
    finally:
        _C._precision_pop()
        _local.override, _local.quiet = saved


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """'highest' for products inside the library's own algorithms (lstsq's), without the
    cost warning meant for the user's choice."""
    with _override("highest", True):
        yield
