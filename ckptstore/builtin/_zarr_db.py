"""The ``zarr`` DB type (the default): one zarr v3 group per node per epoch, one array
per blob, readable by plain zarr-python, xarray or tensorstore without ckptstore.

ckptstore writes the zarr documents and chunk files itself, through the parallel I/O
engine, instead of going through zarr-python's per-array machinery: that is what makes
thousands of small blobs cheap. Chunks are cut so that each is one contiguous range of
the array's bytes (see :mod:`ckptstore.io._chunking`), written without copies; small
blobs are never split. Chunk keys use zarr's default encoding with the ``.`` separator,
so a blob's chunks sit next to its ``zarr.json``. Codecs are off by default;
``compression="zstd"`` or ``"blosc"`` turns them on.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["trainer_0/total"] = np.array([100])
    >>> manager = CheckpointManager("ckpt", "trainer_0", ZarrDB(compression="zstd"))
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(4))
    >>> import zarr
    >>> zarr.open_group("ckpt/trainer_0.4", mode="r")["trainer_0/total"][:]  # plain zarr reads it
    array([100])
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ckptstore._types import Array, Buffer
from ckptstore.errors import UnsupportedBlobError
from ckptstore.io._chunking import ArrayChunk, array_chunks, chunk_data, grid_chunk_shape
from ckptstore.io._engine import ReadRequest, WriteRequest
from ckptstore.plugin._db_type import DBLocation, DBType, WrittenDB, read_raw_blobs
from ckptstore.plugin._markers import hookimpl
from ckptstore.records._layout import MANIFEST_NAME
from ckptstore.records._manifest import BlobRecord, ChunkRecord

__all__ = ["COMPRESSIONS", "ZarrDB"]

COMPRESSIONS = ("zstd", "blosc")
METADATA = "zarr.json"
_DATA_TYPES = {
    "b": {1: "bool"},
    "i": {1: "int8", 2: "int16", 4: "int32", 8: "int64"},
    "u": {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"},
    "f": {2: "float16", 4: "float32", 8: "float64"},
    "c": {8: "complex64", 16: "complex128"},
}


def _zarr_data_type(dtype: np.dtype[Any]) -> str | None:
    return _DATA_TYPES.get(dtype.kind, {}).get(dtype.itemsize)


def _fill_value(dtype: np.dtype[Any]) -> Any:
    return {"b": False, "i": 0, "u": 0, "f": 0.0, "c": [0.0, 0.0]}[dtype.kind]


def _document(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


_SHAPE, _CHUNKS = "@@shape@@", "@@chunks@@"  # placeholders in array document templates


def _json_list(values: tuple[int, ...]) -> bytes:
    return b"[" + b",".join(b"%d" % value for value in values) + b"]"


def _group_document() -> bytes:
    return _document({"zarr_format": 3, "node_type": "group", "attributes": {}})


def _chunk_key(index: tuple[int, ...]) -> str:
    return "c" + "".join(f".{i}" for i in index)


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

    def __init__(self, compression: str | None = None, level: int = 3) -> None:
        if compression not in (None, *COMPRESSIONS):
            raise ValueError(
                f"compression must be None or one of {COMPRESSIONS}, not {compression!r}"
            )
        self.compression = compression
        self.level = level
        self._templates: dict[np.dtype[Any], bytes] = {}

    def __repr__(self) -> str:
        return f"ZarrDB(compression={self.compression!r}, level={self.level})"

    def check_blob(self, name: str, array: Array) -> None:
        if _zarr_data_type(array.dtype) is None:
            raise UnsupportedBlobError(
                name,
                f"zarr v3 has no core data type for {array.dtype} (bool, integers, floats and "
                "complex are supported); store it with db_type='npz'",
            )
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
                chunk_records.append(
                    ChunkRecord(key, 0, result.nbytes, chunk.nbytes, result.crc32c)
                )
            records[plan.name] = BlobRecord(
                plan.name,
                plan.array.dtype.str,
                plan.array.shape,
                tuple(chunk_records),
                codec=self.compression or "raw",
                layout={"chunk_shape": list(plan.chunk_shape)},
            )
        files = tuple(
            ChunkRecord(key, 0, results[key].nbytes, results[key].nbytes, results[key].crc32c)
            for key in documents
        )
        return WrittenDB(records, files)

    def _documents(self, plans: Sequence[_Plan]) -> dict[str, bytes]:
        documents = {METADATA: _group_document()}
        for plan in plans:
            parts = plan.name.split("/")
            for depth in range(1, len(parts)):
                documents.setdefault(f"{'/'.join(parts[:depth])}/{METADATA}", _group_document())
            documents[f"{plan.name}/{METADATA}"] = self._array_document(plan)
        return documents

    def _array_document(self, plan: _Plan) -> bytes:
        """The array's ``zarr.json``: a per-dtype template with the shapes filled in
        (thousands of small blobs make this a hot path)."""
        template = self._templates.get(plan.array.dtype)
        if template is None:
            template = self._templates[plan.array.dtype] = self._array_template(plan.array.dtype)
        return template % (_json_list(plan.array.shape), _json_list(plan.chunk_shape))

    def _array_template(self, dtype: np.dtype[Any]) -> bytes:
        bytes_codec: dict[str, Any] = {"name": "bytes"}
        if dtype.itemsize > 1:
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
                "data_type": _zarr_data_type(dtype),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": _CHUNKS}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
                "fill_value": _fill_value(dtype),
                "codecs": codecs,
                "attributes": {},
                "storage_transformers": [],
            }
        )
        document = document.replace(b"%", b"%%")
        for placeholder in (_SHAPE, _CHUNKS):
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
        return lambda data: codec.encode(data.view(dtype))

    # -- reading ----------------------------------------------------------------------

    def read(self, db: DBLocation, records: Sequence[BlobRecord]) -> dict[str, Array]:
        raw = [record for record in records if record.codec == "raw"]
        arrays = read_raw_blobs(db, raw)
        compressed = [record for record in records if record.codec != "raw"]
        if compressed:
            arrays.update(_read_compressed(db, compressed))
        return {record.name: arrays[record.name] for record in records}


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
            codec = _numcodec(record.codec, 0)
            dest = arrays[record.name].reshape(-1).view(np.uint8)
            position = 0
            for number, chunk in enumerate(record.chunks):
                yield ReadRequest(
                    chunk.key,
                    chunk.offset,
                    partial(_scratch, chunk.stored),
                    chunk.stored,
                    crc32c=chunk.crc32c,
                    holds=chunk.stored + chunk.size,
                    finish=_decoder(codec, dest[position : position + chunk.size]),
                    blob=record.name,
                    chunk=number,
                )
                position += chunk.size

    db.read(requests())
    return arrays


def _scratch(nbytes: int) -> list[memoryview]:
    return [memoryview(bytearray(nbytes))]


def _decoder(codec: Any, dest: np.ndarray[Any, Any]) -> Callable[[Sequence[memoryview]], None]:
    def decode(buffers: Sequence[memoryview]) -> None:
        decoded = np.frombuffer(codec.decode(buffers[0]), dtype=np.uint8)
        dest[:] = decoded[: dest.nbytes]

    return decode


@hookimpl
def ckptstore_db_types() -> list[type[DBType]]:
    return [ZarrDB]
