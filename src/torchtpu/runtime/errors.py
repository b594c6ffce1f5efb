"""The exception types the runtime raises: failures PJRT reports, and data a platform cannot take."""

from __future__ import annotations

# Names of PJRT_Error_Code values (absl status codes), for readable messages.
_CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

UNIMPLEMENTED = 12
RESOURCE_EXHAUSTED = 8
# Codes of a device that failed running work (ABORTED, UNAVAILABLE, INTERNAL, DATA_LOSS), as
# opposed to a refused request (INVALID_ARGUMENT, UNIMPLEMENTED...) or exhausted memory.
DEVICE_FAILURES = (10, 14, 13, 15)


class PjrtError(RuntimeError):
    """An error returned by a PJRT plugin.

    ``code`` is the PJRT_Error_Code (an absl status code) and ``message`` the
    plugin's own text, e.g. the MLIR parser diagnostic for a malformed module.
    A RuntimeError, as PyTorch's own backend errors are: code that catches those
    (``except RuntimeError``) catches a failed compile or launch too.
    """

    def __init__(self, code: int, message: str) -> None:
        self.code = int(code)
        self.message = message
        super().__init__(f"[{self.code_name}] {message}")

    @property
    def code_name(self) -> str:
        return _CODE_NAMES.get(self.code, str(self.code))


# Subclasses of PjrtError raised for particular codes, registered by the layer above (which may
# also derive them from its own exception types: the runtime does not know them).
_TYPE_FOR_CODE: dict[int, type[PjrtError]] = {}


def register_error_type(code: int, cls: type[PjrtError]) -> None:
    """Raise ``cls(code, message)`` instead of a plain PjrtError for errors with this code."""
    _TYPE_FOR_CODE[int(code)] = cls


def make_error(code: int, message: str) -> PjrtError:
    """The exception for a PJRT error: the registered type for its code, else PjrtError."""
    return _TYPE_FOR_CODE.get(int(code), PjrtError)(code, message)


class UnsupportedDtypeError(TypeError):
    """Data of a type the platform cannot hold or compute (complex128 on a TPU), refused before
    it reaches the plugin, where it would stop the process. A TypeError, as PyTorch raises for a
    dtype a device backend lacks (float64 on MPS)."""
