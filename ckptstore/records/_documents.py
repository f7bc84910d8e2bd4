"""Small JSON control documents (manifests, commit records, catalogs) that carry their
own CRC-32C, so a flipped byte in one is reported instead of misread.

A document may be stored gzip-compressed (:func:`gzip_document`: large manifests are,
see :meth:`~ckptstore.records.NodeManifest.encode`); :func:`decode_document` recognises
the gzip magic bytes (JSON never starts with them) and decompresses, never to more than
``Limits.max_document_bytes``, before the JSON is checked as usual.

Example::

    >>> data = encode_document("ckptstore.commit", {"epoch": 3})
    >>> decode_document(data, "ckptstore.commit", url="/ckpt", key="k")
    {'epoch': 3, 'kind': 'ckptstore.commit', 'version': 1}
    >>> decode_document(gzip_document(data), "ckptstore.commit", url="/ckpt", key="k")
    {'epoch': 3, 'kind': 'ckptstore.commit', 'version': 1}
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping

import numpy as np
import orjson

from ckptstore._types import JSONObject
from ckptstore.errors import CorruptCheckpointError
from ckptstore.io import crc32_of, crc32c_of, deflate_raw
from ckptstore.records._limits import current_limits

__all__ = [
    "GZIP_MAGIC",
    "decode_document",
    "encode_document",
    "gzip_document",
    "json_int",
    "json_list",
    "json_number",
    "json_object",
    "json_values_bound",
    "parse_untrusted_json",
]

_VERSION = 1

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip stream (RFC 1952); a JSON text never starts with them
(``\x1f`` is a control character, not JSON whitespace)."""

_GZIP_HEADER = GZIP_MAGIC + bytes([8, 0, 0, 0, 0, 0, 4, 255])
"""The fixed gzip header :func:`gzip_document` writes: deflate, no flags (no name,
comment or header CRC), modification time 0, "fastest" compression, operating system
unknown (255). Fixed, so the bytes depend on nothing but the document."""

_GUNZIP_STEP = 1 << 20
"""Decompressed bytes produced per step: the output grows in place, one step at a time,
so decoding holds about one copy of the document (joining blocks would hold two)."""


def _canonical(body: Mapping[str, object]) -> bytes:
    """``body`` as canonical JSON: what ``json.dumps(body, sort_keys=True,
    separators=(",", ":"))`` gives, made by orjson (~10x faster on a manifest of
    thousands of blobs) whenever its output is the same bytes: printable ASCII (the
    standard library escapes other characters; orjson writes them as UTF-8) and no
    integer beyond 64 bits. Only floats outside ``[1e-4, 1e16)`` are spelled otherwise
    (``0.00001``, not ``1e-05``): :func:`decode_document` accepts either spelling."""
    try:
        data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: integers beyond 64 bits
        return _legacy_canonical(body)
    if data.isascii() and b"\x7f" not in data:
        return data
    return _legacy_canonical(body)


