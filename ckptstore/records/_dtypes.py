"""Which values ckptstore stores, how their dtype is written in a manifest, and which
plain dtype their bytes are stored as by a format: the one place every format asks.

A blob is a numpy array of *plain data*: bool, signed and unsigned integers, floats
(float16 to longdouble), complex, fixed-width bytes (``S``) and unicode (``U``),
datetime64 and timedelta64 (any unit), in either byte order, or one of the
`ml_dtypes <https://github.com/jax-ml/ml_dtypes>`_ types (bfloat16, the float8 family,
int4...). Everything else is refused before anything is written, with an
:class:`~ckptstore.errors.UnsupportedBlobError` naming the blob and saying why: object
arrays (storing them needs pickle, and loads never unpickle), structured and void
dtypes, and masked arrays (whose mask would be silently dropped).

Manifest dtype strings are numpy's ``dtype.str`` (``"<f4"``, ``">M8[ns]"``, ``"|S7"``)
for numpy's own dtypes, and the byte order plus ``ml_dtypes.<name>`` for ml_dtypes
(``"<ml_dtypes.bfloat16"``, ``"|ml_dtypes.float8_e4m3fn"``). A format that only knows
numpy's dtypes (a ``.npy`` header, a zarr ``data_type``) stores an ml_dtypes blob as the
unsigned integer of the same size and byte order (:func:`plain_dtype`): the bytes are
identical, and the manifest says how to view them.

Example::

    >>> encode_dtype("w", np.dtype(">f8"))
    '>f8'
    >>> decode_dtype("w", "<i2")
    dtype('int16')
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import numpy as np

from ckptstore.errors import MissingDependencyError, UnsupportedBlobError

__all__ = [
    "ML_DTYPES_INSTALL",
    "ML_DTYPE_NAMES",
    "check_value",
    "decode_dtype",
    "dtype_itemsize",
    "encode_dtype",
    "plain_dtype",
]

ML_DTYPES_INSTALL = "`pip install ml_dtypes`"
"""The command that installs the optional ml_dtypes support."""

_ML_ITEMSIZES = {
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e4m3b11fnuz": 1,
    "float8_e4m3": 1,
    "float8_e3m4": 1,
    "float8_e8m0fnu": 1,
    "float6_e2m3fn": 1,
    "float6_e3m2fn": 1,
    "float4_e2m1fn": 1,
    "int1": 1,
    "int2": 1,
    "int4": 1,
    "uint1": 1,
    "uint2": 1,
    "uint4": 1,
    "complex32": 4,
    "bcomplex32": 4,
}
ML_DTYPE_NAMES = frozenset(_ML_ITEMSIZES)
"""ml_dtypes types stored natively (one element per ``itemsize`` bytes, as numpy holds
them in memory; int4 and the sub-byte floats take one byte each)."""

_PLAIN_KINDS = frozenset("biufcSUMm")
_ML_PREFIX = "ml_dtypes."
_FOREIGN_FLOAT = re.compile(r"[<>][fc](10|12|16|20|24|32)")
"""Extended-precision floats of other platforms (x87 ``<f12``, ``<f16``, complex twice
that): numpy here may not have them; their size is still known."""
_ML_TEXT = re.compile(r"([<>|])ml_dtypes\.([a-z0-9_]{1,40})")


def _is_ml_dtype(dtype: np.dtype[np.generic]) -> bool:
    return getattr(dtype.type, "__module__", "") == "ml_dtypes"


def _byte_order(dtype: np.dtype[np.generic]) -> str:
    """``<``, ``>`` or ``|`` (byte order does not apply), never numpy's ``=``."""
    if dtype.itemsize == 1 or dtype.byteorder == "|":
        return "|"
    native = "<" if np.little_endian else ">"
    if dtype.isnative:
        return native
    return ">" if native == "<" else "<"


def check_value(blob: str, value: object) -> None:
    """Raise :class:`UnsupportedBlobError` unless ``value`` (an array, or anything
    ``np.asarray`` turns into one) holds only plain data ckptstore can store exactly."""
    if type(value) is np.ndarray:  # the common case: no subclass, so not masked
        encode_dtype(blob, value.dtype)
        return
    if isinstance(value, np.ma.MaskedArray):
        raise UnsupportedBlobError(
            blob,
            "it is a numpy masked array, and storing it as a plain array would drop the "
            "mask; store its .data and np.ma.getmaskarray(...) as two blobs and rebuild it "
            "with np.ma.masked_array(data, mask) after loading",
        )
    if isinstance(value, np.ndarray):
        encode_dtype(blob, value.dtype)


