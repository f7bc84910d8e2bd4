"""Incremental saves: large blobs cut into chunks stored once per content in a store
shared by every node and epoch under a checkpoint root, and the collection that frees
the chunks no committed epoch refers to (docs/design.md, "Incremental checkpoints").

::

    <root>/_ckptstore/chunks/<hash>           one chunk (XXH3-128 of its bytes), created once
    <root>/_ckptstore/chunks/<hash>.<token>   a copy written while a collection ran
    <root>/_ckptstore/intents/<node>.<epoch>.<token>.json
                                                 a save in flight: the chunks it will name
    <root>/_ckptstore/gc/<token>.json             a collection in progress

Example (a save that changes nothing stores nothing new)::

    >>> import numpy as np
    >>> from ckptstore.builtin import LocalPath, ZarrDB
    >>> from ckptstore.io import ParallelIO
    >>> from ckptstore.protocol import commit_epoch, write_node
    >>> storage = LocalPath("incremental")
    >>> blobs = {"w": np.ones(1 << 19)}  # 4 MiB: into the chunk store
    >>> commits = [write_node(storage, "t", e, blobs, ZarrDB(), ParallelIO(), incremental=True)
    ...            for e in (1, 2)]
    >>> for commit in commits:
    ...     _ = commit_epoch(storage, commit.epoch, [commit])
    >>> len(storage.list_keys(CHUNK_STORE_DIR))
    1
    >>> collect_chunks(storage).freed
    ()
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import xxhash

from ckptstore._types import Array, JSONObject
from ckptstore.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobConfigurationError,
    ObjectNotFoundError,
    StorageError,
)
from ckptstore.io import (
    CHUNK_STORE_DIR,
    SHARED_MARK,
    WRITE_WATCH_ENV,
    Ends,
    Look,
    aligned_buffer,
    chunk_object_key,
    crc32_of,
    is_shared_key,
    kept_pool,
    shared_key,
    write_watch,
)
from ckptstore.plugin import DBLocation, PathType
from ckptstore.protocol._control import control_keys
from ckptstore.protocol._lease_document import _process_alive
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import (
    CONTROL_DIR,
    BlobRecord,
    ChunkRecord,
    NodeManifest,
    decode_document,
    encode_document,
    encode_dtype,
    parse_commit_record_key,
)

__all__ = [
    "CHUNK_BYTES",
    "COLLECTIONS_DIR",
    "INCREMENTAL_FROM",
    "INTENTS_DIR",
    "ChunkStore",
    "Collection",
    "collect_chunks",
    "receive_chunks",
    "release_intents",
    "shared_chunk_keys",
]

INCREMENTAL_FROM = 1 << 20
"""Blobs of at least this many bytes go to the chunk store in an incremental save;
smaller ones stay in the node's archive (written whole at every save: a chunk object
per small blob would cost a request each)."""
CHUNK_BYTES = 4 << 20
"""The size of a chunk of the store: what an unchanged range must cover to be reused.
A 1 GiB table of which 5% of the rows change in a few ranges rewrites a few dozen
chunks; a larger chunk rewrites more around each range, a smaller one costs more
objects and requests."""
WRITERS = 16
"""Threads naming and writing an incremental save's chunks (at least; more if the I/O
settings ask for more)."""
PROBE_EVERY = 8
"""On local disk, a blob every chunk of which changed between this process's last two
saves of it (dense updates) goes to the node's archive, unhashed, as a full save writes
it; every ``PROBE_EVERY``-th save of it goes through the chunk store again, to notice
when it stops changing."""
log = logging.getLogger(__name__)
INTENTS_DIR = f"{CONTROL_DIR}/intents"
COLLECTIONS_DIR = f"{CONTROL_DIR}/gc"
INTENT_KIND = "ckptstore.save-intent"
_MARKER_KIND = "ckptstore.gc-marker"


@dataclass(frozen=True)
class _Known:
    """One chunk of a node's previous incremental save in this process."""

    name: str
    crc: int
    size: int


