"""A peer replica's storage: a restore from a copy received for it keeps the copy's
bytes as the blobs (no second copy), each chunk still checked against the manifest;
a copy this worker keeps for others, or bytes lent twice, are copied instead."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from ckptstore import CheckpointManager, IOSettings, LocalSession
from ckptstore._types import Buffer
from ckptstore.dask_session._replica_pieces import (
    LENT_FROM,
    ReplicaLayout,
    ReplicaPiece,
    carve,
    replica_pieces,
)
from ckptstore.dask_session._replica_storage import (
    ArrivingPiece,
    NodeReplica,
    ReplicaPath,
    _MemoryObjects,
    capture_node,
)
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError
from ckptstore.protocol import CheckpointLocation, open_node, read_blobs

NODE = "trainer_0"
EPOCH = 2


def saved(tmp_path: Path, db_type: str, **settings: bool) -> CheckpointLocation:
    session = LocalSession()
    ws = session.workspace(NODE)
    ws["w"] = np.arange(1 << 15, dtype=np.float64)
    ws["b"] = np.arange(7, dtype=np.int32)
    ws["s"] = np.float32(3.5)
    manager = CheckpointManager(str(tmp_path / "ckpt"), NODE, db_type, io=IOSettings(**settings))
    session.run(manager.init([NODE]))
    session.run(manager.save(EPOCH))
    return manager.location


def read(location: CheckpointLocation, storage: ReplicaPath) -> dict[str, np.ndarray]:
    manifest = open_node(storage, NODE, EPOCH)
    return read_blobs(storage, manifest, None, location.reader_for(manifest), location.engine())


def shares(array: np.ndarray, replica: NodeReplica) -> bool:
    return any(
        np.shares_memory(array, piece) for pieces in replica.files.values() for piece in pieces
    )


def flip_a_data_byte(replica: NodeReplica) -> None:
    """Flip the middle byte of the replica's largest object (in the blobs' data)."""
    [largest] = max(replica.files.values(), key=lambda pieces: sum(p.nbytes for p in pieces))
    largest[largest.nbytes // 2] ^= 0xFF


@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_a_received_copy_becomes_the_blobs_without_a_second_copy(
    tmp_path: Path, db_type: str
) -> None:
    location = saved(tmp_path, db_type)
    replica = capture_node(location, NODE, EPOCH)
    arrays = read(location, ReplicaPath(replica, location.storage, lends=True))
    np.testing.assert_array_equal(arrays["w"], np.arange(1 << 15, dtype=np.float64))
    np.testing.assert_array_equal(arrays["b"], np.arange(7, dtype=np.int32))
    assert arrays["s"] == np.float32(3.5)
    assert shares(arrays["w"], replica)
    assert arrays["w"].flags.writeable  # training updates it in place


def test_a_copy_kept_for_others_is_never_lent(tmp_path: Path) -> None:
    location = saved(tmp_path, "zarr")
    replica = capture_node(location, NODE, EPOCH)
    arrays = read(location, ReplicaPath(replica, location.storage))
    assert not any(shares(array, replica) for array in arrays.values())


def test_bytes_are_lent_once_a_second_read_copies_them(tmp_path: Path) -> None:
    location = saved(tmp_path, "zarr")
    replica = capture_node(location, NODE, EPOCH)
    storage = ReplicaPath(replica, location.storage, lends=True)
    first, second = read(location, storage), read(location, storage)
    assert shares(first["w"], replica)
    assert not np.shares_memory(first["w"], second["w"])
    np.testing.assert_array_equal(first["w"], second["w"])


def test_read_only_bytes_are_copied(tmp_path: Path) -> None:
    location = saved(tmp_path, "zarr")
    replica = capture_node(location, NODE, EPOCH)
    for pieces in replica.files.values():
        for piece in pieces:
            piece.flags.writeable = False
    arrays = read(location, ReplicaPath(replica, location.storage, lends=True))
    assert not shares(arrays["w"], replica)
    assert arrays["w"].flags.writeable


def test_a_damaged_lent_chunk_is_refused_even_with_verify_off(tmp_path: Path) -> None:
    location = saved(tmp_path, "zarr", verify=False)
    replica = capture_node(location, NODE, EPOCH)
    flip_a_data_byte(replica)
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        read(location, ReplicaPath(replica, location.storage, lends=True))


def test_a_read_of_some_blobs_copies_them(tmp_path: Path) -> None:
    """Lent bytes would keep the whole received copy alive for the few blobs read."""
    location = saved(tmp_path, "zarr")
    replica = capture_node(location, NODE, EPOCH)
    storage = ReplicaPath(replica, location.storage, lends=True)
    manifest = open_node(storage, NODE, EPOCH)
    arrays = read_blobs(storage, manifest, ["w"], location.reader_for(manifest), location.engine())
    assert not shares(arrays["w"], replica)


def test_a_damaged_copied_chunk_is_refused_even_with_verify_off(tmp_path: Path) -> None:
    location = saved(tmp_path, "zarr", verify=False)
    replica = capture_node(location, NODE, EPOCH)
    flip_a_data_byte(replica)
    storage = ReplicaPath(replica, location.storage)  # kept for others: read by copies
    manifest = open_node(storage, NODE, EPOCH)
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        read_blobs(storage, manifest, ["w"], location.reader_for(manifest), location.engine())


def test_a_replica_in_pieces_reads_the_same_bytes_and_lends_within_a_piece(
    tmp_path: Path,
) -> None:
    """What Dask delivers: each object in pieces no larger than the comm's frames."""
    location = saved(tmp_path, "zarr")
    whole = capture_node(location, NODE, EPOCH)
    limit = 100_000  # the 256 KiB blob spans three pieces
    pieces = {key: whole.pieces(key, limit) for key in whole.files}
    assert max(len(value) for value in pieces.values()) > 2
    assert all(piece.nbytes <= limit for value in pieces.values() for piece in value)
    replica = NodeReplica(whole.root, NODE, EPOCH, pieces)
    arrays = read(location, ReplicaPath(replica, location.storage, lends=True))
    np.testing.assert_array_equal(arrays["w"], np.arange(1 << 15, dtype=np.float64))
    assert not shares(arrays["w"], replica)  # across pieces: copied
    np.testing.assert_array_equal(arrays["b"], np.arange(7, dtype=np.int32))
    single = ReplicaPath(
        NodeReplica(
            whole.root, NODE, EPOCH, {"k": carve([np.arange(10, dtype=np.uint8)], [4, 8, 10])}
        ),
        location.storage,
        lends=True,
    )
    assert single.lend("k", [(4, 4)]) is not None  # one piece: lent
    assert single.lend("k", [(2, 4)]) is None  # across two: copied
    assert single.read_bytes("k", 2, 5) == bytes(range(2, 7))


