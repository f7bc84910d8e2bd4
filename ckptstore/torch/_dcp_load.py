"""Reading a rank's share of a DCP checkpoint: the stored pieces of every item it needs,
from every node checkpoint it touches, in one parallel pass through the I/O engine.

Each piece (a CRC-checked range of a saved chunk's bytes, see :mod:`._dcp_read`) lands
where it is needed: straight in the planner's tensor when an item asks for a whole
saved chunk into a contiguous tensor of the saved dtype (a same-topology load, or a
rank loading whole chunks of several saving ranks: no copy afterwards), else in a
buffer of the covering pieces, which the box is then copied from. Neighbouring pieces
of a file are read with one request of up to the engine's chunk size (on an object
store, up to :data:`REMOTE_RUN_BYTES` per ranged GET, not one per piece), every piece
checked against its own CRC before anything is handed to the planner.

The wants are made as the engine asks for requests (:func:`read_in_waves`): the
engine's threads read the pieces of the first ones while the planner's tensors of the
next are looked up, and the files of several nodes (a resharded load) are read at
once, not one node after the other, with more requests in flight (:func:`engine_for`).
Buffers are bounded: a wave holds at most the engine's memory budget of them, and is
handed back once all its pieces are checked.

Only records of plain stored pieces (raw codec, unpadded) of the zarr format, which
:class:`~ckptstore.torch.dcp.Writer` writes, are read here (:func:`plain`); the reader
reads anything else through :func:`ckptstore.protocol.read_blobs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.planner import ReadItem

from ckptstore.errors import CorruptCheckpointError
from ckptstore.formats import ARCHIVE, check_ranges
from ckptstore.io import ParallelIO, ReadRequest, resolve_key
from ckptstore.plugin import DBLocation, DBType, PathType, Span, coalesced_reads
from ckptstore.protocol import check_decodable, corrupt_in_node
from ckptstore.records import BlobRecord, NodeManifest

__all__ = [
    "MOST_IN_FLIGHT",
    "REMOTE_RUN_BYTES",
    "Want",
    "bytes_of",
    "check_records",
    "engine_for",
    "plain",
    "read_in_waves",
    "read_segments",
]

REMOTE_RUN_BYTES = 64 << 20
"""Neighbouring pieces are read in runs of up to this many bytes from a storage where
each request is a round trip (an object store: one ranged GET per run), of up to the
engine's chunk size elsewhere. Measured on moto +20 ms (256 MiB on 2 ranks, a 2 -> 2
load): runs of 16 MiB took 14.5 s, of 64 MiB 5.1 s (each ranged GET costs moto a pass
over the whole object); a rank's share of a large state still spreads over many."""


MOST_IN_FLIGHT = 16
"""A rank reading the files of several saving ranks reads with the engine's concurrency
for each of them (as many requests in flight as their own loads would have had) up to
this many, or the engine's own if that is more (:func:`engine_for`)."""


def engine_for(io: ParallelIO, nodes: int) -> ParallelIO:
    """``io``, or one like it with more requests in flight for reading ``nodes`` node
    checkpoints (:data:`MOST_IN_FLIGHT`). On this VM's disk (gpt2-adam-narrow, 2 -> 1,
    cold cache, 6 loads a run), with the machine loaded: 4 in flight 0.40 s (median of
    two runs), 8 in flight 0.28 s; idle: 0.16-0.17 s either way."""
    settings = io.settings
    wanted = max(settings.concurrency, min(settings.concurrency * nodes, MOST_IN_FLIGHT))
    if wanted == settings.concurrency:
        return io
    return ParallelIO(settings.merged(concurrency=wanted), progress=io.progress)


@dataclass(frozen=True)
class Want:
    """One item's stored pieces to read: ``record``'s pieces (numbered from ``first``
    in the stored blob, starting ``start`` bytes into it) into ``data`` (bytes, exactly
    as long). ``tensor`` is the planner's tensor for a tensor item (``None`` for a byte
    entry); ``in_place``: ``data`` is its own memory."""

    item: ReadItem
    name: str
    """What a damaged piece is reported as: ``tensor 'fqn'`` or ``entry 'fqn'``."""
    record: BlobRecord
    first: int
    start: int
    data: np.ndarray[Any, Any]
    tensor: torch.Tensor | None = None
    in_place: bool = False

    @property
    def buffered(self) -> int:
        """Bytes of buffer this want holds beyond the planner's tensors."""
        return 0 if self.in_place else int(self.data.nbytes)


def plain(manifest: NodeManifest, record: BlobRecord) -> bool:
    """Whether ``record`` is read here: plain stored pieces of a zarr archive."""
    return (
        manifest.db_type == "zarr"
        and record.codec == "raw"
        and all(chunk.stored == chunk.size for chunk in record.chunks)
    )


def bytes_of(target: torch.Tensor, dtype: torch.dtype, nbytes: int) -> np.ndarray[Any, Any] | None:
    """``target``'s memory as bytes, if the stored chunk's ``nbytes`` of ``dtype`` can be
    read straight into it (contiguous, on the CPU, of that dtype and size), else None."""
    if (
        target.dtype != dtype
        or target.device.type != "cpu"
        or not target.is_contiguous()
        or target.nbytes != nbytes
        or target.numel() == 0
    ):
        return None
    flat = target.reshape(-1).view(torch.uint8)
    return flat.numpy()


