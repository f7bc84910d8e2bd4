"""The Caffe2 scenarios with three nodes under DaskSession: the same numbers as under
LocalSession, checkpoints that move between the two, and fewer workers than nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from caffe2_pipeline import EXPECTED_TOTALS, build_download_job, build_pipeline
from dask_session.jobs import caffe2_job, totals
from distributed import Client

from ckptstore import (
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Session,
)
from ckptstore.dask_session import DaskSession
from ckptstore.errors import BlobNotFoundError

SessionFactory = Callable[[], Session]


@pytest.fixture
def sessions(client: Client) -> dict[str, SessionFactory]:
    return {"local": LocalSession, "dask": lambda: DaskSession(client)}


def scenario_numbers(make_session: SessionFactory, ckpt: str) -> dict[str, object]:
    """Train the three-node job, resume it from every epoch, load every epoch."""
    job = caffe2_job()
    numbers: dict[str, object] = {}
    with make_session() as session:
        numbers["last_epoch"] = JobRunner(job, MultiNodeCheckpointManager(ckpt, "npz")).train(
            session
        )
        numbers["totals"] = totals(session)
    resumed = []
    for epoch in range(1, 5):
        with make_session() as session:
            manager = MultiNodeCheckpointManager(ckpt, "npz")
            runner = JobRunner(job, manager, resume_from_epoch=epoch, overwrite=True)  # rewind
            resumed.append((runner.train(session), totals(session)))
    numbers["resumed"] = resumed
    loaded = []
    with make_session() as session:
        for epoch in range(1, 5):
            session.run(manager.load(epoch))
            loaded.append(totals(session))
    numbers["loaded"] = loaded
    return numbers


def test_the_three_node_scenario_gives_the_same_numbers_as_locally(
    sessions: dict[str, SessionFactory], tmp_path: Path
) -> None:
    local = scenario_numbers(sessions["local"], str(tmp_path / "local"))
    dask = scenario_numbers(sessions["dask"], str(tmp_path / "dask"))
    assert dask == local
    assert dask["last_epoch"] == 4
    assert dask["totals"] == [145, 145, 145]
    # resuming from 1..3 finishes at epoch 4; from 4 it runs (and saves) epoch 5
    assert dask["resumed"] == [(4, [145] * 3)] * 3 + [(5, [145] * 3)]
    assert dask["loaded"] == [[total] * 3 for total in EXPECTED_TOTALS]


@pytest.mark.parametrize(("writer", "reader"), [("local", "dask"), ("dask", "local")])
def test_checkpoints_load_under_the_other_session(
    sessions: dict[str, SessionFactory], tmp_path: Path, writer: str, reader: str
) -> None:
    job = caffe2_job()
    with sessions[writer]() as session:
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), metadata_handler="json")).train(
            session
        )
    with sessions[reader]() as session:
        manager = MultiNodeCheckpointManager(str(tmp_path), metadata_handler="json")
        runner = JobRunner(job, manager, resume_from_epoch=2, overwrite=True)  # a rewind
        assert runner.train(session) == 4
        assert runner.committed_epochs == [3, 4]
        assert totals(session) == [145, 145, 145]
        for epoch, expected in enumerate(EXPECTED_TOTALS, start=1):
            session.run(manager.load(epoch))
            assert totals(session) == [expected] * 3


def test_partial_loads_gather_into_the_current_node(client: Client, tmp_path: Path) -> None:
    ckpt = str(tmp_path)
    for node_id in range(3):  # as in Caffe2: each trainer's job checkpoints separately
        with Job() as node_job:
            build_pipeline(node_id)
        with DaskSession(client) as session:
            assert JobRunner(node_job, MultiNodeCheckpointManager(ckpt, "npz")).train(session) == 4

    runner = JobRunner(caffe2_job(), MultiNodeCheckpointManager(ckpt, "npz"))
    names = ["trainer_1/total", "trainer_2/total"]
    with DaskSession(client) as session:
        for epoch in range(1, 5):
            assert runner.load_blobs_from_checkpoints(names, epoch, session)
            expected = EXPECTED_TOTALS[epoch - 1]
            assert [session.fetch_blob("local", name).tolist() for name in names] == [
                [expected],
                [expected],
            ]
        assert session.blob_names("local") == names
        assert not runner.load_blobs_from_checkpoints(names, 5, session)
        with Node("trainer_0"):  # the current node is where the blobs land
            assert runner.load_blobs_from_checkpoints(["trainer_2/total"], 2, session)
        assert session.fetch_blob("trainer_0", "trainer_2/total").tolist() == [115]


def test_a_checkpoint_of_three_workers_loads_on_two(
    client: Client, workers: list[str], tmp_path: Path
) -> None:
    job = caffe2_job()
    with DaskSession(client) as session:
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz", "json")).train(session)
        assert len(set(session.node_to_worker().values())) == 3

    two = {"trainer_0": workers[0], "trainer_1": workers[0], "trainer_2": workers[1]}
    with DaskSession(client, two) as session:
        manager = MultiNodeCheckpointManager(str(tmp_path), "npz", "json")
        runner = JobRunner(job, manager, resume_from_epoch=1, overwrite=True)  # a rewind
        assert runner.train(session) == 4
        assert set(session.node_to_worker().values()) == {workers[0], workers[1]}
        assert totals(session) == [145, 145, 145]
        session.run(manager.load(3))
        assert totals(session) == [136, 136, 136]
        # trainer_0 and trainer_1 share a worker, not a workspace
        assert session.blob_names("trainer_1") == [
            "trainer_1/cursor",
            "trainer_1/data_finished",
            "trainer_1/dataset",
            "trainer_1/total",
        ]
        with pytest.raises(BlobNotFoundError):
            session.fetch_blob("trainer_0", "trainer_1/total")


def test_download_and_private_epoch_groups_behave_as_locally(session: DaskSession) -> None:
    JobRunner(build_download_job()).train(session)
    expected = np.full(8, 2.0, dtype=np.float32)
    assert np.array_equal(session.fetch_blob("trainer:0", "output"), expected)
    result = session.fetch_blob("trainer:0", "download_result")
    assert np.array_equal(result, expected)
    assert result.dtype == np.float32
    assert "scratch" not in session.blob_names("trainer:0")  # the epoch group is PRIVATE
