"""JobRunner: Caffe2's order of operations, and the fixes of the original's save, resume
and upload weaknesses."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import (
    RecordingHandler,
    ReportRecorder,
    build_counter_job,
    fail_epochs,
    fail_first,
    failing_local_path,
    flip_byte,
    node_dir,
    register_storage,
)

from ckptstore import (
    CheckpointManager,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    Job,
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    SaveFailedError,
    StorageError,
    Task,
    TaskGroup,
    UploadTaskGroupBuilder,
    Workspace,
    epoch_limiter,
    protocol,
)
from ckptstore.builtin import CopyUpload
from ckptstore.checkpoint._manager import ManagerBase
from ckptstore.errors import InvalidPluginError, TooManySaveFailuresError, UnsupportedBlobError
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import Registry

NODE = "trainer_0"


def committed_epochs(root: Path | str) -> list[int]:
    from ckptstore.paths._local_path import LocalPath

    storage = LocalPath(str(root))
    return [e for e in range(10) if protocol.read_commit(storage, e) is not None]


def add_end_groups(job: Job, events: list[str]) -> None:
    """Download and exit tasks that log when they run."""
    with Node(NODE):
        Task(lambda ws: events.append("download"), group=job.download_group)
        Task(lambda ws: events.append("exit"), group=job.exit_group)


# -- configuration errors ------------------------------------------------------------------


def test_a_job_without_stop_condition_is_refused_before_anything_runs() -> None:
    ran: list[str] = []
    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ran.append("init"))
        Task(lambda ws: ran.append("epoch"))
    with pytest.raises(JobConfigurationError, match="no stop condition"):
        JobRunner(job).train(LocalSession())
    assert ran == []


def test_resume_without_a_manager_is_an_error_not_a_silent_skip() -> None:
    job, _ = build_counter_job()
    session = LocalSession()
    with pytest.raises(JobConfigurationError, match="needs a checkpoint manager"):
        JobRunner(job, resume_from_epoch=2).train(session)
    assert session.nodes() == []  # init_group did not run either


@pytest.mark.parametrize(
    "arguments",
    [{"save_retries": -1}, {"max_consecutive_save_failures": 0}],
)
def test_invalid_retry_settings_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(JobConfigurationError):
        JobRunner(Job(), **arguments)


@pytest.mark.parametrize("ttl", [0, -5.0, float("nan")])
def test_a_lease_time_that_is_not_positive_is_refused_before_training(ttl: float) -> None:
    with pytest.raises(JobConfigurationError, match="lease_ttl=None"):
        JobRunner(Job(), lease_ttl=ttl)


def test_an_upload_builder_that_needs_arguments_cannot_be_named() -> None:
    with pytest.raises(InvalidPluginError, match="needs arguments"):
        JobRunner(Job(), upload_task_group_builder="copy")


def test_partial_loads_need_a_multi_node_manager(tmp_path: Path) -> None:
    job, _ = build_counter_job()
    with pytest.raises(JobConfigurationError):
        JobRunner(job).load_blobs_from_checkpoints(["w"], 0, LocalSession())
    runner = JobRunner(job, CheckpointManager(str(tmp_path), NODE, "npz"))
    with pytest.raises(JobConfigurationError, match="MultiNodeCheckpointManager"):
        runner.load_blobs_from_checkpoints(["w"], 0, LocalSession())
    with pytest.raises(JobConfigurationError):
        JobRunner(job).save_checkpoints(0, LocalSession())


# -- the happy path ------------------------------------------------------------------------


def _log_and_init(ws: Workspace, *, events: list[str]) -> None:
    events.append("init")
    ws["x"] = np.zeros(1)


def test_order_of_operations(tmp_path: Path) -> None:
    events: list[str] = []

    class Handler(RecordingHandler):
        def write(self, epoch: int) -> None:
            events.append(f"commit {epoch}")

    class Upload(UploadTaskGroupBuilder):
        name = "log_upload"

        def build(self, epoch: int, checkpoint_manager: Any) -> TaskGroup:
            events.append(f"upload {epoch}")
            return TaskGroup()

    with Job() as job, Node(NODE):
        with job.init_group:
            Task(partial(_log_and_init, events=events))
        Task(lambda ws: events.append("epoch"))
    with Node(NODE):
        epoch_limiter(job, 2)
    add_end_groups(job, events)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=Handler())
    runner = JobRunner(job, manager, upload_task_group_builder=Upload())
    assert runner(LocalSession()) == 2
    assert events == [
        "init",
        "commit 0",
        "epoch",
        "commit 1",
        "epoch",
        "commit 2",
        "upload 2",
        "download",
        "exit",
    ]
    assert runner.committed_epochs == [0, 1, 2]
    assert runner.save_failures == []


def test_resume_skips_init_loads_the_epoch_and_does_not_resave_it(
    tmp_path: Path, registry: Registry
) -> None:
    job, _ = build_counter_job(epochs=4)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    reports = ReportRecorder()
    registry.register(reports)
    session = LocalSession()
    runner = JobRunner(  # rewinding re-saves committed epochs 3 and 4: on purpose
        job, MultiNodeCheckpointManager(str(tmp_path), "npz"), resume_from_epoch=2, overwrite=True
    )
    assert runner.train(session) == 4
    assert runner.committed_epochs == [3, 4]
    assert reports.actions() == ["checkpoint_load", "checkpoint_save", "checkpoint_save"]
    assert session.workspace(NODE)["trainer_0/step"].item() == 4
    assert "trainer_0/scratch" not in session.workspace(NODE)


def test_resume_from_an_epoch_that_was_never_saved_raises(tmp_path: Path) -> None:
    job, _ = build_counter_job()
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz"), resume_from_epoch=9)
    with pytest.raises(CheckpointNotFoundError):
        runner.train(LocalSession())


def test_the_handlers_last_epoch_chooses_where_to_resume(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=3)
    handler = RecordingHandler(answer=1)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=handler)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    runner = JobRunner(job, manager, resume_from_epoch=None, overwrite=True)  # 2, 3 again
    session = LocalSession()
    assert runner.train(session) == 3
    assert runner.committed_epochs == [2, 3]
    assert handler.calls[0] == (
        "set_params",
        {
            "db_prefix": str(tmp_path),
            "db_type": "npz",
            "node_names": [NODE],
            "path_prefix": None,
            "path_type": None,
            "storage": manager.location.storage,
        },
    )
    assert handler.calls[1] == ("last_epoch", None)
    assert handler.written() == [2, 3]


def test_a_json_catalog_resumes_a_rerun_by_itself(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=3)
    first = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz", "json"))
    assert first.train(LocalSession()) == 3
    again = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz", "json"))
    session = LocalSession()
    assert again.train(session) == 3  # resumed from 3: finished, nothing more runs
    assert again.already_finished
    assert again.committed_epochs == []
    assert session.workspace("trainer_0")["trainer_0/step"].item() == 3


# -- save failures -------------------------------------------------------------------------


def test_a_transient_save_failure_is_retried_and_committed(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_first(1)))
    job, _ = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, retry_backoff=0)
    assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    assert runner.save_failures == []
    assert committed_epochs(tmp_path) == [0, 1, 2]


def test_a_failing_save_is_retried_counted_reported_and_never_committed(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1)))
    reports = ReportRecorder()
    registry.register(reports)
    handler = RecordingHandler()
    job, _ = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager(
        str(tmp_path), "npz", metadata_handler=handler, path_type="failing_local"
    )
    runner = JobRunner(job, manager, save_retries=3, retry_backoff=0)
    assert runner.train(LocalSession()) == 2
    assert [failure.epoch for failure in runner.save_failures] == [1]
    error = runner.save_failures[0].error
    assert isinstance(error, SaveFailedError)
    assert error.failed_nodes == (NODE,)
    assert runner.committed_epochs == [0, 2]
    assert committed_epochs(tmp_path) == [0, 2]
    assert not [path for path in tmp_path.glob("trainer_0.1/**/*") if path.is_file()]
    # 1 + 3 retries for epoch 1; one attempt for epochs 0 and 2
    assert [epoch for call, epoch in handler.calls if call == "cp_accessible"] == [None] * 6
    assert handler.written() == [0, 2]
    expected = ["checkpoint_save", "checkpoint_save_failed", "checkpoint_save"]
    assert [action for action, _ in handler.reports] == expected
    assert reports.actions() == expected
    failed = reports.reports[1][1]
    assert list(failed) == [f"{tmp_path}/trainer_0.1"]
    stats = failed[f"{tmp_path}/trainer_0.1"]
    assert stats.action == "checkpoint_save_failed"
    assert stats.epoch == 1
    assert stats.node == NODE
    assert stats.error is not None
    assert "Connection reset" in stats.error


def test_the_job_stops_after_three_consecutive_save_failures_by_default(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(lambda key: True))
    job, _ = build_counter_job(epochs=5)
    epochs_run: list[int] = []
    with Node(NODE):
        Task(lambda ws: epochs_run.append(1), group=job.epoch_group)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, save_retries=0, retry_backoff=0)
    with pytest.raises(TooManySaveFailuresError) as info:
        runner.train(LocalSession())
    assert info.value.failures == 3
    assert isinstance(info.value.last_error, OSError)
    assert info.value.__cause__ is info.value.last_error
    assert [failure.epoch for failure in runner.save_failures] == [0, 1, 2]
    assert len(epochs_run) == 2


def test_keep_going_is_an_explicit_option(tmp_path: Path, registry: Registry) -> None:
    register_storage(registry, failing_local_path(lambda key: True))
    job, _ = build_counter_job(epochs=5)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(
        job, manager, save_retries=0, retry_backoff=0, max_consecutive_save_failures=None
    )
    assert runner.train(LocalSession()) == 5
    assert [failure.epoch for failure in runner.save_failures] == [0, 1, 2, 3, 4, 5]
    assert runner.committed_epochs == []


def test_a_successful_save_resets_the_consecutive_failure_count(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1, 3)))
    job, _ = build_counter_job(epochs=4)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, save_retries=0, max_consecutive_save_failures=2)
    assert runner.train(LocalSession()) == 4
    assert [failure.epoch for failure in runner.save_failures] == [1, 3]
    assert runner.committed_epochs == [0, 2, 4]


def test_an_inaccessible_checkpoint_directory_counts_as_a_failed_save(tmp_path: Path) -> None:
    handler = RecordingHandler(accessible=False)
    job, _ = build_counter_job(epochs=1)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=handler)
    runner = JobRunner(job, manager, save_retries=0)
    assert runner.train(LocalSession()) == 1
    assert [failure.epoch for failure in runner.save_failures] == [0, 1]
    error = runner.save_failures[0].error
    assert isinstance(error, SaveFailedError)
    assert "cannot be accessed" in str(error)
    assert handler.written() == []
    assert committed_epochs(tmp_path) == []


def test_errors_that_retrying_cannot_fix_propagate_at_once(tmp_path: Path) -> None:
    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ws.update(__names=np.array(["a", "b"])), name="init")
        epoch_limiter(job, 2)
    handler = RecordingHandler()
    manager = MultiNodeCheckpointManager(str(tmp_path), "zarr", metadata_handler=handler)
    runner = JobRunner(job, manager, save_retries=5, retry_backoff=0)
    with pytest.raises(UnsupportedBlobError, match="__names"):
        runner.train(LocalSession())
    assert [call for call, _ in handler.calls].count("cp_accessible") == 1
    assert runner.save_failures == []
    # nothing written but the writer lease, released (kept: its generation only grows)
    files = [path for path in tmp_path.rglob("*") if not path.is_dir()]
    assert files == [tmp_path / "_ckptstore" / "lease" / f"{NODE}.json"]
    assert protocol.read_lease(LocalPath(str(tmp_path)), NODE) is None


def test_a_blob_deleted_after_init_is_a_bug_in_the_job_not_a_save_failure(
    tmp_path: Path,
) -> None:
    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ws.update(a=np.zeros(1), b=np.zeros(1)))
        Task(lambda ws: ws.__delitem__("b"))
        job.add_stop_condition("a")
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz"), retry_backoff=0)
    with pytest.raises(KeyError, match="'b'"):
        runner.train(LocalSession())
    assert runner.committed_epochs == [0]


# -- upload --------------------------------------------------------------------------------


class RecordingUpload(UploadTaskGroupBuilder):
    name = "recording_upload"

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def build(self, epoch: int, checkpoint_manager: Any) -> TaskGroup:
        self.epochs.append(epoch)
        return TaskGroup()


def test_upload_runs_on_the_last_committed_epoch_when_the_final_save_failed(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_epochs(3)))
    job, _ = build_counter_job(epochs=3)
    upload = CopyUpload(str(tmp_path / "upload"))
    manager = MultiNodeCheckpointManager(str(tmp_path / "ckpt"), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, upload_task_group_builder=upload, save_retries=0)
    assert runner.train(LocalSession()) == 3
    assert runner.committed_epochs == [0, 1, 2]
    assert committed_epochs(tmp_path / "upload") == [2]


def test_nothing_is_uploaded_when_no_epoch_was_committed(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(lambda key: True))
    job, _ = build_counter_job(epochs=1)
    upload = RecordingUpload()
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, upload_task_group_builder=upload, save_retries=0)
    assert runner.train(LocalSession()) == 1
    assert upload.epochs == []


def test_a_resumed_run_whose_saves_all_fail_uploads_the_resume_epoch(
    tmp_path: Path, registry: Registry
) -> None:
    job, _ = build_counter_job(epochs=2)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    register_storage(registry, failing_local_path(lambda key: True))
    upload = RecordingUpload()
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(
        job,
        manager,
        resume_from_epoch=1,
        upload_task_group_builder=upload,
        save_retries=0,
        overwrite=True,  # a rewind: the save of the committed epoch 2 is meant (and fails)
    )
    assert runner.train(LocalSession()) == 2
    assert upload.epochs == [1]


def train_with_failing_upload(
    tmp_path: Path, upload: CopyUpload, error: type[Exception]
) -> JobRunner:
    """Train one epoch with ``upload``; check the run raises ``error`` and that the
    download and exit groups ran before it did."""
    events: list[str] = []
    job, _ = build_counter_job(epochs=1)
    add_end_groups(job, events)
    runner = JobRunner(
        job,
        MultiNodeCheckpointManager(str(tmp_path / "ckpt"), "npz"),
        upload_task_group_builder=upload,
    )
    with pytest.raises(error):
        runner.train(LocalSession())
    assert events == ["download", "exit"]
    return runner


def test_an_upload_failure_is_raised_after_download_and_exit_ran(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    upload = CopyUpload(str(blocker / "upload"))
    runner = train_with_failing_upload(tmp_path, upload, StorageError)
    assert runner.committed_epochs == [0, 1]


class CorruptThenCopy(CopyUpload):
    """Bit rot between the save and the upload: flips a byte of the final checkpoint's
    archive, then copies as usual."""

    name = "corrupt_then_copy"

    def build(self, epoch: int, checkpoint_manager: ManagerBase) -> TaskGroup:
        root = Path(checkpoint_manager.db_prefix)
        flip_byte(node_dir(root, NODE, epoch) / "blobs.npz", 100)
        return super().build(epoch, checkpoint_manager)


def test_a_corrupt_source_fails_the_upload_after_download_and_exit_ran(tmp_path: Path) -> None:
    upload = CorruptThenCopy(str(tmp_path / "upload"))
    train_with_failing_upload(tmp_path, upload, CorruptCheckpointError)
    assert committed_epochs(tmp_path / "upload") == []


def test_an_upload_builder_without_a_manager_is_an_error() -> None:
    job, _ = build_counter_job(epochs=1)
    runner = JobRunner(job, upload_task_group_builder=RecordingUpload())
    with pytest.raises(JobConfigurationError, match="needs a checkpoint manager"):
        runner.train(LocalSession())


# -- partial loads through the runner ------------------------------------------------------


def test_load_blobs_from_checkpoints_reports_even_when_it_returns_false(
    tmp_path: Path, registry: Registry
) -> None:
    reports = ReportRecorder()
    registry.register(reports)
    job, _ = build_counter_job(nodes=("trainer_0", "trainer_1"), epochs=1)
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz"))
    runner.train(LocalSession())
    session = LocalSession()
    reports.reports.clear()
    assert runner.load_blobs_from_checkpoints(["trainer_1/w"], 1, session)
    assert not runner.load_blobs_from_checkpoints(["trainer_1/w"], 7, session)
    assert reports.actions() == ["checkpoint_partial_load"] * 2
    loaded, missing = reports.reports[0][1], reports.reports[1][1]
    assert sorted(s.node for s in loaded.values()) == ["trainer_0", "trainer_1"]
    assert missing == {}  # no stale stats from the previous load
    assert session.workspace()["trainer_1/w"].tolist() == [1.0] * 4


def test_train_is_also_the_runner_call() -> None:
    job, _ = build_counter_job(epochs=2)
    session = LocalSession()
    assert JobRunner(job)(session) == 2
    assert session.workspace(NODE)["trainer_0/step"].item() == 2


# -- restoring: a damaged newest epoch, a failing handler report --------------------------


def trained(tmp_path: Path, epochs: int = 3) -> str:
    root = str(tmp_path / "ckpt")
    job, _ = build_counter_job(epochs=epochs)
    JobRunner(job, MultiNodeCheckpointManager(root, "npz", metadata_handler="json")).train(
        LocalSession()
    )
    return root


def damage_data(root: str, epoch: int) -> None:
    archive = node_dir(root, NODE, epoch) / "blobs.npz"
    manifest = protocol.open_node(LocalPath(root), NODE, epoch)
    chunk = manifest.blobs[f"{NODE}/w"].chunks[0]
    flip_byte(archive, chunk.offset)


def test_a_damaged_newest_epoch_falls_back_to_the_previous_complete_one(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    root = trained(tmp_path)
    damage_data(root, 3)
    recorder = ReportRecorder()
    registry.register(recorder, name="recorder")
    job, _ = build_counter_job(epochs=3)
    session = LocalSession()
    runner = JobRunner(job, MultiNodeCheckpointManager(root, "npz", metadata_handler="json"))
    # the catalog picks epoch 3; it is damaged, so epoch 2 is restored and one more epoch
    # runs (the limiter's counter, restored from epoch 2, allows one)
    with caplog.at_level(logging.INFO, logger="ckptstore"):
        assert runner.train(session) == 3
    assert [failure.epoch for failure in runner.restore_failures] == [3]
    assert runner.resumed_from_epoch == 2
    # the resume is a warning: it did not resume where it should have
    (resumed,) = [r for r in caplog.records if r.getMessage().startswith("Resumed from")]
    assert resumed.levelno == logging.WARNING
    assert resumed.getMessage() == (
        "Resumed from epoch 2 (epoch(s) 3 could not be restored; see above)"
    )
    assert session.workspace(NODE)[f"{NODE}/w"].tolist() == [3.0] * 4
    assert "checkpoint_load_failed" in [action for action, _ in recorder.reports]
    assert protocol.open_node(LocalPath(root), NODE, 3)  # re-saved, whole again
    assert (node_dir(root, NODE, 3) / "blobs.npz").is_file()


def test_a_fresh_start_resumes_from_no_epoch_and_a_rerun_says_where_it_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job, _ = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(job, manager)
    assert runner.resumed_from_epoch is None  # before train()
    assert runner.train(LocalSession()) == 2
    assert runner.resumed_from_epoch is None  # started from scratch
    longer, _ = build_counter_job(epochs=4)
    rerun = JobRunner(longer, MultiNodeCheckpointManager(str(tmp_path), "npz", "json"))
    with caplog.at_level(logging.INFO, logger="ckptstore"):
        assert rerun.train(LocalSession()) == 4
    assert rerun.resumed_from_epoch == 2
    resumed = [r for r in caplog.records if r.getMessage() == "Resumed from epoch 2"]
    assert [r.levelno for r in resumed] == [logging.INFO]  # nothing wrong: no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_damaged_epoch_the_user_asked_for_is_an_error(tmp_path: Path) -> None:
    root = trained(tmp_path)
    damage_data(root, 2)
    job, _ = build_counter_job(epochs=3)
    runner = JobRunner(job, MultiNodeCheckpointManager(root, "npz"), resume_from_epoch=2)
    with pytest.raises(CorruptCheckpointError, match="blob 'trainer_0/w'"):
        runner.train(LocalSession())


def test_with_no_intact_epoch_left_the_damage_is_raised(tmp_path: Path) -> None:
    root = trained(tmp_path, epochs=1)
    damage_data(root, 0)
    damage_data(root, 1)
    job, _ = build_counter_job(epochs=1)
    with pytest.raises(CorruptCheckpointError):
        JobRunner(job, MultiNodeCheckpointManager(root, "npz", metadata_handler="json")).train(
            LocalSession()
        )


class ReportFailingHandler(RecordingHandler):
    name = "report_failing"

    def report(self, action_name: str, stats: Any) -> None:
        raise RuntimeError("the reporting backend is down")


def test_a_handler_whose_report_fails_does_not_stop_the_job(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=2)
    handler = ReportFailingHandler()
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=handler)
    runner = JobRunner(job, manager)
    assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    assert handler.written() == [0, 1, 2]


class FlakyCatalogHandler(RecordingHandler):
    """A catalog whose write of ``flaky`` times out once (a busy database, a slow disk)."""

    name = "flaky_catalog"

    def __init__(self, flaky: int) -> None:
        super().__init__()
        self.flaky = flaky

    def write(self, epoch: int) -> None:
        super().write(epoch)
        if epoch == self.flaky and self.written().count(epoch) == 1:
            raise TimeoutError("the catalog database is busy")


def test_a_catalog_write_that_fails_once_is_retried_alone_after_the_commit(
    tmp_path: Path,
) -> None:
    """The epoch is committed before the catalog is written: a retry writes the catalog
    entry again, and never saves the committed epoch again (which write-once refuses)."""
    job, _ = build_counter_job(epochs=2)
    handler = FlakyCatalogHandler(flaky=1)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=handler)
    runner = JobRunner(job, manager, save_retries=2, retry_backoff=0)
    assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    assert runner.save_failures == []
    assert handler.written() == [0, 1, 1, 2]  # epoch 1's entry written a second time


# -- never start over committed epochs by accident ---------------------------------------


def test_a_job_without_a_handler_resumes_from_storage_instead_of_starting_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job, _ = build_counter_job(nodes=("trainer_0",), epochs=2)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    commit = tmp_path / "_ckptstore" / "epoch-2" / "trainer_0.commit.json"
    before = commit.read_bytes()
    again, _ = build_counter_job(nodes=("trainer_0",), epochs=3)
    runner = JobRunner(again, MultiNodeCheckpointManager(str(tmp_path), "npz"))
    with caplog.at_level(logging.INFO, logger="ckptstore"):
        runner.train(LocalSession())  # storage is the truth: it resumes after epoch 2
    assert runner.committed_epochs == [3]  # it did not start from scratch
    assert runner.resumed_from_epoch == 2
    assert commit.read_bytes() == before  # nothing was overwritten
    # without a catalog, resuming from the commit records is the normal path: said
    # (at INFO, as every resume is), not warned about (no catalog can be behind)
    resumed = [r for r in caplog.records if r.getMessage() == "Resumed from epoch 2"]
    assert [r.levelno for r in resumed] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class LosingHandler:
    """A user's duck-typed handler that never heard about ``lost``'s commit (a crash
    between the commit and its update): its ``last_epoch`` lags behind storage."""

    def __init__(self, lost: int) -> None:
        self.lost = lost
        self.writes: list[int] = []

    def set_params(self, *args: object, **kwargs: object) -> None:
        pass

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        known = [epoch for epoch in self.writes if epoch != self.lost]
        return user_epoch if user_epoch is not None else max(known, default=None)

    def write(self, epoch: int) -> None:
        self.writes.append(epoch)

    def cp_accessible(self, epoch: int | None = None) -> bool:
        return True


def test_a_handler_behind_storage_resumes_from_the_newest_committed_epoch_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A third-party handler that lost the last commit never makes a rerun save that
    epoch again: the runner catches up with the commit records, and says so."""
    handler = LosingHandler(lost=3)
    job, _ = build_counter_job(epochs=3)
    first = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz", handler))
    assert first.train(LocalSession()) == 3
    assert handler.last_epoch() == 2  # the handler is one epoch behind storage
    commit = tmp_path / "_ckptstore" / "epoch-3" / f"{NODE}.commit.json"
    before = commit.read_bytes()
    longer, _ = build_counter_job(epochs=5)
    rerun = JobRunner(longer, MultiNodeCheckpointManager(str(tmp_path), "npz", handler))
    session = LocalSession()
    with caplog.at_level(logging.WARNING, logger="ckptstore"):
        assert rerun.train(session) == 5
    assert "The catalog is behind storage: epoch 3 is committed on every node" in caplog.text
    assert "Resumed from epoch 3 (the catalog did not know epoch 3; see above)" in caplog.text
    assert rerun.resumed_from_epoch == 3
    assert rerun.committed_epochs == [4, 5]  # resumed after epoch 3, not after 2
    assert handler.writes == [0, 1, 2, 3, 4, 5]  # epoch 3 was never saved again
    assert commit.read_bytes() == before
    assert session.workspace(NODE)[f"{NODE}/step"].item() == 5


def test_overwrite_true_starts_over_on_purpose(tmp_path: Path) -> None:
    job, _ = build_counter_job(nodes=("trainer_0",), epochs=2)
    JobRunner(job, CheckpointManager(str(tmp_path), "trainer_0", "npz")).train(LocalSession())
    again, _ = build_counter_job(nodes=("trainer_0",), epochs=1)
    manager = CheckpointManager(str(tmp_path), "trainer_0", "npz")
    runner = JobRunner(again, manager, overwrite=True)
    assert runner.train(LocalSession()) == 1
    assert runner.committed_epochs == [0, 1]


def test_a_job_with_other_nodes_may_start_on_a_shared_prefix(tmp_path: Path) -> None:
    job, _ = build_counter_job(nodes=("trainer_0",), epochs=2)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    other, _ = build_counter_job(nodes=("trainer_1",), epochs=1)
    runner = JobRunner(other, MultiNodeCheckpointManager(str(tmp_path), "npz"))
    assert runner.train(LocalSession()) == 1
    assert runner.committed_epochs == [0, 1]
