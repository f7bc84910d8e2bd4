"""Reading a rank's share of a DCP checkpoint: the stored pieces of every item it needs
from one node checkpoint, in one parallel pass through the I/O engine.

Each piece (a CRC-checked range of a saved chunk's bytes, see :mod:`._dcp_read`) lands
where it is needed: straight in the planner's tensor when an item asks for a whole
saved chunk into a contiguous tensor of the saved dtype (a same-topology load: no copy
afterwards), else in a buffer of the covering pieces, which the box is then copied
from. Neighbouring pieces of a file are read with one request of up to the engine's
chunk size (on an object store, up to :data:`REMOTE_RUN_BYTES` per ranged GET, not one
per piece), every
piece checked against its own CRC before anything is handed to the planner. Buffers
are bounded: items needing one are read in waves of at most the engine's memory
budget of buffers.

Only records of plain stored pieces (raw codec, unpadded) of the zarr format, which
:class:`~ckptstore.torch.dcp.Writer` writes, are read here (:func:`plain`); the reader
reads anything else through :func:`ckptstore.protocol.read_blobs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.planner import ReadItem

from ckptstore.errors import CorruptCheckpointError
from ckptstore.formats import ARCHIVE, check_ranges
from ckptstore.io import ParallelIO
from ckptstore.plugin import DBLocation, DBType, PathType, Span, coalesced_reads
from ckptstore.protocol import check_decodable, corrupt_in_node
from ckptstore.records import BlobRecord, NodeManifest

__all__ = ["REMOTE_RUN_BYTES", "Want", "bytes_of", "check_records", "plain", "read_wants", "waves"]

REMOTE_RUN_BYTES = 64 << 20
"""Neighbouring pieces are read in runs of up to this many bytes from a storage where
each request is a round trip (an object store: one ranged GET per run), of up to the
engine's chunk size elsewhere. Measured on moto +20 ms (256 MiB on 2 ranks, a 2 -> 2
load): runs of 16 MiB took 14.5 s, of 64 MiB 5.1 s (each ranged GET costs moto a pass
over the whole object); a rank's share of a large state still spreads over many."""


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


def waves(wants: Sequence[Want], budget: int) -> Iterator[list[Want]]:
    """``wants`` in order, cut so that each wave's buffers hold at most ``budget`` bytes
    (a single want larger than that is a wave of its own)."""
    wave: list[Want] = []
    held = 0
    for want in wants:
        if wave and held + want.buffered > budget:
            yield wave
            wave, held = [], 0
        wave.append(want)
        held += want.buffered
    if wave:
        yield wave


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


def read_wants(
    storage: PathType, manifest: NodeManifest, io: ParallelIO, wants: Sequence[Want]
) -> None:
    """Read every want's pieces of node checkpoint ``manifest`` into its ``data``, each
    checked against its CRC; a damaged piece raises
    :class:`~ckptstore.errors.CorruptCheckpointError` naming the file, the node, the
    blob, its piece and the want's tensor or entry."""
    spans: list[Span] = []
    names: dict[str, str] = {}
    for want in wants:
        view = want.data.reshape(-1).view(np.uint8).data
        position = 0
        for number, chunk in enumerate(want.record.chunks, start=want.first):
            spans.append(
                Span(
                    chunk.key,
                    chunk.offset,
                    view[position : position + chunk.size],
                    chunk.crc,
                    want.record.name,
                    number,
                    chunk.algorithm,
                )
            )
            position += chunk.size
        if position != view.nbytes:  # checked by check_records: never for a whole blob
            raise ValueError("the pieces do not fill the buffer")
        names[want.record.name] = want.name
    db = DBLocation(storage, manifest.data_key, io)
    try:
        with corrupt_in_node(storage, manifest.node, manifest.epoch):
            db.read(coalesced_reads(db, spans, runs_of=run_bytes(storage, io)))
    except CorruptCheckpointError as error:
        if error.blob is None or error.blob not in names:
            raise
        raise CorruptCheckpointError(
            f"{error.detail} ({names[error.blob]})",
            url=error.url,
            file=error.file,
            blob=error.blob,
            chunk=error.chunk,
            node=error.node,
            epoch=error.epoch,
        ) from None
