"""A save reads each node's commit record as few times as it can: once to see the epoch
is not committed yet, once more on local disk right before the rename (another writer
may have committed meanwhile), never again to catalog it. Counted by wrappers around
a wrapper around the local path type, and in the moto S3 server's request log."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from ckpt_helpers import RequestCountingPath, build_counter_job, register_storage

from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore.plugin._registry import Registry
from ckptstore.records._layout import parse_commit_record_key
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
def test_a_save_on_local_disk_reads_each_record_at_most_twice(
    tmp_path: Path, registry: Registry, async_save: bool
) -> None:
    register_storage(registry, RequestCountingPath)
    reads = record_reads_per_epoch(_train(str(tmp_path), "request_counting", async_save=async_save))
    assert set(reads) == set(range(EPOCHS + 1))
    assert max(reads.values()) <= 9  # 4.5 per node: the count this test pins down


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
    assert max(reads.values()) <= 5  # 2.5 per node: the count this test pins down
