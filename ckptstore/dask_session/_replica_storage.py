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
from typing import IO, ClassVar

import numpy as np

from ckptstore._types import Buffer
from ckptstore.dask_session._piece_transfer import frame_limit
from ckptstore.dask_session._replica_pieces import (
    LEAD,
    ReplicaPiece,
    Run,
    Span,
    blob_runs,
    carve,
    consecutive,
    spans_of,
)
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError, StorageError
from ckptstore.plugin import PathType
from ckptstore.protocol import CheckpointLocation, copy_node, open_node, read_commit
from ckptstore.records import node_commit_key

__all__ = [
    "ArrivingPiece",
    "NodeReplica",
    "ReplicaPath",
    "capture_node",
]


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
        return (_rebuilt, (LEAD, self.root, self.node, self.epoch, files, dict(self.runs)))


def _rebuilt(
    lead: np.ndarray,
    root: str,
    node: str,
    epoch: int,
    files: dict[str, tuple[np.ndarray, ...]],
    runs: dict[str, tuple[Run, ...]],
) -> NodeReplica:
    return NodeReplica(root, node, epoch, files, runs)


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
        return spans_of(self._object(key), offset, end, _data)

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
            # getvalue, not getbuffer: an export of the buffer outlives write_parts
            # whenever something holds its frame (Dask's profiler samples every thread),
            # and the close below then fails (BufferError); the bytes share the buffer
            self._storage.write_parts(self._key, [self.getvalue()])
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
        joined = consecutive(views)
        if joined is None:
            return None  # not one run of one received piece: copied
        ranges = self._lent.setdefault(key, [])  # sorted, apart
        if any(_overlaps(ranges, start, end) for start, end in ends):
            return None  # lent before: two blobs never share memory
        for lent in ends:
            bisect.insort(ranges, lent)
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


def _overlaps(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether ``start:end`` shares a byte with one of ``ranges`` (sorted, apart): only
    its neighbours can (a load of every blob lends thousands of ranges).

    Example::

        >>> [_overlaps([(0, 4), (8, 12)], *span) for span in [(4, 8), (3, 5), (6, 9)]]
        [False, True, True]
    """
    after = bisect.bisect_left(ranges, (start, start))
    return (after > 0 and ranges[after - 1][1] > start) or (
        after < len(ranges) and ranges[after][0] < end
    )
