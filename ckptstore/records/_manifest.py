"""A node checkpoint's manifest: what was stored where, and the checksum of every piece
(CRC-32; CRC-32C in manifests written before: the manifest's ``"checksum"`` says which).

The manifest is written after a node's data and read before any of it, so loads know
every blob's dtype and shape without trusting the data files, partial loads read only
the bytes of the blobs asked for, and every chunk is checked against its checksum.

Example (a manifest as a save writes it, read back)::

    >>> record = BlobRecord("trainer_0/total", "<f4", (1,), (ChunkRecord("c.0", 0, 4, 4, 0),))
    >>> data = NodeManifest("trainer_0", 3, "npz", {record.name: record}).encode()
    >>> manifest = NodeManifest.decode(data, url="/ckpt", key="trainer_0.3/manifest.json")
    >>> manifest.blobs["trainer_0/total"].shape
    (1,)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from types import MappingProxyType

import numpy as np

from ckptstore._types import JSONObject
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    JobConfigurationError,
    MissingDependencyError,
)
from ckptstore.io import CHECKSUM_ALGORITHM, CHECKSUM_ALGORITHMS, paused_gc
from ckptstore.records._documents import (
    decode_document,
    encode_document,
    gzip_document,
    json_values_bound,
)
from ckptstore.records._dtypes import decode_dtype, dtype_itemsize
from ckptstore.records._limits import Limits, current_limits
from ckptstore.records._names import (
    get_ckpt_filename,
    validate_blob_name,
    validate_key,
    validate_node_name,
)

__all__ = ["BlobRecord", "ChunkRecord", "NodeManifest", "safe_dtype"]

MANIFEST_KIND = "ckptstore.manifest"
GZIP_MANIFESTS_LARGER_THAN = 64 << 10
"""A manifest whose JSON is larger than this many bytes (a node of some 600 small blobs or
more, at ~103 bytes per blob) is stored gzip-compressed, at ~14 bytes per blob: 10,000
blobs of 4 KiB have 1,026,290 bytes of manifest JSON, ~143,000 compressed (ISA-L's level
1: ~0.8 ms to compress; zlib ~2 ms to decompress), so the manifest no longer adds 2.5% to
what the node stores and allocates. Smaller manifests stay plain JSON, readable by eye
and byte-identical to those of earlier versions."""
_validated_key = lru_cache(maxsize=1024)(validate_key)
"""``validate_key``, remembered: a packed manifest names the same file thousands of times
(invalid keys raise, and exceptions are never cached)."""


def safe_dtype(text: str, blob: str) -> np.dtype[np.generic]:
    """Parse a recorded dtype string, refusing anything that could hold Python objects
    (see :func:`ckptstore.records._dtypes.decode_dtype`)."""
    return decode_dtype(blob, text)


@dataclass(frozen=True)
class ChunkRecord:
    """One stored piece: ``stored`` bytes at ``offset`` of object ``key`` (relative to the
    node checkpoint), checked by ``crc`` (a checksum computed by ``algorithm``: see
    :func:`ckptstore.io.checksum_of`), supplying ``size`` bytes of its blob (less than
    ``stored`` for a padded edge chunk; the decoded length for compressed chunks).

    Every chunk of a manifest has one algorithm, the manifest's ``"checksum"``.
    """

    key: str
    offset: int
    stored: int
    size: int
    crc: int
    algorithm: str = CHECKSUM_ALGORITHM

    def encode(self) -> list[str | int]:
        return [self.key, self.offset, self.stored, self.size, self.crc]

    @classmethod
    def decode(cls, raw: object, algorithm: str = CHECKSUM_ALGORITHM) -> ChunkRecord:
        if not isinstance(raw, list) or len(raw) != 5:
            raise ValueError("a chunk record is a list of 5 fields")
        key, offset, stored, size, crc = raw
        most = current_limits().max_file_bytes
        if (  # the common case in one expression: thousands of records per manifest
            type(offset) is int
            and type(stored) is int
            and type(size) is int
            and type(crc) is int
            and offset >= 0
            and stored >= 0
            and 0 <= size <= most
            and 0 <= crc < 1 << 32
            and crc <= most
            and offset + stored <= most
        ):
            return cls(_validated_key(key), offset, stored, size, crc, algorithm)
        for value in (offset, stored, size, crc):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
                raise ValueError(f"chunk field {value!r} is not an integer in [0, {most}]")
        if crc >= 1 << 32:
            raise ValueError("a chunk's checksum field is out of range")
        if offset + stored > most:
            raise ValueError(f"a chunk ends beyond {most} bytes")
        return cls(_validated_key(key), offset, stored, size, crc, algorithm)


@dataclass(frozen=True)
class BlobRecord:
    """One blob: dtype (see :func:`~ckptstore.records._dtypes.encode_dtype`: numpy's
    ``dtype.str``, e.g. ``"<f4"``, or ``"<ml_dtypes.bfloat16"``), shape, codec and chunks.

    ``layout`` holds format-specific details (a zarr chunk shape, for instance).
    Encoded, a record leaves out ``codec`` when it is ``"raw"`` and ``layout`` when it is
    empty (manifests written before did not: both forms decode alike).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[ChunkRecord, ...]
    codec: str = "raw"
    layout: Mapping[str, object] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_itemsize(self.name, self.dtype)

    @property
    def stored_bytes(self) -> int:
        return sum(chunk.stored for chunk in self.chunks)

    def numpy_dtype(self) -> np.dtype[np.generic]:
        return safe_dtype(self.dtype, self.name)

    def encode(self) -> JSONObject:
        """The record as JSON; the defaults (codec ``"raw"``, an empty layout) are left
        out: a manifest holds one record per blob, thousands for small blobs."""
        encoded: JSONObject = {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "chunks": [[c.key, c.offset, c.stored, c.size, c.crc] for c in self.chunks],
        }
        if self.codec != "raw":
            encoded["codec"] = self.codec
        if self.layout:
            encoded["layout"] = dict(self.layout)
        return encoded

    @classmethod
    def decode(cls, name: str, raw: object, algorithm: str = CHECKSUM_ALGORITHM) -> BlobRecord:
        """The record ``raw`` holds, its chunks checked by ``algorithm`` (the manifest's)."""
        validate_blob_name(name, new=False)
        limits = current_limits()
        if not isinstance(raw, dict):
            raise ValueError("a blob record is not a JSON object")
        if len(raw) == 3:  # the common record: dtype, shape and one raw chunk
            fast = cls._decode_plain(name, raw, limits, algorithm)
            if fast is not None:
                return fast
        chunks, layout = raw["chunks"], raw.get("layout", {})
        if not isinstance(chunks, list) or not isinstance(layout, dict):
            raise ValueError("a blob record's chunks must be a list and its layout an object")
        shape = raw["shape"]
        if not isinstance(shape, list) or not all(
            type(d) is int and d >= 0 for d in shape
        ):  # type(d) is int: JSON's integers, never a bool
            raise ValueError("the shape is not a list of non-negative integers")
        if len(shape) > limits.max_ndim:
            raise ValueError(f"{len(shape)} dimensions, more than the limit of {limits.max_ndim}")
        if len(chunks) > limits.max_chunks:
            raise ValueError(f"chunks is not a list of at most {limits.max_chunks} records")
        dtype = str(raw["dtype"])
        # the itemsize is known without importing ml_dtypes: a manifest stays readable
        nbytes = math.prod(shape) * dtype_itemsize(name, dtype)
        if nbytes > limits.max_blob_bytes:
            raise ValueError(
                f"shape {shape} needs more than the limit of {limits.max_blob_bytes} bytes"
            )
        record = cls(
            name=name,
            dtype=dtype,
            shape=tuple(shape),
            chunks=tuple([ChunkRecord.decode(chunk, algorithm) for chunk in chunks]),
            codec=str(raw.get("codec", "raw")),
            layout=dict(layout),
        )
        if record.codec == "raw" and any(c.stored < c.size for c in record.chunks):
            # a raw chunk stores its bytes plus padding: never fewer (readers would
            # otherwise take the difference as negative padding and skip the CRC check)
            raise ValueError("a raw chunk stores fewer bytes than it supplies")
        if record.codec != "raw" and any(
            c.size > min(limits.max_chunk_bytes, max(c.stored, 1) * limits.max_compression_ratio)
            for c in record.chunks
        ):
            raise ValueError(
                f"a compressed chunk decodes to more than {limits.max_chunk_bytes} bytes or "
                f"{limits.max_compression_ratio} times its stored size"
            )
        if sum(c.size for c in record.chunks) != nbytes:
            raise ValueError(
                f"chunks supply {sum(c.size for c in record.chunks)} bytes, "
                f"dtype and shape need {nbytes}"
            )
        return record

    @classmethod
    def _decode_plain(
        cls, name: str, raw: dict[str, object], limits: Limits, algorithm: str
    ) -> BlobRecord | None:
        """A record of exactly ``dtype``, ``shape`` and one raw chunk holding the blob's
        bytes, decoded with the checks of :meth:`decode` spelled out for that case
        (thousands of small blobs per manifest: half the time); None for any other
        record, or one failing a check, which :meth:`decode` then checks in full."""
        shape, chunks, dtype = raw.get("shape"), raw.get("chunks"), raw.get("dtype")
        if type(shape) is not list or type(chunks) is not list or type(dtype) is not str:
            return None
        if len(chunks) != 1 or len(shape) > limits.max_ndim:  # limits are >= 1
            return None
        if not all(type(d) is int and d >= 0 for d in shape):
            return None
        nbytes = math.prod(shape) * dtype_itemsize(name, dtype)
        if nbytes > limits.max_blob_bytes:
            return None
        chunk = ChunkRecord.decode(chunks[0], algorithm)
        if chunk.size != nbytes or chunk.stored < chunk.size:
            return None
        return cls(name, dtype, tuple(shape), (chunk,))


