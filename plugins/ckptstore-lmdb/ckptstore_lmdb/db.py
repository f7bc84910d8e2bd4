"""The ``lmdb`` DB type: one LMDB database per node checkpoint, for many small blobs.

``<node>.<epoch>/data.mdb`` is an ordinary LMDB environment (open it with
``lmdb.open(path, readonly=True, lock=False)``). Each blob is stored as one value per
chunk, under the key ``<blob name>\\0<chunk number, 4 bytes big-endian>`` (names too
long for an LMDB key use ``\\x01`` + their SHA-256 in hex instead). Large blobs are cut
into chunks of about ``IOSettings.chunk_bytes``.

After the write transaction, the file's B-tree is walked (:mod:`ckptstore_lmdb.pages`)
to find the byte range of every value; the manifest records each chunk as that range
with its CRC-32, and the whole file as format ranges of up to 16 MiB with a CRC-32 each
(coverage records: every byte, pages, keys and headers included, is checked by
``verify``; manifests written before recorded the bytes between values as one gap
record each, and still load and verify). So loads read only the requested blobs'
bytes, straight into place and verified, ``ckptstore verify`` checks every byte of the
file, and ``ckptstore cp`` copies a checkpoint to any storage, where it stays readable.

Writing needs a local directory (``needs_rename``): LMDB memory-maps its file.

Example::

    >>> from ckptstore import CheckpointManager
    >>> manager = CheckpointManager("ckpt", "trainer_0", db_type="lmdb")
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import mmap
import os
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import lmdb
import numpy as np

from ckptstore.builtin import LocalPath
from ckptstore.errors import CorruptCheckpointError, JobConfigurationError, storage_error
from ckptstore.io import (
    ArrayChunk,
    array_chunks,
    byte_view,
    chunk_data,
    crc32_buffer,
    crc32_of,
    grid_chunk_shape,
)
from ckptstore.plugin import DBLocation, DBType, WrittenDB
from ckptstore.records import BlobRecord, ChunkRecord, encode_dtype, validate_key
from ckptstore_lmdb.pages import LmdbFormatError, ValueSpan, value_spans

__all__ = ["DATA_FILE", "LmdbDB", "lmdb_key"]

DATA_FILE = "data.mdb"
MAX_VALUE_BYTES = 1 << 30
"""Largest chunk stored as one value (LMDB values are limited to 4 GiB)."""
BATCH_BYTES = 256 << 20
BATCH_VALUES = 50_000
"""A write transaction is committed after this many bytes or values, so that LMDB's
list of dirty pages never overflows, whatever the checkpoint's size."""
COVER_BYTES = 16 << 20
"""The file's format records (the checksums ``verify`` checks every byte against) each
cover at most this many bytes."""
_COPY_BELOW = 16 << 10
"""Values smaller than this are copied to ``bytes`` once, for the CRC and for LMDB."""
_SEPARATOR = b"\x00"
_HASHED = b"\x01"


def lmdb_key(blob: str, chunk: int, max_key_size: int = 511) -> bytes:
    """The LMDB key of chunk ``chunk`` of blob ``blob``.

    Example::

        >>> lmdb_key("w", 2)
        b'w\\x00\\x00\\x00\\x00\\x02'
    """
    name = blob.encode()
    if len(name) + 5 > max_key_size:
        name = _HASHED + hashlib.sha256(name).hexdigest().encode()
    return name + _SEPARATOR + chunk.to_bytes(4, "big")


class _Value(NamedTuple):  # one per small blob: a tuple is the cheapest record
    key: bytes
    blob: str
    number: int
    chunk: ArrayChunk
    chunk_shape: tuple[int, ...]


