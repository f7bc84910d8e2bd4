"""A node checkpoint's stored objects held in memory: what a peer replica is made of,
and the read-only storage a restore reads it through.

:func:`capture_node` copies a committed node checkpoint into memory through the commit
protocol (:func:`~ckptstore.protocol.copy_node`: every chunk checked as it is read, the
manifest byte for byte, the keys the protocol chose). :class:`ReplicaPath` serves those
objects back, and serves every other document (the commit records) from the root it
came from, so :func:`~ckptstore.protocol.open_node` and
:func:`~ckptstore.protocol.read_blobs` check the copy exactly as they check the root:
the manifest's CRC-32C against the root's commit record, every chunk against the
manifest. A key the copy lacks is missing: it is never read from the root. A copy
received for one restore lends its bytes (:meth:`ReplicaPath.lend`): a load of every
blob keeps each blob whose chunks a piece holds one after another (:func:`replica_pieces`
puts each large blob's chunks in a piece of their own) as a view of them, checked, not
copied.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> from ckptstore.protocol import open_node
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.arange(4.0)
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(2))
    >>> replica = capture_node(manager.location, "trainer_0", 2)
    >>> storage = ReplicaPath(replica, manager.location.storage)
    >>> sorted(open_node(storage, "trainer_0", 2).blobs)
    ['w']
"""

from __future__ import annotations

import bisect
import io
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import pairwise
from typing import IO, ClassVar

import numpy as np

from ckptstore._types import Buffer
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError, StorageError
from ckptstore.io import resolve_key
from ckptstore.plugin import PathType
from ckptstore.protocol import CheckpointLocation, copy_node, open_node, read_commit
from ckptstore.records import NodeManifest, node_commit_key

__all__ = [
    "ArrivingPiece",
    "NodeReplica",
    "ReplicaLayout",
    "ReplicaPath",
    "ReplicaPiece",
    "capture_node",
    "replica_pieces",
]


Span = tuple[int, int]
"""``(offset, nbytes)``: a range of an object's bytes."""

Run = tuple[Span, ...]
"""The spans of one blob's chunks in one object, in order: its bytes, once the bytes
between them (a format's headers) are left out."""


@dataclass(frozen=True)
class NodeReplica:
    """A copy of one committed node checkpoint: its stored objects by key, each as
    consecutive ``uint8`` pieces (so Dask sends them without a pickled copy), taken from
    ``root``. ``runs``: for each object, its large blobs (:func:`blob_runs`), which a
    peer keeps in pieces of their own."""

    root: str
    node: str
    epoch: int
    files: dict[str, tuple[np.ndarray, ...]]
    runs: Mapping[str, tuple[Run, ...]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(piece.nbytes for pieces in self.files.values() for piece in pieces)

    def pieces(self, key: str, limit: int) -> tuple[np.ndarray, ...]:
        """Object ``key`` in pieces of at most ``limit`` bytes: views where the pieces
        held allow."""
        size = sum(piece.nbytes for piece in self.files[key])
        return carve(self.files[key], [*range(limit, size, limit), size])

    def __reduce__(self) -> tuple[object, ...]:
        # a small array pickled first: Dask's TCP comm reads the first array of a
        # message into the buffer of the message's header, at any address; each later
        # one lands alone in an aligned buffer. No piece is larger than the comm's shard
        # size: a larger one would arrive in shards, each in a buffer of its own, that
        # Dask joins by copying them all.
        limit = frame_limit()
        files = {key: self.pieces(key, limit) for key in self.files}
        return (_rebuilt, (_LEAD, self.root, self.node, self.epoch, files, dict(self.runs)))


_LEAD = np.zeros(8, np.uint8)


def _rebuilt(
    lead: np.ndarray,
    root: str,
    node: str,
    epoch: int,
    files: dict[str, tuple[np.ndarray, ...]],
    runs: dict[str, tuple[Run, ...]],
) -> NodeReplica:
    return NodeReplica(root, node, epoch, files, runs)


def frame_limit() -> int:
    """The largest buffer Dask's TCP comm sends as one frame in this process
    (``distributed.comm.shard`` when the comm was imported)."""
    from distributed.comm.tcp import TCP

    return max(1, int(TCP.max_shard_size))


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
        {'data/a.zip': (((100, 8388608), (8388758, 8388608)),)}
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
    """The consecutive bytes of ``pieces``, cut anew to end at ``ends``: each a view
    where it lies in one of ``pieces``, else joined into memory of its own.

    Example::

        >>> [p.tolist() for p in carve([np.arange(3, dtype=np.uint8)] * 2, [2, 4, 6])]
        [[0, 1], [2, 0], [1, 2]]
    """
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + piece.nbytes)
    carved: list[np.ndarray] = []
    start = 0
    for end in ends:
        index = min(max(bisect.bisect_right(starts, start) - 1, 0), max(len(pieces) - 1, 0))
        if pieces and end <= starts[index + 1]:
            carved.append(pieces[index][start - starts[index] : end - starts[index]])
        else:
            joined = np.empty(end - start, np.uint8)
            for piece, first in zip(pieces, starts, strict=False):
                low, high = max(start, first), min(end, first + piece.nbytes)
                if low < high:
                    joined[low - start : high - start] = piece[low - first : high - first]
            carved.append(joined)
        start = end
    return tuple(carved)


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
    parts = [part for start, n in spans for part in _spans_of(pieces, start, start + n)]
    joined = _consecutive(parts)
    if joined is not None:
        return joined
    return np.concatenate(parts) if parts else np.empty(0, np.uint8)