def check_records(
    storage: PathType, manifest: NodeManifest, records: Sequence[BlobRecord], db_type: DBType
) -> None:
    """Refuse, before anything is allocated or read, records that no reader decodes,
    whose pieces do not add up to the blob, that leave their archive or overlap."""
    db = DBLocation(storage, manifest.data_key, ParallelIO())
    with corrupt_in_node(storage, manifest.node, manifest.epoch):
        check_decodable(storage, records, db_type)
        for record in records:
            size = math.prod(record.shape) * record.numpy_dtype().itemsize
            if sum(chunk.size for chunk in record.chunks) != size:
                raise CorruptCheckpointError(
                    f"the pieces of blob {record.name!r} do not add up to its {size} bytes",
                    url=storage.display_url,
                    blob=record.name,
                )
        check_ranges(db, ARCHIVE, ((r.name, c) for r in records for c in r.chunks))


def run_bytes(storage: PathType, io: ParallelIO) -> int:
    """How many bytes of neighbouring pieces one request reads (:data:`REMOTE_RUN_BYTES`)."""
    if storage.batches_small_requests:
        return io.settings.chunk_bytes
    return max(io.settings.chunk_bytes, REMOTE_RUN_BYTES)


Segment = tuple[NodeManifest, list[Want]]
"""Wants of one node checkpoint, read together (their neighbouring pieces in one
request)."""


def read_in_waves(
    storage: PathType, io: ParallelIO, wants: Iterable[tuple[NodeManifest, Want]]
) -> Iterator[list[tuple[NodeManifest, Want]]]:
    """Read the pieces of ``wants`` (each with its node checkpoint's manifest, made
    lazily, best in stored order) into their ``data``, each checked against its CRC;
    yield them in waves holding at most ``io``'s memory budget of buffers (a single
    want larger than that is a wave of its own), each once all its pieces are read.

    A wave's wants are made while the engine reads the pieces of those before them, in
    segments of up to :func:`run_bytes` of one node (neighbours: one request). A damaged
    piece raises :class:`~ckptstore.errors.CorruptCheckpointError` naming the file, the
    node, the blob, its piece and the want's tensor or entry."""
    source = iter(wants)
    carried: list[tuple[NodeManifest, Want]] = []
    budget = io.settings.memory_budget
    limit = run_bytes(storage, io)

    def segments(wave: list[tuple[NodeManifest, Want]]) -> Iterator[Segment]:
        held = length = 0
        segment: list[Want] = []
        manifest: NodeManifest | None = None
        for node, want in _chain(carried, source):
            if wave and held + want.buffered > budget:
                carried.append((node, want))  # the next wave's first
                break
            wave.append((node, want))
            held += want.buffered
            if segment and (node is not manifest or length + want.data.nbytes > limit):
                assert manifest is not None
                yield manifest, segment
                segment, length = [], 0
            manifest = node
            segment.append(want)
            length += want.data.nbytes
        if segment and manifest is not None:
            yield manifest, segment

    while True:
        wave: list[tuple[NodeManifest, Want]] = []
        read_segments(storage, io, segments(wave))
        if not wave:
            return
        yield wave


def _chain(
    carried: list[tuple[NodeManifest, Want]], source: Iterator[tuple[NodeManifest, Want]]
) -> Iterator[tuple[NodeManifest, Want]]:
    while carried:
        yield carried.pop()
    yield from source


def read_segments(storage: PathType, io: ParallelIO, segments: Iterable[Segment]) -> None:
    """Read every want's pieces into its ``data`` in one pass of ``io``, the segments
    made as the engine takes their requests (see :func:`read_in_waves`)."""
    db = DBLocation(storage, "", io)  # keys: resolved for each node checkpoint
    runs = run_bytes(storage, io)
    names: dict[tuple[str, str], tuple[NodeManifest, str]] = {}

    def requests() -> Iterator[ReadRequest]:
        for manifest, wants in segments:
            spans: list[Span] = []
            for want in wants:
                _add_spans(spans, manifest, want, names)
            yield from coalesced_reads(db, spans, runs_of=runs)

    try:
        db.read(requests())
    except CorruptCheckpointError as error:
        found = names.get((error.file or "", error.blob or ""))
        if found is None:
            raise
        manifest, name = found
        raise CorruptCheckpointError(
            f"{error.detail} ({name})",
            url=error.url,
            file=error.file,
            blob=error.blob,
            chunk=error.chunk,
            node=manifest.node,
            epoch=manifest.epoch,
        ) from None


def _add_spans(
    spans: list[Span],
    manifest: NodeManifest,
    want: Want,
    names: dict[tuple[str, str], tuple[NodeManifest, str]],
) -> None:
    """Append the spans reading ``want``'s pieces; note what each file's damage names."""
    view = want.data.reshape(-1).view(np.uint8).data
    blob = want.record.name
    position = 0
    keys: dict[str, str] = {}
    for number, chunk in enumerate(want.record.chunks, start=want.first):
        key = keys.get(chunk.key)
        if key is None:
            key = keys[chunk.key] = resolve_key(manifest.data_key, chunk.key)
            names[key, blob] = (manifest, want.name)
        end = position + chunk.size
        spans.append(
            Span(key, chunk.offset, view[position:end], chunk.crc, blob, number, chunk.algorithm)
        )
        position = end
    if position != view.nbytes:  # checked by check_records: never for a whole blob
        raise ValueError("the pieces do not fill the buffer")