def test_spans_consecutive_in_one_piece_are_lent_as_one_view_around_the_bytes_between(
    tmp_path: Path,
) -> None:
    """A zarr blob's chunks have ZIP headers between them in the object; a peer keeps the
    chunks' bytes together in one piece, the headers in another, and lends the former."""
    headers, run = np.arange(100, 104, dtype=np.uint8), np.arange(6, dtype=np.uint8)
    objects = {"k": (headers[:2], run[:3], headers[2:], run[3:])}
    storage = ReplicaPath(
        NodeReplica("root", NODE, EPOCH, objects), saved(tmp_path, "npz").storage, lends=True
    )
    assert storage.read_bytes("k") == bytes([100, 101, 0, 1, 2, 102, 103, 3, 4, 5])
    assert storage.lend("k", [(2, 2), (7, 1)]) is None  # a gap inside the piece: copied
    lent = storage.lend("k", [(2, 3), (7, 3)])
    assert lent is not None
    assert np.shares_memory(np.asarray(lent), run)
    assert np.asarray(lent).tolist() == list(range(6))
    assert storage.lend("k", [(2, 3), (7, 3)]) is None  # lent once


def received(layout: ReplicaLayout, pieces: list[ReplicaPiece]) -> dict[str, tuple]:
    """The objects a restore reads: ``layout``'s, made of ``pieces`` as they arrived."""
    return layout.objects(
        [arriving(piece, piece.data.nbytes) for piece in pieces]  # each its own buffer
    )


