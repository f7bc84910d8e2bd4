"""Flattening a nested tree of arrays and Python scalars into blobs and one JSON spec.

A *tree* is a nest of dicts (``str`` or ``int`` keys), lists and tuples whose leaves are
arrays (numpy, or whatever an :class:`ArrayAdapter` converts, e.g. torch tensors) or the
scalars ``int``, ``float``, ``bool``, ``None`` and ``str``. :func:`flatten` turns the
arrays into blobs named after their key path and everything else (the structure, the
scalars, each array's true dtype) into a JSON-able *spec*; :func:`unflatten` rebuilds
the same tree from both. Nothing is pickled or evaluated.

Blob names: each key becomes one ``/``-separated segment. Integer keys and list/tuple
indices become ``#<n>``; string keys are percent-encoded except for letters, digits and
``_-.~:+@=,`` (so ``/``, ``%``, ``#``, control characters and non-ASCII are escaped), a
leading ``.`` is escaped as ``%2E`` (``.`` and ``..`` stay valid names) and the empty
string is ``%``. :func:`decode_segment` inverts it, so every key round-trips.

Example::

    >>> arrays, spec = flatten({"layer": {"w": np.zeros(2)}, "step": 3})
    >>> sorted(arrays)
    ['layer/w']
    >>> unflatten(spec, arrays)["step"]
    3
"""

from __future__ import annotations

import importlib
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import quote, unquote

import numpy as np

from ckptstore.errors import CorruptCheckpointError, MissingDependencyError, UnsupportedBlobError

__all__ = [
    "ArrayAdapter",
    "Spec",
    "decode_segment",
    "encode_segment",
    "flatten",
    "unflatten",
]

Spec = dict[str, Any]
"""The JSON-able description of a tree: structure, scalars and each array's dtype."""

_RENAMEABLE = (UnsupportedBlobError, MissingDependencyError)
_SAFE = "_-.~:+@=,"
_INDEX = re.compile(r"#(-?[0-9]{1,40})")
_MAX_DEPTH = 200
_MAX_DTYPE_TEXT = 64
"""A leaf's recorded dtype is a short name (``"<f4"``, ``"bfloat16"``); longer is forged."""
# dtypes numpy stores natively; others (ml_dtypes' bfloat16, float8...) are stored as
# unsigned integers of the same width and re-viewed on load
_VIEW_AS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}
_ML_DTYPES = frozenset(
    {
        "bfloat16",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e4m3b11fnuz",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float4_e2m1fn",
        "int2",
        "int4",
        "uint2",
        "uint4",
    }
)


def encode_segment(key: str | int) -> str:
    """The blob-name segment of one dict key or sequence index (see the module doc)."""
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise UnsupportedBlobError(
            repr(key), f"dict keys must be str or int, not {type(key).__name__}"
        )
    if isinstance(key, int):
        return f"#{key}"
    if not key:
        return "%"
    encoded = quote(key, safe=_SAFE)
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


def decode_segment(segment: str) -> str | int:
    """The key :func:`encode_segment` turned into ``segment``."""
    match = _INDEX.fullmatch(segment)
    if match:
        return int(match.group(1))
    return "" if segment == "%" else unquote(segment, errors="strict")


class ArrayAdapter(Protocol):
    """Converts one kind of array leaf (e.g. torch tensors) to and from numpy."""

    kind: str
    """Recorded in the spec for every leaf this adapter stored (``"torch"``)."""

    def to_numpy(self, value: object) -> tuple[np.ndarray[Any, Any], str] | None:
        """``(array as stored, true dtype name)`` if ``value`` is this adapter's, else
        None. The array should be a view of ``value``'s memory where possible."""

    def from_numpy(self, array: np.ndarray[Any, Any], dtype: str) -> object:
        """Rebuild the leaf from the stored ``array`` and its true dtype name."""


def _numpy_leaf(value: object) -> tuple[np.ndarray[Any, Any], str] | None:
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        return None
    dtype = value.dtype
    if type(dtype).__module__.startswith("ml_dtypes") or dtype.type.__module__.startswith(
        "ml_dtypes"
    ):
        if dtype.name not in _ML_DTYPES or dtype.itemsize not in _VIEW_AS:
            raise UnsupportedBlobError(dtype.name, f"ml_dtypes' {dtype.name} is not supported")
        return value.view(_VIEW_AS[dtype.itemsize]), dtype.name
    if dtype.hasobject or dtype.kind == "V":
        raise UnsupportedBlobError(
            dtype.str,
            f"its dtype {dtype.str} is object, structured or void, which would need pickle; "
            "not supported",
        )
    return value, dtype.str


