"""How a peer replica's bytes travel and are kept: cut into pieces, each large blob's
chunks one after another in a piece of its own, so a restore keeps that piece as the
blob instead of copying it (:meth:`ReplicaPath.lend
<ckptstore.dask_session._replica_storage.ReplicaPath.lend>`).

:func:`blob_runs` finds those blobs in a manifest; :func:`replica_pieces` cuts a
captured replica into :class:`ReplicaPiece` s and a :class:`ReplicaLayout` saying how
each object is made of them; :func:`consecutive` tells whether views are one run of
one array's memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

import numpy as np

from ckptstore.io import resolve_key
from ckptstore.records import NodeManifest

if TYPE_CHECKING:
    from ckptstore.dask_session._replica_storage import NodeReplica

__all__ = [
    "LEAD",
    "LENT_FROM",
    "LENT_UP_TO",
    "ReplicaLayout",
    "ReplicaPiece",
    "Run",
    "Segment",
    "Span",
    "blob_runs",
    "carve",
    "consecutive",
    "cut_into_segments",
    "gathered",
    "replica_pieces",
    "spans_of",
]


class _Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


class _Windowed(Protocol):
    def window(self, start: int, stop: int) -> Self: ...


P = TypeVar("P", bound=_Sized)
W = TypeVar("W", bound="_Windowed")

Span = tuple[int, int]
"""``(offset, nbytes)``: a range of an object's bytes."""

Run = tuple[Span, ...]
"""The spans of one blob's chunks in one object, in order: its bytes, once the bytes
between them (a format's headers) are left out."""


LEAD = np.zeros(8, np.uint8)
"""Pickled first in a message of pieces: Dask's TCP comm reads the first array of a
message into the buffer of the message's header, at any address; each later one lands
alone in an aligned buffer."""


LENT_FROM = 8 << 20
"""A blob of this many bytes or more, stored unpadded in one object, travels in a piece
of its own, which a restore keeps as the blob; smaller blobs are copied, cheaper than
one message more each (Dask moved 1 GiB as well in pieces of 8 MiB as in pieces of
64 MiB)."""

LENT_UP_TO = 512 << 20
"""The largest blob that travels in one piece: larger ones are cut, and copied."""


def blob_runs(manifest: NodeManifest) -> dict[str, tuple[Run, ...]]:
    """For each stored object of ``manifest``'s node, the blobs stored there unpadded,
    in order, between :data:`LENT_FROM` and :data:`LENT_UP_TO` bytes (those a restore can
    keep as they land): each as the spans of its chunks, sorted by their first byte.
    The bytes between a blob's chunks (zarr's ZIP headers) are not part of it.

    Example::

        >>> from ckptstore.records import BlobRecord, ChunkRecord
        >>> chunks = [ChunkRecord("a.zip", 100 + i * (LENT_FROM + 50), LENT_FROM, LENT_FROM, 0)
        ...           for i in range(2)]
        >>> manifest = NodeManifest("n", 1, "data", {"w": BlobRecord("w", "uint8",
        ...     (2 * LENT_FROM,), chunks=tuple(chunks))})
        >>> blob_runs(manifest)
        {'n.1/a.zip': (((100, 8388608), (8388758, 8388608)),)}
    """
    runs: dict[str, list[Run]] = {}
    for record in manifest.blobs.values():
        chunks = record.chunks
        if not chunks or any(
            chunk.stored != chunk.size or chunk.key != chunks[0].key for chunk in chunks
        ):
            continue
        spans = tuple((chunk.offset, chunk.size) for chunk in chunks)
        ordered = all(
            start + size <= following for (start, size), (following, _) in pairwise(spans)
        )
        if ordered and spans[0][0] >= 0 and LENT_FROM <= sum(n for _, n in spans) <= LENT_UP_TO:
            runs.setdefault(resolve_key(manifest.data_key, chunks[0].key), []).append(spans)
    return {key: tuple(sorted(found)) for key, found in runs.items()}


Segment = tuple[int, int, int]
"""``(piece, start, stop)``: the bytes ``start:stop`` of a replica's piece number
``piece``, a part of one of its objects."""


