"""records/_dtypes.py: manifest dtype strings, the plain dtype a format stores, and the
refusal of everything that is not plain data (stored strings are untrusted)."""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckptstore.errors import UnsupportedBlobError
from ckptstore.records import (
    ML_DTYPES_INSTALL,
    check_value,
    decode_dtype,
    encode_dtype,
    plain_dtype,
)
from ckptstore.records._dtypes import ML_DTYPE_NAMES, dtype_itemsize

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(
    ("dtype", "text"),
    [
        (np.dtype("<f4"), "<f4"),
        (np.dtype(">i8"), ">i8"),
        (np.dtype("?"), "|b1"),
        (np.dtype("S7"), "|S7"),
        (np.dtype(">U5"), ">U5"),
        (np.dtype("<M8[25s]"), "<M8[25s]"),
        (np.dtype(">m8[ns]"), ">m8[ns]"),
        (BF16.newbyteorder("<"), "<ml_dtypes.bfloat16"),
        (BF16.newbyteorder(">"), ">ml_dtypes.bfloat16"),
        (np.dtype(ml_dtypes.float8_e4m3fn), "|ml_dtypes.float8_e4m3fn"),
        (np.dtype(ml_dtypes.int4), "|ml_dtypes.int4"),
    ],
)
def test_dtypes_are_written_as_a_string_that_reads_back_as_the_same_dtype(
    dtype: np.dtype[Any], text: str
) -> None:
    assert encode_dtype("w", dtype) == text
    decoded = decode_dtype("w", text)
    assert decoded == dtype
    assert decoded.isnative == dtype.isnative or dtype.itemsize == 1
    assert dtype_itemsize("w", text) == dtype.itemsize


def test_ml_dtypes_are_stored_as_unsigned_integers_of_the_same_size_and_byte_order() -> None:
    assert plain_dtype(BF16.newbyteorder(">")) == np.dtype(">u2")
    assert plain_dtype(BF16.newbyteorder("<")) == np.dtype("<u2")
    assert plain_dtype(np.dtype(ml_dtypes.float8_e5m2)) == np.dtype("u1")
    assert plain_dtype(np.dtype(">f8")) == np.dtype(">f8")
    for name in ML_DTYPE_NAMES:
        if hasattr(ml_dtypes, name):
            dtype = np.dtype(getattr(ml_dtypes, name))
            assert plain_dtype(dtype).itemsize == dtype.itemsize, name


@pytest.mark.parametrize(
    "text",
    [
        "|O",
        "O",
        "|V4",
        "[('a', '<i4')]",
        "i4,f8",
        "float32",
        "=f4",
        "|S0",
        ">M8",  # no unit, non-native: numpy cannot allocate it
        "<ml_dtypes.float8_e4m3fn",  # one byte: no byte order
        "|ml_dtypes.bfloat16",
        "<ml_dtypes.os",
        "ml_dtypes.bfloat16",
        "<ml_dtypes.bfloat16 ",
        "x" * 100,
        3,
        None,
    ],
)
def test_stored_dtype_strings_that_are_not_plain_data_are_refused(text: Any) -> None:
    with pytest.raises(UnsupportedBlobError) as caught:
        decode_dtype("w", text)
    assert caught.value.blob == "w"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (np.array([1, None], dtype=object), "pickle"),
        (np.zeros(2, dtype=[("a", "<i4")]), "structured"),
        (np.zeros(2, dtype="V3"), "not plain data"),
        (np.ma.masked_array([1, 2], mask=[0, 1]), "mask"),
        (np.zeros(2, dtype="<M8").view(">M8"), "unit"),
    ],
)
def test_values_that_are_not_plain_data_are_refused_with_the_reason(
    value: Any, reason: str
) -> None:
    with pytest.raises(UnsupportedBlobError, match=reason) as caught:
        check_value("blob/x", value)
    assert "'blob/x'" in str(caught.value)


def test_reading_an_ml_dtype_without_ml_dtypes_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    assert dtype_itemsize("w", "<ml_dtypes.bfloat16") == 2  # the manifest stays readable
    with pytest.raises(UnsupportedBlobError, match="not installed") as caught:
        decode_dtype("w", "<ml_dtypes.bfloat16")
    assert ML_DTYPES_INSTALL in str(caught.value)
    assert caught.value.blob == "w"


@pytest.mark.parametrize("text", ["<f12", ">c24", "<f10"])
def test_another_platforms_longdouble_keeps_the_manifest_readable_and_fails_the_load(
    text: str,
) -> None:
    assert dtype_itemsize("w", text) == int(text[2:])
    with pytest.raises(UnsupportedBlobError, match="platform") as caught:
        decode_dtype("w", text)
    assert caught.value.blob == "w"