@dataclass(frozen=True)
class _Remembered:
    """One blob of a node's previous incremental save in this process."""

    chunks: list[_Known]
    """Its chunks when it last went through the chunk store."""
    nbytes: int
    changing: bool = False
    """Whether every chunk had changed since the save before that one (dense)."""
    archived: int = 0
    """The saves since then that wrote it to the node's archive."""
    address: int = 0
    """Where its bytes were in memory (0: a copy of them)."""
    stamp: int = 0
    """The write watch's look at that memory before that save read it (0: none)."""
    unwatched: int = 0
    """Saves since the watch let its memory go, written all over (0: watched)."""
    ends: Ends | None = None
    """Hashes of its bytes in its first and last pages (see ``Look.settle_ends``)."""

    def to_archive(self) -> bool:
        """Whether the next save writes the blob to the node's archive, unhashed."""
        return self.changing and self.archived + 1 < PROBE_EVERY


_MEMORY: dict[tuple[str, str], dict[str, _Remembered]] = {}
"""Per (root, node), the blobs of the last incremental save in this process: a chunk
whose name is unchanged takes its CRC-32 from there, and is looked for in the store
without being written first."""
_WARNED: set[tuple[str, str]] = set()
"""(root, marker) of the collections saves were told about."""
_CHECKED: dict[tuple[str, str], int] = {}
"""Per (root, node), the saves that checked a chunk of a blob declared frozen."""
_MEMORY_LOCK = threading.Lock()
_REMEMBER_NODES = 64
_SCRATCH = threading.local()
"""Each writing thread's page-aligned buffer of a chunk (see ``_write_temporary``)."""
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This host, as the names of temporary files carry it."""
_INTENTS: dict[tuple[str, str, int], list[str]] = {}
"""Intent records of this process's saves, by (root, node, epoch), until committed."""


@dataclass
class _Piece:
    blob: str
    blob_number: int
    index: int
    data: memoryview
    blob_bytes: int
    name: str = ""
    crc: int = 0
    trusted: bool = False
    """Named after the previous save, unread (a blob declared frozen, or memory the
    write watch saw no write to)."""
    watched: bool = False
    """Trusted because the write watch saw no write to its memory."""
    same: bool = False
    """Whether the chunk is the one the previous save had at its place."""
    staged: str | None = None
    stored: str = ""
    """Its manifest key."""