def _leaf_dtype(text: str) -> np.dtype[Any] | None:
    """The dtype a spec records for a leaf (an ml_dtypes name, or a numpy dtype string),
    or None unless it is plain data: the spec is untrusted, so it never makes an object,
    void or structured view of stored bytes."""
    if text in _ML_DTYPES:  # numpy "V" kinds too, but named from a fixed list
        try:
            module = importlib.import_module("ml_dtypes")
        except ImportError:
            raise UnsupportedBlobError(
                text, f"reading its dtype {text} needs ml_dtypes: `pip install ml_dtypes`"
            ) from None
        found = getattr(module, text, None)
        if found is None:
            raise UnsupportedBlobError(text, f"reading its dtype {text} needs a newer ml_dtypes")
        ml_dtype: np.dtype[Any] = np.dtype(found)
        return ml_dtype
    if len(text) > _MAX_DTYPE_TEXT:
        return None
    try:
        dtype: np.dtype[Any] = np.dtype(text)
    except TypeError:
        return None
    if dtype.hasobject or dtype.kind == "V" or dtype.subdtype is not None:
        return None
    return dtype


def flatten(
    tree: object, adapter: ArrayAdapter | None = None
) -> tuple[dict[str, np.ndarray[Any, Any]], Spec]:
    """Split ``tree`` into ``{blob name: array}`` and its JSON-able spec."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    spec = _visit(tree, (), arrays, adapter)
    return arrays, {"format": "ckptstore.tree", "version": 1, "root": spec}


def _visit(
    value: object,
    path: tuple[str, ...],
    arrays: dict[str, np.ndarray[Any, Any]],
    adapter: ArrayAdapter | None,
) -> Spec:
    """The spec of ``value``, its arrays added to ``arrays`` (a function of the module,
    not a closure calling itself: that cycle kept every array alive until a full
    garbage collection, copies from a GPU included)."""
    if len(path) > _MAX_DEPTH:
        raise UnsupportedBlobError("/".join(path), f"trees deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | str):
        return {"t": "scalar", "v": value}
    if isinstance(value, int):
        return {"t": "int", "v": str(value)}  # exact for any size
    if isinstance(value, float):
        return {"t": "float", "v": value.hex()}  # bit-exact, nan and inf included
    if isinstance(value, Mapping):
        keys = list(value)
        segments = [encode_segment(key) for key in keys]
        node: Spec = {
            "t": "odict" if isinstance(value, OrderedDict) else "dict",
            "k": [[type(key).__name__, key] for key in keys],
            "v": [
                _visit(value[k], (*path, s), arrays, adapter)
                for k, s in zip(keys, segments, strict=True)
            ],
        }
        metadata = getattr(value, "_metadata", None)  # torch's state_dict versions
        if isinstance(metadata, Mapping):
            node["m"] = _visit(metadata, (*path, "%metadata"), arrays, adapter)
        return node
    if isinstance(value, list | tuple):
        return {
            "t": type(value).__name__ if type(value) in (list, tuple) else "list",
            "v": [_visit(item, (*path, f"#{i}"), arrays, adapter) for i, item in enumerate(value)],
        }
    name = "/".join(path) or "%"
    with _naming(name):
        converted = adapter.to_numpy(value) if adapter is not None else None
        kind = adapter.kind if converted is not None and adapter is not None else "numpy"
        if converted is None:
            converted = _numpy_leaf(value)
    if converted is None:
        raise UnsupportedBlobError(
            name,
            f"{type(value).__name__} is not an array or int/float/bool/None/str; convert it first",
        )
    array, dtype = converted
    scalar = isinstance(value, np.generic)
    arrays[name] = array
    return {"t": "array", "b": name, "k": kind, "d": dtype, "s": scalar}


def unflatten(
    spec: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray[Any, Any]],
    adapter: ArrayAdapter | None = None,
    *,
    url: str = "",
) -> object:
    """Rebuild the tree :func:`flatten` described.

    A malformed spec raises :class:`CorruptCheckpointError`."""

    def bad(detail: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"tree spec: {detail}", url=url)

    if spec.get("format") != "ckptstore.tree" or spec.get("version") != 1:
        raise bad("not a ckptstore.tree version 1 spec")
    return _build(spec.get("root"), 0, arrays, adapter, bad)


def _build(
    node: object,
    depth: int,
    arrays: Mapping[str, np.ndarray[Any, Any]],
    adapter: ArrayAdapter | None,
    bad: Callable[[str], CorruptCheckpointError],
) -> object:
    """The value of the spec's ``node`` (a function of the module, not a closure
    calling itself: that cycle kept the whole loaded tree alive until a full garbage
    collection, a GiB per load of a GiB)."""
    if depth > _MAX_DEPTH or not isinstance(node, dict):
        raise bad("a node is not an object or the tree is too deep")
    kind = node.get("t")
    value = node.get("v")
    if kind == "scalar":
        if value is not None and not isinstance(value, bool | str):
            raise bad("a scalar is not bool, str or null")
        return value
    if kind == "int" and isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,5000}", value):
        return int(value)
    if kind == "float" and isinstance(value, str):
        try:
            return float.fromhex(value)
        except ValueError:
            raise bad(f"bad float {value[:40]!r}") from None
    if kind in ("dict", "odict"):
        keys = node.get("k")
        if not isinstance(keys, list) or not isinstance(value, list) or len(keys) != len(value):
            raise bad("a dict's keys and values do not match")
        result: dict[object, object] = OrderedDict() if kind == "odict" else {}
        for key, item in zip(keys, value, strict=True):
            result[_key(key, bad)] = _build(item, depth + 1, arrays, adapter, bad)
        if "m" in node:
            metadata = _build(node["m"], depth + 1, arrays, adapter, bad)
            if not isinstance(metadata, dict):
                raise bad("a dict's _metadata is not a dict")
            result._metadata = metadata  # type: ignore[attr-defined]
        return result
    if kind in ("list", "tuple") and isinstance(value, list):
        items = [_build(item, depth + 1, arrays, adapter, bad) for item in value]
        return items if kind == "list" else tuple(items)
    if kind == "array":
        return _leaf(node, arrays, adapter, bad)
    raise bad(f"unknown node kind {str(kind)[:40]!r}")


@contextmanager
def _naming(blob: str) -> Iterator[None]:
    """Converters know a leaf's dtype, not its key path: an
    :class:`~ckptstore.errors.UnsupportedBlobError` they raise is raised again naming ``blob``
    (same class, same reason)."""
    try:
        yield
    except UnsupportedBlobError as error:
        if error.blob == blob:
            raise
        reason = (
            error.reason if error.blob in error.reason else f"{error.reason} ({error.blob[:80]})"
        )
        kind = type(error) if type(error) in _RENAMEABLE else UnsupportedBlobError
        raise kind(blob, reason) from None


def _key(raw: object, bad: Callable[[str], CorruptCheckpointError]) -> str | int:
    if isinstance(raw, list) and len(raw) == 2:
        kind, key = raw
        if kind == "str" and isinstance(key, str):
            return key
        if kind == "int" and isinstance(key, int) and not isinstance(key, bool):
            return key
    raise bad("a dict key is not a [type, key] pair of str or int")


def _leaf(
    node: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray[Any, Any]],
    adapter: ArrayAdapter | None,
    bad: Callable[[str], CorruptCheckpointError],
) -> object:
    name, kind, dtype = node.get("b"), node.get("k"), node.get("d")
    if not isinstance(name, str) or name not in arrays or not isinstance(dtype, str):
        raise bad(f"array leaf {str(name)[:80]!r} has no blob or dtype")
    array = arrays[name]
    if adapter is not None and kind == adapter.kind:
        with _naming(name):
            return adapter.from_numpy(array, dtype)
    # without its adapter (e.g. a torch checkpoint read without torch), a leaf is
    # returned as the numpy array of its true dtype when numpy (or ml_dtypes) has it
    with _naming(name):
        true = _leaf_dtype(dtype)
    if true is None:
        raise bad(f"leaf {name!r} has an unknown dtype {dtype[:40]!r}")
    if true != array.dtype:
        # the one reinterpretation flatten records: ml_dtypes floats stored as uints
        reinterpretable = dtype in _ML_DTYPES and array.dtype.kind == "u"
        if not reinterpretable or true.itemsize != array.dtype.itemsize:
            raise bad(f"leaf {name!r} is stored as {array.dtype}, not as {dtype[:40]}")
        array = array.view(true)
    return array[()] if node.get("s") else array
