"""Epochs are checked where they enter the managers and the runner: non-negative
integers (numpy integers become ``int``); bools, floats, strings and negative numbers
raise :class:`InvalidEpochError` (a ``ValueError``) naming the argument, before anything
is written or read. Before, ``save("1")``, ``save(4.0)`` and ``save(True)`` wrote
checkpoints later read back as corrupt, ``save(-1)`` one ``ls`` ignored, and
``save(np.int64(3))`` failed half-way with a raw ``TypeError`` from JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import build_counter_job, files_under

from ckptstore import (
    CheckpointManager,
    CorruptCheckpointError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.errors import InvalidEpochError
from ckptstore.records import node_commit_key

NODE = "trainer_0"
NOT_EPOCHS = ["1", 4.0, True, np.bool_(True), -1, np.int64(-2), 2**63, 1.5, None]


def single(root: Path) -> tuple[LocalSession, CheckpointManager]:
    session = LocalSession()
    session.workspace(NODE)["w"] = np.ones(3)
    manager = CheckpointManager(str(root), NODE, "npz")
    session.run(manager.init([NODE]))
    return session, manager


def multi(root: Path) -> tuple[LocalSession, MultiNodeCheckpointManager]:
    session = LocalSession()
    for node in ("trainer_0", "trainer_1"):
        session.workspace(node)["w"] = np.ones(3)
    manager = MultiNodeCheckpointManager(str(root), "npz")
    session.run(manager.init(["trainer_0", "trainer_1"]))
    return session, manager


def refused(call: Callable[[], object], argument: str = "epoch") -> InvalidEpochError:
    with pytest.raises(InvalidEpochError) as raised:
        call()
    error = raised.value
    assert isinstance(error, ValueError)
    assert not isinstance(error, CorruptCheckpointError)
    assert error.argument == argument
    assert str(error).startswith(f"{argument}=")
    assert "non-negative integer" in str(error)
    return error


@pytest.mark.parametrize("epoch", NOT_EPOCHS, ids=repr)
@pytest.mark.parametrize("build", [single, multi])
def test_every_manager_entry_refuses_what_is_not_an_epoch(
    tmp_path: Path, build: Callable[[Path], tuple[LocalSession, object]], epoch: object
) -> None:
    session, manager = build(tmp_path)
    assert isinstance(manager, CheckpointManager | MultiNodeCheckpointManager)
    session.run(manager.save(1))
    files = files_under(tmp_path)
    refused(lambda: manager.save(epoch))  # type: ignore[arg-type]
    refused(lambda: manager.save_async(epoch, session))  # type: ignore[arg-type]
    refused(lambda: manager.load(epoch))  # type: ignore[arg-type]
    refused(lambda: manager.verify(epoch))  # type: ignore[arg-type]
    refused(lambda: manager.get_ckpt_db_name(NODE, epoch))  # type: ignore[arg-type]
    if epoch is not None:  # None: the blobs in the workspace
        refused(
            lambda: manager.init(manager.node_names(), retrieve_from_epoch=epoch),  # type: ignore[arg-type]
            "retrieve_from_epoch",
        )
    if isinstance(manager, CheckpointManager):
        refused(lambda: manager.check_db_exists(epoch))  # type: ignore[arg-type]
        refused(lambda: manager.load_blobs_from_checkpoint(["w"], epoch))  # type: ignore[arg-type]
    else:
        nodes = ["trainer_0", "trainer_1"]
        refused(lambda: manager.load_blobs_locally(nodes, ["w"], epoch, session))  # type: ignore[arg-type]
    assert manager.saves_in_flight() == []
    assert files_under(tmp_path) == files  # nothing written


@pytest.mark.parametrize("epoch", NOT_EPOCHS, ids=repr)
def test_the_runner_refuses_what_is_not_an_epoch(tmp_path: Path, epoch: object) -> None:
    job, _ = build_counter_job(nodes=("trainer_0", "trainer_1"), epochs=1)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
    if epoch is not None:  # None: resume from the newest committed epoch
        refused(
            lambda: JobRunner(job, manager, resume_from_epoch=epoch),  # type: ignore[arg-type]
            "resume_from_epoch",
        )
    runner = JobRunner(job, manager)
    session = LocalSession()
    assert runner.train(session) == 1
    files = files_under(tmp_path)
    refused(lambda: runner.save_checkpoints(epoch, session))  # type: ignore[arg-type]
    refused(lambda: runner.load_blobs_from_checkpoints(["w"], epoch, session))  # type: ignore[arg-type]
    assert runner.save_failures == []  # refused, not a failed save to retry
    assert files_under(tmp_path) == files


def test_a_numpy_integer_epoch_is_an_int_everywhere(tmp_path: Path) -> None:
    session, manager = single(tmp_path)
    session.run(manager.save(np.int64(3)))  # type: ignore[arg-type]
    record = json.loads((tmp_path / node_commit_key(3, NODE)).read_bytes())
    assert type(record["epoch"]) is int
    assert record["epoch"] == 3
    session.run(manager.load(np.uint16(3)))  # type: ignore[arg-type]
    assert manager.get_ckpt_db_name(NODE, np.int32(3)) == f"{tmp_path}/{NODE}.3"  # type: ignore[arg-type]
    future = manager.save_async(np.int64(4), session)  # type: ignore[arg-type]
    future.wait()
    assert future.epoch == 4
    assert type(future.epoch) is int
    job, _ = build_counter_job(epochs=1)
    runner = JobRunner(job, resume_from_epoch=np.int64(2))  # type: ignore[arg-type]
    assert type(runner.resume_from_epoch) is int
