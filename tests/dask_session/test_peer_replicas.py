"""Peer replicas (``DaskSession(client, peer_replicas=k)``): a node lost with its worker
(a real worker process killed with SIGKILL, its local directory removed) is restored
from a surviving peer's copy, verified against the root's commit record, without
reading the node's data from the root; a damaged, lost or uncommitted copy is never
used, and the node is read from the root as without replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial, wraps
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dask_session.jobs import NODES, expected_state, kept_in_place, state_job
from distributed import Client

from ckptstore import IOSettings, JobRunner, MultiNodeCheckpointManager, Node, Task
from ckptstore.dask_session import DaskSession
from ckptstore.dask_session._peers import PeerReplicas, peer_order, replica_dataset
from ckptstore.dask_session._replica_pieces import LENT_FROM, ReplicaPiece
from ckptstore.errors import CheckpointNotFoundError, JobConfigurationError
from ckptstore.protocol import retract_epoch
from ckptstore.records import NodeStats
from ckptstore.testing.dask_workers import kill_worker, wait_for_workers

VALUES = 1 << 17  # 1 MiB of float64 per node
EPOCHS = 2
LOST_DATA = pytest.mark.filterwarnings("ignore:Client .* desires key .* but key is unknown")
"""Dask's warning when a restore looks up a replica whose only peer was killed."""


@pytest.fixture
def replicas(client: Client) -> Iterator[Client]:
    yield client
    DaskSession(client).drop_peer_replicas()


def train(
    client: Client, ckpt: str, *, values: int = VALUES, io: IOSettings | None = None, **options: Any
) -> tuple[JobRunner, DaskSession]:
    """Train the job for :data:`EPOCHS` in a new session with ``options``; returns the
    runner and the (closed) session."""
    manager = MultiNodeCheckpointManager(ckpt, metadata_handler="json", io=io)
    runner = JobRunner(state_job(values, EPOCHS), manager)
    with DaskSession(client, **options) as session:
        assert runner.train(session) == EPOCHS
        shipped = session.wait_for_peer_replicas(timeout=60)
    if options.get("peer_replicas"):
        assert {node: shipment.epoch for node, shipment in shipped.items()} == dict.fromkeys(
            NODES, EPOCHS
        )
        for node, shipment in shipped.items():
            assert session.node_to_worker()[node] not in shipment.peers
    return runner, session


def restore(client: Client, ckpt: str, values: int = VALUES) -> DaskSession:
    """Re-run the finished job in a new session (it restores epoch EPOCHS on every
    node), check each node's bytes, and return the session (still open)."""
    wait_for_workers(client, 3)
    manager = MultiNodeCheckpointManager(ckpt, metadata_handler="json")
    session = DaskSession(client, peer_replicas=1)
    runner = JobRunner(state_job(values, EPOCHS), manager)
    assert runner.train(session) == EPOCHS
    assert runner.resumed_from_epoch == EPOCHS
    for node in NODES:
        np.testing.assert_array_equal(
            session.fetch_blob(node, f"{node}/w"), expected_state(node, values, EPOCHS)
        )
    return session


def hide_node_data(manager_ckpt: str, node: str) -> Path:
    """Move ``node``'s data of epoch EPOCHS out of the root (its commit record stays):
    a read of it from the root now fails. Returns where it went."""
    manager = MultiNodeCheckpointManager(manager_ckpt)
    manager.init(list(NODES))
    db = Path(str(manager.get_ckpt_db_name(node, EPOCHS)))
    assert db.is_dir()
    hidden = db.parent.parent / f"hidden-{node}"
    db.rename(hidden)
    return hidden


