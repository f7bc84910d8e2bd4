"""Jobs and epoch_limiter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import build_counter_job

from ckptstore import (
    Job,
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    TaskGroup,
    Workspace,
    epoch_limiter,
)
from ckptstore.errors import FrozenGroupError, InvalidEpochError
from ckptstore.execution import WorkspaceType


def test_default_groups() -> None:
    job = Job()
    assert job.init_group.workspace_type() is WorkspaceType.GLOBAL
    for group in (job.epoch_group, job.download_group, job.exit_group):
        assert group.workspace_type() is None
    assert job.stop_conditions == []
    assert job.groups() == (job.init_group, job.epoch_group, job.download_group, job.exit_group)


def test_with_job_makes_it_current_and_enters_its_epoch_group() -> None:
    with Job() as job:
        assert Job.current() is job
        assert TaskGroup.current() is job.epoch_group
        task = Task(lambda ws: None)
        with job.init_group:
            init = Task(lambda ws: None)
    assert task.group is job.epoch_group
    assert init.group is job.init_group
    assert job.epoch_group.workspace_type() is WorkspaceType.PRIVATE
    with pytest.raises(JobConfigurationError, match="no current job"):
        Job.current()


def test_nested_jobs() -> None:
    with Job() as outer:
        with Job() as inner:
            assert Job.current() is inner
        assert Job.current() is outer


def test_add_stop_condition_with_an_output() -> None:
    job = Job()
    task = Task(lambda ws: None, outputs=["done"])
    output = task.outputs()[0]
    assert job.add_stop_condition(output) is output
    assert job.stop_conditions == [output]


def test_add_stop_condition_by_blob_name_reads_it_on_the_current_node() -> None:
    job = Job()
    with Node("trainer_0"):
        output = job.add_stop_condition("trainer_0/finished")
    [reader] = job.epoch_group.tasks()
    assert reader.outputs() == [output]
    assert reader.group is job.epoch_group
    assert reader.node == "trainer_0"
    assert output.blob_name == "trainer_0/finished"
    assert reader.fn is None


def test_a_blob_name_stop_condition_ends_the_job() -> None:
    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(lambda ws: ws.update(count=np.array(0), stop=np.array(False)))

        def step(ws: Workspace) -> None:
            ws["count"] += 1
            ws["stop"] = ws["count"] >= 3

        Task(step)
        job.add_stop_condition("stop")
    assert JobRunner(job).train(LocalSession()) == 3


def test_add_stop_condition_refuses_anything_else() -> None:
    with pytest.raises(JobConfigurationError, match="TaskOutput"):
        Job().add_stop_condition(42)  # type: ignore[arg-type]


def test_nodes_to_checkpoint_defaults_to_init_nodes_in_first_use_order() -> None:
    with Job() as job:
        for node in ("b", "a", "b"):
            with Node(node), job.init_group:
                Task(lambda ws: None)
        with Node("epoch_only"):
            Task(lambda ws: None)
    assert job.nodes_to_checkpoint() == ["b", "a"]
    assert Job(nodes_to_checkpoint=["x"]).nodes_to_checkpoint() == ["x"]


def test_an_explicit_empty_nodes_to_checkpoint_is_an_error() -> None:
    job = Job(nodes_to_checkpoint=[])
    with pytest.raises(JobConfigurationError, match="empty list"):
        job.nodes_to_checkpoint()
    job.compile(LocalSession)
    with pytest.raises(JobConfigurationError):
        job.nodes_to_checkpoint()


def test_compile_freezes_every_group_and_caches_the_nodes() -> None:
    with Job() as job, Node("trainer_0"), job.init_group:
        Task(lambda ws: None)
    job.compile(LocalSession)
    assert all(group.frozen for group in job.groups())
    assert job.nodes_to_checkpoint() == ["trainer_0"]
    with pytest.raises(FrozenGroupError), job.init_group:
        Task(lambda ws: None)
    with pytest.raises(FrozenGroupError):
        job.add_stop_condition("x")


def test_epoch_limiter_needs_at_least_one_epoch() -> None:
    with pytest.raises(JobConfigurationError):
        epoch_limiter(Job(), 0)
    for bad in (-1, "3", 2.0, True):
        with pytest.raises(InvalidEpochError, match="num_epochs"):
            epoch_limiter(Job(), bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("epochs", [1, 2, 5])
def test_epoch_limiter_runs_exactly_n_epochs(epochs: int) -> None:
    job, _ = build_counter_job(epochs=epochs)
    session = LocalSession()
    assert JobRunner(job).train(session) == epochs
    assert session.workspace("trainer_0")["trainer_0/step"].item() == epochs


def test_two_limiters_use_distinct_blobs_and_the_first_to_finish_stops() -> None:
    job, _ = build_counter_job(epochs=5)
    with Node("trainer_0"):
        epoch_limiter(job, 2)
    session = LocalSession()
    assert JobRunner(job).train(session) == 2
    names = sorted(n for n in session.workspace("trainer_0") if n.startswith("epoch_limiter"))
    assert names == [
        "epoch_limiter/0/done",
        "epoch_limiter/0/epochs",
        "epoch_limiter/1/done",
        "epoch_limiter/1/epochs",
    ]


def test_epoch_limiter_counter_is_checkpointed_and_resumes_correctly(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=5)
    assert (
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession()) == 5
    )
    for resume in (0, 2, 4):
        session = LocalSession()
        manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
        runner = JobRunner(job, manager, resume_from_epoch=resume, overwrite=True)  # a rewind
        assert runner.train(session) == 5
        ws = session.workspace("trainer_0")
        assert ws["trainer_0/step"].item() == 5
        assert ws["epoch_limiter/0/epochs"].item() == 5


def _committed(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("trainer_0.*"))


def test_rerunning_a_finished_job_runs_nothing_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job, _ = build_counter_job(epochs=3)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    assert JobRunner(job, manager).train(LocalSession()) == 3
    before = _committed(tmp_path)
    for _ in range(2):  # Caffe2 would train one more epoch on each rerun
        session = LocalSession()
        manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
        runner = JobRunner(job, manager)
        with caplog.at_level("WARNING", logger="ckptstore.checkpoint._runner"):
            assert runner.train(session) == 3
        assert runner.already_finished
        assert runner.committed_epochs == []
        assert session.workspace("trainer_0")["trainer_0/step"].item() == 3  # restored
    assert _committed(tmp_path) == before == [f"trainer_0.{e}" for e in range(4)]
    assert "Nothing to do: epoch 3 is committed" in caplog.text
    assert "Raise the limit to train further" in caplog.text


def test_raising_the_limit_continues_from_the_last_epoch(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=3)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    assert JobRunner(job, manager).train(LocalSession()) == 3
    longer, _ = build_counter_job(epochs=5)
    session = LocalSession()
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(longer, manager)
    assert runner.train(session) == 5
    assert not runner.already_finished
    assert runner.committed_epochs == [4, 5]
    ws = session.workspace("trainer_0")
    assert ws["trainer_0/step"].item() == 5  # resumed from 3, not retrained from 0
    assert ws["epoch_limiter/0/epochs"].item() == 5


def test_an_explicit_resume_at_the_limit_runs_nothing(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=2)
    assert JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz"), resume_from_epoch=2)
    assert runner.train(LocalSession()) == 2
    assert runner.already_finished
    assert _committed(tmp_path) == ["trainer_0.0", "trainer_0.1", "trainer_0.2"]
