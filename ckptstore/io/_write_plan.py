"""Planning the parallel write of a few large files (the packed archives): which file
takes which blob, how a large array is cut into pieces that go ``O_DIRECT``, how small
members are grouped into one call each, and in which order the files' writes reach the
engine. What the bytes are (the ZIP layout, the members) is the format's business
(:mod:`ckptstore.formats`); this is where, in which order and in what sizes.

Example (a node's blobs shared among two archives: the second takes the largest)::

    >>> big = ARCHIVE_BYTES
    >>> archive_shares({"tiny": 4, "w1": big, "w2": big})
    [['tiny', 'w2'], ['w1']]
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterator, Mapping, Sequence

from ckptstore._types import Array
from ckptstore.io._chunking import ArrayChunk, array_chunks, grid_chunk_shape
from ckptstore.io._direct import DIRECT_ALIGN, DIRECT_FROM
from ckptstore.io._engine import WriteRequest

__all__ = [
    "ARCHIVE_BYTES",
    "GATHERED_FROM",
    "GROUP_BYTES",
    "GROUP_MEMBERS",
    "MAX_ARCHIVES",
    "PIECED_FROM",
    "aligned_pieces",
    "archive_shares",
    "interleaved",
    "write_groups",
]

GROUP_BYTES = 8 << 20
"""A run of small members is cut into pieces of about this many bytes (each copied
into one buffer and written with one call)..."""
GROUP_MEMBERS = 512
"""...or this many members, whichever comes first."""
PIECED_FROM = 4 << 20
"""Members with at least this many bytes of data (or more than ``chunk_bytes``) are
written from their array's memory, in pieces, each its own request; smaller ones join a
run with their neighbours (see ``GATHERED_FROM`` for what a run copies). Blobs of about
1 MiB thus reach a disk in runs of several MiB, one call each, instead of three calls
each (unaligned head, direct body, unaligned tail): the 1 GiB benchmark mix, 200 such
blobs among others, saved 14% faster to ext4 that way, and faster again since they go
through the page cache from their own memory (docs/design.md, "Layout")."""
GATHERED_FROM = 256 << 10
"""In a run, a member's data of at least this many bytes is not copied into the run's
buffer: the run is written as the buffer's slices with the arrays' own memory between
them (``pwritev`` gathers them into the page cache, an upload keeps the views), where a
copy took the GIL for each byte. The write-back of what goes through the page cache
starts as it is written (:mod:`ckptstore.paths._local_path`). The 1 GiB benchmark
mix, whose 200 blobs of about 1 MiB go this way, saves 6% faster to ext4 (0.438
against 0.466 s, medians of 9 alternating in one process); to tmpfs, which copies
under the file's lock either way, no faster."""


ARCHIVE_BYTES = 256 << 20
"""A node checkpoint's large blobs (``DIRECT_FROM`` and up) are shared among one archive
per this many bytes of them..."""
SMALL_RUN_BYTES = PIECED_FROM
"""Small blobs placed among archives go in runs of consecutive blobs of this size."""
MAX_ARCHIVES = 4
"""...and at most this many archives. tmpfs lets one writer at a time into a file (it
holds the file's lock through each write): two files written in parallel take half the
time one does, which a save of hundreds of MiB to ``/dev/shm`` gains. This VM's disk
gains too (the 1 GiB benchmark mix: 0.48-0.51 s in three archives against 0.55-0.59 in
one; 128 or 64 MiB per archive, up to 8, measured no better); object stores are
indifferent. Small blobs all go into the first archive."""


