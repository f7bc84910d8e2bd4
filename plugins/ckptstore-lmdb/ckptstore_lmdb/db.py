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
from collections.abc import Iterable, Iterator, Mapping
from operator import attrgetter
from typing import Any, NamedTuple

import lmdb
import numpy as np

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
from ckptstore.paths import LocalPath
from ckptstore.plugin import DBLocation, DBType, WrittenDB
from ckptstore.records import BlobRecord, ChunkRecord, encode_dtype, validate_key
from ckptstore_lmdb.pages import LmdbFormatError, ValueSpan, value_spans

__all__ = ["DATA_FILE", "LmdbDB", "lmdb_key"]

DATA_FILE = "data.mdb"
MAX_VALUE_BYTES = 1 << 30
"""Largest chunk stored as one value (LMDB values are limited to 4 GiB)."""
BATCH_BYTES = 2 << 20
BATCH_VALUES = 50_000
"""A write transaction is committed after this many bytes or values, so that LMDB's
list of dirty pages never overflows, whatever the checkpoint's size. Small transactions
are also faster: LMDB copies each value into pages it allocates and frees them once the
commit has written them, so the next transaction gets the same memory back, already
mapped and cached, where one large transaction touches fresh memory for every page.
Writing 10,000 values of 4 KiB, or the 1 GiB mix, takes two thirds of the time in
transactions of 2 MiB as in one (/dev/shm and disk alike; from 512 KiB to 4 MiB it
hardly matters). The commits between are not synced (the file is, once, at the end),
and add a few pages to the file."""
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
        values = sorted(_plan(blobs, target), key=attrgetter("key"))
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
                covered = _coverage_records(view, spans.values())
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
    """Every value to store, blob by blob, each chunk of a blob in order."""
    wholes: dict[tuple[int, int], ArrayChunk] = {}
    for name, array in blobs.items():
        nbytes = array.nbytes
        shape = array.shape
        if shape and 0 < nbytes <= target:  # one chunk, the whole array (most blobs)
            yield _Value(lmdb_key(name, 0), name, 0, _whole(wholes, len(shape), nbytes), shape)
            continue
        itemsize = array.dtype.itemsize
        chunk_shape = grid_chunk_shape(array.shape, itemsize, target)
        for number, chunk in enumerate(array_chunks(array.shape, itemsize, chunk_shape)):
            yield _Value(lmdb_key(name, number), name, number, chunk, chunk_shape)


def _whole(wholes: dict[tuple[int, int], ArrayChunk], ndim: int, nbytes: int) -> ArrayChunk:
    """The one chunk of an array of ``ndim`` dimensions and ``nbytes`` bytes stored whole,
    made once per save for all such blobs (an ``ArrayChunk`` is frozen, so one serves them
    all: thousands of small blobs often share a size, and making one costs more than
    finding it)."""
    whole = wholes.get((ndim, nbytes))
    if whole is None:
        whole = wholes[ndim, nbytes] = ArrayChunk((0,) * ndim, 0, nbytes, nbytes)
    return whole


def _store(
    directory: str,
    values: list[_Value],
    blobs: Mapping[str, np.ndarray[Any, Any]],
    *,
    fsync: bool,
    batch_bytes: int = BATCH_BYTES,
) -> list[int]:
    """Write every value in key order, in transactions of at most ``batch_bytes`` (LMDB
    holds a transaction's pages in memory until it commits); returns the values'
    CRC-32s, in their order."""
    page = mmap.PAGESIZE
    pages = sum(math.ceil((value.chunk.nbytes + 64) / page) + 1 for value in values)
    map_size = ((pages + 1024) * page + (1 << 20) - 1) >> 20 << 20
    os.makedirs(directory, exist_ok=True)
    env = lmdb.open(
        directory, map_size=map_size, lock=False, sync=False, metasync=False, readahead=False
    )
    crcs: list[int] = []
    try:
        for batch in _batches(values, batch_bytes):
            with env.begin(write=True) as txn, txn.cursor() as cursor:
                # LMDB's loop over the items, in C; append: keys come in order, so no
                # B-tree search (a key out of order is not stored, and the walk of the
                # file after the write reports it missing)
                cursor.putmulti(_items(batch, blobs, crcs), append=True)
        if fsync:
            env.sync(True)
    finally:
        env.close()
    return crcs


def _items(
    values: Iterable[_Value], blobs: Mapping[str, np.ndarray[Any, Any]], crcs: list[int]
) -> Iterator[tuple[bytes, bytes | memoryview]]:
    """Each value's key and bytes, as ``Cursor.putmulti`` takes them, its CRC-32 appended
    to ``crcs`` on the way. A small value is copied to ``bytes`` once, for the CRC and for
    LMDB, and dropped once stored; a large one is passed as a view of its array."""
    for value in values:
        array = blobs[value.blob]
        nbytes = value.chunk.nbytes
        if nbytes < _COPY_BELOW:
            small = (
                array.tobytes()  # the value is the whole array
                if nbytes == array.nbytes
                else chunk_data(array, value.chunk, value.chunk_shape).tobytes()
            )
            crcs.append(crc32_buffer(small))
            yield value.key, small
            continue
        data = chunk_data(array, value.chunk, value.chunk_shape)
        crcs.append(crc32_of((data,)))
        yield value.key, byte_view(data)


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
    crcs: list[int],
    spans: Mapping[bytes, ValueSpan],
) -> dict[str, BlobRecord]:
    """Each blob's record, from its values' CRC-32s (``crcs``, in the order of
    ``values``) and where the walk of the file found them; the file must hold exactly the
    values written, each of the size written."""
    if len(spans) != len(values):
        raise _unlike_written(db, f"holds {len(spans)} values, {len(values)} were written")
    chunks: dict[str, list[ChunkRecord]] = {name: [] for name in blobs}
    # ``values`` are in key order, and a blob's keys share a prefix and end with the
    # chunk number big-endian: each blob's chunks come in number order
    for value, crc in zip(values, crcs, strict=True):
        span = spans.get(value.key)
        if span is None:  # as many values as written, so another key took its place
            raise _unlike_written(db, f"holds no value {value.key!r}, which was written")
        if span.size != value.chunk.nbytes:
            raise _unlike_written(
                db,
                f"value {value.key!r} holds {span.size} bytes, {value.chunk.nbytes} were written",
            )
        chunks[value.blob].append(_chunk_record(span.offset, span.size, crc))
    return {
        name: BlobRecord(name, encode_dtype(name, array.dtype), array.shape, tuple(chunks[name]))
        for name, array in blobs.items()
    }


def _unlike_written(db: DBLocation, what: str) -> CorruptCheckpointError:
    """The error for a file just written that does not hold what was written."""
    return CorruptCheckpointError(
        f"the LMDB file {what}", url=db.storage.display_url, file=db.key(DATA_FILE)
    )


def _chunk_record(offset: int, size: int, crc: int) -> ChunkRecord:
    """``size`` bytes of data at ``offset`` of the file, with their CRC-32."""
    return ChunkRecord(DATA_FILE, offset, size, size, crc)


def _coverage_records(view: memoryview, ranges: Iterable[tuple[int, int]]) -> list[ChunkRecord]:
    """Checksummed format records tiling the whole file, of up to :data:`COVER_BYTES`
    each, once the values' ``ranges`` (offset, size) are known to lie apart inside it."""
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
        records.append(_chunk_record(start, size, crc32_of((view[start : start + size],))))
    return records


@contextlib.contextmanager
def _mapped(fd: int) -> Iterator[memoryview]:
    mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        with memoryview(mapping) as view:
            yield view
    finally:
        mapping.close()
