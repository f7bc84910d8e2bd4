"""A worker that cannot reach storage: the epoch it fails to save stays uncommitted,
the failure names the node, and the other epochs commit as usual."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from dask_session import jobs
from dask_session.jobs import NODES, caffe2_job, totals
from distributed import Client

from ckptstore import JobRunner, MultiNodeCheckpointManager, SaveFailedError
from ckptstore.dask_session import DaskSession
from ckptstore.errors import CheckpointNotFoundError
from ckptstore.plugin import hookimpl
from ckptstore.plugin._registry import Registry
from ckptstore.protocol._commit import committed_nodes
from ckptstore.records import NodeStats


class FailureReports:
    """Collects ``checkpoint_save_failed`` reports (a ckptstore_report plugin)."""

    def __init__(self) -> None:
        self.failed: list[dict[str, str | None]] = []

    @hookimpl
    def ckptstore_report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        if action_name == "checkpoint_save_failed":
            self.failed.append({s.node: s.error for s in stats.values()})


def faulty_manager(ckpt: str, **options: object) -> MultiNodeCheckpointManager:
    return MultiNodeCheckpointManager(
        ckpt, metadata_handler="json", path_type="faulty_local", storage_options=options
    )


def test_a_worker_that_cannot_write_one_epoch_leaves_it_uncommitted(
    client: Client, workers: list[str], registry: Registry, tmp_path: Path
) -> None:
    registry.register(jobs)
    reports = FailureReports()
    registry.register(reports)
    placement = dict(zip(NODES, workers, strict=True))
    ckpt = str(tmp_path)
    manager = faulty_manager(
        ckpt, unreachable_from=[placement["trainer_1"]], only_keys_containing="trainer_1.2"
    )
    runner = JobRunner(caffe2_job(), manager, retry_backoff=0)
    with DaskSession(client, placement) as session:
        assert runner.train(session) == 4
        assert totals(session) == [145, 145, 145]  # training went on

    assert runner.committed_epochs == [0, 1, 3, 4]
    [failure] = runner.save_failures
    assert failure.epoch == 2
    assert isinstance(failure.error, SaveFailedError)
    assert failure.error.failed_nodes == ("trainer_1",)
    assert "node 'trainer_1'" in str(failure.error)
    assert "storage unreachable" in failure.error.node_errors["trainer_1"]
    assert reports.failed == [{"trainer_1": failure.error.node_errors["trainer_1"]}]
    storage = manager.location.storage
    assert committed_nodes(storage, 2) == set()
    assert committed_nodes(storage, 3) == set(NODES)

    resume_from_2 = JobRunner(caffe2_job(), faulty_manager(ckpt), resume_from_epoch=2)
    with DaskSession(client) as session, pytest.raises(CheckpointNotFoundError, match="epoch 2"):
        resume_from_2.train(session)


def test_a_worker_that_cannot_write_at_all_commits_nothing(
    client: Client, workers: list[str], registry: Registry, tmp_path: Path
) -> None:
    registry.register(jobs)
    placement = dict(zip(NODES, workers, strict=True))
    manager = faulty_manager(str(tmp_path), unreachable_from=[placement["trainer_2"]])
    runner = JobRunner(
        caffe2_job(),
        manager,
        retry_backoff=0,
        save_retries=0,
        max_consecutive_save_failures=None,  # keep going: every save fails here
    )
    with DaskSession(client, placement) as session:
        assert runner.train(session) == 4
    assert runner.committed_epochs == []
    assert [failure.epoch for failure in runner.save_failures] == [0, 1, 2, 3, 4]
    for failure in runner.save_failures:
        assert isinstance(failure.error, SaveFailedError)
        assert failure.error.failed_nodes == ("trainer_2",)
    assert manager.get_resume_from_epoch_id() is None