@LOST_DATA
def test_a_lost_worker_s_node_is_restored_from_a_peer(replicas: Client, tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    _, trained = train(replicas, ckpt, peer_replicas=1)
    kill_worker(replicas, trained.node_to_worker()["trainer_1"])
    hide_node_data(ckpt, "trainer_1")  # the restore cannot read it from the root
    with restore(replicas, ckpt) as session:
        assert ("trainer_1", EPOCHS) in session.restored_from_peers()
        with Node("trainer_1"):  # the restored blob is the received copy: training updates it
            [in_place] = session.run(Task(partial(kept_in_place, name="trainer_1/w")))
            session.run(Task(lambda ws: ws["trainer_1/w"].__iadd__(1.0)))
        assert in_place
        np.testing.assert_array_equal(
            session.fetch_blob("trainer_1", "trainer_1/w"),
            expected_state("trainer_1", VALUES, EPOCHS) + 1.0,
        )


def _set_frame_limit(nbytes: int | None) -> int:
    """Set this worker's comm frame size (``None``: back to the configured one)."""
    import dask
    from dask.utils import parse_bytes
    from distributed.comm.tcp import TCP

    limit = parse_bytes(dask.config.get("distributed.comm.shard")) if nbytes is None else nbytes
    TCP.max_shard_size = limit
    return limit


@LOST_DATA
def test_a_replica_held_in_many_pieces_restores_the_node(replicas: Client, tmp_path: Path) -> None:
    """Frames of 256 KiB: each node's 1 MiB travels and is held in several pieces, each a
    key of its own, and the restore reads them as they arrive."""
    ckpt = str(tmp_path / "ckpt")
    replicas.run(_set_frame_limit, 256 << 10)
    try:
        _, trained = train(replicas, ckpt, peer_replicas=1)
        name = replica_dataset(ckpt, "trainer_1") + "0"
        _, layout, futures = replicas.get_dataset(name)
        assert len(futures) == layout.count > 4
        kill_worker(replicas, trained.node_to_worker()["trainer_1"])
        hide_node_data(ckpt, "trainer_1")  # the restore cannot read it from the root
        del futures
        with restore(replicas, ckpt) as session:
            assert ("trainer_1", EPOCHS) in session.restored_from_peers()
    finally:
        replicas.run(_set_frame_limit, None)


def _spy_on_frames(on: bool) -> int:
    """Record the largest frame this worker's TCP comm writes (``on``), or stop and
    return it."""
    import distributed.comm.tcp as tcp

    original = getattr(tcp.to_frames, "__wrapped__", tcp.to_frames)
    if not on:
        tcp.to_frames = original
        return int(getattr(tcp, "largest_frame_written", 0))
    tcp.largest_frame_written = 0  # type: ignore[attr-defined]

    @wraps(original)
    async def spy(*args: Any, **kwargs: Any) -> Any:
        frames = await original(*args, **kwargs)
        largest = max((memoryview(frame).nbytes for frame in frames), default=0)
        tcp.largest_frame_written = max(tcp.largest_frame_written, largest)  # type: ignore[attr-defined]
        return frames

    tcp.to_frames = spy
    return 0


@LOST_DATA
def test_a_blob_larger_than_a_comm_frame_travels_in_one_frame_and_becomes_the_blob(
    replicas: Client, tmp_path: Path
) -> None:
    """Frames of 1 MiB, 8 MiB blobs in chunks of 1 MiB (a ZIP header before each): the
    peer keeps each blob's bytes in a piece of its own, sent in one frame of 8 MiB (Dask
    would cut it in 8 and join them by copying), which the restore keeps as the blob."""
    ckpt, values = str(tmp_path / "ckpt"), LENT_FROM // 8
    replicas.run(_set_frame_limit, 1 << 20)
    replicas.run(_spy_on_frames, True)
    try:
        _, trained = train(
            replicas, ckpt, values=values, io=IOSettings(chunk_bytes=1 << 20), peer_replicas=1
        )
        kill_worker(replicas, trained.node_to_worker()["trainer_1"])
        replicas.run(_set_frame_limit, 1 << 20)  # on the new worker too
        hide_node_data(ckpt, "trainer_1")
        with restore(replicas, ckpt, values) as session:
            assert ("trainer_1", EPOCHS) in session.restored_from_peers()
            with Node("trainer_1"):
                [in_place] = session.run(Task(partial(kept_in_place, name="trainer_1/w")))
            assert in_place
    finally:
        replicas.run(_set_frame_limit, None)
        largest = max(replicas.run(_spy_on_frames, False).values())
    assert largest >= LENT_FROM


def test_a_damaged_replica_falls_back_to_the_root(replicas: Client, tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    train(replicas, ckpt, peer_replicas=1)
    name = replica_dataset(str(tmp_path / "ckpt"), "trainer_1") + "0"  # its one copy
    epoch, layout, futures = replicas.get_dataset(name)
    pieces = [piece.data.copy() for piece in replicas.gather(futures)]
    largest = max(pieces, key=lambda piece: piece.nbytes)
    largest[largest.nbytes // 2] ^= 0xFF  # one flipped byte in the data
    forged = replicas.scatter([ReplicaPiece(piece) for piece in pieces])
    replicas.unpublish_dataset(name)
    replicas.publish_dataset((epoch, layout, forged), name=name)
    del futures, forged
    with restore(replicas, ckpt) as session:  # the bytes are right: read from the root
        assert ("trainer_1", EPOCHS) not in session.restored_from_peers()


def test_keys_holding_something_else_than_a_replica_piece_are_not_served(
    replicas: Client, tmp_path: Path
) -> None:
    """A peer serves a restore only the replica pieces it holds: another value under a
    replica's key is refused, and the node is read from the root."""
    ckpt = str(tmp_path / "ckpt")
    train(replicas, ckpt, peer_replicas=1)
    name = replica_dataset(ckpt, "trainer_1") + "0"
    epoch, layout, futures = replicas.get_dataset(name)
    raw = [piece.data.copy() for piece in replicas.gather(futures)]  # right bytes, not pieces
    forged = replicas.scatter(raw)
    replicas.unpublish_dataset(name)
    replicas.publish_dataset((epoch, layout, forged), name=name)
    del futures, forged
    with restore(replicas, ckpt) as session:
        assert ("trainer_1", EPOCHS) not in session.restored_from_peers()


@LOST_DATA
def test_with_no_surviving_replica_the_node_is_read_from_the_root(
    replicas: Client, tmp_path: Path
) -> None:
    ckpt = str(tmp_path / "ckpt")
    _, trained = train(replicas, ckpt, peer_replicas=1)
    [holder] = trained.wait_for_peer_replicas()["trainer_1"].peers
    kill_worker(replicas, holder)  # the only copy of trainer_1 goes with it
    with restore(replicas, ckpt) as session:
        assert ("trainer_1", EPOCHS) not in session.restored_from_peers()


def test_a_replica_of_an_uncommitted_epoch_is_never_used(replicas: Client, tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    runner, _ = train(replicas, ckpt, peer_replicas=1)
    assert runner.checkpoint_manager is not None
    retract_epoch(runner.checkpoint_manager.location.storage, EPOCHS, ["trainer_1"])
    manager = MultiNodeCheckpointManager(ckpt, metadata_handler="json")
    rerun = JobRunner(state_job(VALUES, EPOCHS), manager, resume_from_epoch=EPOCHS)
    with DaskSession(replicas, peer_replicas=1) as session:
        with pytest.raises(CheckpointNotFoundError, match="trainer_1"):
            rerun.train(session)  # the replica of epoch 2 does not stand in for its record
        assert session.restored_from_peers() == []


def test_without_peer_replicas_nothing_is_shipped(client: Client, tmp_path: Path) -> None:
    _, session = train(client, str(tmp_path / "ckpt"))
    assert session.wait_for_peer_replicas() == {}
    assert not [
        name for name in client.list_datasets() if str(name).startswith("ckptstore-peer-replica/")
    ]


def test_replicas_spread_over_the_other_workers_within_the_memory_limit(
    client: Client,
) -> None:
    workers = ["tcp://a:1", "tcp://b:1", "tcp://c:1"]
    assert peer_order(workers, "tcp://b:1") == ["tcp://c:1", "tcp://a:1"]
    saves = [
        NodeStats(node, 1, f"/ckpt/{node}.1", "checkpoint_save", stored_bytes=100) for node in NODES
    ]
    unbounded = PeerReplicas(client, 2)
    chosen = [
        unbounded._choose(stats, writer, workers)
        for stats, writer in zip(saves, workers, strict=True)
    ]
    assert chosen == [[workers[1], workers[2]], [workers[2], workers[0]], [workers[0], workers[1]]]
    bounded = PeerReplicas(client, 2, memory_limit=100)  # room for one replica per worker
    chosen = [
        bounded._choose(stats, writer, workers)
        for stats, writer in zip(saves, workers, strict=True)
    ]
    assert chosen == [[workers[1], workers[2]], [workers[0]], []]  # the last one is logged
    with pytest.raises(JobConfigurationError, match="peer_memory_limit"):
        PeerReplicas(client, 1, memory_limit=-1)