@dataclass(frozen=True)
class NodeManifest:
    """Everything stored for one node and epoch: its blobs and the format's own files.

    Example::

        >>> w = BlobRecord("w", "<f4", (2, 3), (ChunkRecord("w.0", 0, 24, 24, 0),))
        >>> manifest = NodeManifest("trainer_0", 0, "zarr", {"w": w})
        >>> manifest.blobs["w"].dtype, manifest.nbytes, manifest.db_type
        ('<f4', 24, 'zarr')
    """

    node: str
    epoch: int
    db_type: str
    blobs: Mapping[str, BlobRecord]
    files: tuple[ChunkRecord, ...] = ()
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    root: str | None = field(default=None, compare=False, repr=False)
    """Where the checkpoint's files are (a key prefix): set by the reader from the
    commit record's attempt; not stored in the manifest."""

    @property
    def data_key(self) -> str:
        """The key prefix of the checkpoint's files (``<node>.<epoch>`` for a manifest
        that was not read through a commit record, as earlier versions laid it out)."""
        return self.root if self.root is not None else get_ckpt_filename(self.node, self.epoch)

    @cached_property
    def nbytes(self) -> int:
        """Bytes of blob data (as held in memory); computed once (read-only)."""
        return sum(record.nbytes for record in self.blobs.values())

    @cached_property
    def stored_bytes(self) -> int:
        """Bytes on storage covered by checksums (data, padding and format files);
        computed once (read-only). A byte under several records (a packed archive's
        format range covers the small blobs it holds) counts once."""
        return _covered_bytes([*(c for r in self.blobs.values() for c in r.chunks), *self.files])

    def encode(self) -> bytes:
        """The manifest's bytes as stored: canonical JSON, gzip-compressed
        (:func:`~ckptstore.records._documents.gzip_document`, deterministic) when the JSON
        is larger than :data:`GZIP_MANIFESTS_LARGER_THAN` bytes and compression makes it
        smaller (JSON always shrinks; the check keeps the stored bytes within the JSON's
        size whatever happens).

        Refused with :class:`JobConfigurationError` if readers under the current
        :class:`~ckptstore.records._limits.Limits` would refuse them (as corrupt): a save
        never writes a checkpoint that its own loads cannot read. ``max_document_bytes``
        bounds the *JSON*, before compression: what a reader must decompress and hold."""
        data = self._encode()
        limits = current_limits()
        for count, most, what, field_name in (
            (
                len(data),
                limits.max_document_bytes,
                "bytes of JSON (before compression)",
                "max_document_bytes",
            ),
            (json_values_bound(data), limits.max_json_values, "JSON values", "max_json_values"),
            (len(self.blobs), limits.max_blobs, "blobs", "max_blobs"),
            (len(self.files), limits.max_chunks, "format ranges", "max_chunks"),
        ):
            if count > most:
                raise JobConfigurationError(
                    f"the manifest of node {self.node!r}, epoch {self.epoch} would hold {count} "
                    f"{what}, more than the {most} that loads accept (Limits.{field_name}), "
                    "so it was not written. Raise the limit wherever this checkpoint is saved "
                    f"and loaded (CKPTSTORE_LIMIT_{field_name.upper()}, or "
                    "ckptstore.records.set_limits), or spread the blobs over more nodes"
                )
        if len(data) <= GZIP_MANIFESTS_LARGER_THAN:
            return data
        compressed = gzip_document(data)
        return compressed if len(compressed) < len(data) else data

    @property
    def checksum(self) -> str:
        """The algorithm of every chunk's checksum, one of :data:`CHECKSUM_ALGORITHMS`;
        a :class:`JobConfigurationError` (a DB type's mistake) for chunks of several, or
        of one that loads could not check."""
        algorithms = {c.algorithm for r in self.blobs.values() for c in r.chunks}
        algorithms.update(c.algorithm for c in self.files)
        if len(algorithms) > 1 or not algorithms <= set(CHECKSUM_ALGORITHMS):
            raise JobConfigurationError(
                f"the chunks of node {self.node!r} are checked by {sorted(algorithms)}: a "
                f"manifest records one algorithm of {list(CHECKSUM_ALGORITHMS)} (make every "
                "ChunkRecord's algorithm that one), so nothing was written"
            )
        return algorithms.pop() if algorithms else CHECKSUM_ALGORITHM

    def _encode(self) -> bytes:
        return encode_document(
            MANIFEST_KIND,
            {
                "node": self.node,
                "epoch": self.epoch,
                "db_type": self.db_type,
                "checksum": self.checksum,
                "created": self.created,
                "blobs": {name: record.encode() for name, record in self.blobs.items()},
                "files": [chunk.encode() for chunk in self.files],
            },
        )

    @classmethod
    def decode(cls, data: bytes, *, url: str, key: str) -> NodeManifest:
        """The manifest ``data`` holds, every field checked (untrusted bytes); raises
        :class:`CorruptCheckpointError` naming ``url`` and ``key``.

        The same bytes decode to the same manifest (shared: treat it as read-only), so
        the last few are remembered by content and limits: a load that lists a node's
        blobs, then reads them, parses thousands of records once."""
        remembered = (bytes(data), current_limits())
        with _DECODED_LOCK:
            known = _DECODED.get(remembered)
        if known is not None:
            return known
        with paused_gc():
            manifest = cls._decode(data, url=url, key=key)
        with _DECODED_LOCK:
            _DECODED[remembered] = manifest
            while len(_DECODED) > _REMEMBER:
                del _DECODED[next(iter(_DECODED))]
        return manifest

    @classmethod
    def _decode(cls, data: bytes, *, url: str, key: str) -> NodeManifest:
        document = decode_document(data, MANIFEST_KIND, url=url, key=key)
        limits = current_limits()
        try:
            epoch, blobs, files = document["epoch"], document["blobs"], document["files"]
            if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 1 << 63:
                raise ValueError("the epoch is not a non-negative 64-bit integer")
            if not isinstance(blobs, dict) or not isinstance(files, list):
                raise ValueError("blobs is not an object or files not a list")
            if len(blobs) > limits.max_blobs:
                raise ValueError(f"more than the limit of {limits.max_blobs} blobs")
            if len(files) > limits.max_chunks:
                raise ValueError(f"more than the limit of {limits.max_chunks} files")
            # manifests before CRC-32 recorded CRC-32C (and said so, or nothing at all)
            algorithm = document.get("checksum", "crc32c")
            if algorithm not in CHECKSUM_ALGORITHMS:
                raise ValueError(
                    f"checksum {algorithm!r} is none of {list(CHECKSUM_ALGORITHMS)} (written "
                    "by a newer ckptstore? upgrade it to read this checkpoint)"
                )
            return cls(
                node=validate_node_name(str(document["node"])),
                epoch=epoch,
                db_type=str(document["db_type"]),
                blobs=MappingProxyType(
                    {name: BlobRecord.decode(name, raw, algorithm) for name, raw in blobs.items()}
                ),
                files=tuple(ChunkRecord.decode(chunk, algorithm) for chunk in files),
                created=str(document["created"]),
            )
        except MissingDependencyError:
            raise  # intact, but this environment lacks a package to read it: not corruption
        except (KeyError, TypeError, ValueError, AttributeError, CkptStoreError) as error:
            raise CorruptCheckpointError(
                f"manifest is malformed: {type(error).__name__}: {_short(error)}", url=url, file=key
            ) from None


def _covered_bytes(records: list[ChunkRecord]) -> int:
    """Bytes of the union of the ranges ``records`` cover, file by file."""
    by_key: dict[str, list[ChunkRecord]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(record)
    total = 0
    for pieces in by_key.values():
        if len(pieces) == 1:
            total += pieces[0].stored
            continue
        starts = np.fromiter((p.offset for p in pieces), dtype=np.int64, count=len(pieces))
        ends = starts + np.fromiter((p.stored for p in pieces), dtype=np.int64, count=len(pieces))
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reached = np.maximum.accumulate(ends)  # the end of everything up to each range
        before = np.concatenate([starts[:1], reached[:-1]])
        total += int(np.maximum(ends - np.maximum(starts, before), 0).sum())
    return total


_DECODED: dict[tuple[bytes, Limits], NodeManifest] = {}
"""The last few manifests decoded, by their exact bytes and the limits they passed."""
_DECODED_LOCK = threading.Lock()
_REMEMBER = 4


def _short(error: BaseException) -> str:
    """An error's message cut to one short line (stored text is attacker-chosen)."""
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."
