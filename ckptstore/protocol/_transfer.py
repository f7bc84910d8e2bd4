"""Copying committed node checkpoints from one checkpoint root to another (for example
from fast local disk to an object store), through the same commit protocol.

Every byte read from the source is checked against its checksum before it is written,
and the copy is read back and verified before it is published. The manifest is copied
byte for byte, so the destination's commit record carries the same manifest CRC-32C.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> from ckptstore.builtin import LocalPath
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("runs/a", "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(3))
    >>> from ckptstore.protocol import CheckpointLocation, commit_epoch
    >>> local_location = CheckpointLocation.open("runs/a", "npz")
    >>> archive = LocalPath("archive")  # an S3 or GCS path type works alike
    >>> stats = copy_node(source=local_location, dest=archive, node="trainer_0", epoch=3)
    >>> _ = commit_epoch(archive, 3, [stats.commit])
    >>> archive.exists(f"{stats.commit.data_key}/ckptstore.manifest.json")  # a new attempt
    True
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import replace

from ckptstore.errors import AlreadyCommittedError, CorruptCheckpointError
from ckptstore.execution import Workspace
from ckptstore.io import ByteProgress, ReadRequest, checksum_of, is_shared_key
from ckptstore.plugin import DBLocation, PathType
from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._bounds import check_decodable, check_pieces_fit, corrupt_in_node
from ckptstore.protocol._chunks import receive_chunks
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import (
    ChunkRecord,
    NodeManifest,
    NodeStats,
    get_ckpt_filename,
    new_attempt,
    node_data_key,
)

__all__ = ["copy_node", "copy_node_task"]


def copy_node(
    *,
    source: CheckpointLocation,
    dest: CheckpointLocation | PathType,
    node: str,
    epoch: int,
    verify: bool = True,
    progress: ByteProgress | None = None,
) -> NodeStats:
    """Copy ``node``'s committed checkpoint of ``epoch`` to ``dest`` (not yet committed
    there: commit the epoch once every node is copied). ``progress`` hears the bytes of
    each chunk or range as it is copied, then (``verify``) as the copy is read back."""
    started = time.perf_counter_ns()
    to = storage_of(dest)
    manifest, manifest_bytes, node_commit = protocol.open_node_record(source, node, epoch)
    engine = source.engine().reporting(progress)
    src = DBLocation(source.storage, manifest.data_key, engine)
    pieces = _pieces_by_file(manifest)
    with corrupt_in_node(source.storage, node, epoch):
        check_decodable(source.storage, manifest.blobs.values(), source.reader_for(manifest))
        check_pieces_fit(
            source.storage, manifest.data_key, (p for group in pieces.values() for p in group)
        )

    shared = [records[0] for key, records in pieces.items() if is_shared_key(key)]

    def fetch(chunk: ChunkRecord) -> memoryview:
        data = memoryview(src.storage.read_bytes(src.key(chunk.key)))
        if data.nbytes != chunk.stored or checksum_of(chunk.algorithm)((data,)) != chunk.crc:
            raise CorruptCheckpointError(
                "the shared chunk differs from the one recorded in the manifest",
                url=src.storage.display_url,
                file=src.key(chunk.key),
            )
        if progress is not None:
            progress(chunk.stored)
        return data

    def fill(root: str) -> bytes:
        target = DBLocation(to, root, engine)
        if shared:  # only those the destination lacks, never replacing one in place
            receive_chunks(to, node, epoch, shared, fetch)
        whole = [
            records[0]
            for key, records in pieces.items()
            if _is_whole(records) and not is_shared_key(key)
        ]
        src.read((_copy_request(chunk, target) for chunk in whole), verify=True)
        for key, records in pieces.items():
            if not _is_whole(records) and not is_shared_key(key):
                _stream_file(src, target, key, records, progress)
        if verify:
            problems = source.reader_for(manifest).verify(target, manifest)
            if problems:
                raise problems[0]
        return manifest_bytes

    attempt = new_attempt()
    root = node_data_key(node, epoch, attempt)
    with corrupt_in_node(source.storage, node, epoch):
        protocol.publish_node(to, root, fill)
    return NodeStats(
        node=node,
        epoch=epoch,
        db_path=f"{to.display_url.rstrip('/')}/{get_ckpt_filename(node, epoch)}",
        action="checkpoint_upload",
        duration_ns=time.perf_counter_ns() - started,
        nbytes=manifest.nbytes,
        stored_bytes=node_commit.stored_bytes,
        nblobs=len(manifest.blobs),
        blobs=tuple(manifest.blobs),
        commit=replace(node_commit, duration_ns=time.perf_counter_ns() - started, attempt=attempt),
    )


def copy_node_task(
    ws: Workspace,
    *,
    source: CheckpointLocation,
    dest: CheckpointLocation | PathType,
    node: str,
    epoch: int,
    verify: bool,
) -> NodeStats:
    """:func:`copy_node` as a task body (the workspace is not used).

    A copy that finds ``node`` already committed at ``dest`` never replaces it: the
    same checkpoint (its manifest's CRC-32C, which a copy keeps byte for byte) is left
    as it is and not committed again (an interrupted copy resumes); another one raises
    :class:`~ckptstore.errors.AlreadyCommittedError` (another job's epoch)."""
    there = protocol.read_commit(dest, epoch, [node])
    if there is not None and node in there.nodes:
        ours = protocol.require_commit(source, epoch, [node]).nodes[node]
        if there.nodes[node].manifest_crc32c != ours.manifest_crc32c:
            raise AlreadyCommittedError(storage_of(dest).display_url, epoch, [node])
        return NodeStats(node, epoch, storage_of(dest).display_url, "checkpoint_upload")
    return copy_node(source=source, dest=dest, node=node, epoch=epoch, verify=verify)


def _pieces_by_file(manifest: NodeManifest) -> dict[str, list[ChunkRecord]]:
    pieces: dict[str, list[ChunkRecord]] = defaultdict(list)
    for record in manifest.blobs.values():
        for chunk in record.chunks:
            pieces[chunk.key].append(chunk)
    for chunk in manifest.files:
        pieces[chunk.key].append(chunk)
    return {key: _outermost(records) for key, records in pieces.items()}


def _outermost(records: list[ChunkRecord]) -> list[ChunkRecord]:
    """``records`` by offset, without those inside another one (the blobs of a packed
    archive's run lie inside the run's format range, whose checksum covers them)."""
    records.sort(key=lambda chunk: (chunk.offset, -chunk.stored))
    kept: list[ChunkRecord] = []
    reached = 0
    for chunk in records:
        end = chunk.offset + chunk.stored
        if kept and end <= reached:  # sorted by offset: inside what is kept
            continue
        kept.append(chunk)
        reached = max(reached, end)
    return kept


def _is_whole(records: Sequence[ChunkRecord]) -> bool:
    return len(records) == 1 and records[0].offset == 0


def _copy_request(chunk: ChunkRecord, target: DBLocation) -> ReadRequest:
    def write(buffers: Sequence[memoryview]) -> None:
        target.storage.write_parts(target.key(chunk.key), buffers)

    return ReadRequest(
        chunk.key,
        0,
        lambda: [memoryview(bytearray(chunk.stored))],
        chunk.stored,
        crc=chunk.crc,
        holds=chunk.stored,
        finish=write,
        chunk=None,
        algorithm=chunk.algorithm,
    )


def _stream_file(
    src: DBLocation,
    target: DBLocation,
    key: str,
    records: Sequence[ChunkRecord],
    progress: ByteProgress | None,
) -> None:
    """Copy a file recorded as consecutive pieces (an archive), checking each piece;
    neighbouring pieces are read together, up to a chunk's worth per request."""
    with target.open_write(key) as out:
        span = src.io.settings.chunk_bytes
        for data, chunk in zip(_read_pieces(src, key, records, span), records, strict=True):
            if checksum_of(chunk.algorithm)((data,)) != chunk.crc:
                raise CorruptCheckpointError(
                    f"the checksum ({chunk.algorithm}) of the {chunk.stored} bytes at offset "
                    f"{chunk.offset} "
                    "differs from the one recorded in the manifest",
                    url=src.storage.display_url,
                    file=src.key(key),
                )
            out.write(data)
            if progress is not None:
                progress(chunk.stored)


def _read_pieces(
    src: DBLocation, key: str, records: Sequence[ChunkRecord], span: int
) -> Iterator[memoryview]:
    """Each piece's bytes, in order; one read covers consecutive pieces up to ``span``
    bytes (a larger piece is read alone)."""
    position = 0
    for chunk in records:
        if chunk.offset != position:
            raise CorruptCheckpointError(
                f"the manifest leaves bytes {position}-{chunk.offset} unrecorded, so the file "
                "cannot be copied verifiably",
                url=src.storage.display_url,
                file=src.key(key),
            )
        position = chunk.offset + chunk.stored
    index = 0
    while index < len(records):
        first = index
        end = records[index].offset + records[index].stored
        index += 1
        while index < len(records) and end + records[index].stored - records[first].offset <= span:
            end += records[index].stored
            index += 1
        start = records[first].offset
        data = memoryview(src.storage.read_bytes(src.key(key), start, end - start))
        for chunk in records[first:index]:
            yield data[chunk.offset - start : chunk.offset - start + chunk.stored]