def save_large_blobs(tmp_path: Path, db_type: str, **settings: int) -> tuple[Path, LocalSession]:
    session = LocalSession()
    ws = session.workspace(NODE)
    for name in "abc":
        ws[name] = np.full(LENT_FROM // 8, ord(name), dtype=np.float64)
    ws["small"] = np.arange(100, dtype=np.int64)
    manager = CheckpointManager(str(tmp_path / "ckpt"), NODE, db_type, io=IOSettings(**settings))
    session.run(manager.init([NODE]))
    session.run(manager.save(EPOCH))
    return tmp_path / "ckpt", session


@pytest.mark.parametrize(
    ("db_type", "chunk_bytes"), [("npz", 16 << 20), ("zarr", 16 << 20), ("zarr", 1 << 20)]
)
def test_a_peer_keeps_each_large_blob_in_a_piece_of_its_own_which_a_restore_keeps(
    tmp_path: Path, db_type: str, chunk_bytes: int
) -> None:
    """Blobs of 8 MiB share an object (with 1 MiB chunks, zarr puts a ZIP header before
    each chunk). The peer keeps each blob's bytes in a piece of its own, the other bytes
    in pieces of at most 1 MiB; a restore keeps each of those pieces as its blob (checked,
    not copied). Pieces cut every 1 MiB instead split every blob: each is copied."""
    root, session = save_large_blobs(tmp_path, db_type, chunk_bytes=chunk_bytes)
    location = CheckpointManager(str(root), NODE, db_type).location
    whole = capture_node(location, NODE, EPOCH)
    assert sum(len(runs) for runs in whole.runs.values()) == 3
    layout, pieces = replica_pieces(whole, 1 << 20)
    assert layout.valid()
    assert layout.count == len(pieces)
    large = [piece for piece in pieces if piece.data.nbytes > 1 << 20]
    assert [piece.data.nbytes for piece in large] == [LENT_FROM] * 3
    storage = ReplicaPath(NodeReplica(whole.root, NODE, EPOCH, {}), location.storage, lends=True)
    storage.files = received(layout, pieces)
    arrays = read(location, storage)
    ws = session.workspace(NODE)
    for name in ["a", "b", "c", "small"]:
        np.testing.assert_array_equal(arrays[name], ws[name])
    for name in "abc":
        assert any(np.shares_memory(arrays[name], piece.data) for piece in large)
    cut = {key: whole.pieces(key, 1 << 20) for key in whole.files}
    evenly = NodeReplica(whole.root, NODE, EPOCH, cut)
    arrays = read(location, ReplicaPath(evenly, location.storage, lends=True))
    assert not any(shares(arrays[name], evenly) for name in "abc")


def arriving(
    data: object, nbytes: int, *, failed: bool = False, lost: bool = False
) -> ArrivingPiece:
    arrival: Future[object] = Future()
    if failed:
        arrival.set_exception(ConnectionError("the peer left"))
    elif data is not None:
        arrival.set_result(data)
    return ArrivingPiece("peer replica", "k", nbytes, arrival, timeout=600.0, lost=lambda: lost)


def test_a_restore_reads_the_pieces_that_arrived_without_waiting_for_the_others(
    tmp_path: Path,
) -> None:
    """A read waits only for the pieces it needs; the layout gives every size at once."""
    location = saved(tmp_path, "zarr")
    first = np.arange(4, dtype=np.uint8)
    never: ArrivingPiece = arriving(None, 4)  # its bytes never come
    storage = ReplicaPath(
        NodeReplica(location.storage.display_url, NODE, EPOCH, {}), location.storage
    )
    storage.files = {"k": (arriving(ReplicaPiece(first), 4), never)}
    assert storage.size("k") == 8
    assert storage.read_bytes("k", 1, 3) == bytes([1, 2, 3])


def test_a_piece_that_never_arrives_is_missing_and_one_of_another_size_is_damage(
    tmp_path: Path,
) -> None:
    """Either way the load refuses the replica and reads the root (read_committed)."""
    location = saved(tmp_path, "zarr")
    storage = ReplicaPath(
        NodeReplica(location.storage.display_url, NODE, EPOCH, {}), location.storage
    )
    storage.files = {"k": (arriving(None, 4, failed=True),)}
    with pytest.raises(ObjectNotFoundError):
        storage.read_bytes("k")
    storage.files = {"k": (arriving(None, 4, lost=True),)}  # its peer left: no 600 s wait
    started = time.monotonic()
    with pytest.raises(ObjectNotFoundError, match="left"):
        storage.read_bytes("k")
    assert time.monotonic() - started < 60
    storage.files = {"k": (arriving(ReplicaPiece(np.zeros(3, np.uint8)), 4),)}
    with pytest.raises(CorruptCheckpointError, match="4 bytes"):
        storage.read_bytes("k")
    storage.files = {"k": (arriving(np.zeros(4, np.uint8), 4),)}  # not a replica's piece
    with pytest.raises(CorruptCheckpointError):
        storage.read_bytes("k")


def test_a_peer_keeps_a_replica_as_pieces_of_at_most_a_frame_each(tmp_path: Path) -> None:
    location = saved(tmp_path, "zarr")
    replica = capture_node(location, NODE, EPOCH)
    layout, pieces = replica_pieces(replica, 100_000)
    assert layout.valid()
    assert layout.count == len(pieces) > len(replica.files)
    assert all(0 < piece.data.nbytes <= 100_000 for piece in pieces)
    assert sum(layout.pieces) == replica.nbytes
    storage = ReplicaPath(NodeReplica(replica.root, NODE, EPOCH, {}), location.storage)
    storage.files = received(layout, pieces)
    arrays = read(location, storage)
    np.testing.assert_array_equal(arrays["w"], np.arange(1 << 15, dtype=np.float64))


class _LendOrder(ReplicaPath):
    """Records the first offset of every lend asked for."""

    asked: list[int]

    def lend(self, key: str, spans: Sequence[tuple[int, int]]) -> memoryview | None:
        self.asked.append(spans[0][0])
        return super().lend(key, spans)


def test_a_load_takes_lent_blobs_in_the_order_their_bytes_are_stored(tmp_path: Path) -> None:
    """A peer copy's pieces arrive in stored order: each blob is checked as its piece
    lands, not after the last one, whatever order the manifest lists the blobs in."""
    root, session = save_large_blobs(tmp_path, "zarr", chunk_bytes=1 << 20)
    location = CheckpointManager(str(root), NODE, "zarr").location
    whole = capture_node(location, NODE, EPOCH)
    storage = _LendOrder(NodeReplica(whole.root, NODE, EPOCH, {}), location.storage, lends=True)
    storage.asked = []
    layout, pieces = replica_pieces(whole, 1 << 20)
    storage.files = received(layout, pieces)
    manifest = open_node(storage, NODE, EPOCH)
    backwards = sorted(manifest.blobs.values(), key=lambda r: -r.chunks[0].offset)
    manifest = dataclasses.replace(manifest, blobs={r.name: r for r in backwards})
    arrays = read_blobs(storage, manifest, None, location.reader_for(manifest), location.engine())
    assert list(arrays) == [record.name for record in backwards]  # as the manifest lists them
    assert len(storage.asked) == 4
    assert storage.asked == sorted(storage.asked)
    for name in "abc":
        np.testing.assert_array_equal(arrays[name], session.workspace(NODE)[name])


def test_a_written_stream_closes_while_something_still_holds_what_it_handed_over() -> None:
    memory = _MemoryObjects("peer-replica:trainer_0")
    held: list[Sequence[Buffer]] = []
    write_parts = memory.write_parts

    def holding(key: str, parts: Sequence[Buffer]) -> None:  # as a profiler's frame does
        held.append(parts)
        write_parts(key, parts)

    memory.write_parts = holding  # type: ignore[method-assign]
    with memory.open_write("archive") as out:
        out.write(b"abc")

    assert memory.read_bytes("archive") == b"abc"
    assert held  # still held: the stream closed all the same
