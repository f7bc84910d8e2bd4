"""The arrays the conformance kit round-trips, and how it compares them.

``REQUIRED_DTYPES`` must round-trip through every DB type; ``OPTIONAL_DTYPES`` may
instead be refused up front by :meth:`~ckptstore.plugin.DBType.check_blob` with an
:class:`~ckptstore.errors.UnsupportedBlobError`. ``SHAPES`` covers 0-d, empty and
non-contiguous arrays.

Example::

    >>> loaded = {"w": dtype_sample("<f2").copy()}  # what a format read back
    >>> assert_same_blob(loaded["w"], dtype_sample("<f2"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "OPTIONAL_DTYPES",
    "REQUIRED_DTYPES",
    "SHAPES",
    "assert_same_blob",
    "dtype_sample",
    "shape_sample",
]

Array = np.ndarray[Any, Any]

REQUIRED_DTYPES = (
    "|b1",
    "|i1",
    "<i2",
    "<i4",
    "<i8",
    "|u1",
    "<u2",
    "<u4",
    "<u8",
    "<f2",
    "<f4",
    "<f8",
    "<c8",
    "<c16",
    ">i4",
    ">u8",
    ">f2",
    ">f8",
    ">c16",
)
"""Every DB type stores these: bool, integers, float16/32/64, complex, big-endian."""

OPTIONAL_DTYPES = (
    "|S7",
    "<U5",
    "<M8[ns]",
    "<m8[s]",
    np.dtype(np.longdouble).str,
    np.dtype(np.clongdouble).str,
)
"""ckptstore accepts these (the built-in formats store them all); a third-party DB type
may refuse them up front."""


def dtype_sample(dtype: str, shape: tuple[int, ...] = (3, 5)) -> Array:
    """A deterministic array of ``dtype`` whose bytes differ from element to element."""
    kind = np.dtype(dtype).kind
    count = int(np.prod(shape))
    values = np.arange(1, count + 1)
    result: Array
    if kind == "b":
        result = (values % 3 == 0).astype(dtype)
    elif kind in "iu":
        info = np.iinfo(np.dtype(dtype))
        result = ((values * 7919) % min(int(info.max), 2**31 - 1) + max(int(info.min), -5)).astype(
            dtype
        )
    elif kind == "f":
        result = (values * 0.37 - 2.5).astype(dtype)
        result.reshape(-1)[:3] = [np.nan, -0.0, np.inf][: min(3, count)]
    elif kind == "c":
        result = (values * 0.5 - 1j * values / 3).astype(dtype)
    elif kind == "S":
        result = np.array([f"b{v}\x00x" for v in values], dtype=dtype)
    elif kind == "U":
        result = np.array([f"é{v}✓" for v in values], dtype=dtype)
    elif kind == "M":
        result = (np.datetime64("2024-02-29T12:00:00", "ns") + values * 1_000_003).astype(dtype)
    elif kind == "m":
        result = (values * np.timedelta64(3, "s")).astype(dtype)
    else:
        raise ValueError(f"no sample for dtype {dtype!r}")
    return result.reshape(shape)


def _strided() -> Array:
    return dtype_sample("<f8", (8, 6))[::2, 1::2]


def _transposed() -> Array:
    return dtype_sample("<i4", (4, 7)).T


def _reversed() -> Array:
    return dtype_sample("<i2", (20,))[::-1]


def _fortran() -> Array:
    return np.asfortranarray(dtype_sample("<f4", (5, 3, 2)))


def _big_endian_view() -> Array:
    return dtype_sample(">f8", (6, 4))[:, ::-2]


SHAPES: dict[str, Callable[[], Array]] = {
    "0-d": lambda: np.array(7.25, dtype="<f8"),
    "0-d bool": lambda: np.array(True),
    "empty": lambda: np.zeros((0,), dtype="<f4"),
    "empty 3-d": lambda: np.zeros((2, 0, 3), dtype="<i8"),
    "one element": lambda: np.array([42], dtype="<u2"),
    "3-d": lambda: dtype_sample("<f4", (3, 4, 5)),
    "strided": _strided,
    "transposed": _transposed,
    "negative stride": _reversed,
    "fortran order": _fortran,
    "big-endian strided": _big_endian_view,
}
"""Named array builders covering 0-d, empty and non-contiguous layouts."""


def shape_sample(name: str) -> Array:
    """The array ``SHAPES[name]`` builds."""
    return SHAPES[name]()


def assert_same_blob(actual: Array, expected: Array) -> None:
    """``actual`` has ``expected``'s exact dtype (byte order included), shape and bytes,
    and is a writeable array of its own."""
    assert isinstance(actual, np.ndarray), f"loaded a {type(actual).__name__}, not an ndarray"
    assert actual.dtype.str == expected.dtype.str, (
        f"dtype {actual.dtype.str} != {expected.dtype.str}"
    )
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert actual.flags.writeable, "loaded arrays must be writeable (jobs update them in place)"
    assert not np.shares_memory(actual, expected), (
        "the loaded array shares memory with the saved one"
    )
    actual_bytes = np.ascontiguousarray(actual).tobytes()
    assert actual_bytes == np.ascontiguousarray(expected).tobytes(), "the bytes differ"
