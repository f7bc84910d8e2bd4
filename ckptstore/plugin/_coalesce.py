"""Reading many small byte ranges of one file with few requests.

Thousands of small blobs packed in one file (a ZIP archive, an LMDB data file) would
cost one ranged read, one engine hand-off and one worker wake-up each. Here ranges of
one file that lie close together are read with one request: the bytes between them
(headers, documents) land in a scratch buffer, and every range is checked against its
own checksum, so a damaged blob is still named. Overlapping ranges are never coalesced
(each is read on its own and fails its checksum if the manifest lied).

Example::

    >>> from ckptstore.builtin import LocalPath
    >>> from ckptstore.io import ParallelIO, crc32_of
    >>> from ckptstore.plugin import DBLocation
    >>> db = DBLocation(LocalPath("packed"), "trainer_0.1", ParallelIO())
    >>> _ = db.storage.write_bytes("trainer_0.1/data.bin", b"head" + b"abcd" + b"gap!" + b"wxyz")
    >>> first, second = bytearray(4), bytearray(4)
    >>> spans = [Span("data.bin", 4, memoryview(first), crc32_of([b"abcd"]), "a", 0),
    ...          Span("data.bin", 12, memoryview(second), crc32_of([b"wxyz"]), "b", 0)]
    >>> requests = list(coalesced_reads(db, spans))
    >>> len(requests)  # neighbours: one request, the gap read into scratch
    1
    >>> _ = db.read(requests)
    >>> bytes(first), bytes(second)
    (b'abcd', b'wxyz')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ckptstore.errors import CorruptCheckpointError
from ckptstore.io import CHECKSUM_ALGORITHM, RangeCheck, ReadRequest, checksum_of

if TYPE_CHECKING:
    from ckptstore.plugin._db_type import DBLocation

__all__ = ["ALONE_FROM", "COALESCE_BYTES", "COALESCE_GAP", "Span", "coalesced_reads"]

COALESCE_GAP = 64 << 10
"""Requested ranges at most this far apart are read with one request (the bytes between
them go to a scratch buffer)..."""
COALESCE_BYTES = 4 << 20
"""...up to this many bytes per request; larger pieces are read on their own."""
ALONE_FROM = 256 << 10
"""Ranges larger than this get a request (and a worker) of their own."""
MAX_TARGETS = 500
"""Ranges per request at most (each is a view handed to one vectored read)."""


class Span(NamedTuple):
    """One checked range of a stored file, to be read into ``target``.

    ``target.nbytes`` bytes at ``offset`` of ``key``, checked by ``crc`` (computed by
    ``algorithm``): chunk ``chunk`` of blob ``blob``."""

    key: str
    offset: int
    target: memoryview
    crc: int
    blob: str
    chunk: int
    algorithm: str = CHECKSUM_ALGORITHM


def _place(span: Span) -> tuple[str, int]:
    return span.key, span.offset


def coalesced_reads(
    db: DBLocation, spans: Sequence[Span], *, runs_of: int | None = None
) -> Iterator[ReadRequest]:
    """Requests reading every span into its target, neighbours of one file together.

    Small ones go up to :data:`COALESCE_BYTES`, large ones (the chunks of a large array,
    each its own archive member) up to the engine's chunk size, so that the device sees
    reads as long as one member's pieces. With ``runs_of``, spans of every size are
    read in runs of up to that many bytes, each span checked on its own (many pieces
    of one blob: one request per run, where each request is a round trip)."""
    group: list[Span] = []
    end = 0
    run: list[Span] = []
    run_end = run_bytes = 0
    # of the spans' bytes (the gaps are headers)
    run_limit = db.io.settings.chunk_bytes if runs_of is None else runs_of
    alone_from = ALONE_FROM if runs_of is None else -1
    for span in sorted(spans, key=_place):
        size = span.target.nbytes
        if size > alone_from:
            if run and not (
                span.key == run[0].key
                and span.algorithm == run[0].algorithm
                and run_end <= span.offset <= run_end + COALESCE_GAP
                and run_bytes + size <= run_limit
            ):
                yield _run_request(db, run)
                run, run_bytes = [], 0
            run.append(span)
            run_end = span.offset + size
            run_bytes += size
            continue
        if group and (
            span.key != group[0].key
            or span.offset < end  # overlaps the previous range: never in one request
            or span.offset - end > COALESCE_GAP
            or end - group[0].offset + size > COALESCE_BYTES
            or len(group) >= MAX_TARGETS
        ):
            yield _group_request(db, group)
            group = []
        group.append(span)
        end = span.offset + size
    if group:
        yield _group_request(db, group)
    if run:
        yield _run_request(db, run)


def _alone(span: Span) -> ReadRequest:
    """The request reading one span, checked by the engine (in windows)."""
    return ReadRequest(
        span.key,
        span.offset,
        [span.target],
        span.target.nbytes,
        crc=span.crc,
        blob=span.blob,
        chunk=span.chunk,
        algorithm=span.algorithm,
    )


def _layout(spans: list[Span]) -> list[Span | int]:
    """The spans in file order with the size of each gap before one (the bytes read
    into scratch): what one request reading them all reads, in order."""
    items: list[Span | int] = []
    position = spans[0].offset
    for span in spans:
        if span.offset > position:
            items.append(span.offset - position)
        items.append(span)
        position = span.offset + span.target.nbytes
    return items


def _targets(items: list[Span | int]) -> Callable[[], list[memoryview]]:
    """The views one request reads ``items`` into: each span's target, and slices of
    one scratch buffer (allocated in the worker) for the gaps."""

    def targets() -> list[memoryview]:
        scratch = memoryview(bytearray(sum(i for i in items if isinstance(i, int))))
        views: list[memoryview] = []
        for item in items:
            if isinstance(item, int):
                views.append(scratch[:item])
                scratch = scratch[item:]
            else:
                views.append(item.target)
        return views

    return targets


def _run_request(db: DBLocation, run: list[Span]) -> ReadRequest:
    """One request reading large neighbouring spans and the bytes between them (headers
    of the next member), each span checked on its own by the engine, in windows."""
    first = run[0]
    if len(run) == 1:
        return _alone(first)
    items = _layout(run)
    gaps = sum(item for item in items if isinstance(item, int))
    return ReadRequest(
        first.key,
        first.offset,
        _targets(items),
        gaps + sum(span.target.nbytes for span in run),
        holds=gaps,
        blob=first.blob,
        chunk=first.chunk,
        algorithm=first.algorithm,
        checks=[
            None if isinstance(item, int) else RangeCheck(item.crc, item.blob, item.chunk)
            for item in items
        ],
    )


def _group_request(db: DBLocation, group: list[Span]) -> ReadRequest:
    """One request reading small neighbouring spans in one call, checked after it (a
    window of their own would cost a system call each)."""
    if len(group) == 1:
        return _alone(group[0])
    key = group[0].key
    start = group[0].offset
    last = group[-1]
    nbytes = last.offset + last.target.nbytes - start
    gaps = nbytes - sum(span.target.nbytes for span in group)
    check = db.io.settings.verify

    def verify(_: Sequence[memoryview]) -> None:
        if not check:
            return
        for span in group:
            if checksum_of(span.algorithm)((span.target,)) != span.crc:
                raise CorruptCheckpointError(
                    f"the checksum ({span.algorithm}) of {span.target.nbytes} bytes at offset "
                    f"{span.offset} "
                    "differs from the one the manifest recorded",
                    url=db.storage.display_url,
                    file=db.key(key),
                    blob=span.blob,
                    chunk=span.chunk,
                )

    return ReadRequest(
        key,
        start,
        _targets(_layout(group)),
        nbytes,
        holds=gaps,
        finish=verify,
        blob=group[0].blob,
        chunk=group[0].chunk,
    )