class LmdbDB(DBType):
    """Blobs as values of one LMDB database per node checkpoint (local disk only).

    Example::

        >>> from ckptstore import MultiNodeCheckpointManager
        >>> manager = MultiNodeCheckpointManager("ckpt", db_type="lmdb")
        >>> manager.db_type.name
        'lmdb'
    """

    name = "lmdb"
    needs_rename = True

    def write(self, db: DBLocation, blobs: Mapping[str, np.ndarray[Any, Any]]) -> WrittenDB:
        directory = local_directory(db)
        target = max(1, min(db.io.settings.chunk_bytes, MAX_VALUE_BYTES))
        values = sorted(_plan(blobs, target), key=lambda value: value.key)
        try:
            crcs = _store(
                directory,
                values,
                blobs,
                fsync=_durability(db) == "fsync",
                batch_bytes=min(BATCH_BYTES, db.io.settings.memory_budget // 2),
            )
        except (lmdb.Error, OSError) as error:
            cause = error if isinstance(error, OSError) else _os_error(error, directory)
            raise storage_error(
                db.storage.display_url, db.key(DATA_FILE), "write", cause
            ) from error
        path = os.path.join(directory, DATA_FILE)
        with open(path, "rb") as file, _mapped(file.fileno()) as view:
            try:
                spans = value_spans(view)
                covered = _coverage_records(
                    view, [(span.offset, span.size) for span in spans.values()]
                )
            except LmdbFormatError as error:
                raise CorruptCheckpointError(
                    f"the LMDB file just written cannot be walked: {error}",
                    url=db.storage.display_url,
                    file=db.key(DATA_FILE),
                ) from None
        records = _blob_records(db, blobs, values, crcs, spans)
        return WrittenDB(records, tuple(covered))


_ERRNOS = (
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EIO,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENAMETOOLONG,
)


def _os_error(error: lmdb.Error, path: str) -> OSError:
    """``error`` (py-lmdb's exceptions carry no errno, only the C library's message) as
    the :class:`OSError` it reports, so it is classified like any other: a full disk
    (``lmdb.DiskError``), an I/O error, permission denied..."""
    text = str(error)
    for code in _ERRNOS:
        if os.strerror(code) in text:
            if code == errno.EIO and _full(path):
                # LMDB reports a write cut short (a disk filling up) as EIO
                code = errno.ENOSPC
            return OSError(code, os.strerror(code), path)
    if isinstance(error, lmdb.DiskError):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return OSError(errno.EIO, f"{type(error).__name__}: {text}", path)


def _full(path: str) -> bool:
    """Whether the file system holding ``path`` has less than 64 KiB left for this user
    (what a short write on a full disk leaves)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 64 << 10


def local_directory(db: DBLocation) -> str:
    """The local directory holding ``db`` (LMDB memory-maps its file)."""
    storage = db.storage
    if not isinstance(storage, LocalPath):
        raise JobConfigurationError(
            f"DB type 'lmdb' writes only to local directories, not to {storage.display_url}; "
            "save locally and `ckptstore cp` the checkpoint, or use 'zarr' or 'npz'"
        )
    return os.path.join(storage.root, validate_key(db.root))


def _durability(db: DBLocation) -> str:
    durability: str = getattr(db.storage, "durability", "fsync")
    return durability


def _plan(blobs: Mapping[str, np.ndarray[Any, Any]], target: int) -> Iterator[_Value]:
    for name, array in blobs.items():
        nbytes = array.nbytes
        shape = array.shape
        if shape and 0 < nbytes <= target:  # one chunk, the whole array (most blobs)
            whole = ArrayChunk((0,) * len(shape), 0, nbytes, nbytes)
            yield _Value(lmdb_key(name, 0), name, 0, whole, shape)
            continue
        itemsize = array.dtype.itemsize
        chunk_shape = grid_chunk_shape(array.shape, itemsize, target)
        for number, chunk in enumerate(array_chunks(array.shape, itemsize, chunk_shape)):
            yield _Value(lmdb_key(name, number), name, number, chunk, chunk_shape)


def _store(
    directory: str,
    values: list[_Value],
    blobs: Mapping[str, np.ndarray[Any, Any]],
    *,
    fsync: bool,
    batch_bytes: int = BATCH_BYTES,
) -> dict[bytes, int]:
    """Write every value in key order, in transactions of at most ``batch_bytes`` (LMDB
    holds a transaction's pages in memory until it commits); returns each value's
    CRC-32."""
    page = mmap.PAGESIZE
    pages = sum(math.ceil((value.chunk.nbytes + 64) / page) + 1 for value in values)
    map_size = ((pages + 1024) * page + (1 << 20) - 1) >> 20 << 20
    os.makedirs(directory, exist_ok=True)
    env = lmdb.open(
        directory, map_size=map_size, lock=False, sync=False, metasync=False, readahead=False
    )
    crcs: dict[bytes, int] = {}
    try:
        for batch in _batches(values, batch_bytes):
            with env.begin(write=True) as txn:
                for value in batch:
                    array = blobs[value.blob]
                    if value.chunk.nbytes < _COPY_BELOW:  # one copy: the CRC's and LMDB's
                        small = (
                            array.tobytes()  # the value is the whole array
                            if value.chunk.nbytes == array.nbytes
                            else chunk_data(array, value.chunk, value.chunk_shape).tobytes()
                        )
                        crcs[value.key] = crc32_buffer(small)
                        txn.put(value.key, small, append=True)
                        continue
                    data = chunk_data(array, value.chunk, value.chunk_shape)
                    crcs[value.key] = crc32_of((data,))
                    txn.put(value.key, byte_view(data), append=True)
        if fsync:
            env.sync(True)
    finally:
        env.close()
    return crcs


def _batches(values: list[_Value], batch_bytes: int) -> Iterator[list[_Value]]:
    batch: list[_Value] = []
    held = 0
    for value in values:
        batch.append(value)
        held += value.chunk.nbytes
        if len(batch) >= BATCH_VALUES or held >= batch_bytes:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def _blob_records(
    db: DBLocation,
    blobs: Mapping[str, np.ndarray[Any, Any]],
    values: list[_Value],
    crcs: Mapping[bytes, int],
    spans: Mapping[bytes, ValueSpan],
) -> dict[str, BlobRecord]:
    if set(spans) != set(crcs):
        raise CorruptCheckpointError(
            f"the LMDB file holds {len(spans)} values, {len(crcs)} were written",
            url=db.storage.display_url,
            file=db.key(DATA_FILE),
        )
    chunks: dict[str, list[ChunkRecord]] = {name: [] for name in blobs}
    # ``values`` are in key order, and a blob's keys share a prefix and end with the
    # chunk number big-endian: each blob's chunks come in number order
    for value in values:
        span = spans[value.key]
        if span.size != value.chunk.nbytes:
            raise CorruptCheckpointError(
                f"value {value.key!r} holds {span.size} bytes, {value.chunk.nbytes} were written",
                url=db.storage.display_url,
                file=db.key(DATA_FILE),
            )
        chunks[value.blob].append(
            ChunkRecord(DATA_FILE, span.offset, span.size, span.size, crcs[value.key])
        )
    return {
        name: BlobRecord(name, encode_dtype(name, array.dtype), array.shape, tuple(chunks[name]))
        for name, array in blobs.items()
    }


def _coverage_records(view: memoryview, ranges: list[tuple[int, int]]) -> list[ChunkRecord]:
    """Checksummed format records tiling the whole file, of up to :data:`COVER_BYTES`
    each, once the values' ``ranges`` are known to lie apart inside it."""
    position = 0
    for offset, size in sorted(ranges):
        if offset < position:
            raise LmdbFormatError(f"two values overlap at offset {offset}")
        position = offset + size
    if position > view.nbytes:
        raise LmdbFormatError(f"a value ends at offset {position}, past the end of the file")
    records = []
    for start in range(0, view.nbytes, COVER_BYTES):
        size = min(COVER_BYTES, view.nbytes - start)
        crc = crc32_of((view[start : start + size],))
        records.append(ChunkRecord(DATA_FILE, start, size, size, crc))
    return records


@contextlib.contextmanager
def _mapped(fd: int) -> Iterator[memoryview]:
    mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        with memoryview(mapping) as view:
            yield view
    finally:
        mapping.close()
