"""The ``zarr`` DB type (the default): one zarr v3 group per node per epoch, one array
per blob, readable by plain zarr-python, xarray or tensorstore without ckptstore.

Uncompressed (the default), a node checkpoint is ONE file, ``blobs.zarr.zip``: the zarr
hierarchy inside a ZIP, the layout zarr's own ``ZipStore`` and fsspec's ``zip::`` URLs
read (from 512 MiB of large blobs, up to four such files, each a group holding its share
of the arrays: see :func:`~ckptstore.io.archive_shares`). Chunks are stored
as they are; each ``zarr.json`` is deflated (ZIP method 8: 293 bytes in 179 for a
float32 vector, which thousands of small blobs feel).
An array of up to 64 MiB (``CHUNKED_FROM``) is a single chunk (chunk shape = array
shape: no edge padding); a larger one is cut into chunks of at most 16 MiB, each its own
ZIP member, so that a plain reader reads a slice without the rest of the array
(:func:`_large_chunk_shape`). Members are written by the shared parallel archive writer
(:mod:`ckptstore.formats._packed`) in pieces at precomputed offsets; the manifest
records those pieces' byte ranges and CRC-32s, so loads stay parallel and partial.
Each array names its dimensions (``dimension_names``: ``dim<axis>_<length>``), which
xarray needs to open a group.

With ``compression="zstd"`` or ``"blosc"``, chunks are compressed one by one (sizes
unknown in advance), so that layout is a zarr directory store: one file per chunk and
per document. Chunk keys use zarr's ``v2`` encoding in a ZIP (``w/0.0``, the shortest)
and its default encoding with the ``.`` separator in a directory (``w/c.0.0``).

Every plain dtype is stored (:mod:`ckptstore.records._dtypes`): zarr's core types,
``S``/``U``/datetime64/timedelta64 as the data types zarr-python defines, longdouble as
``raw_bytes``, and ml_dtypes as unsigned integers with a ``ckptstore_dtype`` attribute.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["trainer_0/total"] = np.array([100])
    >>> manager = CheckpointManager("ckpt", "trainer_0", ZarrDB(compression="zstd"))
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(4))
    >>> import zarr
    >>> from ckptstore.protocol import open_node
    >>> files = open_node(manager.location.storage, "trainer_0", 4).data_key  # its attempt
    >>> zarr.open_group(f"ckpt/{files}", mode="r")["trainer_0/total"][:]  # plain zarr reads it
    array([100])
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ckptstore._types import Array, Buffer
from ckptstore.errors import CorruptCheckpointError, UnsupportedBlobError
from ckptstore.formats._packed import (
    Member,
    check_ranges,
    document_member,
    manifest_ranges,
    read_archive,
    write_shared,
)
from ckptstore.io import (
    ArrayChunk,
    ReadRequest,
    WriteRequest,
    array_chunks,
    chunk_data,
    grid_chunk_shape,
)
from ckptstore.plugin import DBLocation, DBType, WrittenDB, hookimpl, verify_records
from ckptstore.records import (
    MANIFEST_NAME,
    BlobRecord,
    ChunkRecord,
    NodeManifest,
    current_limits,
    encode_dtype,
    plain_dtype,
)

__all__ = ["ARCHIVE", "COMPRESSIONS", "ZarrDB"]

COMPRESSIONS = ("zstd", "blosc")
METADATA = "zarr.json"
ARCHIVE = "blobs.zarr.zip"
_DATA_TYPES = {
    "b": {1: "bool"},
    "i": {1: "int8", 2: "int16", 4: "int32", 8: "int64"},
    "u": {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"},
    "f": {2: "float16", 4: "float32", 8: "float64"},
    "c": {8: "complex64", 16: "complex128"},
}
_FILL_VALUES = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": [0.0, 0.0]}
_NAT = -(2**63)
CHUNKED_FROM = 64 << 20
"""Arrays of more bytes than this are cut into chunks (:func:`_large_chunk_shape`), each
its own archive member, so that a plain reader reads a slice without the rest."""
CHUNK_BYTES = 16 << 20
"""The most bytes of a chunk of such an array."""


def _zarr_data_type(dtype: np.dtype[Any]) -> tuple[Any, Any, bool]:
    """(zarr ``data_type``, ``fill_value``, whether the bytes codec names an endianness)
    of the plain dtype ``dtype`` (see :func:`ckptstore.records.plain_dtype`): zarr's
    core types, the numpy datetime/string types zarr-python defines, and ``raw_bytes``
    for longdouble (whose bits zarr has no float type for)."""
    name = _DATA_TYPES.get(dtype.kind, {}).get(dtype.itemsize)
    if name is not None:
        return name, _FILL_VALUES[dtype.kind], dtype.itemsize > 1
    if dtype.kind in "Mm":
        unit, scale = np.datetime_data(dtype)
        kind = "numpy.datetime64" if dtype.kind == "M" else "numpy.timedelta64"
        return {"name": kind, "configuration": {"unit": unit, "scale_factor": scale}}, _NAT, True
    if dtype.kind == "S":
        return _sized("null_terminated_bytes", dtype), "", False
    if dtype.kind == "U":
        return _sized("fixed_length_utf32", dtype), "", True
    fill = base64.b64encode(bytes(dtype.itemsize)).decode()
    return _sized("raw_bytes", dtype), fill, False


def _sized(name: str, dtype: np.dtype[Any]) -> dict[str, Any]:
    return {"name": name, "configuration": {"length_bytes": dtype.itemsize}}


def _attributes(dtype: np.dtype[Any]) -> dict[str, Any]:
    """ml_dtypes blobs are stored as unsigned integers; the attribute says which type
    to view them as (``array.view(ml_dtypes.bfloat16)``)."""
    if plain_dtype(dtype) is dtype:
        return {}
    return {"ckptstore_dtype": encode_dtype("", dtype)}


def _document(body: dict[str, Any]) -> bytes:
    """A ``zarr.json`` document, compact: one per blob, so its bytes count."""
    return json.dumps(body, separators=(",", ":")).encode()


_SHAPE, _CHUNKS, _DIMENSIONS = "@@shape@@", "@@chunks@@", "@@dims@@"  # template placeholders


def _json_list(values: tuple[int, ...]) -> bytes:
    return b"[" + b",".join(b"%d" % value for value in values) + b"]"


def _dimension_names(shape: tuple[int, ...]) -> bytes:
    """The array's ``dimension_names`` (JSON): ``dim<axis>_<length>``, which xarray needs
    to open a group. Named by axis and length, they are unique within an array and
    agree wherever two arrays share one (an xarray dataset wants each dimension to have
    one length), and they depend on the shape alone, so documents stay shared.

    Example::

        >>> _dimension_names((3, 5))
        b'["dim0_3","dim1_5"]'
    """
    return b"[" + b",".join(b'"dim%d_%d"' % pair for pair in enumerate(shape)) + b"]"


def _group_document() -> bytes:
    return _document({"zarr_format": 3, "node_type": "group"})


def _group_keys(names: Iterable[str]) -> list[str]:
    """The ``zarr.json`` keys of the groups that hold the arrays ``names``: the root's
    and each parent path's, once each, in the order first met.

    Example::

        >>> _group_keys(["a/b/w", "a/v", "x"])
        ['zarr.json', 'a/zarr.json', 'a/b/zarr.json']
    """
    keys = {METADATA: None}
    for name in names:
        if "/" not in name:  # most names, in a checkpoint of thousands of small blobs
            continue
        parts = name.split("/")
        for depth in range(1, len(parts)):
            keys.setdefault(f"{'/'.join(parts[:depth])}/{METADATA}")
    return list(keys)


def _chunk_key(index: tuple[int, ...]) -> str:
    """A chunk's key in a directory: zarr's default encoding with ``.`` (``c.0.1``)."""
    return "c" + "".join(f".{i}" for i in index)


def _member_key(index: tuple[int, ...]) -> str:
    """A chunk's key in a ZIP: zarr's ``v2`` encoding (``0.1``; ``0`` for a 0-d array),
    the shortest (each key is in the archive twice: 4 bytes a blob less than ``c/0``)."""
    return ".".join(map(str, index)) or "0"


@dataclass(frozen=True)
class _Plan:
    """One blob to write: its array, chunk shape and chunks."""

    name: str
    array: np.ndarray[Any, Any]
    chunk_shape: tuple[int, ...]
    chunks: tuple[ArrayChunk, ...]


class ZarrDB(DBType):
    """Each node checkpoint is a zarr v3 group; each blob an array in it.

    ``compression``: ``None`` (default, raw chunks), ``"zstd"`` or ``"blosc"`` (zstd
    inside, byte shuffle); ``level`` the compression level.

    Example::

        >>> from ckptstore import MultiNodeCheckpointManager
        >>> manager = MultiNodeCheckpointManager("ckpt", ZarrDB(compression="zstd", level=3))
    """

    name = "zarr"
    codecs = frozenset({"raw", *COMPRESSIONS})

    def __init__(self, compression: str | None = None, level: int = 3) -> None:
        if compression not in (None, *COMPRESSIONS):
            raise ValueError(
                f"compression must be None or one of {COMPRESSIONS}, not {compression!r}"
            )
        self.compression = compression
        self.level = level
        # raw chunks only: a compressed blob's chunks are not byte ranges of it
        self.supports_incremental = compression is None
        self._templates: dict[np.dtype[Any], bytes] = {}

    def __repr__(self) -> str:
        return f"ZarrDB(compression={self.compression!r}, level={self.level})"

    def check_blob(self, name: str, array: Array) -> None:
        encode_dtype(name, array.dtype)
        for segment in name.split("/"):
            if segment.startswith("__") or segment == METADATA:
                raise UnsupportedBlobError(
                    name, f"zarr reserves the name {segment!r}; rename the blob or use 'npz'"
                )
        if name.split("/", 1)[0] == MANIFEST_NAME:
            raise UnsupportedBlobError(
                name, f"ckptstore writes its manifest as {MANIFEST_NAME!r}; rename the blob"
            )

    # -- writing ----------------------------------------------------------------------

    def write(self, db: DBLocation, blobs: Mapping[str, Array]) -> WrittenDB:
        _refuse_nested_arrays(blobs)
        if self.compression is None:
            return self._write_archive(db, blobs)
        return self._write_directory(db, blobs)

    def _write_archive(
        self, db: DBLocation, blobs: Mapping[str, np.ndarray[Any, Any]]
    ) -> WrittenDB:
        """The hierarchy in ZIPs (one, or a few for hundreds of MiB: see
        :func:`~ckptstore.io.archive_shares`), each a zarr group holding
        its share of the arrays; one chunk per array (its shape recorded in the blob's
        layout only when it differs from the array's: empty arrays), or one member per
        chunk for arrays over ``CHUNKED_FROM``."""
        empty: dict[str, BlobRecord] = {}
        written = write_shared(db, ARCHIVE, blobs, lambda share: self._members(share, blobs, empty))
        found = written.blobs
        records = {name: found.get(name) or empty[name] for name in blobs}
        return WrittenDB(records, written.files)

    def _members(
        self,
        names: Sequence[str],
        blobs: Mapping[str, np.ndarray[Any, Any]],
        empty: dict[str, BlobRecord],
    ) -> list[Member]:
        """One archive's members: the group documents its arrays need, and each array's
        document and chunk (the records of arrays with no chunk go into ``empty``)."""
        group = document_member(METADATA, _group_document())
        members = [group._replace(name=key) for key in _group_keys(names)]
        # thousands of blobs share a few dtypes and shapes: their documents are made (and
        # deflated) once
        documents: dict[tuple[str, type, tuple[int, ...]], tuple[Member, tuple[int, ...]]] = {}
        chunk_keys = {0: "0", 1: "0"}
        for name in names:
            array = blobs[name]
            if array.nbytes > CHUNKED_FROM:
                members.extend(self._chunk_members(name, array))
                continue
            dtype, shape = array.dtype, array.shape
            kind = (dtype.str, dtype.type, shape)
            known = documents.get(kind)
            if known is None:
                chunk_shape = tuple([max(d, 1) for d in shape])
                plan = _Plan(name, array, chunk_shape, ())
                document = document_member(METADATA, self._array_document(plan))
                known = documents[kind] = (document, chunk_shape)
            document, chunk_shape = known
            members.append(
                Member(f"{name}/{METADATA}", document.prefix, None, None, document.inflated)
            )
            if array.size:  # no zero-length axis: the one chunk is the array, unrecorded
                key = chunk_keys.get(array.ndim) or _member_key((0,) * array.ndim)
                members.append(Member(f"{name}/{key}", b"", name, array))
            else:
                empty[name] = BlobRecord(
                    name,
                    encode_dtype(name, dtype),
                    shape,
                    (),
                    layout={"chunk_shape": list(chunk_shape)},
                )
        return members

    def _chunk_members(self, name: str, array: np.ndarray[Any, Any]) -> list[Member]:
        """A large array's document and chunks (:func:`_large_chunk_shape`), each chunk
        its own member, in C order: a plain reader (zarr-python through a ZIP reader,
        which reads a member from its start) fetches only the chunks a slice overlaps."""
        chunk_shape = _large_chunk_shape(array.shape, array.dtype.itemsize)
        document = _document_member(name, self._array_document(_Plan(name, array, chunk_shape, ())))
        members = [document]
        for chunk in array_chunks(array.shape, array.dtype.itemsize, chunk_shape):
            region = tuple(
                slice(i * c, min((i + 1) * c, d))
                for i, c, d in zip(chunk.index, chunk_shape, array.shape, strict=True)
            )
            members.append(
                Member(
                    f"{name}/{_member_key(chunk.index)}",
                    b"",
                    name,
                    array[region],
                    padding=chunk.padded - chunk.nbytes,
                    blob_shape=array.shape,
                )
            )
        return members

    def _write_directory(
        self, db: DBLocation, blobs: Mapping[str, np.ndarray[Any, Any]]
    ) -> WrittenDB:
        """Compressed chunks: one file per chunk and per document."""
        target = db.io.settings.chunk_bytes
        plans = []
        for name, array in blobs.items():
            chunk_shape = grid_chunk_shape(array.shape, array.dtype.itemsize, target)
            chunks = tuple(array_chunks(array.shape, array.dtype.itemsize, chunk_shape))
            plans.append(_Plan(name, array, chunk_shape, chunks))
        documents = self._documents(plans)
        # small files first: creating files is cheap before gigabytes are dirty, and
        # slow after (ext4's ordered mode makes each create wait on data write-back)
        order = sorted(
            ((plan, chunk) for plan in plans for chunk in plan.chunks),
            key=lambda pair: pair[1].padded,
        )
        requests = [WriteRequest(key, [data], len(data)) for key, data in documents.items()]
        requests.extend(self._chunk_request(plan, chunk) for plan, chunk in order)
        results = {result.key: result for result in db.write(requests)}
        records = {}
        for plan in plans:
            chunk_records = []
            for chunk in plan.chunks:
                key = f"{plan.name}/{_chunk_key(chunk.index)}"
                result = results[key]
                chunk_records.append(ChunkRecord(key, 0, result.nbytes, chunk.nbytes, result.crc))
            records[plan.name] = BlobRecord(
                plan.name,
                encode_dtype(plan.name, plan.array.dtype),
                plan.array.shape,
                tuple(chunk_records),
                codec=self.compression or "raw",
                layout={"chunk_shape": list(plan.chunk_shape)},
            )
        files = tuple(
            ChunkRecord(key, 0, results[key].nbytes, results[key].nbytes, results[key].crc)
            for key in documents
        )
        return WrittenDB(records, files)

    def _documents(self, plans: Sequence[_Plan]) -> dict[str, bytes]:
        group = _group_document()
        documents = dict.fromkeys(_group_keys(plan.name for plan in plans), group)
        for plan in plans:
            documents[f"{plan.name}/{METADATA}"] = self._array_document(plan)
        return documents

    def _array_document(self, plan: _Plan) -> bytes:
        """The array's ``zarr.json``: a per-dtype template with the shapes filled in
        (thousands of small blobs make this a hot path)."""
        template = self._templates.get(plan.array.dtype)
        if template is None:
            template = self._templates[plan.array.dtype] = self._array_template(plan.array.dtype)
        shape = plan.array.shape
        return template % (
            _json_list(shape),
            _json_list(plan.chunk_shape),
            _dimension_names(shape),
        )

    def _array_template(self, dtype: np.dtype[Any]) -> bytes:
        data_type, fill_value, has_endian = _zarr_data_type(plain_dtype(dtype))
        bytes_codec: dict[str, Any] = {"name": "bytes"}
        if has_endian:
            big = dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False)
            bytes_codec["configuration"] = {"endian": "big" if big else "little"}
        codecs: list[dict[str, Any]] = [bytes_codec]
        if self.compression == "zstd":
            codecs.append(
                {"name": "zstd", "configuration": {"level": self.level, "checksum": False}}
            )
        elif self.compression == "blosc":
            codecs.append(
                {
                    "name": "blosc",
                    "configuration": {
                        "typesize": dtype.itemsize,
                        "cname": "zstd",
                        "clevel": self.level,
                        "shuffle": "shuffle",
                        "blocksize": 0,
                    },
                }
            )
        document = _document(
            {
                "zarr_format": 3,
                "node_type": "array",
                "shape": _SHAPE,
                "data_type": data_type,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": _CHUNKS}},
                # "v2" ("." its default separator) in a ZIP: the shortest keys and
                # document (see _member_key); "default" with "." in a directory
                "chunk_key_encoding": (
                    {"name": "v2"}
                    if self.compression is None
                    else {"name": "default", "configuration": {"separator": "."}}
                ),
                "fill_value": fill_value,
                "codecs": codecs,
                "dimension_names": _DIMENSIONS,
                # optional in zarr v3 and left out when empty (as "storage_transformers"
                # always): one document per blob, so its bytes count
                **({"attributes": attributes} if (attributes := _attributes(dtype)) else {}),
            }
        )
        document = document.replace(b"%", b"%%")
        for placeholder in (_SHAPE, _CHUNKS, _DIMENSIONS):
            document = document.replace(f'"{placeholder}"'.encode(), b"%s")
        return document

    def _chunk_request(self, plan: _Plan, chunk: ArrayChunk) -> WriteRequest:
        key = f"{plan.name}/{_chunk_key(chunk.index)}"
        padding = chunk.padded - chunk.nbytes
        array, chunk_shape = plan.array, plan.chunk_shape
        if self.compression is None and array.flags.c_contiguous:
            data = chunk_data(array, chunk, chunk_shape)
            parts: list[Buffer] = [data, bytes(padding)] if padding else [data]
            return WriteRequest(key, parts, chunk.padded, holds=padding, blob=plan.name)
        encode = self._encoder(array.dtype)

        def produce() -> list[Buffer]:
            data = chunk_data(array, chunk, chunk_shape)
            if padding:
                data = np.concatenate([data, np.zeros(padding, dtype=np.uint8)])
            return [encode(data)]

        return WriteRequest(key, produce, chunk.padded, holds=2 * chunk.padded, blob=plan.name)

    def _encoder(self, dtype: np.dtype[Any]) -> Callable[[np.ndarray[Any, Any]], Buffer]:
        if self.compression is None:
            return lambda data: data
        codec = _numcodec(self.compression, self.level)
        # numcodecs takes buffers of numpy's own dtypes (blosc shuffles by their size)
        plain = plain_dtype(dtype)
        if plain.kind in "fc" and _DATA_TYPES[plain.kind].get(plain.itemsize) is None:
            plain = np.dtype(f"V{plain.itemsize}")  # longdouble: no buffer format
        return lambda data: codec.encode(data.view(plain))

    # -- reading ----------------------------------------------------------------------

    def read(self, db: DBLocation, records: Sequence[BlobRecord]) -> dict[str, Array]:
        check_ranges(db, ARCHIVE, ((r.name, c) for r in records for c in r.chunks))
        raw = [record for record in records if record.codec == "raw"]
        arrays = read_archive(db, raw)
        compressed = [record for record in records if record.codec != "raw"]
        if compressed:
            arrays.update(_read_compressed(db, compressed))
        return {record.name: arrays[record.name] for record in records}

    def verify(self, db: DBLocation, manifest: NodeManifest) -> list[CorruptCheckpointError]:
        """The archive's ranges against its real size, checksums, and each compressed
        chunk's header: the size it declares must fit the blob (a chunk that would expand
        beyond it is reported, not decoded)."""
        try:
            check_ranges(db, ARCHIVE, manifest_ranges(manifest))
        except CorruptCheckpointError as error:
            return [error]
        return verify_records(db, manifest, check_chunk=_check_declared_size)


def _document_member(name: str, document: bytes) -> Member:
    return document_member(f"{name}/{METADATA}", document)


def _large_chunk_shape(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The chunk shape of an array of more than ``CHUNKED_FROM`` bytes: chunks of at most
    ``CHUNK_BYTES`` (or one item, if larger), each a contiguous range of the array's
    bytes (whole trailing axes, :func:`~ckptstore.io.grid_chunk_shape`), along the first
    axis where its rows allow.
    zarr stores an edge chunk whole, padded: of the steps along the cut axis from half
    the most that fit up to that most, the one that pads least (the largest if tied).

    Example::

        >>> _large_chunk_shape((1000, 1 << 18), 4)  # rows of 1 MiB: 16 fit, 10 pad none
        (10, 262144)
        >>> _large_chunk_shape((1 << 26,), 2)  # 128 MiB of float16: 8 chunks of 16 MiB
        (8388608,)
    """
    chunk_shape = grid_chunk_shape(shape, itemsize, CHUNK_BYTES)
    if not shape:  # a 0-d array of one huge item (bytes, text): one chunk
        return chunk_shape
    axis = next((a for a, c in enumerate(chunk_shape) if c != 1), len(shape) - 1)
    most, length = chunk_shape[axis], shape[axis]
    # each count of chunks along the axis, from the fewest, with the fewest steps it takes
    fewest = -(-length // most)
    counts = range(fewest, max(fewest, -(-length // max(1, most // 2))) + 1)
    steps = min((-(-length // n) for n in counts), key=lambda k: -(-length // k) * k - length)
    return (*chunk_shape[:axis], steps, *chunk_shape[axis + 1 :])


def _refuse_nested_arrays(blobs: Mapping[str, Any]) -> None:
    names = set(blobs)
    for name in names:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in names:
                raise UnsupportedBlobError(
                    name,
                    f"zarr stores blobs as arrays in a hierarchy and {parent!r} is an array, so "
                    f"{name!r} cannot sit under it; rename one of them or use db_type='npz'",
                )


def _numcodec(compression: str, level: int) -> Any:
    import numcodecs

    if compression == "zstd":
        return numcodecs.Zstd(level=level)
    return numcodecs.Blosc(cname="zstd", clevel=level, shuffle=numcodecs.Blosc.SHUFFLE)


def _read_compressed(
    db: DBLocation, records: Sequence[BlobRecord]
) -> dict[str, np.ndarray[Any, Any]]:
    arrays = {record.name: np.empty(record.shape, record.numpy_dtype()) for record in records}

    def requests() -> Iterator[ReadRequest]:
        for record in records:
            if record.codec not in COMPRESSIONS:
                raise UnsupportedBlobError(record.name, f"unknown codec {record.codec!r}")
            codec = _numcodec(record.codec, 0)
            bound = _chunk_bound(record)
            dest = arrays[record.name].reshape(-1).view(np.uint8)
            position = 0
            for number, chunk in enumerate(record.chunks):
                yield ReadRequest(
                    chunk.key,
                    chunk.offset,
                    partial(_scratch, chunk.stored),
                    chunk.stored,
                    crc=chunk.crc,
                    algorithm=chunk.algorithm,
                    holds=chunk.stored + bound,
                    finish=_decoder(
                        record.codec, codec, bound, dest[position : position + chunk.size]
                    ),
                    blob=record.name,
                    chunk=number,
                )
                position += chunk.size

    db.read(requests())
    return arrays


def _chunk_bound(record: BlobRecord) -> int:
    """Bytes one chunk of ``record`` decodes to (its padded chunk), from the manifest's
    chunk shape, checked against the limits: decompression never goes beyond it."""
    chunk_shape = record.layout.get("chunk_shape")
    if (
        not isinstance(chunk_shape, list)
        or len(chunk_shape) != len(record.shape)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in chunk_shape)
    ):
        raise ValueError("the manifest's chunk shape does not fit the blob's shape")
    bound = math.prod(chunk_shape) * record.numpy_dtype().itemsize
    if bound > current_limits().max_chunk_bytes:
        raise ValueError("the manifest's chunk shape is beyond the chunk size limit")
    return max(bound, 1)


def _check_declared_size(record: BlobRecord, chunk: ChunkRecord, data: memoryview) -> None:
    if record.codec == "raw":
        return
    declared = _declared_size(record.codec, data)
    if declared is None or not chunk.size <= declared <= _chunk_bound(record):
        raise ValueError("the compressed chunk declares a size that does not fit its blob")


def _scratch(nbytes: int) -> list[memoryview]:
    return [memoryview(bytearray(nbytes))]


def _decoder(
    name: str, codec: Any, bound: int, dest: np.ndarray[Any, Any]
) -> Callable[[Sequence[memoryview]], None]:
    def decode(buffers: Sequence[memoryview]) -> None:
        declared = _declared_size(name, buffers[0])
        if declared is None or not dest.nbytes <= declared <= bound:
            raise ValueError("the compressed chunk declares a size that does not fit its blob")
        decoded = np.empty(declared, dtype=np.uint8)
        codec.decode(buffers[0], out=decoded)
        dest[:] = decoded[: dest.nbytes]

    return decode


_ZSTD_MAGIC = 0xFD2FB528


def _declared_size(name: str, frame: memoryview) -> int | None:
    """The decoded size a compressed chunk declares in its header (``None``: unknown),
    read before decoding so a small chunk cannot expand beyond its bound."""
    data = bytes(frame[:18])
    if name == "blosc":
        if len(data) < 16:
            return None
        return int.from_bytes(data[4:8], "little")
    if len(data) < 5 or int.from_bytes(data[:4], "little") != _ZSTD_MAGIC:
        return None
    descriptor = data[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0 or len(data) < start + width:
        return None
    value = int.from_bytes(data[start : start + width], "little")
    return value + 256 if width == 2 else value


@hookimpl
def ckptstore_db_types() -> list[type[DBType]]:
    return [ZarrDB]