def _spans_of(pieces: Sequence[Piece], offset: int, end: int) -> Iterable[np.ndarray]:
    """The views of the consecutive ``pieces`` that hold their bytes ``offset:end``,
    in order (waiting for those still on their way)."""
    start = 0
    for piece in pieces:
        stop = start + piece.nbytes
        if offset < stop and start < end:
            yield _data(piece)[max(offset - start, 0) : min(end, stop) - start]
        start = stop


def _owner(view: np.ndarray) -> np.ndarray:
    """The array whose memory ``view`` is a view of (following ``base`` to the last
    array)."""
    while isinstance(view.base, np.ndarray):
        view = view.base
    return view


def _consecutive(views: Sequence[np.ndarray]) -> np.ndarray | None:
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


def cut_into_segments(
    size: int, runs: Sequence[Run], limit: int
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """How an object of ``size`` bytes with ``runs`` travels: each run's spans in a piece
    of its own, the other bytes in pieces of at most ``limit`` bytes, in the order the
    object holds them. Returns, per piece, the index of its run (``-1``: other bytes),
    and the object's bytes in order as ``(piece, start, stop)``.

    Example::

        >>> kinds, segments = cut_into_segments(10, [((2, 2), (5, 2))], 4)
        >>> kinds
        [-1, 0, -1]
        >>> segments
        [(0, 0, 2), (1, 0, 2), (0, 2, 3), (1, 2, 4), (0, 3, 4), (2, 0, 2)]
    """
    labelled = sorted((start, n, run) for run, spans in enumerate(runs) for start, n in spans)
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
        return (_piece, (_LEAD, self.data))  # the lead: see NodeReplica.__reduce__


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

    def objects(self, pieces: Sequence[ArrivingPiece]) -> dict[str, tuple[Piece, ...]]:
        """The objects made of ``pieces`` (one per piece, in order), as they arrive."""
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


class ArrivingPiece:
    """A piece of a replica on its way from a peer, or its bytes ``start:stop`` (a part
    of an object): its size is known at once, its bytes are waited for when a read
    first needs them (for at most ``timeout`` s, and no longer once ``lost()`` says the
    peer holding it left). A piece that never arrives is a missing object; one of
    another size, damage."""

    POLL = 0.5
    """Seconds between two looks at ``lost()`` while the piece is awaited."""

    def __init__(
        self,
        url: str,
        key: str,
        nbytes: int,
        arrival: Future[object],
        timeout: float,
        lost: Callable[[], bool] = lambda: False,
        window: tuple[int, int] | None = None,
    ) -> None:
        self.url, self.key, self.size = url, key, nbytes
        self.start, self.stop = (0, nbytes) if window is None else window
        self._arrival, self._timeout, self._lost = arrival, timeout, lost

    @property
    def nbytes(self) -> int:
        return self.stop - self.start

    def window(self, start: int, stop: int) -> ArrivingPiece:
        """The bytes ``start:stop`` of this piece, arriving with it."""
        return ArrivingPiece(
            self.url, self.key, self.size, self._arrival, self._timeout, self._lost, (start, stop)
        )

    def _received(self) -> object:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                return self._arrival.result(
                    timeout=max(0.0, min(self.POLL, deadline - time.monotonic()))
                )
            except TimeoutError:
                if self._lost():
                    raise ConnectionError("the peer holding it left") from None
                if time.monotonic() >= deadline:
                    raise

    def data(self) -> np.ndarray:
        try:
            piece = self._received()
        except Exception as error:  # the peer left, or the fetch timed out
            raise ObjectNotFoundError(self.url, self.key, "read", error) from error
        data = piece.data if isinstance(piece, ReplicaPiece) else None
        if (
            not isinstance(data, np.ndarray)
            or data.dtype != np.uint8
            or data.ndim != 1
            or data.nbytes != self.size
        ):
            raise CorruptCheckpointError(
                f"a piece of the peer replica is not the {self.size} bytes its layout says",
                url=self.url,
                file=self.key,
            )
        return data[self.start : self.stop]


Piece = np.ndarray | ArrivingPiece


def _data(piece: Piece) -> np.ndarray:
    return piece.data() if isinstance(piece, ArrivingPiece) else piece


class _MemoryObjects(PathType):
    """Objects in a dict, each as consecutive pieces, written whole: what
    :func:`copy_node` fills."""

    name: ClassVar[str] = "ckptstore-peer-replica"
    batches_small_requests: ClassVar[bool] = True

    def __init__(self, url: str, files: dict[str, tuple[Piece, ...]] | None = None) -> None:
        super().__init__(url)
        self.files: dict[str, tuple[Piece, ...]] = {} if files is None else files

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        pieces = [np.frombuffer(part, np.uint8) for part in parts]
        data = np.empty(sum(piece.nbytes for piece in pieces), np.uint8)
        position = 0
        for piece in pieces:
            data[position : position + piece.nbytes] = piece
            position += piece.nbytes
        self.files[key] = (data,)

    def _object(self, key: str) -> tuple[Piece, ...]:
        pieces = self.files.get(key)
        if pieces is None:
            raise ObjectNotFoundError(
                self.display_url, key, "read", FileNotFoundError("not in the peer replica")
            )
        return pieces

    def _spans(self, key: str, offset: int, end: int) -> Iterable[np.ndarray]:
        """The views of ``key``'s pieces that hold its bytes ``offset:end``, in order
        (waiting for those still on their way)."""
        return _spans_of(self._object(key), offset, end)

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        size = self.size(key)
        for target in targets:
            view = np.asarray(target.cast("B"))
            end = offset + view.nbytes
            if end > size:
                raise CorruptCheckpointError(
                    f"the object is {size} bytes, shorter than the {end} read",
                    url=self.display_url,
                    file=key,
                )
            position = 0
            for span in self._spans(key, offset, end):
                view[position : position + span.nbytes] = span
                position += span.nbytes
            offset = end

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        end = self.size(key) if length is None else min(self.size(key), offset + length)
        return b"".join(span.tobytes() for span in self._spans(key, offset, end))

    def exists(self, key: str) -> bool:
        return key in self.files

    def size(self, key: str) -> int:
        return sum(int(piece.nbytes) for piece in self._object(key))

    def delete(self, keys: Iterable[str]) -> None:
        for key in list(keys):
            self.files.pop(key, None)

    def delete_tree(self, prefix: str) -> None:
        self.delete([key for key in self.files if key.startswith(f"{prefix}/")])

    def list_keys(self, prefix: str = "") -> list[str]:
        return sorted(key for key in self.files if key.startswith(prefix))

    def open_write(self, key: str) -> IO[bytes]:
        return _ClosingWriter(self, key)


class _ClosingWriter(io.BytesIO):
    """A stream whose bytes become the object ``key`` when it is closed."""

    def __init__(self, storage: _MemoryObjects, key: str) -> None:
        super().__init__()
        self._storage, self._key = storage, key

    def close(self) -> None:
        if not self.closed:
            self._storage.write_parts(self._key, [self.getbuffer()])
        super().close()


def capture_node(location: CheckpointLocation, node: str, epoch: int) -> NodeReplica:
    """``node``'s committed checkpoint of ``epoch`` under ``location``, read into memory
    (each chunk checked against the manifest as it is read)."""
    memory = _MemoryObjects(f"peer-replica:{node}")
    stats = copy_node(source=location, dest=memory, node=node, epoch=epoch, verify=False)
    assert stats.commit is not None
    copied = f"{stats.commit.data_key}/"
    # the copy is a new attempt: keep its files under the attempt the root's record
    # names, which is what a restore reading that record looks for
    record = read_commit(location, epoch, [node])
    if record is None or node not in record.nodes:
        raise CorruptCheckpointError(
            "the node's commit record went away while its peer replica was made",
            url=location.storage.display_url,
            file=node_commit_key(epoch, node),
        )
    committed = f"{record.nodes[node].data_key}/"
    files = {
        committed + key[len(copied) :] if key.startswith(copied) else key: tuple(map(_data, data))
        for key, data in memory.files.items()
    }
    runs = blob_runs(open_node(location, node, epoch))
    return NodeReplica(location.storage.display_url, node, epoch, files, runs)


class ReplicaPath(_MemoryObjects):
    """A peer replica's objects, read-only; every other document (the commit records)
    comes from ``root``, each read once. Nothing else is read from ``root``.

    ``lends``: the objects are this process's own copy, received for this restore only,
    so a load makes each blob a view of them (:meth:`lend`) instead of copying it."""

    always_verified: ClassVar[bool] = True

    def __init__(self, replica: NodeReplica, root: PathType, *, lends: bool = False) -> None:
        super().__init__(f"peer replica of {replica.node}.{replica.epoch} from {root.display_url}")
        self.files = dict(replica.files)
        self.lends = lends
        self._root = root
        self._documents: dict[str, bytes | None] = {}
        self._lent: dict[str, list[tuple[int, int]]] = {}

    def lend(self, key: str, spans: Sequence[Span]) -> memoryview | None:
        if not self.lends or key not in self.files or not spans:
            return None
        ends = [(offset, offset + nbytes) for offset, nbytes in spans]
        if any(start < 0 or start >= end for start, end in ends):
            return None
        views: list[np.ndarray] = []
        for start, end in ends:
            found = list(self._spans(key, start, end))
            if len(found) != 1 or found[0].nbytes != end - start:
                return None  # beyond the object, or across two parts: copied
            views.append(found[0])
        joined = _consecutive(views)
        if joined is None:
            return None  # not one run of one received piece: copied
        ranges = self._lent.setdefault(key, [])
        if any(low < end and start < high for start, end in ends for low, high in ranges):
            return None  # lent before: two blobs never share memory
        ranges.extend(ends)
        return joined.data

    def get_document(self, key: str) -> bytes | None:
        if key in self.files:
            return self.read_bytes(key)
        if key not in self._documents:
            self._documents[key] = self._root.get_document(key)
        return self._documents[key]

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        raise StorageError(
            self.display_url, key, "write", PermissionError("a peer replica is read-only")
        )

    def delete(self, keys: Iterable[str]) -> None:
        raise StorageError(
            self.display_url, None, "delete", PermissionError("a peer replica is read-only")
        )