def archive_shares(
    sizes: Mapping[str, int], archive_bytes: int | None = None, max_archives: int | None = None
) -> list[list[str]]:
    """Which blobs (given their sizes in bytes, in order) go into which archive: the
    first takes every small blob, then each large blob, largest first, goes to the
    archive holding the fewest bytes. Each share keeps the blobs' order. One archive
    per ``archive_bytes`` of large blobs, at most ``max_archives`` (a storage's choice,
    :attr:`ckptstore.plugin.PathType.archive_bytes`; ``None``: :data:`ARCHIVE_BYTES`,
    :data:`MAX_ARCHIVES`). Small blobs that hold more than an archive's fair share of
    the bytes (shards of many tensors of about 1 MiB: DCP on 2 ranks) are placed too,
    in runs of consecutive blobs of :data:`SMALL_RUN_BYTES`, so that no archive holds
    them all.

    Example::

        >>> archive_shares({"a": 10, "b": 20})
        [['a', 'b']]
        >>> big = ARCHIVE_BYTES
        >>> archive_shares({"tiny": 4, "w1": big, "w2": big, "w3": big // 2})
        [['tiny', 'w2'], ['w1', 'w3']]
        >>> archive_shares({"tiny": 4, "w1": 48 << 20, "w2": 48 << 20}, 16 << 20, 16)
        [['tiny'], ['w1'], ['w2']]
        >>> halves = {f"h{i}": 512 << 10 for i in range(64)}  # 32 MiB of small blobs
        >>> shares = archive_shares({**halves, "w1": 24 << 20, "w2": 24 << 20}, 16 << 20, 4)
        >>> [len(share) for share in shares]  # 8 runs of 4 MiB beside w1, w2: 28, 28, 24 MiB
        [9, 9, 48]
    """
    large = [(nbytes, [name]) for name, nbytes in sizes.items() if nbytes >= DIRECT_FROM]
    archive_bytes = ARCHIVE_BYTES if archive_bytes is None else archive_bytes
    max_archives = MAX_ARCHIVES if max_archives is None else max_archives
    count = min(max_archives, sum(nbytes for nbytes, _ in large) // archive_bytes)
    if count <= 1:
        return [list(sizes)]
    small = [(name, nbytes) for name, nbytes in sizes.items() if nbytes < DIRECT_FROM]
    small_bytes = sum(nbytes for _, nbytes in small)
    loads = [0] * count
    if small_bytes * count > sum(sizes.values()):  # more than a fair share: placed too
        large += _runs(small, SMALL_RUN_BYTES)
    else:
        loads[0] = small_bytes
    where: dict[str, int] = {}
    for nbytes, names in sorted(large, key=lambda pair: -pair[0]):
        number = loads.index(min(loads))
        where.update(dict.fromkeys(names, number))
        loads[number] += nbytes
    shares: list[list[str]] = [[] for _ in range(count)]
    for name in sizes:
        shares[where.get(name, 0)].append(name)
    return [share for share in shares if share]


def _runs(blobs: Sequence[tuple[str, int]], most: int) -> list[tuple[int, list[str]]]:
    """``blobs`` (name, bytes) in runs of consecutive blobs of about ``most`` bytes."""
    runs: list[tuple[int, list[str]]] = []
    names: list[str] = []
    nbytes = 0
    for name, size in blobs:
        names.append(name)
        nbytes += size
        if nbytes >= most:
            runs.append((nbytes, names))
            names, nbytes = [], 0
    if names:
        runs.append((nbytes, names))
    return runs


def interleaved(streams: Sequence[Iterator[WriteRequest]], late: int = 0) -> Iterator[WriteRequest]:
    """The requests of every stream, the stream with the fewest bytes yielded so far
    first (ties: in the order given; one stream: as it comes). The last stream starts
    as if it had yielded ``late`` bytes already.

    Example::

        >>> def stream(key, count):
        ...     return iter([WriteRequest(key, [b"1234"], 4)] * count)
        >>> [r.key for r in interleaved([stream("a", 3), stream("b", 3), stream("c", 3)], late=8)]
        ['a', 'b', 'a', 'b', 'a', 'b', 'c', 'c', 'c']
    """
    if len(streams) == 1:
        yield from streams[0]
        return
    queue = [(0, number) for number in range(len(streams))]
    queue[-1] = (late, len(streams) - 1)
    heapq.heapify(queue)
    while queue:
        sent, number = heapq.heappop(queue)
        request = next(streams[number], None)
        if request is not None:
            yield request
            heapq.heappush(queue, (sent + request.nbytes, number))


def write_groups(spans: Sequence[int], pieced: Container[int], most: int) -> Iterator[list[int]]:
    """The members of a file (their indexes; ``spans``: each one's bytes, in file order)
    grouped into writes: a member in ``pieced`` alone (it is written in its own pieces),
    the others in runs of neighbours written with one call each, of at most ``most``
    bytes (unless one member) and :data:`GROUP_MEMBERS` members. A run never spans a
    member in ``pieced``: it is a contiguous range of the file.

    Example::

        >>> list(write_groups([10, 10, 10, 50, 10], pieced={3}, most=25))
        [[0, 1], [2], [3], [4]]
    """
    run: list[int] = []
    run_bytes = 0
    for index, span in enumerate(spans):
        if index in pieced:
            if run:
                yield run
                run, run_bytes = [], 0
            yield [index]
            continue
        if run and (run_bytes + span > most or len(run) >= GROUP_MEMBERS):
            yield run
            run, run_bytes = [], 0
        run.append(index)
        run_bytes += span
    if run:
        yield run


def aligned_pieces(array: Array, piece_bytes: int, base: int) -> list[ArrayChunk]:
    """The pieces ``array``'s bytes are written in, starting at file offset
    ``base``. A C-contiguous array is cut into byte ranges of about ``piece_bytes``
    whose inner cuts fall on multiples of ``DIRECT_ALIGN`` of the file, and so of
    memory (the layout makes the two congruent): every piece but the first and the last
    then goes ``O_DIRECT`` whole, where cuts every ``piece_bytes`` from the data's start
    left the page at each cut to two small writes through the page cache, one by each
    piece's writer. Any other array is cut into grid chunks (each copied when written).

    Example::

        >>> array = np.zeros(10 << 20, np.uint8)
        >>> [(piece.start, piece.nbytes) for piece in aligned_pieces(array, 4 << 20, 100)]
        [(0, 4194204), (4194204, 4194304), (8388508, 2097252)]
    """
    if not array.flags.c_contiguous or piece_bytes < DIRECT_FROM:
        shape = grid_chunk_shape(array.shape, array.dtype.itemsize, piece_bytes)
        return list(array_chunks(array.shape, array.dtype.itemsize, shape))
    size = array.nbytes
    inner = range(1, -(-size // piece_bytes))  # as many pieces as cuts every piece_bytes
    cuts = [0, *((base + k * piece_bytes) // DIRECT_ALIGN * DIRECT_ALIGN - base for k in inner)]
    ends = [*cuts[1:], size]
    return [
        ArrayChunk((number,), start, end - start, end - start)
        for number, (start, end) in enumerate(zip(cuts, ends, strict=True))
    ]