def encode_dtype(blob: str, dtype: np.dtype[np.generic]) -> str:
    """The manifest string of ``dtype`` (see the module docstring), or
    :class:`UnsupportedBlobError` naming ``blob`` and why it cannot be stored."""
    known = _ENCODED.get(dtype)
    if known is not None:
        return known
    text = _encode_dtype(blob, dtype)
    if len(_ENCODED) < _REMEMBER:
        _ENCODED[dtype] = text
    return text


_ENCODED: dict[np.dtype[np.generic], str] = {}
"""Dtypes already encoded (equal dtypes have the same layout and string)."""


def _encode_dtype(blob: str, dtype: np.dtype[np.generic]) -> str:
    if dtype.hasobject:
        raise UnsupportedBlobError(
            blob,
            "it holds Python objects (dtype=object), which could only be stored with pickle; "
            "store numeric, bool or fixed-width string arrays instead",
        )
    if dtype.fields is not None:
        raise UnsupportedBlobError(
            blob,
            f"structured dtypes ({dtype}) are not supported: their field layout and padding "
            "are not portable; store each field as its own blob",
        )
    if _is_ml_dtype(dtype):
        name = dtype.type.__name__
        if _ML_ITEMSIZES.get(name) != dtype.itemsize:
            raise UnsupportedBlobError(
                blob,
                f"ml_dtypes type {name!r} is not one ckptstore knows how to store; "
                f"supported: {', '.join(sorted(ML_DTYPE_NAMES))}",
            )
        return f"{_byte_order(dtype)}{_ML_PREFIX}{name}"
    if dtype.kind not in _PLAIN_KINDS:
        raise UnsupportedBlobError(
            blob,
            f"dtype {dtype} (kind {dtype.kind!r}) is not plain data (void, structured or "
            "an unknown extension type); store bool, integer, float, complex, S, U, "
            "datetime64/timedelta64 or ml_dtypes arrays",
        )
    if dtype.kind in "Mm" and not dtype.isnative and np.datetime_data(dtype.str)[0] == "generic":
        raise UnsupportedBlobError(
            blob,
            f"dtype {dtype.str} is a non-native datetime/timedelta without a unit, which numpy "
            "cannot allocate (arrays of it come back native); give it a unit "
            "(e.g. astype('>M8[s]')) or store it in native byte order",
        )
    if dtype.itemsize == 0:
        raise UnsupportedBlobError(
            blob, f"dtype {dtype.str} has zero-width elements; give the string type a length"
        )
    return dtype.str


def plain_dtype(dtype: np.dtype[np.generic]) -> np.dtype[np.generic]:
    """The numpy dtype a format that knows only numpy's own dtypes writes ``dtype``'s
    bytes as: ``dtype`` itself, or for ml_dtypes the unsigned integer of the same size
    and byte order (the bytes are unchanged)."""
    if not _is_ml_dtype(dtype):
        return dtype
    return np.dtype(f"{_byte_order(dtype)}u{dtype.itemsize}")


def decode_dtype(blob: str, text: object) -> np.dtype[np.generic]:
    """The dtype a manifest string stands for, refusing anything that is not plain data
    (a stored document is untrusted: it never yields an object or structured dtype).

    A checkpoint holding ml_dtypes blobs needs ml_dtypes installed to load; without it
    this raises :class:`UnsupportedBlobError` naming the blob and the install command.
    """
    if type(text) is str and (known := _DECODED.get(text)) is not None:
        return known
    dtype = _decode_dtype(blob, text)
    if len(_DECODED) < _REMEMBER and not _is_ml_dtype(dtype):  # ml_dtypes: import each time
        _DECODED[str(text)] = dtype
    return dtype


_DECODED: dict[str, np.dtype[np.generic]] = {}
"""Dtype strings already decoded (a manifest names the same few thousands of times);
ml_dtypes ones are not kept, so whether ml_dtypes imports is asked each time."""
_REMEMBER = 1024
_ITEMSIZES: dict[str, int] = {}