def _legacy_canonical(body: Mapping[str, object]) -> bytes:
    """The standard library's canonical JSON (every document before orjson)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode_document(kind: str, body: Mapping[str, object]) -> bytes:
    """Serialise ``body`` as a ``kind`` document with a version and a CRC-32C.

    The document is canonical JSON (sorted keys, no spaces: numpy-free and fast, as the
    C encoder handles it) with ``"crc32c"`` put first, computed over the rest.
    """
    if "crc32c" in body:
        raise ValueError("'crc32c' is reserved in control documents")
    canonical = _canonical({"kind": kind, "version": _VERSION, **body})
    return b'{"crc32c":%d,%s' % (crc32c_of([canonical]), canonical[1:])


def gzip_document(data: bytes) -> bytes:
    """``data`` (an encoded document) as one gzip member, deflated by
    :func:`~ckptstore.io._deflate.deflate_raw` (ISA-L: a save's manifest is on its
    critical path); any gzip reader inflates it.

    Deterministic: the same ``data`` always gives the same bytes (with the same ISA-L),
    since the header is fixed (modification time 0, OS byte 255). ``gzip.compress``
    would not do: from Python 3.11 to 3.12 it takes zlib's header, whose OS byte
    depends on the platform."""
    trailer = struct.pack("<II", crc32_of([data]), len(data) & 0xFFFFFFFF)
    return b"".join((_GZIP_HEADER, deflate_raw(data), trailer))


def _gunzip(data: bytes, *, url: str, key: str) -> bytearray:
    """The document a gzip stream ``data`` holds, decompressed to at most
    ``current_limits().max_document_bytes`` bytes; anything but exactly one whole, intact
    gzip member within that bound is a :class:`CorruptCheckpointError`: a stream
    decompressing beyond the limit (a decompression bomb: refused once it produced one
    byte more, never decoded further), a truncated stream, bytes after it (a second
    member included), or a damaged header, deflate stream or CRC-32/size trailer."""
    limit = current_limits().max_document_bytes

    def corrupt(detail: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"gzip-compressed document: {detail}", url=url, file=key)

    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip only
    out = bytearray()
    pending: bytes = data
    try:
        while not decompressor.eof and len(out) <= limit:
            piece = decompressor.decompress(pending, min(_GUNZIP_STEP, limit + 1 - len(out)))
            if not piece and len(decompressor.unconsumed_tail) == len(pending):
                break  # no input left to use and nothing more to give: the stream is cut
            pending = decompressor.unconsumed_tail
            out += piece
    except zlib.error as error:  # a bad header, deflate stream or CRC-32/size trailer
        raise corrupt(f"not valid gzip data ({error})") from None
    if len(out) > limit:
        raise corrupt(
            f"it decompresses to more than the limit of {limit} bytes "
            "(CKPTSTORE_LIMIT_MAX_DOCUMENT_BYTES)"
        )
    if not decompressor.eof:
        raise corrupt("the gzip stream is truncated")
    if decompressor.unused_data.startswith(GZIP_MAGIC):
        raise corrupt("more than one gzip member (a control document is one)")
    if decompressor.unused_data:
        raise corrupt(f"{len(decompressor.unused_data)} bytes follow the gzip stream")
    return out


def decode_document(data: bytes, kind: str, *, url: str, key: str) -> JSONObject:
    """Parse and check a document written by :func:`encode_document`, stored as is or
    compressed by :func:`gzip_document` (recognised by :data:`GZIP_MAGIC`, decompressed
    within the document size limit); the JSON is then checked alike either way: size,
    depth, strict parsing, its own CRC-32C, kind and version."""

    def corrupt(detail: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(detail, url=url, file=key)

    text = _gunzip(data, url=url, key=key) if data[:2] == GZIP_MAGIC else data
    document = parse_untrusted_json(text, url=url, key=key)
    if not isinstance(document, dict):
        raise corrupt("not a JSON object")
    recorded = document.pop("crc32c", None)
    if not _crc_matches(text, recorded) and recorded not in _canonical_crcs(document):
        raise corrupt("its CRC-32C does not match its content")
    if document.get("kind") != kind:
        raise corrupt(f"expected a {kind!r} document, found {document.get('kind')!r}")
    if document.get("version") != _VERSION:
        raise corrupt(
            f"document version {document.get('version')!r} is not supported by this "
            f"ckptstore (it reads version {_VERSION}); upgrade ckptstore"
        )
    return document


def _canonical_crcs(document: Mapping[str, object]) -> tuple[int, ...]:
    """The CRC-32Cs a reformatted ``document`` may carry: of its canonical form, as
    written now and as written by the standard library (they differ only for some
    floats and non-ASCII text)."""
    return crc32c_of([_canonical(document)]), crc32c_of([_legacy_canonical(document)])


def _crc_matches(data: bytes | bytearray, recorded: object) -> bool:
    """Whether ``data`` is exactly what :func:`encode_document` wrote for the CRC-32C
    ``recorded``: checked over the stored bytes, without re-encoding the parsed document
    (documents written otherwise, e.g. reformatted by hand, take the canonical check)."""
    if type(recorded) is not int or not isinstance(data, bytes | bytearray):
        return False
    prefix = b'{"crc32c":%d,' % recorded
    if not data.startswith(prefix):
        return False
    return crc32c_of([b"{", memoryview(data)[len(prefix) :]]) == recorded


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # the unrolled form: no per-byte branching
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def _depth(data: bytes | bytearray) -> int:
    """How deep ``[`` and ``{`` nest in the JSON text ``data`` (brackets inside strings
    do not count)."""
    if b"\\" in data:  # escapes: strings are found by the regex
        steps = _OPEN[np.frombuffer(_STRING.sub(b"", data), dtype=np.uint8)]
    else:  # every '"' opens or closes a string: a bracket after an odd count is inside one
        raw = np.frombuffer(data, dtype=np.uint8)
        steps = _OPEN[raw]
        brackets = np.flatnonzero(steps)
        quotes_before = np.searchsorted(np.flatnonzero(raw == ord('"')), brackets)
        steps = steps[brackets[quotes_before % 2 == 0]]
    return int(np.cumsum(steps[steps != 0], dtype=np.int64).max(initial=0))


def json_values_bound(data: bytes | bytearray) -> int:
    """At least as many as the JSON values in the text ``data``: every value but the
    first follows a ``,`` or opens an array or object (bytes inside strings count too,
    so it may say more, never fewer). Three byte counts in C, ~15 ms for 48 MiB."""
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def parse_untrusted_json(data: bytes | bytearray, *, url: str, key: str) -> object:
    """Strict JSON parsing (orjson) for stored bytes: size, nesting depth and the number
    of values (:func:`json_values_bound`) are checked first (against
    :func:`~ckptstore.records._limits.current_limits`), ``NaN``/``Infinity``
    and numbers too long to parse are refused (integers beyond 64 bits parse as floats,
    which every integer field refuses); every failure is a
    :class:`CorruptCheckpointError`, never a ``RecursionError`` or ``MemoryError``."""
    limits = current_limits()

    def corrupt(detail: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(detail, url=url, file=key)

    if len(data) > limits.max_document_bytes:
        raise corrupt(
            f"the document is {len(data)} bytes, more than the limit of "
            f"{limits.max_document_bytes} (CKPTSTORE_LIMIT_MAX_DOCUMENT_BYTES)"
        )
    values = json_values_bound(data)
    if values > limits.max_json_values:
        # orjson builds every object at once: bounded here, before any is built (and
        # before the depth check, whose arrays grow with the brackets)
        raise corrupt(
            f"the document holds up to {values} JSON values, more than the limit of "
            f"{limits.max_json_values} (CKPTSTORE_LIMIT_MAX_JSON_VALUES)"
        )
    depth = _depth(data)
    if depth > limits.max_json_depth:
        raise corrupt(
            f"JSON nested {depth} levels deep, more than the limit of {limits.max_json_depth}"
        )
    try:
        # orjson refuses NaN/Infinity, numbers beyond a double, invalid UTF-8 and lone
        # surrogates, and nesting beyond 1024 (already bounded above); duplicate keys
        # keep the last value, as json.loads does
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:  # a ValueError
        raise corrupt(f"not valid JSON ({type(error).__name__})") from None


def json_int(document: Mapping[str, object], key: str) -> int:
    """``document[key]`` as a non-negative integer; raises :class:`KeyError` when it is
    missing and :class:`ValueError` when it is anything else (a bool, a float, text)."""
    value = document[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} {value!r} is not a non-negative integer")
    return value


def json_number(document: Mapping[str, object], key: str) -> float:
    """``document[key]`` as a finite number; :class:`KeyError` or :class:`ValueError` else."""
    value = document[key]
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        raise ValueError(f"{key} {value!r} is not a number")
    return float(value)


def json_object(document: Mapping[str, object], key: str) -> JSONObject:
    """``document[key]`` as a JSON object; :class:`KeyError` or :class:`ValueError` else."""
    value = document[key]
    if not isinstance(value, dict):
        raise ValueError(f"{key} {value!r} is not a JSON object")
    return value


def json_list(document: Mapping[str, object], key: str) -> list[object]:
    """``document[key]`` as a JSON array; :class:`KeyError` or :class:`ValueError` else."""
    value = document[key]
    if not isinstance(value, list):
        raise ValueError(f"{key} {value!r} is not a JSON array")
    return value