def carve(pieces: Sequence[np.ndarray], ends: Sequence[int]) -> tuple[np.ndarray, ...]:
    """The consecutive bytes of ``pieces``, cut anew to end at ``ends``
    (:func:`gathered`: a view where a cut lies in one piece, else joined).

    Example::

        >>> [p.tolist() for p in carve([np.arange(3, dtype=np.uint8)] * 2, [2, 4, 6])]
        [[0, 1], [2, 0], [1, 2]]
    """
    return tuple(gathered(pieces, [(start, end - start)]) for start, end in pairwise([0, *ends]))


def gathered(pieces: Sequence[np.ndarray], spans: Sequence[Span]) -> np.ndarray:
    """The bytes of ``spans`` of the object made of ``pieces``, one after another: a
    view where they are consecutive in one of ``pieces``, else joined.

    Example::

        >>> data = np.arange(8, dtype=np.uint8)
        >>> gathered([data], [(1, 2), (5, 2)]).tolist()
        [1, 2, 5, 6]
        >>> np.shares_memory(gathered([data], [(1, 2), (3, 2)]), data)
        True
    """
    parts = [part for start, n in spans for part in spans_of(pieces, start, start + n, _itself)]
    if len(parts) == 1:
        return parts[0]
    joined = consecutive(parts)
    if joined is not None:
        return joined
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)


def spans_of(
    pieces: Sequence[P], offset: int, end: int, data: Callable[[P], np.ndarray]
) -> Iterator[np.ndarray]:
    """The views of the consecutive ``pieces`` (their bytes: ``data(piece)``, asked
    only of the pieces needed) that hold their bytes ``offset:end``, in order."""
    start = 0
    for piece in pieces:
        stop = start + piece.nbytes
        if offset < stop and start < end:
            yield data(piece)[max(offset - start, 0) : min(end, stop) - start]
        start = stop


def _itself(piece: np.ndarray) -> np.ndarray:
    return piece


def _owner(view: np.ndarray) -> np.ndarray:
    """The array whose memory ``view`` is a view of (following ``base`` to the last
    array)."""
    while isinstance(view.base, np.ndarray):
        view = view.base
    return view


def consecutive(views: Sequence[np.ndarray]) -> np.ndarray | None:
    """``views`` as one view, if they are 1-d ``uint8`` views of one array's memory,
    each starting where the one before ends; else ``None``."""
    if not views or any(view.ndim != 1 or view.dtype != np.uint8 for view in views):
        return None
    owner = _owner(views[0])
    if owner.ndim != 1 or owner.dtype != np.uint8 or not owner.flags.c_contiguous:
        return None
    base = owner.ctypes.data
    start = position = views[0].ctypes.data
    for view in views:
        if view.ctypes.data != position or _owner(view) is not owner:
            return None
        if not view.flags.c_contiguous:
            return None
        position += view.nbytes
    return owner[start - base : position - base]


def _apart(runs: Sequence[Run], size: int) -> set[int]:
    """The indices of ``runs`` whose spans lie inside ``size`` bytes, each nonempty, and
    share no byte with another run's."""
    inside = [
        run
        for run, spans in enumerate(runs)
        if spans and all(start >= 0 and n > 0 and start + n <= size for start, n in spans)
    ]
    spans = sorted((start, start + n, run) for run in inside for start, n in runs[run])
    clashing: set[int] = set()
    reach, owner = -1, -1  # the furthest end so far, and its run
    for start, end, run in spans:
        if start < reach:
            clashing.update((run, owner))
        if end > reach:
            reach, owner = end, run
    return set(inside) - clashing


