"""Resume asks storage one question, once: the newest epoch complete on the job's nodes,
from ONE listing of the control directory plus the candidate's commit records."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import RequestCountingPath, build_counter_job, data_key, register_storage

from ckptstore import (
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.io import ParallelIO
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import CommitListing, commit_epoch, retract_epoch, write_node
from ckptstore.records._layout import (
    CONTROL_DIR,
    MANIFEST_NAME,
    manifest_key,
    node_commit_key,
)

NODES = ("trainer_0", "trainer_1")
EPOCHS = 5
RECORD_READS = 2
"""Reads of each node's commit record by a resume: the listing's check of the
candidate, then the restore's, which opens each node once."""
MANIFEST_READS = 1
"""Reads of each node's manifest by a resume (the restore loads what it lists)."""


def manifest_reads(storage: RequestCountingPath) -> dict[str, int]:
    """How many times each node's manifest was read."""
    counts = dict.fromkeys(NODES, 0)
    for key in storage.document_keys:
        if key.endswith(MANIFEST_NAME):
            counts[key.split("/")[0].split(".")[0]] += 1
    return counts


def _trained(root: Path, registry: Registry) -> None:
    register_storage(registry, RequestCountingPath)
    job, _ = build_counter_job(nodes=NODES, epochs=EPOCHS)
    JobRunner(job, MultiNodeCheckpointManager(str(root), "npz")).train(LocalSession())


def _rerun(
    root: Path, handler: str | None = None, **runner: Any
) -> tuple[JobRunner, RequestCountingPath]:
    """The same job again (already at its limit: it only resumes and restores)."""
    manager = MultiNodeCheckpointManager(str(root), "npz", handler, path_type="request_counting")
    storage = manager.location.storage
    assert isinstance(storage, RequestCountingPath)
    job, _ = build_counter_job(nodes=NODES, epochs=EPOCHS)
    return JobRunner(job, manager, **runner), storage


def test_a_resume_lists_the_commit_records_once_and_reads_only_the_newest(
    tmp_path: Path, registry: Registry
) -> None:
    _trained(tmp_path, registry)
    runner, storage = _rerun(tmp_path)
    assert runner.train(LocalSession()) == EPOCHS
    assert runner.already_finished
    assert storage.listings == [CONTROL_DIR]  # one listing, of the control directory only
    # the candidate's records (and the restore's own checks of them): no walk over
    # epochs 0..4 one GET at a time, as the catch-up did before
    assert storage.record_reads == [EPOCHS] * RECORD_READS * len(NODES)
    assert manifest_reads(storage) == dict.fromkeys(NODES, MANIFEST_READS)


def test_with_a_catalog_the_runner_asks_storage_nothing_more(
    tmp_path: Path, registry: Registry
) -> None:
    _trained(tmp_path, registry)
    JobRunner(
        build_counter_job(nodes=NODES, epochs=EPOCHS)[0],
        MultiNodeCheckpointManager(str(tmp_path), "npz", "json"),
        overwrite=True,  # writes the catalog this time (epochs 0..5 again)
    ).train(LocalSession())
    runner, storage = _rerun(tmp_path, "json")
    assert runner.train(LocalSession()) == EPOCHS
    commit_listings = [prefix for prefix in storage.listings if prefix == CONTROL_DIR]
    assert commit_listings == [CONTROL_DIR]  # the catalog's last_epoch; the runner's none
    assert storage.record_reads == [EPOCHS] * RECORD_READS * len(NODES)
    assert manifest_reads(storage) == dict.fromkeys(NODES, MANIFEST_READS)


def test_the_restore_fallback_reuses_the_same_listing(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    _trained(tmp_path, registry)
    (tmp_path / manifest_key(data_key(LocalPath(str(tmp_path)), "trainer_1", EPOCHS))).unlink()
    runner, storage = _rerun(tmp_path)
    with caplog.at_level(logging.ERROR):
        assert runner.train(LocalSession()) == EPOCHS  # resumed from 4, epoch 5 re-run
    assert "resuming from epoch 4" in caplog.text
    assert [failure.epoch for failure in runner.restore_failures] == [EPOCHS]
    assert storage.listings == [CONTROL_DIR]
    # 5 is tried, then 4 (intact): nothing older is read
    assert sorted(set(storage.record_reads)) == [EPOCHS - 1, EPOCHS]
    assert storage.record_reads.count(EPOCHS - 1) == RECORD_READS * len(NODES)


def test_refusing_to_start_over_asks_the_same_question(tmp_path: Path, registry: Registry) -> None:
    _trained(tmp_path, registry)
    runner, storage = _rerun(tmp_path)
    assert runner.checkpoint_manager is not None
    runner.checkpoint_manager.overwrite = True  # no catch-up; the runner did not say so
    with pytest.raises(JobConfigurationError, match=f"epoch {EPOCHS} is committed on every"):
        runner.train(LocalSession())
    assert storage.listings == [CONTROL_DIR]


# -- the listing itself ----------------------------------------------------------------------


def _commit(storage: LocalPath, epoch: int, nodes: tuple[str, ...]) -> None:
    blobs = {"w": np.ones(2)}
    commits = [write_node(storage, node, epoch, blobs, NpzDB(), ParallelIO()) for node in nodes]
    commit_epoch(storage, epoch, commits)


def test_the_newest_complete_epoch_skips_partial_and_damaged_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalPath(str(tmp_path))
    for epoch in (1, 2, 3, 4):
        _commit(storage, epoch, NODES)
    retract_epoch(storage, 4, ["trainer_1"])  # an interrupted commit: trainer_0 only
    (tmp_path / node_commit_key(3, "trainer_0")).write_bytes(b"{not json")  # damaged
    listing = CommitListing.of(storage)
    assert listing.epochs == [1, 2, 3, 4]
    assert listing.complete_on(NODES) == [1, 2, 3]  # candidates, from the listing alone
    with caplog.at_level(logging.WARNING):
        assert listing.newest_complete(NODES) == 2
    assert "Skipping epoch 3" in caplog.text
    assert listing.unreadable == {3}
    assert listing.newest_complete(["trainer_0"]) == 4
    assert listing.newest_complete(NODES, before=2) == 1
    assert listing.complete(NODES) == [1, 2]
    partial = listing.record(4)
    assert partial is not None
    assert set(partial.nodes) == {"trainer_0"}
    assert listing.record(9) is None