def _decode_dtype(blob: str, text: object) -> np.dtype[np.generic]:
    if not isinstance(text, str) or len(text) > 64:
        raise UnsupportedBlobError(blob, f"dtype {text!r} is not a dtype string")
    match = _ML_TEXT.fullmatch(text)
    if match is not None:
        order, name = match.groups()
        return _ml_dtype(blob, name, order)
    if _ML_PREFIX in text:
        raise UnsupportedBlobError(blob, f"dtype {text!r} is not a valid ml_dtypes dtype string")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError) as error:
        raise UnsupportedBlobError(
            blob,
            f"unknown dtype {text!r} ({error}); it may have been written on a platform "
            "with other numpy types (longdouble differs between platforms)",
        ) from None
    if (
        dtype.hasobject
        or dtype.fields is not None
        or dtype.kind not in _PLAIN_KINDS
        or _is_ml_dtype(dtype)
    ):
        raise UnsupportedBlobError(blob, f"dtype {text!r} is not a plain numeric or string dtype")
    if dtype.itemsize == 0:
        raise UnsupportedBlobError(blob, f"dtype {text!r} has zero-width elements")
    if dtype.kind in "Mm" and not dtype.isnative and np.datetime_data(dtype)[0] == "generic":
        raise UnsupportedBlobError(blob, f"dtype {text!r} cannot be allocated by numpy")
    if dtype.str != text and not (dtype.itemsize == 1 and text[1:] == dtype.str[1:]):
        raise UnsupportedBlobError(
            blob, f"dtype {text!r} is not in numpy's canonical form ({dtype.str!r})"
        )
    return dtype


def dtype_itemsize(blob: str, text: object) -> int:
    """The element size of the manifest dtype string ``text``, checking it as
    :func:`decode_dtype` does, but without importing ml_dtypes: a manifest stays
    readable (listing, sizes, verification) where ml_dtypes is not installed, or where
    numpy lacks another platform's longdouble (the load then raises)."""
    if type(text) is str and (known := _ITEMSIZES.get(text)) is not None:
        return known
    itemsize = _dtype_itemsize(blob, text)
    if len(_ITEMSIZES) < _REMEMBER:
        _ITEMSIZES[str(text)] = itemsize
    return itemsize


def _dtype_itemsize(blob: str, text: object) -> int:
    match = _ML_TEXT.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        order, name = match.groups()
        return _ml_itemsize(blob, name, order)
    foreign = _FOREIGN_FLOAT.fullmatch(text) if isinstance(text, str) else None
    try:
        return decode_dtype(blob, text).itemsize
    except UnsupportedBlobError:
        if foreign is None:
            raise
        return int(foreign.group(1))  # another platform's longdouble: fails at load


def _ml_itemsize(blob: str, name: str, order: str) -> int:
    itemsize = _ML_ITEMSIZES.get(name)
    if itemsize is None:
        raise UnsupportedBlobError(blob, f"ml_dtypes type {name!r} is not one ckptstore stores")
    if (order == "|") != (itemsize == 1):
        raise UnsupportedBlobError(
            blob, f"byte order {order!r} does not fit ml_dtypes.{name} ({itemsize} bytes)"
        )
    return itemsize


def _ml_dtype(blob: str, name: str, order: str) -> np.dtype[np.generic]:
    itemsize = _ml_itemsize(blob, name, order)
    module = _ml_dtypes(blob, name)
    scalar = getattr(module, name, None)
    if scalar is None:
        raise UnsupportedBlobError(
            blob,
            f"it is stored as ml_dtypes.{name}, which ml_dtypes {module.__version__} does not "
            "have; upgrade it: `pip install -U ml_dtypes`",
        )
    dtype: np.dtype[np.generic] = np.dtype(scalar)
    if dtype.itemsize != itemsize:
        raise UnsupportedBlobError(
            blob, f"ml_dtypes.{name} holds {dtype.itemsize} bytes here, {itemsize} when stored"
        )
    native = "<" if np.little_endian else ">"
    return dtype if order in ("|", native) else dtype.newbyteorder(">" if order == ">" else "<")


def _ml_dtypes(blob: str, name: str) -> ModuleType:
    try:
        return importlib.import_module("ml_dtypes")
    except ImportError:
        raise MissingDependencyError(
            blob,
            f"it is stored as ml_dtypes.{name}, and the ml_dtypes package is not "
            f"installed; install it with: {ML_DTYPES_INSTALL}",
        ) from None
