from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torchtpu.runtime import (
    SUPPORTED_DTYPES,
    from_pjrt_type,
    from_stablehlo,
    to_pjrt_type,
    to_stablehlo,
)
from torchtpu.runtime import dtypes as dt

EXPECTED = {
    np.float32: ("F32", "f32"),
    np.float16: ("F16", "f16"),
    np.float64: ("F64", "f64"),
    ml_dtypes.bfloat16: ("BF16", "bf16"),
    np.int8: ("S8", "i8"),
    np.int16: ("S16", "i16"),
    np.int32: ("S32", "i32"),
    np.int64: ("S64", "i64"),
    np.uint8: ("U8", "ui8"),
    np.uint16: ("U16", "ui16"),
    np.uint32: ("U32", "ui32"),
    np.uint64: ("U64", "ui64"),
    np.bool_: ("PRED", "i1"),
    np.complex64: ("C64", "complex<f32>"),
    np.complex128: ("C128", "complex<f64>"),
}


@pytest.mark.parametrize("np_type", list(EXPECTED))
def test_mapping_matches_header(plugin, np_type):
    enum_name, shlo = EXPECTED[np_type]
    code = getattr(plugin.lib, "PJRT_Buffer_Type_" + enum_name)
    assert to_pjrt_type(np_type) == code
    assert from_pjrt_type(code) == np.dtype(np_type)
    assert to_stablehlo(np_type) == shlo
    assert from_stablehlo(shlo) == np.dtype(np_type)
    assert np.dtype(np_type) in SUPPORTED_DTYPES


def test_all_table_codes_match_header(plugin):
    for code, _name, _shlo in dt._TABLE:
        names = [n for n in dir(plugin.lib) if n.startswith("PJRT_Buffer_Type_")]
        assert code in {getattr(plugin.lib, n) for n in names}


def test_fp8_names():
    assert to_stablehlo(ml_dtypes.float8_e4m3fn) == "f8E4M3FN"
    assert from_stablehlo("f8E5M2") == np.dtype(ml_dtypes.float8_e5m2)


def test_unsupported():
    with pytest.raises(TypeError):
        to_pjrt_type(np.dtype("U3"))
    with pytest.raises(TypeError):
        from_stablehlo("f128")
    assert not dt.is_host_transferable(ml_dtypes.int4)  # sub-byte: not via numpy
