"""A worker process killed in the middle of an epoch or of a save: the run fails naming
the node, and the job re-run in a new session resumes from the last epoch committed on
all nodes, with the right values.

The kill is a SIGKILL the worker sends itself at a chosen point (a task at the start
of an epoch, or the path type when the node starts writing its checkpoint), once: a
marker file makes the re-run go through.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from caffe2_pipeline import EXPECTED_TOTALS
from dask_session import jobs
from dask_session.jobs import KillAt, caffe2_job, totals
from distributed import Client

from ckptstore import JobRunner, MultiNodeCheckpointManager
from ckptstore.dask_session import DaskSession
from ckptstore.errors import NodeLostError
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import Registry
from ckptstore.protocol._commit import committed_nodes
from ckptstore.testing.dask_workers import wait_for_workers

ALL_NODES = set(jobs.NODES)


def rerun_and_check(client: Client, ckpt: str, last_committed: int | None) -> None:
    """Re-run the job in a new session: it resumes after ``last_committed`` (from
    scratch if None) and ends with every node at the right totals."""
    wait_for_workers(client, 3)  # the nanny restarts the killed worker
    manager = MultiNodeCheckpointManager(ckpt, metadata_handler="json")
    runner = JobRunner(caffe2_job(), manager)
    with DaskSession(client) as session:
        assert runner.train(session) == 4
        first = 0 if last_committed is None else last_committed + 1
        assert runner.committed_epochs == list(range(first, 5))
        assert totals(session) == [145, 145, 145]
        for epoch, expected in enumerate(EXPECTED_TOTALS, start=1):
            session.run(manager.load(epoch))
            assert totals(session) == [expected] * 3


def committed_epochs(ckpt: str) -> list[int]:
    """The epochs committed on every node (read from the commit records)."""
    storage = LocalPath(ckpt)
    return [epoch for epoch in range(6) if committed_nodes(storage, epoch) == ALL_NODES]


# the epoch task of trainer_1 reads records cursor..cursor+2; cursor 3k starts epoch k+1
@pytest.mark.parametrize("epoch", [1, 3])
def test_a_worker_killed_mid_epoch(client: Client, tmp_path: Path, epoch: int) -> None:
    ckpt = str(tmp_path / "ckpt")
    kill = KillAt("trainer_1", cursor=3 * (epoch - 1), marker=str(tmp_path / "killed"))
    session = DaskSession(client)
    victim = session.worker_of("trainer_1")
    with session, pytest.raises(NodeLostError) as failure:
        JobRunner(
            caffe2_job(kill), MultiNodeCheckpointManager(ckpt, metadata_handler="json")
        ).train(session)
    assert failure.value.node == "trainer_1"
    assert failure.value.worker == victim
    assert "'trainer_1'" in str(failure.value)
    assert victim not in client.nthreads()
    assert committed_epochs(ckpt) == list(range(epoch))
    rerun_and_check(client, ckpt, last_committed=epoch - 1)


@pytest.mark.parametrize("epoch", [0, 2])
def test_a_worker_killed_mid_save(
    client: Client, registry: Registry, tmp_path: Path, epoch: int
) -> None:
    registry.register(jobs)
    ckpt = str(tmp_path / "ckpt")
    options = {"kill_on_key": f"trainer_1.{epoch}", "kill_marker": str(tmp_path / "killed")}
    manager = MultiNodeCheckpointManager(
        ckpt, metadata_handler="json", path_type="faulty_local", storage_options=options
    )
    with DaskSession(client) as session, pytest.raises(NodeLostError, match="'trainer_1'"):
        JobRunner(caffe2_job(), manager).train(session)
    assert (tmp_path / "killed").exists()  # it died writing its checkpoint of that epoch
    assert committed_epochs(ckpt) == list(range(epoch))
    assert committed_nodes(manager.location.storage, epoch) == set()
    rerun_and_check(client, ckpt, last_committed=epoch - 1 if epoch else None)
