"""One ZIP archive per node checkpoint (or a few, for hundreds of MiB: see
:func:`~ckptstore.io.archive_shares`), written in parallel at precomputed offsets: the writer shared
by the ``zarr`` and ``npz`` formats.

The archive's layout (:class:`~ckptstore.io._zip.ZipLayout`) is fixed before any byte
is written, so its pieces go to storage in parallel through the I/O engine:

* runs of small members (documents, npy headers, blobs under 4 MiB) are one piece
  each: the worker checksums every member, builds its local header and writes headers
  and data of the whole run with one ``pwritev``, copied into one buffer but for the
  data of members of 256 KiB or more (``GATHERED_FROM``), which goes from the arrays'
  own memory through the page cache;
* a member of at least 4 MiB (``PIECED_FROM``) or larger than ``chunk_bytes`` is
  written from its array's memory, cut into pieces of about ``chunk_bytes`` (each a
  contiguous range of the array's C-order bytes, so no copy for C-contiguous arrays),
  in parallel (pieces under ``DIRECT_FROM``, as DCP's 128 KiB, go in writes of up to
  ``PIECED_FROM`` consecutive bytes, each piece still checksummed apart); its local
  header goes last, once the CRC-32s of its pieces are
  combined. Its data starts at a file offset with the array's address modulo 4096, so
  a local disk writes the pieces ``O_DIRECT`` (:mod:`ckptstore.io._direct`), each
  whole but for the member's first and last page: the cuts between pieces fall on
  multiples of 4096 of the file (:func:`~ckptstore.io.aligned_pieces`); a run's
  buffer of 1 MiB or more is allocated at its file offset's remainder for the same
  reason;
* the central directory goes at the end.

Local disk writes every piece in place (``pwritev``) and fsyncs the file once; object
stores upload the archive as one multipart upload with parallel parts. Nothing is
padded but the alignment of large members' data. Members are stored as they are, but
for documents the format deflates (:func:`document_member`: zarr's ``zarr.json``).

The manifest records every blob's byte range(s) with a CRC-32 each (what a load
checks, reading only its blobs' ranges), and the rest of the archive as format ranges
("files" records) that tile it: one per run of small members (written with one call:
one CRC-32 over all of it, blobs included), the header of each large member, and the
central directory. Every byte is thus under a format range or a large member's piece,
so any flipped byte is found by ``verify``. The ZIP format wants a CRC-32 per member
too: each is joined from the CRC-32s already taken (``crc32_combine``), so every byte
is checksummed once. Manifests written before recorded CRC-32Cs (a second pass over
the data), and the bytes between blobs as one gap range each; they read and verify
alike.
Before reading, :func:`check_ranges` refuses recorded ranges that leave the file or
overlap each other (blob ranges among themselves, format ranges among themselves: the
manifest is untrusted input).

Example::

    >>> import zipfile
    >>> from ckptstore.builtin import LocalPath
    >>> from ckptstore.io import ParallelIO
    >>> from ckptstore.plugin import DBLocation
    >>> db = DBLocation(LocalPath("packed"), "trainer_0.1", ParallelIO())
    >>> written = write_archives(db, [("blobs.zip", [Member("w.bin", b"", "w", np.arange(4.0))])])
    >>> [(chunk.key, chunk.size) for chunk in written.blobs["w"].chunks]  # w's byte range
    [('blobs.zip', 32)]
    >>> zipfile.ZipFile("packed/trainer_0.1/blobs.zip").namelist()  # a plain ZIP archive
    ['w.bin']
    >>> read_archive(db, [written.blobs["w"]])["w"]
    array([0., 1., 2., 3.])
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ckptstore._types import Buffer, byte_view
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError
from ckptstore.io import (
    DIRECT_ALIGN,
    GATHERED_FROM,
    GROUP_BYTES,
    PIECED_FROM,
    ArrayChunk,
    WriteRequest,
    ZipLayout,
    aligned_buffer,
    aligned_pieces,
    archive_shares,
    chunk_data,
    crc32_combine,
    crc32_of,
    deflate_raw,
    grid_chunk_shape,
    interleaved,
    kept_pool,
    memory_residue,
    run_together,
    write_groups,
)
from ckptstore.io import crc32_buffer as _crc32
from ckptstore.plugin import DBLocation, PathType, PositionalWriter, WrittenDB, read_raw_blobs
from ckptstore.records import BlobRecord, ChunkRecord, NodeManifest, encode_dtype

__all__ = [
    "Inflated",
    "Member",
    "archive_name",
    "check_ranges",
    "document_member",
    "is_archive",
    "manifest_ranges",
    "read_archive",
    "write_archives",
    "write_shared",
]


ARCHIVE_THREADS = 16
"""Threads of the process's pools that work on a node's archives all at once (close
each, an object store's upload; ask their sizes): object stores take up to 16."""


def archive_name(first: str, number: int) -> str:
    """The name of archive ``number`` of a node checkpoint whose first archive is
    ``first``: ``blobs.zarr.zip``, ``blobs.1.zarr.zip``, ``blobs.2.zarr.zip``...

    Example::

        >>> archive_name("blobs.npz", 0), archive_name("blobs.npz", 2)
        ('blobs.npz', 'blobs.2.npz')
    """
    if number == 0:
        return first
    stem, _, suffix = first.partition(".")
    return f"{stem}.{number}.{suffix}"


def is_archive(first: str, key: str) -> bool:
    """Whether ``key`` is one of the names :func:`archive_name` gives (any number: a
    checkpoint written with a higher :data:`MAX_ARCHIVES` reads alike).

    Example::

        >>> is_archive("blobs.npz", "blobs.3.npz"), is_archive("blobs.npz", "blobs.03.npz")
        (True, False)
    """
    if key == first:
        return True
    stem, _, suffix = first.partition(".")
    number = key.removeprefix(f"{stem}.").removesuffix(f".{suffix}")
    return (
        number.isascii()
        and number.isdigit()
        and number[0] != "0"
        and key == archive_name(first, int(number))
    )


class Inflated(NamedTuple):
    """What a deflated document inflates to: its size and CRC-32 (the ZIP records both)."""

    size: int
    crc: int


class Member(NamedTuple):
    """One archive member: ``prefix`` (a document, an npy header) followed by the bytes of
    ``array`` (the blob ``blob``), if any. A document without an array may be stored
    deflated (:func:`document_member`): ``prefix`` then holds the deflated bytes and
    ``inflated`` what they inflate to.

    A large blob may be several members, one per chunk (zarr), each with ``array`` a
    view of its chunk and ``blob_shape`` the blob's shape, in the blob's C order; an
    edge chunk is followed by ``padding`` zero bytes (zarr stores every chunk whole).
    The blob's records are then its members' ranges in order, a padding range
    supplying no bytes of the blob (its size is 0) but checksummed like the rest."""

    name: str
    prefix: bytes
    blob: str | None = None
    array: np.ndarray[Any, Any] | None = None
    inflated: Inflated | None = None
    padding: int = 0
    blob_shape: tuple[int, ...] | None = None

    @property
    def data_size(self) -> int:
        return 0 if self.array is None else int(self.array.nbytes)


def document_member(name: str, document: bytes) -> Member:
    """The member ``name`` holding ``document``, deflated (ZIP method 8) when that makes
    it smaller. Every reader of ZIPs inflates such members (``zipfile``, so zarr's
    ``ZipStore`` and fsspec's ``zip::``), and ckptstore never reads them: a load takes
    dtypes and shapes from the manifest. A zarr checkpoint of 10,000 blobs of 4 KiB
    holds 10,000 documents: deflated (293 bytes in 179), they take 1.14 MB less.
    Callers deflate a document once per distinct content.

    Example::

        >>> member = document_member("a/zarr.json", b'{"zarr_format":3}' * 4)
        >>> len(member.prefix), member.inflated.size
        (56, 68)
    """
    deflated = deflate_raw(document)
    if len(deflated) >= len(document):
        return Member(name, document)
    return Member(name, deflated, inflated=Inflated(len(document), crc32_of([document])))


class _Ranges:
    """What the workers found, collected under a lock: blob ranges and format ranges."""

    def __init__(self, archive: str, members: int) -> None:
        self.archive = archive
        self.lock = threading.Lock()
        self.blob_chunks: dict[int, dict[int, ChunkRecord]] = {}  # member -> its pieces
        self.files: list[ChunkRecord] = []
        self.run_chunks: dict[int, tuple[ChunkRecord]] = {}  # members written in runs
        self.member_crcs: list[int] = [0] * members
        self.piece_crc: dict[tuple[int, int], tuple[int, int]] = {}  # (member, n) -> crc, len

    def piece(
        self, index: int, number: int, offset: int, data: memoryview, *, padding: bool = False
    ) -> None:
        """Piece ``number`` of member ``index``, at ``offset``: its CRC-32 serves the
        manifest and, joined with its neighbours', the ZIP. A ``padding`` piece supplies
        no bytes of the blob."""
        crc = crc32_of((data,))
        size = 0 if padding else data.nbytes
        record = ChunkRecord(self.archive, offset, data.nbytes, size, crc)
        with self.lock:
            self.blob_chunks.setdefault(index, {})[number] = record
            self.piece_crc[(index, number)] = (crc, data.nbytes)

    def file(self, offset: int, parts: Sequence[memoryview]) -> None:
        size = sum(part.nbytes for part in parts)
        if size:
            record = ChunkRecord(self.archive, offset, size, size, crc32_of(parts))
            with self.lock:
                self.files.append(record)


Members = Sequence[Member] | Callable[[], Sequence[Member]]
"""An archive's members, or what makes them when its first write is due."""


def write_shared(
    db: DBLocation,
    first: str,
    blobs: Mapping[str, np.ndarray[Any, Any]],
    members_of: Callable[[Sequence[str]], Sequence[Member]],
) -> WrittenDB:
    """Write ``blobs`` as the archive ``first``, or as a few (:func:`~ckptstore.io.archive_shares`,
    named by :func:`archive_name`), each holding the members ``members_of`` gives for
    its share of the blobs' names (asked for when the archive's first write is due:
    see :func:`write_archives`)."""
    shared = db.shared
    offered: dict[str, np.ndarray[Any, Any]] = {}
    if shared is not None:  # an incremental save: large blobs go to the chunk store
        offered = {name: array for name, array in blobs.items() if shared.takes(array)}
    left = shared.leaves(offered) if shared is not None else frozenset()
    large = {name: array for name, array in offered.items() if name not in left}
    if shared is None or not large:
        if offered and shared is not None:
            shared.store(db, offered)  # stores none, but counts the saves they skip it
        return write_archives(db, _shares(db, first, blobs, members_of))
    archived = {name: array for name, array in blobs.items() if name not in large}
    # the chunk store hashes (CPU) while the archive's writes wait on the disk: a
    # LoRA-shaped save takes the longer of the two, not their sum
    run = contextvars.copy_context().run
    # a kept thread runs one node's store, which waits only on threads of its own
    storing = kept_pool("ckptstore-shared", 64).submit(run, shared.store, db, offered)
    try:
        written = write_archives(db, _shares(db, first, archived, members_of))
    except BaseException:
        with contextlib.suppress(Exception):
            storing.result()  # nothing of the save runs on once it raised
        raise
    stored = storing.result()
    if stored.keys() != large.keys():
        raise RuntimeError(f"the chunk store stored {sorted(stored)}, not {sorted(large)}")
    return WrittenDB({**written.blobs, **stored}, written.files)


def _shares(
    db: DBLocation,
    first: str,
    blobs: Mapping[str, np.ndarray[Any, Any]],
    members_of: Callable[[Sequence[str]], Sequence[Member]],
) -> list[tuple[str, Members]]:
    """The archives of ``blobs`` (:func:`~ckptstore.io.archive_shares`, with ``db``'s
    storage's archive size), members made late."""
    sizes = {name: array.nbytes for name, array in blobs.items()}
    shares = archive_shares(sizes, db.storage.archive_bytes, db.storage.max_archives)
    return [(archive_name(first, n), partial(members_of, share)) for n, share in enumerate(shares)]


def write_archives(db: DBLocation, archives: Sequence[tuple[str, Members]]) -> WrittenDB:
    """Write each ``(archive, members)`` as a ZIP under ``db``, all at once: their
    pieces go to the engine interleaved, the archive with the fewest bytes sent so far
    first, so that parallel writers fill every file together (on tmpfs one file takes
    one writer at a time). Returns every blob's records (its data ranges) and the
    format records (ranges tiling each archive but for large members' data), all
    checksummed, archive after archive.

    An archive's members (when given as a callable) and layout are made when its first
    write is due, the last archive first. The first archive starts last, once the others
    have sent enough to keep every I/O worker busy: it holds every small blob
    (:func:`~ckptstore.io.archive_shares`), whose documents take longest to make, and the others'
    large blobs are on their way to storage meanwhile (the 1 GiB benchmark mix: 14 ms
    of members made while the disk writes, where it used to wait for them)."""
    piece_bytes = db.io.settings.chunk_bytes
    db.storage.prepare_keys([db.key(archive) for archive, _ in archives])
    plans: dict[int, tuple[_ArchivePlan, PositionalWriter]] = {}
    with ExitStack() as stack:

        def stream(number: int) -> Iterator[WriteRequest]:
            archive, members = archives[number]
            made = members() if callable(members) else members
            plan = _ArchivePlan.make(archive, made, piece_bytes)
            key = db.key(archive)
            target = stack.enter_context(db.storage.open_positional(key, plan.layout.total_size))
            plans[number] = (plan, target)
            yield from plan.requests(target)

        others = len(archives) - 1
        late = db.io.settings.concurrency * piece_bytes // others if others else 0
        db.write(interleaved([stream(n) for n in reversed(range(len(archives)))], late))
        for number in range(len(archives)):
            plan, target = plans[number]
            plan.finish(target)
        stack.pop_all()  # closed here, not again on the way out
        _close_all([plans[number][1] for number in range(len(archives))])
    blobs: dict[str, BlobRecord] = {}
    files: list[ChunkRecord] = []
    for number in range(len(archives)):
        written = plans[number][0].records()
        blobs.update(written.blobs)
        files.extend(written.files)
    return WrittenDB(blobs, tuple(files))


def _close_all(targets: Sequence[PositionalWriter]) -> None:
    """Close every archive, all at once: an object store uploads each one on close (one
    PUT each, under its multipart threshold), a local disk syncs each file. Raises the
    first failure once every close has ended; the caller deletes the attempt."""
    run_together("ckptstore-close", ARCHIVE_THREADS, [target.close for target in targets])


@dataclass
class _ArchivePlan:
    """One archive of :func:`write_archives`: its layout, and what its writes found."""

    archive: str
    members: Sequence[Member]
    pieced: dict[int, list[ArrayChunk]]  # members written in pieces: their pieces
    gathered: set[int]
    piece_bytes: int
    layout: ZipLayout
    found: _Ranges

    @classmethod
    def make(cls, archive: str, members: Sequence[Member], piece_bytes: int) -> _ArchivePlan:
        # one pass: tens of thousands of members for small blobs
        names: list[str] = []
        sizes: list[int] = []
        deflated: dict[int, int] = {}  # deflated documents: their inflated size
        pieced: set[int] = set()  # members written from their array's memory, in pieces
        gathered: set[int] = set()  # ...or in a run (see GATHERED_FROM)
        smallest = min(piece_bytes + 1, PIECED_FROM)  # more than a piece, or PIECED_FROM
        for index, (name, prefix, _, array, inflated, padding, _) in enumerate(members):
            names.append(name)
            if array is None:
                sizes.append(len(prefix))
                if inflated is not None:
                    deflated[index] = inflated.size
                continue
            if inflated is not None:
                raise ValueError(f"member {name!r}: only a document is deflated")
            sizes.append(len(prefix) + array.nbytes + padding)
            if array.nbytes >= smallest or padding:
                pieced.add(index)
            elif array.nbytes >= GATHERED_FROM and array.flags.c_contiguous:
                gathered.add(index)
        layout = ZipLayout.place(names, sizes, _residues(members, pieced), deflated)
        pieces: dict[int, list[ArrayChunk]] = {}
        for index in sorted(pieced):  # cut once the layout places the data
            member = members[index]
            assert member.array is not None  # only members with data are written in pieces
            start = _data_start(layout, index, member)
            pieces[index] = aligned_pieces(member.array, piece_bytes, start)
        found = _Ranges(archive, len(members))
        return cls(archive, members, pieces, gathered, piece_bytes, layout, found)

    def requests(self, target: PositionalWriter) -> Iterator[WriteRequest]:
        """The archive's writes, in archive order: a run of small members is one request
        (of up to ``GROUP_BYTES`` and at most ``chunk_bytes``, so that a run's buffer is
        never larger than the chunks the memory budget is sized for, unless it is one
        member; of up to ``GROUP_MEMBERS``; cut before each member written in pieces), a
        member written in pieces one request per piece."""
        layout, members, found, archive = self.layout, self.members, self.found, self.archive
        run_request = partial(_run_request, layout, members, self.gathered, found, target, archive)
        ends, headers = layout.end, layout.header_offsets
        spans = [ends(index) - headers[index] for index in range(len(members))]  # header, data
        for group in write_groups(spans, self.pieced, min(GROUP_BYTES, self.piece_bytes)):
            if group[0] in self.pieced:
                yield from _piece_requests(self, group[0], target)
            else:
                yield run_request(group)

    def finish(self, target: PositionalWriter) -> None:
        """The headers of members written in pieces (their CRC-32 is known once every
        piece is written), then the central directory."""
        layout, found = self.layout, self.found
        for index, pieces in self.pieced.items():  # in archive order
            member = self.members[index]
            crc = crc32_of([member.prefix])
            for number in range(len(pieces) + (member.padding > 0)):
                piece_crc, length = found.piece_crc[(index, number)]
                crc = crc32_combine(crc, piece_crc, length)
            head = [memoryview(layout.local_header(index, crc)), memoryview(member.prefix)]
            target.write_at(layout.header_offsets[index], head)
            found.file(layout.header_offsets[index], head)
            found.member_crcs[index] = crc
        tail = memoryview(layout.central_directory(found.member_crcs))
        target.write_at(layout.directory_offset, [tail])
        found.file(layout.directory_offset, [tail])

    def records(self) -> WrittenDB:
        """Each blob's record: its members' ranges, in archive order."""
        found = self.found
        blobs: dict[str, BlobRecord] = {}
        for index, member in enumerate(self.members):
            blob, array = member.blob, member.array
            if blob is None or array is None:
                continue
            chunks: tuple[ChunkRecord, ...] | None = found.run_chunks.get(index)
            if chunks is None:  # written in pieces (or empty)
                pieces = found.blob_chunks.get(index, {})
                chunks = tuple(pieces[n] for n in sorted(pieces))
            if member.blob_shape is None:  # the whole blob (the common case)
                blobs[blob] = BlobRecord(blob, encode_dtype(blob, array.dtype), array.shape, chunks)
                continue
            known = blobs.get(blob)  # a chunk of a blob held in several members
            held = () if known is None else known.chunks
            dtype = encode_dtype(blob, array.dtype)
            blobs[blob] = BlobRecord(blob, dtype, member.blob_shape, held + chunks)
        return WrittenDB(blobs, tuple(sorted(found.files, key=lambda record: record.offset)))


def _residues(members: Sequence[Member], pieced: set[int]) -> dict[int, int]:
    """Where each contiguous member written in pieces should start, modulo the
    alignment: its array's address (minus its prefix), so that the pieces can go
    ``O_DIRECT`` from the array's memory (:mod:`ckptstore.io._direct`)."""
    residues = {}
    for index in pieced:
        member = members[index]
        if member.array is not None and member.array.flags.c_contiguous:
            residue = memory_residue(member.array) - len(member.prefix)
            residues[index] = residue % DIRECT_ALIGN
    return residues


def _data_start(layout: ZipLayout, index: int, member: Member) -> int:
    """Where member ``index``'s array data starts in the archive (after its prefix)."""
    return layout.data_offsets[index] + len(member.prefix)


def _data(member: Member) -> memoryview:
    """The member's array as bytes, flat (a view when it is C-contiguous)."""
    array = member.array
    if array is None:
        return memoryview(b"")
    if array.flags.c_contiguous:
        try:
            # the cheapest view, for numpy's own dtypes (numpy's stubs lack __buffer__)
            return memoryview(array).cast("B")  # type: ignore[arg-type]
        except (TypeError, ValueError):  # datetime64, ml_dtypes: no buffer format
            return array.reshape(-1).view(np.uint8).data
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _run_request(
    layout: ZipLayout,
    members: Sequence[Member],
    gathered: set[int],
    found: _Ranges,
    target: PositionalWriter,
    archive: str,
    run: list[int],
) -> WriteRequest:
    """A run of small members (the indexes in ``run``, a list the caller no longer
    changes), written with one call: headers, documents and the data of members under
    ``GATHERED_FROM`` copied into one buffer in archive order, and the data of larger
    members (``gathered``) passed between the buffer's slices as views of their own
    arrays. Each blob's bytes are checksummed once (CRC-32: the blob's range in the
    manifest, so that a partial load reads only those); the member's CRC-32 for the ZIP
    (document or npy header, then the blob) and the CRC-32 of the whole run (its format
    record, which covers its headers and documents) are joined from that and the small
    parts around it."""
    start = layout.header_offsets[run[0]]
    nbytes = layout.end(run[-1]) - start
    copied = nbytes  # all but the gathered members' data (none in most archives)
    if gathered:
        copied -= sum(members[index].data_size for index in run if index in gathered)

    def produce() -> list[Buffer]:
        view = aligned_buffer(start, copied)
        parts: list[Buffer] = []
        cut = 0  # where the buffer's next slice starts
        skipped = 0  # gathered bytes so far: file offsets minus buffer offsets
        data_offsets, header_offsets = layout.data_offsets, layout.header_offsets
        sizes = layout.sizes  # each member's stored bytes
        chunks: list[tuple[int, tuple[ChunkRecord]]] = []
        crcs = found.member_crcs  # one slot per member: set without a lock
        header_into = layout.local_header_into
        run_crc = 0
        for index in run:
            member = members[index]
            prefix = member.prefix
            first = data_offsets[index] - start - skipped  # in the buffer
            end = first + len(prefix)
            view[first:end] = prefix
            crc = _crc32(prefix)
            array = member.array
            if array is not None and array.nbytes:
                data_at = end
                data = _data(member)
                size = data.nbytes
                if gathered and index in gathered:
                    data_crc = _crc32(data)
                    parts += (view[cut:data_at], data)
                    cut = data_at
                    skipped += size
                else:
                    end += size
                    view[data_at:end] = data
                    data_crc = _crc32(view[data_at:end])
                crc = crc32_combine(crc, data_crc, size)
                if member.blob is not None:
                    at = data_offsets[index] + len(prefix)
                    chunk = ChunkRecord(archive, at, size, size, data_crc)
                    chunks.append((index, (chunk,)))
            inflated = member.inflated  # the ZIP wants the CRC-32 of the inflated bytes
            zip_crc = crc if inflated is None else inflated.crc
            crcs[index] = zip_crc
            header = header_offsets[index] - data_offsets[index] + first
            header_into(view, header, index, zip_crc)
            run_crc = crc32_combine(_crc32(view[header:first], run_crc), crc, sizes[index])
        parts.append(view[cut:])
        record = ChunkRecord(archive, start, nbytes, nbytes, run_crc)
        with found.lock:
            found.files.append(record)
            found.run_chunks.update(chunks)
        return parts

    return WriteRequest(
        archive,
        produce,
        nbytes,
        holds=copied,
        blob=members[run[0]].blob,
        target=target,
        offset=start,
        checksum=False,
    )


def _piece_requests(
    plan: _ArchivePlan, index: int, target: PositionalWriter
) -> Iterator[WriteRequest]:
    """One request per piece of ``plan``'s member ``index`` (``plan.pieced[index]``)."""
    member, found, archive = plan.members[index], plan.found, plan.archive
    array = member.array
    blob = member.blob
    assert array is not None
    assert blob is not None
    base = _data_start(plan.layout, index, member)
    chunk_shape = grid_chunk_shape(array.shape, array.dtype.itemsize, plan.piece_bytes)
    contiguous = bool(array.flags.c_contiguous)
    flat = _data(member) if contiguous else None
    for group in _piece_batches(plan.pieced[index], contiguous, plan.piece_bytes):
        first = group[0][1].start
        nbytes = sum(chunk.nbytes for _, chunk in group)

        def produce(
            group: list[tuple[int, ArrayChunk]] = group, first: int = first, nbytes: int = nbytes
        ) -> list[Buffer]:
            for number, chunk in group:
                data = byte_view(chunk_data(array, chunk, chunk_shape))
                found.piece(index, number, base + chunk.start, data)
            return [data] if flat is None else [flat[first : first + nbytes]]  # copied: alone

        yield WriteRequest(
            archive,
            produce,
            nbytes,
            holds=0 if contiguous else nbytes,
            blob=blob,
            chunk=group[0][0],
            target=target,
            offset=base + first,
            checksum=False,
        )
    if member.padding:  # an edge chunk's zeros, after its data
        number, offset = len(plan.pieced[index]), base + array.nbytes

        def pad() -> list[Buffer]:
            zeros = memoryview(bytes(member.padding))
            found.piece(index, number, offset, zeros, padding=True)
            return [zeros]

        yield WriteRequest(
            archive,
            pad,
            member.padding,
            holds=member.padding,
            blob=blob,
            chunk=number,
            target=target,
            offset=offset,
            checksum=False,
        )


def _piece_batches(
    pieces: Sequence[ArrayChunk], contiguous: bool, piece_bytes: int
) -> Iterator[list[tuple[int, ArrayChunk]]]:
    """The pieces of one member (numbered) in the batches written with one request
    each: a C-contiguous array's consecutive pieces up to ``PIECED_FROM`` bytes (or one
    piece), each still its own CRC-checked range in the manifest; any other array's
    pieces one by one (each is copied). Pieces smaller than ``DIRECT_FROM`` (DCP's
    128 KiB, of which a resharded load reads only those it needs) thus reach a disk as
    a few large writes (``O_DIRECT`` from 1 MiB) instead of hundreds through the page
    cache: the GPT-2 + Adam DCP benchmark's ``write_data``, 0.1 GiB a rank, took 0.27 s
    instead of 0.37 s (0.55 against 0.94 under heavier load; docs/benchmarks-tables.md,
    "torch DCP, 2 ranks"). A contiguous array's pieces are consecutive ranges of its
    bytes, so a batch is one range of them."""
    most = max(piece_bytes, PIECED_FROM) if contiguous else 0
    batch: list[tuple[int, ArrayChunk]] = []
    size = 0
    for number, chunk in enumerate(pieces):
        if batch and size + chunk.nbytes > most:
            yield batch
            batch, size = [], 0
        batch.append((number, chunk))
        size += chunk.nbytes
    if batch:
        yield batch


# -- reading: the manifest's ranges are untrusted ------------------------------------------


_Span = tuple[int, int, str | None]
"""A recorded range: offset, length, and its blob (``None``: a format range)."""


def check_ranges(
    db: DBLocation,
    first: str,
    ranges: Iterable[tuple[str | None, ChunkRecord]],
) -> None:
    """Refuse recorded ranges (``(blob or None, record)``) of the archives of a node
    checkpoint (``first`` and the others :func:`archive_name` numbers) that end past
    their file or overlap each other, before anything is allocated or read: a manifest
    is data from storage, and a forged one must not make a load read the wrong bytes or
    allocate at will (one size request per archive). Blob ranges must not overlap each
    other, nor format ranges (``None``) each other; a format range covering a run of
    small blobs overlaps their ranges by design. Raises :class:`CorruptCheckpointError`
    naming the blob and the file. Ranges of other files (one file per chunk, compressed
    zarr) are checked by their reads."""
    spans: dict[str, tuple[list[_Span], list[_Span]]] = {}
    for blob, record in ranges:
        key = record.key
        if is_archive(first, key):
            blob_spans, file_spans = spans.setdefault(key, ([], []))
            span = (record.offset, record.stored, blob)
            (file_spans if blob is None else blob_spans).append(span)
    url = db.storage.display_url
    sizes = _sizes(db.storage, [db.key(key) for key in sorted(spans)])
    for key, (blob_spans, file_spans) in sorted(spans.items()):
        file = db.key(key)
        size = sizes[file]
        if size is None:
            named = blob_spans[0][2] if blob_spans else None
            raise CorruptCheckpointError("the file is missing", url=url, file=file, blob=named)
        _check_spans(blob_spans, size, url, file)
        _check_spans(file_spans, size, url, file)


def _sizes(storage: PathType, files: Sequence[str]) -> dict[str, int | None]:
    """Each file's size (``None``: missing); on a storage where each is a round trip
    (an object store's archives), all asked at once."""

    def size(file: str) -> int | None:
        try:
            return storage.size(file)
        except ObjectNotFoundError:
            return None

    if len(files) < 2 or storage.batches_small_requests:
        return {file: size(file) for file in files}
    pool = kept_pool("ckptstore-size", ARCHIVE_THREADS)
    return dict(zip(files, pool.map(size, files), strict=True))


def _check_spans(spans: list[_Span], size: int, url: str, file: str) -> None:
    """Raise unless ``spans`` (offset, length, blob) lie inside ``size`` bytes without
    overlapping each other."""
    if not spans:
        return
    # thousands of ranges: checked as arrays; the loop below runs only to name a culprit
    offsets = np.fromiter((span[0] for span in spans), dtype=np.int64, count=len(spans))
    ends = offsets + np.fromiter((span[1] for span in spans), dtype=np.int64, count=len(spans))
    order = np.argsort(offsets, kind="stable")
    offsets, ends = offsets[order], ends[order]
    if int(ends.max()) <= size and bool(np.all(offsets[1:] >= np.maximum.accumulate(ends)[:-1])):
        return
    previous_end, previous_blob = 0, None
    for index in order.tolist():
        offset, stored, blob = spans[index]
        if offset + stored > size:
            raise CorruptCheckpointError(
                f"the manifest places {stored} bytes at offset {offset}, past the end of "
                f"the {size}-byte file",
                url=url,
                file=file,
                blob=blob,
            )
        if offset < previous_end:
            other = f"blob {previous_blob!r}" if previous_blob else "another recorded range"
            raise CorruptCheckpointError(
                f"the manifest's range at offset {offset} overlaps {other}",
                url=url,
                file=file,
                blob=blob,
            )
        previous_end, previous_blob = max(previous_end, offset + stored), blob


def manifest_ranges(manifest: NodeManifest) -> Iterator[tuple[str | None, ChunkRecord]]:
    """Every range a manifest records: blob chunks (with their blob) and format files."""
    for record in manifest.blobs.values():
        for chunk in record.chunks:
            yield record.name, chunk
    for chunk in manifest.files:
        yield None, chunk


# -- reading ---------------------------------------------------------------------------


def read_archive(db: DBLocation, records: Sequence[BlobRecord]) -> dict[str, np.ndarray[Any, Any]]:
    """Read raw blobs from the archives their chunk records name (after
    :func:`check_ranges`): each range lands in
    place in a new array; runs of neighbouring small ranges are read with one ranged
    read each (thousands of small blobs cost tens of requests, not thousands) and
    checked range by range (:func:`~ckptstore.plugin.read_raw_blobs`)."""
    return read_raw_blobs(db, records)
