"""A save reads each node's commit record as few times as it can: once to see the epoch
is not committed yet, once more on local disk right before the rename (another writer
may have committed meanwhile), never again to catalog it. Counted by wrappers around
a wrapper around the local path type, and in the moto S3 server's request log."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import RequestCountingPath, build_counter_job, register_storage

from ckptstore import CheckpointManager, JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.errors import AlreadyCommittedError
from ckptstore.io import ParallelIO
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import commit_epoch, retract_epoch, write_node
from ckptstore.records._layout import CONTROL_DIR, commit_record_key, parse_commit_record_key
from ckptstore.testing import FaultProxy

NODES = ("trainer_0", "trainer_1")
EPOCHS = 3


def record_reads_per_epoch(keys: list[str]) -> Counter[int]:
    """How many commit-record reads (per-node or one-document) each epoch got."""
    return Counter(epoch for key in keys if (epoch := parse_commit_record_key(key)) is not None)


def _train(url: str, path_type: str, *, async_save: bool = False) -> list[str]:
    manager = MultiNodeCheckpointManager(url, "npz", "json", path_type=path_type)
    storage = manager.location.storage
    assert isinstance(storage, RequestCountingPath)
    job, _ = build_counter_job(nodes=NODES, epochs=EPOCHS)
    runner = JobRunner(job, manager, async_save=async_save)
    assert runner.train(LocalSession()) == EPOCHS
    assert runner.committed_epochs == list(range(EPOCHS + 1))
    return storage.document_keys


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_on_local_disk_reads_each_record_at_most_once(
    tmp_path: Path, registry: Registry, async_save: bool
) -> None:
    register_storage(registry, RequestCountingPath)
    reads = record_reads_per_epoch(_train(str(tmp_path), "request_counting", async_save=async_save))
    assert set(reads) == set(range(EPOCHS + 1))
    assert max(reads.values()) <= len(NODES)  # the check; no look before a rename: none


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_on_s3_reads_each_record_at_most_once(
    s3_url: str, s3_faults: FaultProxy, async_save: bool
) -> None:
    """Counted in the moto server's request log (every request through the proxy)."""
    manager = MultiNodeCheckpointManager(s3_url, "npz", "json")
    job, _ = build_counter_job(nodes=NODES, epochs=EPOCHS)
    runner = JobRunner(job, manager, async_save=async_save)
    assert runner.train(LocalSession()) == EPOCHS
    prefix = "/" + s3_url[len("s3://") :] + "/"
    gets = [
        request.path[len(prefix) :]
        for request in s3_faults.requests
        if request.method == "GET" and request.path.startswith(prefix)
    ]
    reads = record_reads_per_epoch(gets)
    assert set(reads) == set(range(EPOCHS + 1))
    assert max(reads.values()) <= len(NODES)  # the check; the catalog reads nothing back


def test_the_one_document_record_is_looked_for_only_where_a_listing_shows_one(
    tmp_path: Path, registry: Registry
) -> None:
    """Earlier versions wrote one record per epoch; a save reads it only for an epoch
    whose record the manager's one listing of the control directory found."""
    register_storage(registry, RequestCountingPath)
    storage = LocalPath(str(tmp_path))
    commit = write_node(storage, "trainer_0", 1, {"w": np.ones(2)}, NpzDB(), ParallelIO())
    record = commit_epoch(storage, 1, [commit])
    retract_epoch(storage, 1, ["trainer_0"])
    storage.put_document(commit_record_key(1), record.encode())  # as an earlier version did
    manager = CheckpointManager(str(tmp_path), "trainer_0", "npz", path_type="request_counting")
    counting = manager.location.storage
    assert isinstance(counting, RequestCountingPath)
    session = LocalSession()
    session.workspace("trainer_0")["w"] = np.zeros(2)
    session.run(manager.init(["trainer_0"]))
    with pytest.raises(AlreadyCommittedError):
        session.run(manager.save(1))  # write-once holds for the older record too
    assert counting.document_keys.count(commit_record_key(1)) == 1
    session.run(manager.save(2))
    assert commit_record_key(2) not in counting.document_keys  # the listing showed none
    assert counting.listings == [CONTROL_DIR]  # one listing for every save
