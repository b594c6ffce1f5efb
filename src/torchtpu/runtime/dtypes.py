"""Element types: numpy dtype <-> PJRT_Buffer_Type <-> StableHLO type name.

PJRT_Buffer_Type values are fixed by the C ABI (upstream only appends), so
they are written out here instead of read from the cffi module; a test checks
them against the generated declarations.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# (PJRT_Buffer_Type value, numpy dtype name or ml_dtypes attribute, StableHLO name)
_TABLE: tuple[tuple[int, str, str], ...] = (
    (1, "bool", "i1"),
    (2, "int8", "i8"),
    (3, "int16", "i16"),
    (4, "int32", "i32"),
    (5, "int64", "i64"),
    (6, "uint8", "ui8"),
    (7, "uint16", "ui16"),
    (8, "uint32", "ui32"),
    (9, "uint64", "ui64"),
    (10, "float16", "f16"),
    (11, "float32", "f32"),
    (12, "float64", "f64"),
    (13, "bfloat16", "bf16"),
    (14, "complex64", "complex<f32>"),
    (15, "complex128", "complex<f64>"),
    (16, "float8_e5m2", "f8E5M2"),
    (17, "float8_e4m3fn", "f8E4M3FN"),
    (18, "float8_e4m3b11fnuz", "f8E4M3B11FNUZ"),
    (19, "float8_e5m2fnuz", "f8E5M2FNUZ"),
    (20, "float8_e4m3fnuz", "f8E4M3FNUZ"),
    (21, "int4", "i4"),
    (22, "uint4", "ui4"),
    (24, "int2", "i2"),
    (25, "uint2", "ui2"),
    (26, "float8_e4m3", "f8E4M3"),
    (27, "float8_e3m4", "f8E3M4"),
    (28, "float8_e8m0fnu", "f8E8M0FNU"),
    (29, "float4_e2m1fn", "f4E2M1FN"),
)

# Types narrower than a byte: ml_dtypes stores them one element per byte,
# while PJRT's host layout for them is plugin-specific, so host transfers of
# these are refused (see is_host_transferable).
_SUB_BYTE = frozenset({21, 22, 24, 25, 29})


def _resolve(name: str) -> np.dtype | None:
    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    if hasattr(np, name):
        return np.dtype(getattr(np, name))
    return None  # an ml_dtypes release without this type


_NP_TO_PJRT: dict[np.dtype, int] = {}
_PJRT_TO_NP: dict[int, np.dtype] = {}
_PJRT_TO_SHLO: dict[int, str] = {}
_SHLO_TO_PJRT: dict[str, int] = {}
for _code, _name, _shlo in _TABLE:
    _PJRT_TO_SHLO[_code] = _shlo
    _SHLO_TO_PJRT[_shlo] = _code
    _dt = _resolve(_name)
    if _dt is not None:
        _NP_TO_PJRT[_dt] = _code
        _PJRT_TO_NP[_code] = _dt


def to_pjrt_type(dtype: np.dtype | type | str) -> int:
    """PJRT_Buffer_Type value for a numpy (or ml_dtypes) dtype."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    try:
        return _NP_TO_PJRT[dt]
    except KeyError:
        raise TypeError(f"dtype {dt} has no PJRT buffer type") from None


def from_pjrt_type(code: int) -> np.dtype:
    """numpy dtype for a PJRT_Buffer_Type value."""
    try:
        return _PJRT_TO_NP[int(code)]
    except KeyError:
        raise TypeError(f"PJRT buffer type {code} has no numpy dtype") from None


def to_stablehlo(dtype: np.dtype | type | str) -> str:
    """StableHLO element type name ("f32", "bf16", "i1", "complex<f32>", ...)."""
    return _PJRT_TO_SHLO[to_pjrt_type(dtype)]


def from_stablehlo(name: str) -> np.dtype:
    """numpy dtype for a StableHLO element type name."""
    try:
        return from_pjrt_type(_SHLO_TO_PJRT[name])
    except KeyError:
        raise TypeError(f"unknown StableHLO element type {name!r}") from None


def pjrt_type_to_stablehlo(code: int) -> str:
    try:
        return _PJRT_TO_SHLO[int(code)]
    except KeyError:
        raise TypeError(f"PJRT buffer type {code} has no StableHLO name") from None


# dtype -> PJRT type for the dtypes that can be copied to/from numpy arrays.
HOST_PJRT_TYPES: dict[np.dtype, int] = {dt: code for dt, code in _NP_TO_PJRT.items() if code not in _SUB_BYTE}


def is_host_transferable(dtype: np.dtype | type | str) -> bool:
    """Whether buffers of this dtype can be copied to/from numpy arrays."""
    return np.dtype(dtype) in HOST_PJRT_TYPES


SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(HOST_PJRT_TYPES)
