"""The DB-type contract: how one node's blobs are laid out under its checkpoint key.

A DB type writes blobs through the I/O engine and returns what it stored (one
:class:`~ckptstore.records._manifest.BlobRecord` per blob plus the format's own files, each
with a checksum: the CRC-32 the engine returns for each write). The commit protocol
(:mod:`ckptstore.protocol._commit`) does the rest: staging, manifest, durability, commit
record. Formats whose chunks are raw byte ranges of the blobs (``codec="raw"``) get
reading and verification for free.

Example::

    >>> from ckptstore.io import array_bytes
    >>> from ckptstore.records import encode_dtype
    >>> class RawFiles(DBType):
    ...     name = "rawfiles"
    ...
    ...     def write(self, db, blobs):
    ...         records = {}
    ...         for name, array in blobs.items():
    ...             data = array_bytes(array)
    ...             result, = db.write([WriteRequest(f"{name}.bin", [data], data.nbytes)])
    ...             chunk = ChunkRecord(f"{name}.bin", 0, data.nbytes, data.nbytes, result.crc)
    ...             dtype = encode_dtype(name, array.dtype)
    ...             records[name] = BlobRecord(name, dtype, array.shape, (chunk,))
    ...         return WrittenDB(records)
    >>> from ckptstore.builtin import LocalPath
    >>> db = DBLocation(LocalPath("ckpt"), "trainer_0.1", ParallelIO())
    >>> written = RawFiles().write(db, {"w": np.arange(3.0)})
    >>> RawFiles().read(db, [written.blobs["w"]])["w"]
    array([0., 1., 2.])
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any, ClassVar, Protocol

import numpy as np

from ckptstore._types import Array
from ckptstore.errors import CorruptCheckpointError, UnsupportedBlobError
from ckptstore.io import (
    DIRECT_FROM,
    ParallelIO,
    ReadRequest,
    WriteRequest,
    WriteResult,
    aligned_buffer,
    checksum_of,
    resolve_key,
)
from ckptstore.plugin._coalesce import Span, coalesced_reads
from ckptstore.plugin._path_type import PathType
from ckptstore.records import BlobRecord, ChunkRecord, NodeManifest

__all__ = ["DBLocation", "DBType", "SharedChunks", "WrittenDB", "read_raw_blobs", "verify_records"]


@dataclass(frozen=True)
class DBLocation:
    """One node checkpoint as a format sees it: keys under its root, and an I/O engine.

    A DB type reads and writes keys relative to the root, and moves chunks with the
    engine.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> db = DBLocation(LocalPath("ckpt"), "trainer_0.1", ParallelIO())
        >>> view = memoryview(b"data")
        >>> db.write([WriteRequest("w/c.0", [view], view.nbytes)])  # stored at <root>/w/c.0
        [WriteResult(key='w/c.0', nbytes=4, crc=...)]
        >>> db.storage.read_bytes(db.key("w/c.0"))
        b'data'
    """

    storage: PathType
    root: str
    io: ParallelIO
    shared: SharedChunks | None = None
    """An incremental save's chunk store (docs/design.md, "Incremental checkpoints"):
    formats that support it hand it their large blobs; ``None`` for a full save."""
    whole: bool = False
    """The read takes every blob of the checkpoint: memory the storage lends
    (:meth:`PathType.lend`) may become the blobs, as nothing of it is left unused."""

    def key(self, relative: str) -> str:
        """The storage key of ``relative`` inside this checkpoint (or of a shared chunk
        it names: :func:`~ckptstore.io.resolve_key`)."""
        return resolve_key(self.root, relative)

    def write(self, requests: Iterable[WriteRequest]) -> list[WriteResult]:
        """Write through the engine; keys in requests and results are relative.
        A list of requests is announced to the storage first (see
        :meth:`PathType.prepare_keys`)."""
        if isinstance(requests, list):
            self.storage.prepare_keys(self.key(request.key) for request in requests)
        return self.io.write(self.storage, requests, prefix=self.root)

    def read(
        self,
        requests: Iterable[ReadRequest],
        *,
        verify: bool | None = None,
        on_error: Callable[[ReadRequest, Exception], None] | None = None,
    ) -> None:
        """Read through the engine (see :meth:`ParallelIO.read`); keys are relative."""
        self.io.read(self.storage, requests, prefix=self.root, verify=verify, on_error=on_error)

    def open_write(self, relative: str) -> IO[bytes]:
        """A stream creating ``relative``, for formats that write sequentially."""
        return self.storage.open_write(self.key(relative))


class SharedChunks(Protocol):
    """Where an incremental save puts its large blobs: each cut into chunks stored once
    per content under the checkpoint root, the records naming them (shared keys)."""

    def takes(self, array: Array) -> bool:
        """Whether ``array`` goes to the chunk store (large enough to be worth it)."""

    def leaves(self, blobs: Mapping[str, Array]) -> frozenset[str]:
        """The names of ``blobs`` that :meth:`store` will leave to the format, which
        writes them itself, as in a full save (known before: the format writes its
        archive while the store works)."""

    def store(self, db: DBLocation, blobs: Mapping[str, Array]) -> dict[str, BlobRecord]:
        """Store ``blobs``' chunks the store lacks; the records of the blobs stored:
        all but those :meth:`leaves` names. Safe to run on another thread while the
        format writes its own files."""


@dataclass(frozen=True)
class WrittenDB:
    """What a DB type stored: a record per blob and its own files, all checksummed.

    Its own files are metadata documents, archive headers and the like."""

    blobs: Mapping[str, BlobRecord]
    files: tuple[ChunkRecord, ...] = field(default=())


class DBType(ABC):
    """A checkpoint format. Subclasses set ``name`` and implement :meth:`write`.

    Override :meth:`read` for chunks that are not raw bytes (compression), and
    :meth:`check_blob` to refuse blobs the format cannot hold, with the reason.
    ``needs_rename`` marks formats that only work on renaming (local) path types.

    Example (any instance, or a registered name, is a manager's ``db_type``)::

        >>> from ckptstore import CheckpointManager
        >>> from ckptstore.builtin import NpzDB
        >>> class MyFormat(NpzDB):
        ...     name = "myformat"
        >>> manager = CheckpointManager("ckpt", "trainer_0", db_type=MyFormat())
    """

    name: ClassVar[str]
    needs_rename: ClassVar[bool] = False
    supports_incremental: bool = False
    """Whether an incremental save may put large blobs in the root's chunk store
    (:attr:`DBLocation.shared`): the format's :meth:`write` hands them over and its
    reads take raw chunks from any key (the packed formats do)."""
    codecs: ClassVar[frozenset[str]] = frozenset({"raw"})
    """The chunk codecs :meth:`read` decodes: a manifest naming another is corrupt
    (``ckptstore verify`` reports it, a load refuses it)."""

    def check_blob(self, name: str, array: Array) -> None:
        """Raise :class:`UnsupportedBlobError` if this format cannot store ``array``."""

    @abstractmethod
    def write(self, db: DBLocation, blobs: Mapping[str, Array]) -> WrittenDB:
        """Store ``blobs`` under ``db``; return what was stored, with checksums."""

    def read(self, db: DBLocation, records: Sequence[BlobRecord]) -> dict[str, Array]:
        """Read the blobs of ``records`` (verified) into new arrays."""
        return read_raw_blobs(db, records)

    def verify(self, db: DBLocation, manifest: NodeManifest) -> list[CorruptCheckpointError]:
        """Check every stored byte of the checkpoint against the manifest; one error per
        damaged chunk or file, empty if all is well."""
        return verify_records(db, manifest)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def read_raw_blobs(db: DBLocation, records: Sequence[BlobRecord]) -> dict[str, Array]:
    """Read raw-codec blobs, each chunk straight into its place in a new array.

    Unpadded chunks lying close together in one file are read with one request per run
    (:mod:`ckptstore.plugin._coalesce`). Each chunk is still checked against its
    checksum."""
    verify = db.io.settings.verify or db.storage.always_verified
    arrays: dict[str, Array] = {}
    buffers: list[memoryview] = []
    copied: list[BlobRecord] = []
    # in the order the bytes are stored: a peer replica's pieces arrive in that order,
    # so each lent blob is checked as soon as its piece lands
    for record in sorted(records, key=_stored_at):
        if record.codec != "raw":
            raise UnsupportedBlobError(
                record.name, f"codec {record.codec!r} needs a DB type that can decode it"
            )
        dtype = record.numpy_dtype()
        lent = _lent_blob(db, record, dtype)
        if lent is not None:
            arrays[record.name] = lent
            continue
        # bytes first, then viewed as the blob: the bytes' view is had without a call;
        # when large, at the remainder of its stored offset modulo a page, so that a
        # storage may read into it O_DIRECT
        nbytes = math.prod(record.shape) * dtype.itemsize
        if nbytes < DIRECT_FROM or not record.chunks:
            data = np.empty(nbytes, dtype=np.uint8)
        else:
            data = np.frombuffer(aligned_buffer(record.chunks[0].offset, nbytes), np.uint8)
        arrays[record.name] = data.view(dtype).reshape(record.shape)
        buffers.append(data.data)
        copied.append(record)

    def requests() -> Iterator[ReadRequest]:
        spans: list[Span] = []
        for record, dest in zip(copied, buffers, strict=True):
            chunks = record.chunks
            if len(chunks) == 1 and chunks[0].stored == chunks[0].size == dest.nbytes:
                chunk = chunks[0]  # the common case of small blobs, without slicing
                spans.append(
                    Span(chunk.key, chunk.offset, dest, chunk.crc, record.name, 0, chunk.algorithm)
                )
                continue
            position = 0
            for number, chunk in enumerate(chunks):
                target = dest[position : position + chunk.size]
                position += chunk.size
                padding = chunk.stored - chunk.size
                if not padding:
                    spans.append(
                        Span(
                            chunk.key,
                            chunk.offset,
                            target,
                            chunk.crc,
                            record.name,
                            number,
                            chunk.algorithm,
                        )
                    )
                elif verify:
                    yield ReadRequest(
                        chunk.key,
                        chunk.offset,
                        _with_scratch(target, padding),
                        chunk.stored,
                        crc=chunk.crc,
                        holds=padding,
                        blob=record.name,
                        chunk=number,
                        algorithm=chunk.algorithm,
                    )
                else:
                    yield ReadRequest(
                        chunk.key,
                        chunk.offset,
                        [target],
                        chunk.size,
                        crc=None,
                        blob=record.name,
                        chunk=number,
                    )
        yield from coalesced_reads(db, spans)

    db.read(requests())
    return {record.name: arrays[record.name] for record in records}


def _stored_at(record: BlobRecord) -> tuple[str, int]:
    """Where ``record``'s first chunk is stored: its file and offset."""
    return (record.chunks[0].key, record.chunks[0].offset) if record.chunks else ("", 0)


def _lent_blob(db: DBLocation, record: BlobRecord, dtype: np.dtype[Any]) -> Array | None:
    """``record``'s blob as a view of memory the storage lends (:meth:`PathType.lend`),
    every chunk checked against its checksum whatever the settings say; ``None`` when
    the read is not :attr:`~DBLocation.whole`, the blob's chunks are padded or in
    several objects, or the storage does not lend their bytes as one aligned,
    writable run."""
    chunks = record.chunks
    nbytes = math.prod(record.shape) * dtype.itemsize
    if not chunks or nbytes == 0 or any(chunk.stored != chunk.size for chunk in chunks):
        return None
    if any(chunk.key != chunks[0].key for chunk in chunks):
        return None
    if sum(chunk.size for chunk in chunks) != nbytes:
        return None
    key = db.key(chunks[0].key)
    view = db.storage.lend(key, [(c.offset, c.size) for c in chunks]) if db.whole else None
    if view is None:
        return None
    data = np.frombuffer(view, dtype=np.uint8)
    if data.nbytes != nbytes or not data.flags.writeable or data.ctypes.data % dtype.alignment:
        return None  # the storage gave the bytes up: a later read copies them
    position = 0
    for number, chunk in enumerate(chunks):
        piece = view[position : position + chunk.size]
        if checksum_of(chunk.algorithm)([piece]) != chunk.crc:
            raise CorruptCheckpointError(
                f"the checksum ({chunk.algorithm}) of the {chunk.size} bytes at offset "
                f"{chunk.offset} differs from the one recorded in the manifest",
                url=db.storage.display_url,
                file=key,
                blob=record.name,
                chunk=number,
            )
        position += chunk.size
    return data.view(dtype).reshape(record.shape)


def _with_scratch(target: memoryview, padding: int) -> Any:
    def targets() -> list[memoryview]:
        return [target, memoryview(bytearray(padding))]

    return targets


def verify_records(
    db: DBLocation,
    manifest: NodeManifest,
    *,
    check_chunk: Callable[[BlobRecord, ChunkRecord, memoryview], None] | None = None,
) -> list[CorruptCheckpointError]:
    """Re-read every chunk and file in ``manifest``, and report each one that is damaged.

    Each checksum is checked; every damaged, missing or short piece is reported,
    instead of stopping at the first. ``check_chunk`` is a format's own check of a
    chunk's bytes (such as a compressed chunk's declared size). It runs on every chunk
    whose CRC matched; if it raises, the chunk is reported."""
    problems: list[CorruptCheckpointError] = []

    def requests() -> Iterator[ReadRequest]:
        for record in manifest.blobs.values():
            for number, chunk in enumerate(record.chunks):
                request = _verify_request(chunk, record.name, number)
                if check_chunk is not None:
                    request = replace(request, finish=_checker(check_chunk, record, chunk))
                yield request
        for chunk in manifest.files:
            yield _verify_request(chunk, None, None)

    def collect(request: ReadRequest, error: Exception) -> None:
        if isinstance(error, CorruptCheckpointError):
            problems.append(error)
        elif isinstance(error, FileNotFoundError):
            problems.append(
                CorruptCheckpointError(
                    "the file is missing",
                    url=db.storage.display_url,
                    file=request.key,
                    blob=request.blob,
                    chunk=request.chunk,
                )
            )
        else:
            raise error

    db.read(requests(), verify=True, on_error=collect)
    return problems


def _checker(
    check: Callable[[BlobRecord, ChunkRecord, memoryview], None],
    record: BlobRecord,
    chunk: ChunkRecord,
) -> Callable[[Sequence[memoryview]], None]:
    def finish(buffers: Sequence[memoryview]) -> None:
        check(record, chunk, buffers[0])

    return finish


def _verify_request(chunk: ChunkRecord, blob: str | None, number: int | None) -> ReadRequest:
    return ReadRequest(
        chunk.key,
        chunk.offset,
        lambda: [memoryview(bytearray(chunk.stored))],
        chunk.stored,
        crc=chunk.crc,
        holds=chunk.stored,
        blob=blob,
        chunk=number,
        algorithm=chunk.algorithm,
    )