def cut_into_segments(
    size: int, runs: Sequence[Run], limit: int
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """How an object of ``size`` bytes with ``runs`` travels: each run's spans in a piece
    of its own, the other bytes in pieces of at most ``limit`` bytes, in the order the
    object holds them. Returns, per piece, the index of its run in ``runs`` (``-1``:
    other bytes), and the object's bytes in order as ``(piece, start, stop)``. Runs
    reaching past the object or sharing a byte with another (a forged manifest's) are
    other bytes: every byte travels once.

    Example::

        >>> kinds, segments = cut_into_segments(10, [((2, 2), (5, 2))], 4)
        >>> kinds
        [-1, 0, -1]
        >>> segments
        [(0, 0, 2), (1, 0, 2), (0, 2, 3), (1, 2, 4), (0, 3, 4), (2, 0, 2)]
        >>> cut_into_segments(10, [((2, 4),), ((4, 4),)], 10)  # overlapping: other bytes
        ([-1], [(0, 0, 10)])
    """
    kept = _apart(runs, size)
    labelled = sorted(
        (start, n, run) for run, spans in enumerate(runs) if run in kept for start, n in spans
    )
    kinds: list[int] = []
    segments: list[tuple[int, int, int]] = []
    filled: dict[int, int] = {}  # piece -> bytes placed in it so far
    run_piece: dict[int, int] = {}
    loose = -1  # the piece taking other bytes now

    def place_loose(start: int, stop: int) -> None:
        nonlocal loose
        while start < stop:
            if loose < 0 or filled[loose] >= limit:
                loose = len(kinds)
                kinds.append(-1)
                filled[loose] = 0
            take = min(stop - start, limit - filled[loose])
            segments.append((loose, filled[loose], filled[loose] + take))
            filled[loose] += take
            start += take

    position = 0
    for offset, nbytes, run in labelled:
        place_loose(position, offset)
        if run not in run_piece:
            run_piece[run] = len(kinds)
            kinds.append(run)
            filled[run_piece[run]] = 0
        piece = run_piece[run]
        segments.append((piece, filled[piece], filled[piece] + nbytes))
        filled[piece] += nbytes
        position = offset + nbytes
    place_loose(position, size)
    return kinds, segments


@dataclass(frozen=True)
class ReplicaPiece:
    """One piece of a replica as a peer keeps it: a Dask key of its own, so a restore
    receives the pieces one message at a time and reads each one on arrival."""

    data: np.ndarray

    def __reduce__(self) -> tuple[object, ...]:
        return (_piece, (LEAD, self.data))  # the lead: see NodeReplica.__reduce__


def _piece(lead: np.ndarray, data: np.ndarray) -> ReplicaPiece:
    return ReplicaPiece(data)


@dataclass(frozen=True)
class ReplicaLayout:
    """Where a replica's pieces go: the size of each piece (in order: the peer's keys),
    and each object's bytes in order as segments of them."""

    root: str
    node: str
    epoch: int
    pieces: tuple[int, ...]
    files: dict[str, tuple[Segment, ...]]

    @property
    def count(self) -> int:
        return len(self.pieces)

    def owners(self) -> dict[int, str]:
        """The object each piece is part of."""
        return {piece: key for key, segments in self.files.items() for piece, _, _ in segments}

    def objects(self, pieces: Sequence[W]) -> dict[str, tuple[W, ...]]:
        """The objects made of ``pieces`` (one per piece, in order, each able to give
        a window of its bytes: arriving ones included)."""
        return {
            key: tuple(pieces[piece].window(start, stop) for piece, start, stop in segments)
            for key, segments in self.files.items()
        }

    def valid(self) -> bool:
        """Whether every segment lies inside its piece and every piece is used."""
        used = [0] * len(self.pieces)
        for segments in self.files.values():
            for piece, start, stop in segments:
                if not (0 <= piece < len(self.pieces) and 0 <= start <= stop <= self.pieces[piece]):
                    return False
                used[piece] += stop - start
        return used == list(self.pieces)


def replica_pieces(replica: NodeReplica, limit: int) -> tuple[ReplicaLayout, list[ReplicaPiece]]:
    """``replica`` as pieces and their layout: each large blob's bytes in a piece of its
    own (:func:`blob_runs`: a restore keeps the piece as the blob), the other bytes in
    pieces of at most ``limit`` bytes; the smallest objects first, so a restore has the
    manifest at once."""
    order = sorted(replica.files, key=lambda key: (sum(p.nbytes for p in replica.files[key]), key))
    sizes: list[int] = []
    pieces: list[ReplicaPiece] = []
    files: dict[str, tuple[Segment, ...]] = {}
    for key in order:
        held = replica.files[key]
        runs = replica.runs.get(key, ())
        kinds, segments = cut_into_segments(sum(p.nbytes for p in held), runs, limit)
        first = len(sizes)
        parts: dict[int, list[Span]] = {}
        position = 0
        for piece, start, stop in segments:
            parts.setdefault(piece, []).append((position, stop - start))
            position += stop - start
        for piece in range(len(kinds)):
            data = gathered(held, parts.get(piece, []))
            sizes.append(data.nbytes)
            pieces.append(ReplicaPiece(data))
        files[key] = tuple((first + piece, start, stop) for piece, start, stop in segments)
    layout = ReplicaLayout(replica.root, replica.node, replica.epoch, tuple(sizes), files)
    return layout, pieces