class ChunkStore:
    """One node's incremental save (a :class:`~ckptstore.plugin.SharedChunks`): it
    names each chunk of its large blobs by its content, writes those the store lacks,
    and records its intent first so that a collection never frees them.

    ``frozen``: names of blobs the caller promises hold the bytes they had at this
    process's previous incremental save of the node. Their chunks take that save's
    names and CRC-32s without being read, as long as the blob's size is the same. The
    promise is checked only where it is cheap: one of their chunks per save (in turn),
    and every chunk that must be written again (gone from the store, or a collection
    runs); a broken promise found there raises
    :class:`~ckptstore.errors.JobConfigurationError` and nothing is committed. A broken
    promise not found there saves the previous bytes: declare only what nothing
    writes (a frozen base of fine-tuning).

    Without a promise, chunks of memory the kernel saw no write to since the previous
    save read them are named the same way, unread (:class:`~ckptstore.io.WriteWatch`;
    Linux 6.7+, else every chunk is read). They are checked as frozen ones are; a
    changed one found there turns the watch off for the process and the save reads
    every chunk instead."""

    def __init__(
        self, storage: PathType, node: str, epoch: int, *, frozen: Iterable[str] = ()
    ) -> None:
        self.storage = storage
        self.node = node
        self.epoch = epoch
        self.frozen = frozenset(frozen)
        self.token = secrets.token_hex(6)
        self.written_bytes = 0
        self.reused_bytes = 0
        self._lock = threading.Lock()
        self._staged = False
        """Whether this save's directory of temporary files exists."""
        self._known: dict[str, _Remembered] | None = None

    def takes(self, array: Array) -> bool:
        return int(array.nbytes) >= INCREMENTAL_FROM

    def leaves(self, blobs: Mapping[str, Array]) -> frozenset[str]:
        """The blobs :meth:`store` leaves to the node's archive: those every chunk of
        which changed at the previous save (see :data:`PROBE_EVERY`), on local disk."""
        # on object stores, chunks uploaded in parallel beat one archive (moto: dense
        # saves 2.4x faster than full ones): there they stay in the store
        if not self.storage.supports_rename:
            return frozenset()
        previous = self._previous()
        return frozenset(name for name in blobs if name in previous and previous[name].to_archive())

    def _previous(self) -> dict[str, _Remembered]:
        with _MEMORY_LOCK:
            return _MEMORY.get((self.storage.display_url, self.node), {})

    def store(self, db: DBLocation, blobs: Mapping[str, Array]) -> dict[str, BlobRecord]:
        """Records of the blobs stored; the others (:meth:`leaves`) go to the node's
        archive."""
        previous = self._previous()
        left = self.leaves(blobs)
        known = {
            name: replace(previous[name], archived=previous[name].archived + 1) for name in left
        }
        blobs = {name: array for name, array in blobs.items() if name not in left}
        looks = {name: self._look(name, array, previous) for name, array in blobs.items()}
        pieces = [
            piece
            for number, (name, array) in enumerate(blobs.items())
            for piece in _cut(name, number, array)
        ]
        for piece in pieces:  # named after the previous save's chunk at its place, unread
            if piece.blob in self.frozen:
                _trust(piece, previous)
            elif looks[piece.blob][1].unchanged(piece.index * CHUNK_BYTES, piece.data.nbytes):
                piece.watched = _trust(piece, previous)
        if pieces:
            self._store(db, pieces, previous)
        records: dict[str, BlobRecord] = {}
        by_blob: dict[str, list[_Piece]] = {name: [] for name in blobs}
        for piece in pieces:
            by_blob[piece.blob].append(piece)
        for name, array in blobs.items():
            own_pieces = by_blob[name]
            chunks = tuple(
                ChunkRecord(p.stored, 0, p.data.nbytes, p.data.nbytes, p.crc) for p in own_pieces
            )
            records[name] = BlobRecord(name, encode_dtype(name, array.dtype), array.shape, chunks)
            before = previous.get(name)
            changing = (
                before is not None
                and bool(own_pieces)
                and not any(p.index < len(before.chunks) and p.same for p in own_pieces)
            )
            address, look, ends = looks[name]
            unwatched = _unwatched(before, look, changing)
            if unwatched == 1:  # no page faults on memory written all over at each save
                write_watch().release(address, int(array.nbytes))
            known[name] = _Remembered(
                [_Known(p.name, p.crc, p.data.nbytes) for p in own_pieces],
                int(array.nbytes),
                changing,
                address=address,
                stamp=0 if unwatched else look.stamp,
                unwatched=unwatched,
                ends=ends,
            )
        self._known = known
        return records

    def _look(
        self, name: str, array: Array, previous: Mapping[str, _Remembered]
    ) -> tuple[int, Look, Ends | None]:
        """The blob's address in memory, the write watch's look at it (before its bytes
        are read): which pages were written since the previous save's look, and the
        hashes of its ends."""
        if not array.flags.c_contiguous:
            return 0, Look(0), None  # saved from a copy, at a new address each time
        address, nbytes = int(array.ctypes.data), int(array.nbytes)
        before = previous.get(name)
        if before is not None and before.unwatched % PROBE_EVERY:
            return address, Look(0), None  # written all over lately: every 8th save looks
        same = before is not None and before.address == address and before.nbytes == nbytes
        stamp = before.stamp if before is not None and same else 0
        consumer = (self.storage.display_url, self.node, name)
        look = write_watch().look(consumer, address, nbytes, stamp)
        if not look.stamp:
            return address, look, None
        data = array.reshape(-1).view(np.uint8).data
        return address, *look.settle_ends(data, before.ends if before and same else None)

    def _store(
        self, db: DBLocation, pieces: list[_Piece], previous: Mapping[str, _Remembered]
    ) -> None:
        """Name ``pieces``, record the intent, store those the store lacks."""
        # one file per chunk, each synced when closed: waiting on a sync each, more
        # writers keep the disk busy (1 GiB in 4 MiB chunks on this VM: 1.35 s with 4,
        # 0.61 s with 16, one 1 GiB file 0.65 s)
        pool = kept_pool("ckptstore-chunks", max(db.io.settings.concurrency, WRITERS))
        try:
            # named, and (on local disk) changed chunks written to temporary files
            rest = [piece for piece in pieces if not piece.trusted]
            list(pool.map(lambda piece: self._stage(piece, previous), rest))
            if not self._check_one_trusted(pieces):
                rest = [piece for piece in pieces if piece.watched]
                for piece in rest:
                    piece.trusted = piece.watched = piece.same = False
                list(pool.map(lambda piece: self._stage(piece, previous), rest))
            names = sorted({piece.name for piece in pieces})
            self._announce(names)
            # a collection running now may not have seen the intent: then every
            # chunk goes under a name of this save's own (see collect_chunks)
            running = self.storage.list_keys(COLLECTIONS_DIR)
            _warn_of(self.storage, running)
            alone = bool(running)
            first = {piece.name: piece for piece in reversed(pieces)}
            # a chunk the store holds and that was not written again needs no thread
            present = self._present(first.values(), alone)
            objects = {name: shared_key(name) for name in present}
            with self._lock:
                self.reused_bytes += sum(first[name].data.nbytes for name in present)
            rest = [piece for name, piece in first.items() if name not in present]
            objects.update(pool.map(partial(self._put, alone=alone), rest))
        finally:
            if self._staged:  # made by the first chunk written (none if nothing changed)
                self.storage.delete_tree(self._staging)
        for piece in pieces:
            piece.stored = objects[piece.name]

    @property
    def _staging(self) -> str:
        """This save's temporary files: named after its host and process, so that a
        collection can tell those of a save killed on its host."""
        return f"{CHUNK_STORE_DIR}/tmp-{_HOST}-{os.getpid()}-{self.token}"

    def _stage(self, piece: _Piece, previous: Mapping[str, _Remembered]) -> None:
        """Name ``piece`` (:func:`_name`); on local disk, write a changed one to a
        temporary file of this save (from the array's memory, ``O_DIRECT``), while the
        other workers hash: nothing of the store is looked at before the intent."""
        _name(piece, previous)
        if not piece.same and self.storage.supports_rename:
            piece.staged = self._write_temporary(piece)

    def _write_temporary(self, piece: _Piece) -> str:
        """Write ``piece`` to a temporary file of this save. The bytes are copied into
        this thread's page-aligned buffer first: an array's chunk seldom starts at a
        page boundary of memory, and only aligned memory goes ``O_DIRECT`` to a file's
        offset 0 (through the page cache instead, a save of 1 GiB of chunks took 4-6 s
        where the archive took 0.6 s on this project's VM)."""
        with self._lock:
            if not self._staged:
                self.storage.prepare_keys([f"{self._staging}/-"])
                self._staged = True
        key = f"{self._staging}/{piece.blob_number}-{piece.index}"
        data = piece.data
        scratch: memoryview | None = getattr(_SCRATCH, "buffer", None)
        if scratch is None or scratch.nbytes < data.nbytes:
            scratch = _SCRATCH.buffer = aligned_buffer(0, max(data.nbytes, CHUNK_BYTES))
        view = scratch[: data.nbytes]
        np.copyto(np.frombuffer(view, np.uint8), np.frombuffer(data, np.uint8))
        with self.storage.open_positional(key, data.nbytes) as target:
            target.write_at(0, [view])
        return key

    def _present(self, pieces: Iterable[_Piece], alone: bool) -> set[str]:
        """The names of the unwritten ``pieces`` whose objects the store holds, on local
        disk looked up together after the intent (see :meth:`LocalPath.existing`); on
        object stores each piece's writing thread asks (a request each, in parallel)."""
        if alone or not self.storage.supports_rename:
            return set()
        keys = {_object(piece.name): piece.name for piece in pieces if piece.staged is None}
        return {keys[key] for key in self.storage.existing(keys)}

    def _put(self, piece: _Piece, *, alone: bool) -> tuple[str, str]:
        """Store ``piece`` (on local disk: written to a temporary file, or one the store
        lacked after the intent; on object stores, unless the store holds it); its
        content name and manifest key."""
        name = f"{piece.name}.{self.token}" if alone else piece.name
        key = _object(name)
        written = False
        if self.storage.supports_rename:
            staged = piece.staged
            if staged is None:
                self._check_trusted(piece)
                staged = self._write_temporary(piece)  # unchanged, but gone from the store
            if staged is not None:
                written = self.storage.adopt(staged, key)  # an existing one is kept
        elif alone or not self.storage.exists(key):
            self._check_trusted(piece)
            self.storage.write_parts(key, [piece.data])  # the same bytes, if it raced
            written = True
        with self._lock:
            if written:
                self.written_bytes += piece.data.nbytes
            else:
                self.reused_bytes += piece.data.nbytes
        return piece.name, shared_key(name)

    def _check_trusted(self, piece: _Piece) -> None:
        """Raise unless a chunk of a blob declared frozen, or of memory the write watch
        saw unwritten, holds the bytes it is named after (no-op for a chunk that was
        read); a watched one that does not turns the watch off."""
        if not self._broken(piece):
            return
        if piece.watched:
            raise JobConfigurationError(
                f"the bytes of blob {piece.blob!r} of node {self.node!r} changed since the "
                "previous save without a write the kernel saw (a device writing into "
                "pinned memory?): nothing was committed. The next save reads every chunk; "
                f"set {WRITE_WATCH_ENV}=off to read them always"
            )
        raise JobConfigurationError(
            f"blob {piece.blob!r} of node {self.node!r} was declared frozen, but its "
            "bytes changed since the previous save: nothing was committed. Take it out "
            "of frozen= (its bytes are then read at every save)"
        )

    def _broken(self, piece: _Piece) -> bool:
        """Whether ``piece`` was trusted unread and does not hold the bytes it is named
        after; for watched memory, the watch is then turned off for the process."""
        if not piece.trusted or xxhash.xxh3_128_hexdigest(piece.data) == piece.name:
            return False
        if piece.watched:
            write_watch().disable(f"blob {piece.blob!r} of node {self.node!r}")
        return True

    def _check_one_trusted(self, pieces: Sequence[_Piece]) -> bool:
        """Check one trusted chunk, the next one at each save; False when it was one of
        watched memory and changed (the watch is then off for the process)."""
        trusted = [piece for piece in pieces if piece.trusted]
        if not trusted:
            return True
        with _MEMORY_LOCK:
            place = (self.storage.display_url, self.node)
            turn = _CHECKED[place] = _CHECKED.get(place, -1) + 1
        checked = trusted[turn % len(trusted)]
        if checked.watched:
            return not self._broken(checked)
        self._check_trusted(checked)
        return True

    def remember(self) -> None:
        """After the node's save: its chunks are what the next save compares with."""
        if self._known is None:
            return
        with _MEMORY_LOCK:
            _MEMORY[(self.storage.display_url, self.node)] = self._known
            while len(_MEMORY) > _REMEMBER_NODES:
                del _MEMORY[next(iter(_MEMORY))]

    @property
    def intent_key(self) -> str:
        return f"{INTENTS_DIR}/{self.node}.{self.epoch}.{self.token}.json"

    def _announce(self, names: list[str]) -> None:
        body = {
            "node": self.node,
            "epoch": self.epoch,
            "chunks": names,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        # other processes see it at once; it need not survive a power cut, which ends
        # this save too (the commit record, fsynced, protects the chunks from then on)
        self.storage.create_volatile_document(self.intent_key, encode_document(INTENT_KIND, body))
        with _MEMORY_LOCK:
            place = (self.storage.display_url, self.node, self.epoch)
            _INTENTS.setdefault(place, []).append(self.intent_key)

    def withdraw(self) -> None:
        """Delete the intent (a failed save: nothing of it will be committed)."""
        with _MEMORY_LOCK:
            place = (self.storage.display_url, self.node, self.epoch)
            mine = _INTENTS.get(place, [])
            if self.intent_key in mine:
                mine.remove(self.intent_key)
        self.storage.delete([self.intent_key])


def _object(name: str) -> str:
    return chunk_object_key(shared_key(name))


def _cut(blob: str, number: int, array: Array) -> list[_Piece]:
    """``array``'s bytes (C order) in chunks of :data:`CHUNK_BYTES`."""
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    data = flat.data
    return [
        _Piece(blob, number, index, data[start : start + CHUNK_BYTES], flat.nbytes)
        for index, start in enumerate(range(0, flat.nbytes, CHUNK_BYTES))
    ]


def _warn_of(storage: PathType, markers: Sequence[str]) -> None:
    """Say once per marker that saves write their chunks anew while it is there."""
    with _MEMORY_LOCK:
        new = [key for key in markers if (storage.display_url, key) not in _WARNED]
        _WARNED.update((storage.display_url, key) for key in new)
    for key in new:
        log.warning(
            "A chunk collection runs at %s (%s): incremental saves write every chunk "
            "anew, reusing none, while it does. If no collection runs there (one killed "
            "on another host left it), delete that file",
            storage.display_url,
            key,
        )


def _unwatched(before: _Remembered | None, look: Look, changing: bool) -> int:
    """The blob's saves since the watch let it go (1: let go now). Memory written all
    over between two saves (dense updates, a buffer copied into at each save) is let go:
    a write to a watched page costs a page fault."""
    if look.stamp:
        written = look.written
        if written is not None and written.size > 2:
            written = written[1:-1]  # its end pages may have been settled by their bytes
        rewritten = written is not None and bool(written.all())
        return 1 if changing or rewritten else 0
    return before.unwatched + 1 if before is not None and before.unwatched else 0


def _trust(piece: _Piece, previous: Mapping[str, _Remembered]) -> bool:
    """Name ``piece`` after the previous save's chunk at its place, unread, if the
    blob had the same size then; whether it did."""
    before = previous.get(piece.blob)
    if before is None or before.nbytes != piece.blob_bytes or piece.index >= len(before.chunks):
        return False
    known = before.chunks[piece.index]
    if known.size != piece.data.nbytes:
        return False
    piece.name, piece.crc, piece.trusted, piece.same = known.name, known.crc, True, True
    return True


def _name(piece: _Piece, previous: Mapping[str, _Remembered]) -> None:
    """Name ``piece`` by its content (XXH3-128, hex), and take its CRC-32 for the
    manifest: the previous save's when the chunk there had the same name."""
    piece.name = xxhash.xxh3_128_hexdigest(piece.data)
    before = previous.get(piece.blob)
    if before is not None and piece.index < len(before.chunks):
        known = before.chunks[piece.index]
        if known.name == piece.name and known.size == piece.data.nbytes:
            piece.crc, piece.same = known.crc, True
            return
    piece.crc = crc32_of((piece.data,))


def receive_chunks(
    storage: PathType,
    node: str,
    epoch: int,
    chunks: Sequence[ChunkRecord],
    fetch: Callable[[ChunkRecord], memoryview],
) -> int:
    """Store the shared ``chunks`` of a node checkpoint copied from another root
    (``ckptstore cp``) that ``storage`` lacks, under the same names (the copied manifest
    names them); ``fetch`` reads and checks one from the source. Returns the bytes
    copied. The copy records its intent first, as a save does; while a collection runs
    at ``storage`` it cannot write copies of its own (the names are fixed), so it
    raises :class:`~ckptstore.errors.StorageError` and copies nothing."""
    store = ChunkStore(storage, node, epoch)
    names = sorted({chunk.key.removeprefix(SHARED_MARK) for chunk in chunks})
    store._announce(names)
    running = storage.list_keys(COLLECTIONS_DIR)
    if running:
        store.withdraw()
        raise StorageError(
            storage.display_url,
            running[0],
            "copy shared chunks while a chunk collection runs at",
            OSError(
                errno.EBUSY,
                "copy again once it is done (a marker left by a killed "
                "collection is removed by hand)",
            ),
        )
    copied = 0
    for chunk in {chunk.key: chunk for chunk in chunks}.values():
        key = chunk_object_key(chunk.key)
        if storage.exists(key):
            continue
        data = fetch(chunk)
        if storage.supports_rename:
            staging = f"{store._staging}/{copied}"
            storage.write_parts(staging, [data])
            storage.adopt(staging, key)
        else:
            storage.write_parts(key, [data])
        copied += chunk.stored
    if storage.supports_rename:
        storage.delete_tree(store._staging)
    return copied


def release_intents(storage: PathType, epoch: int, nodes: Iterable[str]) -> None:
    """Delete this process's intent records of ``nodes``' saves of ``epoch``, once
    committed: their commit records now protect the chunks they name."""
    keys: list[str] = []
    with _MEMORY_LOCK:
        for node in nodes:
            keys += _INTENTS.pop((storage.display_url, node, epoch), [])
    if keys:
        storage.delete(keys)


def shared_chunk_keys(manifest: NodeManifest) -> set[str]:
    """The shared chunks (manifest keys) a node checkpoint refers to."""
    return {
        chunk.key
        for record in manifest.blobs.values()
        for chunk in record.chunks
        if is_shared_key(chunk.key)
    }


@dataclass(frozen=True)
class Collection:
    """What a collection of the chunk store found and freed (or would free)."""

    listed: int
    referenced: int
    freed: tuple[str, ...]
    freed_bytes: int
    intents: tuple[str, ...] = field(default=())
    dry_run: bool = False

    def to_json(self) -> JSONObject:
        return {
            "chunks_listed": self.listed,
            "chunks_referenced": self.referenced,
            "chunks_freed": len(self.freed),
            "chunk_bytes_freed": self.freed_bytes,
            "saves_in_flight": list(self.intents),
        }


def collect_chunks(
    where: CheckpointLocation | PathType,
    *,
    dry_run: bool = False,
    read_manifest: Callable[[PathType, str, int], NodeManifest] | None = None,
    deleting: Iterable[tuple[int, str]] = (),
) -> Collection:
    """Free the chunks of the store that no committed epoch under ``where`` (any job,
    any node) and no save in flight refers to; with ``dry_run``, only say which
    (counting the node checkpoints ``deleting``, ``(epoch, node)``, as gone: what a
    retention about to run would delete).

    It lists the chunk store, then the intents (and reads them), then the control
    directory (commit records), and reads every committed node's manifest. The safety
    argument (docs/design.md, "Collecting chunks"): the collection records itself
    before it lists; a save records its intent before it looks at the store, then
    looks for collections; so of the two, at least one sees the other. A collection
    that sees an intent keeps the chunks it names (and the save's own copies); a save
    that sees a collection reuses nothing and writes its chunks under names of its
    own, created after the chunk store was listed. A save whose intent is gone by the
    time the intents are listed was committed before the commit records are listed.
    A manifest that cannot be read stops the collection before it deletes anything."""
    storage = storage_of(where)
    from ckptstore.protocol._commit import open_node  # the commit path imports this module

    opened = read_manifest or open_node
    token = secrets.token_hex(6)
    marker = f"{COLLECTIONS_DIR}/{token}.json"
    if not dry_run:
        body = {"host": socket.gethostname(), "pid": os.getpid()}
        storage.create_document(marker, encode_document(_MARKER_KIND, body))
    try:
        # three listings, in this order: the chunk store, the intents (read at once),
        # the control directory (commit records, markers). A listing takes time, and a
        # save creates its intent, then its chunks, then its commit record, then
        # deletes its intent: listed in any other order, a save running meanwhile can
        # slip between them (docs/design.md, "Collecting chunks")
        stored = storage.list_keys(CHUNK_STORE_DIR)
        chunks = [key for key in stored if _is_object(key)]
        listed_intents = storage.list_keys(INTENTS_DIR)
        intents: list[str] = []
        creating: list[str] = []  # ".<name>.tmp-...": an intent being created
        for key in listed_intents:
            hidden = key.rpartition("/")[2].startswith(".")
            (creating if hidden else intents).append(key)
        kept: set[str] = set()
        tokens: set[str] = set()
        dead: list[str] = []  # left by saves killed on this host: they never commit
        for key in intents:
            names, intent_token, abandoned = _read_intent(storage, key)
            if abandoned:
                dead.append(key)
                continue
            kept.update(_object(name) for name in names)
            tokens.add(intent_token)
        for key in creating:  # its save looks for markers after: it sees this one
            if _left_by_dead_process(storage, key, INTENT_KIND):
                dead.append(key)  # left by a save killed on this host as it wrote it
        dead += (
            key
            for key in stored
            if key.startswith(f"{CHUNK_STORE_DIR}/tmp-") and _temporary_of_dead_save(key)
        )
        control = control_keys(storage)
        dead += (  # markers of collections killed on this host
            key
            for key in control
            if key.startswith(COLLECTIONS_DIR + "/")
            and key != marker
            and _left_by_dead_process(storage, key, _MARKER_KIND)
        )
        gone = set(deleting)
        for epoch, nodes in _committed(storage, control).items():
            for node in sorted(nodes):
                if (epoch, node) in gone:
                    continue
                try:
                    manifest = opened(storage, node, epoch)
                except CheckpointNotFoundError:
                    continue  # retracted since the listing: being deleted
                except CorruptCheckpointError as error:
                    raise CorruptCheckpointError(
                        "the collection deleted nothing: it cannot tell which chunks this "
                        f"committed node checkpoint refers to ({error.detail}). Check it with "
                        "`ckptstore verify`; delete that epoch (`ckptstore gc --keep-last`) "
                        "or repair it, then collect again",
                        url=storage.display_url,
                        file=error.file,
                    ) from error
                kept.update(chunk_object_key(key) for key in shared_chunk_keys(manifest))
        garbage = tuple(
            key for key in chunks if key not in kept and key.rpartition(".")[2] not in tokens
        )
        freed = sum(_size(storage, key) for key in garbage)
        if not dry_run and (garbage or dead):
            storage.delete([*dead, *garbage])
        referenced = len(chunks) - len(garbage)
        return Collection(len(chunks), referenced, garbage, freed, tuple(intents), dry_run)
    finally:
        if not dry_run:
            storage.delete([marker])


def _is_object(key: str) -> bool:
    """Whether a listed key is a chunk object (not a temporary of one being created)."""
    name = key.rpartition("/")[2]
    try:
        shared_key(name)
    except ValueError:
        return False
    return True


def _left_by_dead_process(storage: PathType, key: str, kind: str) -> bool:
    """Whether the intent or marker ``key`` was made by a process of this host that is
    gone (it can neither commit nor delete anything any more); False when unsure."""
    try:
        document = decode_document(
            storage.read_document(key), kind, url=storage.display_url, key=key
        )
    except (ObjectNotFoundError, CorruptCheckpointError):
        return False
    return _made_by_dead_process(document)


def _temporary_of_dead_save(key: str) -> bool:
    """Whether ``key`` is a temporary file of a save killed on this host."""
    parts = key.removeprefix(f"{CHUNK_STORE_DIR}/tmp-").split("/", 1)[0].split("-")
    return (
        len(parts) == 3
        and parts[0] == _HOST
        and parts[1].isdigit()
        and int(parts[1]) != os.getpid()
        and not _process_alive(int(parts[1]))
    )


def _made_by_dead_process(document: JSONObject) -> bool:
    pid = document.get("pid")
    return (
        document.get("host") == socket.gethostname()
        and isinstance(pid, int)
        and pid != os.getpid()
        and not _process_alive(pid)
    )


def _read_intent(storage: PathType, key: str) -> tuple[list[str], str, bool]:
    """The chunk names an intent record holds, its save's token, and whether that save
    was killed on this host (its process is gone: see :func:`_left_by_dead_process`)."""
    url = storage.display_url
    try:
        data = storage.read_document(key)
    except ObjectNotFoundError:
        return [], "", False  # its save was committed (or failed) since the listing
    document = decode_document(data, INTENT_KIND, url=url, key=key)
    gone = _made_by_dead_process(document)
    names = document.get("chunks")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise CorruptCheckpointError("the intent record's chunks are not names", url=url, file=key)
    for name in names:
        if not _is_object(f"x/{name}"):
            raise CorruptCheckpointError(f"{name!r} is not a chunk's name", url=url, file=key)
    token = key.rpartition("/")[2].removesuffix(".json").rpartition(".")[2]
    return [str(name) for name in names], token, gone


def _committed(storage: PathType, keys: Iterable[str]) -> dict[int, set[str]]:
    """Committed nodes by epoch, from the listing (an earlier version's one-document
    record is read for its nodes)."""
    from ckptstore.protocol._commit import read_commit

    found: dict[int, set[str]] = {}
    legacy: set[int] = set()
    for key in keys:
        epoch = parse_commit_record_key(key)
        if epoch is None:
            continue
        node = key.rpartition("/")[2].removesuffix(".commit.json")
        if key.count("/") == 2:
            found.setdefault(epoch, set()).add(node)
        else:
            legacy.add(epoch)
    for epoch in legacy:
        record = read_commit(storage, epoch)
        if record is not None:
            found.setdefault(epoch, set()).update(record.nodes)
    return found


def _size(storage: PathType, key: str) -> int:
    try:
        return storage.size(key)
    except ObjectNotFoundError:
        return 0
