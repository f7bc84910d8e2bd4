"""Asynchronous saves under DaskSession: each worker stages and writes its own node's
checkpoint on a background thread, the driver commits once every node's write ended,
and the run stores exactly what a synchronous local run stores."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from dask_session.jobs import NODES, caffe2_job, totals
from distributed import Client

from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore.dask_session import DaskSession
from ckptstore.io import ParallelIO
from ckptstore.plugin import get_registry
from ckptstore.protocol import _commit as protocol


def writer_threads() -> list[str]:
    """The background save threads of this worker process."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("ckptstore-save-"))


def stored_epoch(root: Path, epoch: int) -> dict[str, np.ndarray]:
    storage = get_registry().open_path(str(root))
    blobs: dict[str, np.ndarray] = {}
    for node in NODES:
        manifest = protocol.open_node(storage, node, epoch)
        reader = get_registry().db_type(manifest.db_type)
        blobs.update(protocol.read_blobs(storage, manifest, None, reader, ParallelIO()))
    return blobs


def test_each_worker_saves_its_node_in_the_background(tmp_path: Path, client: Client) -> None:
    sync_root, async_root = tmp_path / "sync", tmp_path / "async"
    with LocalSession() as session:
        sync_runner = JobRunner(caffe2_job(), MultiNodeCheckpointManager(str(sync_root), "npz"))
        last = sync_runner.train(session)
        expected_totals = totals(session)
    manager = MultiNodeCheckpointManager(str(async_root), "npz", metadata_handler="json")
    with DaskSession(client) as session:
        runner = JobRunner(caffe2_job(), manager, async_save=True)
        assert runner.train(session) == last
        assert totals(session) == expected_totals
        placed = session.node_to_worker()
    assert runner.committed_epochs == sync_runner.committed_epochs
    assert manager.saves_in_flight() == []
    assert manager.get_resume_from_epoch_id() == last
    threads = client.run(writer_threads)
    for node, worker in placed.items():  # each node was written by its own worker
        assert any(name.startswith(f"ckptstore-save-{node}") for name in threads[worker])
    for epoch in runner.committed_epochs:
        assert protocol.committed_nodes(manager.location.storage, epoch) == set(NODES)
        expected = stored_epoch(sync_root, epoch)
        found = stored_epoch(async_root, epoch)
        assert found.keys() == expected.keys()
        for name, value in expected.items():
            assert np.array_equal(found[name], value), (epoch, name)
