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
blob keeps each blob stored as one run of bytes as a view of them, checked, not copied.

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


@dataclass(frozen=True)
class NodeReplica:
    """A copy of one committed node checkpoint: its stored objects by key, each as
    consecutive ``uint8`` pieces (so Dask sends them without a pickled copy), taken from
    ``root``. ``runs``: for each object, the byte ranges of its large blobs
    (:func:`blob_runs`), which start pieces of their own."""

    root: str
    node: str
    epoch: int
    files: dict[str, tuple[np.ndarray, ...]]
    runs: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(piece.nbytes for pieces in self.files.values() for piece in pieces)

    def pieces(self, key: str, limit: int) -> tuple[np.ndarray, ...]:
        """Object ``key`` in pieces of at most ``limit`` bytes, a large blob starting
        each of its own (:func:`cut_ends`): views where the pieces held allow."""
        pieces = self.files[key]
        size = sum(piece.nbytes for piece in pieces)
        return carve(pieces, cut_ends(size, self.runs.get(key, ()), limit))

    def __reduce__(self) -> tuple[object, ...]:
        # a small array pickled first: Dask's TCP comm reads the first array of a
        # message into the buffer of the message's header, at any address; each later
        # one lands alone in an aligned buffer, which a restore can keep as its blobs.
        # No piece is larger than the comm's shard size: a larger one would arrive in
        # shards, each in a buffer of its own, that Dask joins by copying them all.
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
    runs: dict[str, tuple[tuple[int, int], ...]],
) -> NodeReplica:
    return NodeReplica(root, node, epoch, files, runs)


def frame_limit() -> int:
    """The largest buffer Dask's TCP comm sends as one frame in this process
    (``distributed.comm.shard`` when the comm was imported)."""
    from distributed.comm.tcp import TCP

    return max(1, int(TCP.max_shard_size))


LENT_FROM = 8 << 20
"""A blob stored as one run of this many bytes or more starts a piece of its own,
which a restore keeps as the blob; smaller blobs are copied, cheaper than one message
more each (Dask moved 1 GiB as well in pieces of 8 MiB as in pieces of 64 MiB)."""


def blob_runs(manifest: NodeManifest) -> dict[str, tuple[tuple[int, int], ...]]:
    """For each stored object of ``manifest``'s node, the byte ranges ``(start, end)``
    of the blobs stored there as one run of unpadded bytes, :data:`LENT_FROM` bytes
    or more (those a restore can keep as they land), sorted."""
    runs: dict[str, list[tuple[int, int]]] = {}
    for record in manifest.blobs.values():
        chunks = record.chunks
        if not chunks or any(chunk.stored != chunk.size for chunk in chunks):
            continue
        key, start = chunks[0].key, chunks[0].offset
        end = start
        for chunk in chunks:
            if chunk.key != key or chunk.offset != end:
                break
            end += chunk.stored
        else:
            if end - start >= LENT_FROM:
                runs.setdefault(resolve_key(manifest.data_key, key), []).append((start, end))
    return {key: tuple(sorted(found)) for key, found in runs.items()}


def cut_ends(size: int, runs: Sequence[tuple[int, int]], limit: int) -> list[int]:
    """Where the pieces of an object of ``size`` bytes end, none longer than ``limit``:
    each of ``runs`` (sorted, apart) starts a piece, and one no longer than ``limit``
    fills it alone.

    Example::

        >>> cut_ends(10, [(1, 3), (5, 9)], 4)
        [1, 3, 5, 9, 10]
        >>> cut_ends(10, [(2, 8)], 4)
        [2, 6, 8, 10]
        >>> cut_ends(0, [], 4)
        [0]
    """
    starts = [start for start, _ in runs]
    run_ends = [end for _, end in runs]
    ends: list[int] = []
    position = 0
    while position < size or not ends:
        reach = min(position + limit, size)
        after = bisect.bisect_right(starts, position)
        within = bisect.bisect_right(run_ends, reach) - 1
        if after < len(starts) and starts[after] < reach:
            ends.append(starts[after])  # a run starts a piece
        elif within >= 0 and position < run_ends[within] < reach:
            ends.append(run_ends[within])
        else:
            ends.append(reach)
        position = ends[-1]
    return ends


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


@dataclass(frozen=True)
class ReplicaPiece:
    """One piece of a replica's object as a peer keeps it: a Dask key of its own, so a
    restore receives the pieces one message at a time and reads each one on arrival."""

    data: np.ndarray

    def __reduce__(self) -> tuple[object, ...]:
        return (_piece, (_LEAD, self.data))  # the lead: see NodeReplica.__reduce__


def _piece(lead: np.ndarray, data: np.ndarray) -> ReplicaPiece:
    return ReplicaPiece(data)


@dataclass(frozen=True)
class ReplicaLayout:
    """Where a replica's pieces go: the size of each piece of each object, in order
    (the pieces of all objects, in this order, are the peer's keys)."""

    root: str
    node: str
    epoch: int
    files: dict[str, tuple[int, ...]]

    @property
    def count(self) -> int:
        return sum(len(sizes) for sizes in self.files.values())


def replica_pieces(replica: NodeReplica, limit: int) -> tuple[ReplicaLayout, list[ReplicaPiece]]:
    """``replica`` as pieces of at most ``limit`` bytes, cut where blobs start or end
    (:meth:`NodeReplica.pieces`), and their layout: the smallest objects first, so a
    restore has the manifest at once."""
    order = sorted(replica.files, key=lambda key: (sum(p.nbytes for p in replica.files[key]), key))
    files = {key: replica.pieces(key, limit) for key in order}
    layout = ReplicaLayout(
        replica.root,
        replica.node,
        replica.epoch,
        {key: tuple(piece.nbytes for piece in pieces) for key, pieces in files.items()},
    )
    return layout, [ReplicaPiece(piece) for pieces in files.values() for piece in pieces]


class ArrivingPiece:
    """A piece of a replica on its way from a peer: its size is known at once, its
    bytes are waited for when a read first needs them (for at most ``timeout`` s, and
    no longer once ``lost()`` says the peer holding it left). A piece that never
    arrives is a missing object; one of another size, damage."""

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
    ) -> None:
        self.url, self.key, self.nbytes = url, key, nbytes
        self._arrival, self._timeout, self._lost = arrival, timeout, lost

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
            or data.nbytes != self.nbytes
        ):
            raise CorruptCheckpointError(
                f"a piece of the peer replica is not the {self.nbytes} bytes its layout says",
                url=self.url,
                file=self.key,
            )
        return data


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
        start = 0
        for piece in self._object(key):
            stop = start + piece.nbytes
            if offset < stop and start < end:
                yield _data(piece)[max(offset - start, 0) : min(end, stop) - start]
            start = stop

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

    def lend(self, key: str, offset: int, nbytes: int) -> memoryview | None:
        if not self.lends or key not in self.files or offset < 0:
            return None
        spans = list(self._spans(key, offset, offset + nbytes))
        if len(spans) != 1 or spans[0].nbytes != nbytes:
            return None  # beyond the object, or across two pieces: copied
        ranges = self._lent.setdefault(key, [])
        if any(offset < end and start < offset + nbytes for start, end in ranges):
            return None  # lent before: two blobs never share memory
        ranges.append((offset, offset + nbytes))
        return spans[0].data

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
