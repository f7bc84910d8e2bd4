"""A node checkpoint's manifest: what was stored where, and the CRC-32C of every piece.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from ckptstore._types import JSONObject
from ckptstore.errors import CkptStoreError, CorruptCheckpointError, UnsupportedBlobError
from ckptstore.records._documents import decode_document, encode_document
from ckptstore.records._names import validate_blob_name, validate_key, validate_node_name

__all__ = ["BlobRecord", "ChunkRecord", "NodeManifest", "safe_dtype"]

MANIFEST_KIND = "ckptstore.manifest"
_ALLOWED_KINDS = frozenset("biufcmMSU")


def safe_dtype(text: str, blob: str) -> np.dtype[np.generic]:
    """Parse a recorded dtype string, refusing anything that could hold Python objects."""
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError) as error:
        raise UnsupportedBlobError(blob, f"unknown dtype {text!r} ({error})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in _ALLOWED_KINDS:
        raise UnsupportedBlobError(blob, f"dtype {text!r} is not a plain numeric or string dtype")
    return dtype


@dataclass(frozen=True)
class ChunkRecord:
    """One stored piece: ``stored`` bytes at ``offset`` of object ``key`` (relative to the
    node checkpoint), checked by ``crc32c``, supplying ``size`` bytes of its blob (less
    than ``stored`` for a padded edge chunk; the decoded length for compressed chunks).
    """

    key: str
    offset: int
    stored: int
    size: int
    crc32c: int

    def encode(self) -> list[str | int]:
        return [self.key, self.offset, self.stored, self.size, self.crc32c]

    @classmethod
    def decode(cls, raw: object) -> ChunkRecord:
        if not isinstance(raw, list) or len(raw) != 5:
            raise ValueError(f"chunk record {raw!r} is not a list of five fields")
        key, offset, stored, size, crc = raw
        for value in (offset, stored, size, crc):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"chunk field {value!r} is not a non-negative integer")
        return cls(validate_key(key), offset, stored, size, crc)


@dataclass(frozen=True)
class BlobRecord:
    """One blob: dtype (numpy's ``dtype.str``, e.g. ``"<f4"``), shape, codec and chunks.

    ``layout`` holds format-specific details (a zarr chunk shape, for instance).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[ChunkRecord, ...]
    codec: str = "raw"
    layout: Mapping[str, object] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def stored_bytes(self) -> int:
        return sum(chunk.stored for chunk in self.chunks)

    def numpy_dtype(self) -> np.dtype[np.generic]:
        return safe_dtype(self.dtype, self.name)

    def encode(self) -> JSONObject:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "codec": self.codec,
            "layout": dict(self.layout),
            "chunks": [chunk.encode() for chunk in self.chunks],
        }

    @classmethod
    def decode(cls, name: str, raw: object) -> BlobRecord:
        validate_blob_name(name)
        if not isinstance(raw, dict):
            raise ValueError(f"blob record {raw!r} is not a JSON object")
        chunks, layout = raw["chunks"], raw.get("layout", {})
        if not isinstance(chunks, list) or not isinstance(layout, dict):
            raise ValueError("a blob record's chunks must be a list and its layout an object")
        shape = raw["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"shape {shape!r} is not a list of non-negative integers")
        record = cls(
            name=name,
            dtype=str(raw["dtype"]),
            shape=tuple(shape),
            chunks=tuple(ChunkRecord.decode(chunk) for chunk in chunks),
            codec=str(raw["codec"]),
            layout=dict(layout),
        )
        record.numpy_dtype()
        if record.codec == "raw" and any(c.stored < c.size for c in record.chunks):
            # a raw chunk stores its bytes plus padding: never fewer (readers would
            # otherwise take the difference as negative padding and skip the CRC check)
            raise ValueError("a raw chunk stores fewer bytes than it supplies")
        if record.codec == "raw" and sum(c.size for c in record.chunks) != record.nbytes:
            raise ValueError(
                f"chunks supply {sum(c.size for c in record.chunks)} bytes, "
                f"dtype and shape need {record.nbytes}"
            )
        return record


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

    @property
    def nbytes(self) -> int:
        """Bytes of blob data (as held in memory)."""
        return sum(record.nbytes for record in self.blobs.values())

    @property
    def stored_bytes(self) -> int:
        """Bytes on storage covered by checksums (data, padding and format files)."""
        return sum(r.stored_bytes for r in self.blobs.values()) + sum(f.stored for f in self.files)

    def encode(self) -> bytes:
        return encode_document(
            MANIFEST_KIND,
            {
                "node": self.node,
                "epoch": self.epoch,
                "db_type": self.db_type,
                "checksum": "crc32c",
                "created": self.created,
                "blobs": {name: record.encode() for name, record in self.blobs.items()},
                "files": [chunk.encode() for chunk in self.files],
            },
        )

    @classmethod
    def decode(cls, data: bytes, *, url: str, key: str) -> NodeManifest:
        document = decode_document(data, MANIFEST_KIND, url=url, key=key)
        try:
            epoch, blobs, files = document["epoch"], document["blobs"], document["files"]
            if not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"epoch {epoch!r} is not a non-negative integer")
            if not isinstance(blobs, dict) or not isinstance(files, list):
                raise ValueError("blobs must be a JSON object and files a list")
            return cls(
                node=validate_node_name(str(document["node"])),
                epoch=epoch,
                db_type=str(document["db_type"]),
                blobs={name: BlobRecord.decode(name, raw) for name, raw in blobs.items()},
                files=tuple(ChunkRecord.decode(chunk) for chunk in files),
                created=str(document["created"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError, CkptStoreError) as error:
            raise CorruptCheckpointError(
                f"manifest is malformed: {type(error).__name__}: {error}", url=url, file=key
            ) from None
