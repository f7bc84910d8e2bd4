"""CheckpointManager: the single-node API with Caffe2's names and call shapes."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import (
    RecordingHandler,
    ReportRecorder,
    failing_local_path,
    node_dir,
    register_storage,
)

from ckptstore import (
    CheckpointManager,
    CheckpointNotFoundError,
    JobConfigurationError,
    LocalSession,
    Node,
    protocol,
)
from ckptstore.builtin import NpzDB
from ckptstore.errors import BlobNotFoundError, NotRunError, SaveFailedError, UnknownPluginError
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.plugin import Caffe2Handler
from ckptstore.plugin._registry import Registry

NODE = "trainer_0"


def session_with(blobs: dict[str, Any], node: str = NODE) -> LocalSession:
    session = LocalSession()
    workspace = session.workspace(node)
    for name, value in blobs.items():
        workspace[name] = value
    return session


def initialised(
    tmp_path: Path, blobs: dict[str, Any], **kwargs: Any
) -> tuple[LocalSession, CheckpointManager]:
    session = session_with(blobs)
    manager = CheckpointManager(str(tmp_path), NODE, kwargs.pop("db_type", "npz"), **kwargs)
    session.run(manager.init([NODE]))
    return session, manager


def test_init_checkpoints_one_node_only(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), NODE, "npz")
    with pytest.raises(JobConfigurationError, match="MultiNodeCheckpointManager"):
        manager.init(["trainer_0", "trainer_1"])
    task = manager.init(["trainer_0"])
    assert task.node == "trainer_0"
    with pytest.raises(JobConfigurationError):
        manager.init([])
    with Node("elsewhere"):
        assert manager.init().node == "elsewhere"


def test_blob_list_needs_init_and_its_task_to_have_run(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), NODE, "npz")
    with pytest.raises(JobConfigurationError, match="init"):
        manager.blob_list()
    with pytest.raises(JobConfigurationError):
        manager.save(1)
    manager.init([NODE])
    with pytest.raises(NotRunError, match="has not run yet"):
        manager.blob_list()


def test_init_lists_the_workspace_sorted_at_the_time_it_runs(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"b": [1], "a": [2]})
    session.workspace(NODE)["created_later"] = np.zeros(1)
    assert manager.blob_list() == ["a", "b"]


def test_save_then_load_restores_the_listed_blobs_in_place(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"w": np.arange(4.0), "step": np.array(3)})
    session.run(manager.save(1))
    assert (node_dir(tmp_path, "trainer_0", 1) / "blobs.npz").is_file()
    assert protocol.committed_nodes(manager.location.storage, 1) == {NODE}
    ws = session.workspace(NODE)
    ws["w"] = np.zeros(4)
    ws["step"] = np.array(9)
    session.run(manager.load(1))
    assert ws["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ws["step"].item() == 3


def test_checkpoint_files_are_named_after_the_managers_node(tmp_path: Path) -> None:
    session = session_with({"x": [1]}, node="job_node")
    manager = CheckpointManager(str(tmp_path), "temp_node", "npz")
    session.run(manager.init(["job_node"]))
    session.run(manager.save(0))
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("_")] == ["temp_node.0"]
    assert manager.get_ckpt_db_name("temp_node", 0) == f"{tmp_path}/temp_node.0"
    assert manager.get_ckpt_db_name("job_node", 0) is None


def test_init_from_an_epoch_lists_the_checkpoints_blobs(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"a": [1], "b": [2]})
    session.run(manager.save(3))
    fresh = LocalSession()
    other = CheckpointManager(str(tmp_path), NODE, "npz")
    fresh.run(other.init([NODE], retrieve_from_epoch=3))
    assert other.blob_list() == ["a", "b"]
    fresh.run(other.load(3))
    assert sorted(fresh.workspace(NODE)) == ["a", "b"]
    with pytest.raises(CheckpointNotFoundError):
        fresh.run(other.init([NODE], retrieve_from_epoch=4))


def test_check_db_exists_is_true_only_for_committed_epochs(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"a": [1]})
    session.run(manager.save(1))
    exists = manager.check_db_exists(1)
    absent = manager.check_db_exists(2)
    session.run(exists)
    session.run(absent)
    assert exists.outputs()[0].fetch() is True
    assert absent.outputs()[0].fetch() is False


def test_load_of_a_missing_epoch_raises_file_not_found(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"a": [1]})
    with pytest.raises(CheckpointNotFoundError) as info:
        session.run(manager.load(5))
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.epoch == 5
    assert info.value.node == NODE


def test_load_blobs_from_checkpoint_lands_on_the_current_node(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"a": [1], "b": [2]})
    session.run(manager.save(1))
    with Node("reader"):
        task = manager.load_blobs_from_checkpoint(["b"], 1)
    session.run(task)
    assert sorted(session.workspace("reader")) == ["b"]
    with Node("reader"):
        missing = manager.load_blobs_from_checkpoint(["b", "nowhere"], 1)
    with pytest.raises(BlobNotFoundError, match="nowhere"):
        session.run(missing)


def test_a_blob_listed_at_init_must_exist_at_save(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path, {"a": [1], "b": [2]})
    del session.workspace(NODE)["b"]
    with pytest.raises(BlobNotFoundError, match="'b'"):
        session.run(manager.save(1))
    assert protocol.read_commit(manager.location.storage, 1) is None


def test_a_single_node_save_that_fails_midway_raises_save_failed_and_leaves_nothing(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(lambda key: "/late/" in key))
    blobs = {"ok": np.zeros(3), "late": np.ones(2)}  # the connection drops writing "late"
    # compressed zarr writes a file per chunk, so the failure lands after "ok" was written
    session, manager = initialised(
        tmp_path, blobs, db_type=ZarrDB(compression="zstd"), path_type="failing_local"
    )
    with pytest.raises(SaveFailedError) as info:
        session.run(manager.save(1))
    assert info.value.failed_nodes == (NODE,)
    assert info.value.epoch == 1
    assert "Connection reset" in str(info.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing stored


def test_db_types_are_given_by_name_or_instance(tmp_path: Path) -> None:
    assert isinstance(CheckpointManager(str(tmp_path), NODE, "npz").db_type, NpzDB)
    zarr = ZarrDB(compression="zstd")
    assert CheckpointManager(str(tmp_path), NODE, zarr).db_type is zarr
    assert isinstance(CheckpointManager(str(tmp_path), NODE).db_type, ZarrDB)
    with pytest.raises(UnknownPluginError, match=r"installed: .*npz"):
        CheckpointManager(str(tmp_path), NODE, "minidb")
    assert "trainer_0" in repr(CheckpointManager(str(tmp_path), NODE, "npz"))


# -- stats -----------------------------------------------------------------------------------


def test_stats_reach_the_handler_and_the_hook_with_the_action_name(
    tmp_path: Path, registry: Registry
) -> None:
    reports = ReportRecorder()
    registry.register(reports)
    handler = RecordingHandler()
    session, manager = initialised(
        tmp_path, {"w": np.zeros(8, dtype=np.float32)}, metadata_handler=handler
    )
    session.run(manager.save(2))
    manager.report_checkpoint_stats("checkpoint_save")
    session.run(manager.load(2))
    manager.report_checkpoint_stats("checkpoint_load")
    with Node("other"):
        session.run(manager.load_blobs_from_checkpoint(["w"], 2))
    manager.report_checkpoint_stats("checkpoint_partial_load")
    expected = ["checkpoint_save", "checkpoint_load", "checkpoint_partial_load"]
    assert [action for action, _ in handler.reports] == expected
    assert reports.actions() == expected
    path = f"{tmp_path}/trainer_0.2"
    for (action, stats), (_, hooked) in zip(handler.reports, reports.reports, strict=True):
        assert stats == hooked
        assert list(stats) == [path]
        node_stats = stats[path]
        assert node_stats.action == action
        assert (node_stats.node, node_stats.epoch, node_stats.db_path) == (NODE, 2, path)
        assert node_stats.nbytes == 32
        assert node_stats.nblobs == 1
        assert node_stats.blobs == ("w",)
        assert node_stats.duration_ns > 0
    assert handler.reports[0][1][path].stored_bytes > 32


def test_an_operation_that_did_not_run_reports_no_stale_stats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)  # a Dask cluster of an earlier test may have raised it
    handler = RecordingHandler()
    session, manager = initialised(tmp_path, {"w": np.zeros(2)}, metadata_handler=handler)
    session.run(manager.save(1))
    manager.report_checkpoint_stats("checkpoint_save")
    with pytest.raises(CheckpointNotFoundError):
        session.run(manager.load(7))
    manager.report_checkpoint_stats("checkpoint_load")
    assert handler.reports[1] == ("checkpoint_load", {})
    assert "Failed to collect checkpoint stats" in caplog.text


def test_no_handler_means_hook_only(tmp_path: Path, registry: Registry) -> None:
    reports = ReportRecorder()
    registry.register(reports)
    session, manager = initialised(tmp_path, {"w": np.zeros(2)})
    session.run(manager.save(1))
    manager.report_checkpoint_stats("checkpoint_save")
    manager.write_checkpoint_metadata(1)  # no handler: nothing to do
    assert reports.actions() == ["checkpoint_save"]


# -- the metadata handler protocol -----------------------------------------------------------


def test_handler_calls_and_arguments(tmp_path: Path) -> None:
    handler = RecordingHandler(answer=None)
    manager = CheckpointManager(str(tmp_path), NODE, "npz", metadata_handler=handler)
    assert manager.metadata_handler is handler
    manager.set_params(["ignored_a", "ignored_b"], path_prefix="/elsewhere")
    assert handler.calls[0][1]["node_names"] == [NODE]
    assert handler.calls[0][1]["path_prefix"] == "/elsewhere"
    assert handler.node_names == [NODE]
    assert handler.storage is manager.location.storage
    assert manager.get_resume_from_epoch_id(3) is None  # the handler's answer wins
    manager.write_checkpoint_metadata(4)
    assert manager.cp_accessible() is True
    assert handler.calls[1:] == [("last_epoch", 3), ("write", 4), ("cp_accessible", None)]
    handler.accessible = False
    assert manager.cp_accessible(epoch=5) is False
    assert handler.calls[-1] == ("cp_accessible", 5)


class Caffe2StyleHandler:
    """A duck-typed handler written for Caffe2: no base class, no ``storage``."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}

    def set_params(self, **kwargs: Any) -> None:
        self.params = kwargs

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        return 7

    def cp_accessible(self, epoch: int | None) -> bool:
        return True

    def write(self, epoch: int) -> None:
        pass


def test_a_duck_typed_caffe2_handler_gets_caffe2_arguments(tmp_path: Path) -> None:
    handler = Caffe2StyleHandler()
    manager = CheckpointManager(str(tmp_path), NODE, "npz", metadata_handler=handler)
    manager.set_params([NODE])
    assert handler.params == {
        "db_prefix": str(tmp_path),
        "db_type": "npz",
        "node_names": [NODE],
        "path_prefix": None,
        "path_type": None,
    }
    assert manager.get_resume_from_epoch_id(None) == 7
    manager.report_checkpoint_stats("checkpoint_save")  # no report method: skipped
    wrapped = manager.metadata_handler
    assert isinstance(wrapped, Caffe2Handler)  # one contract inside the managers
    assert wrapped.handler is handler
    wrapped.forget([3])  # no forget method: nothing to drop


def test_without_handler_the_users_epoch_and_the_storage_decide(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path / "new"), NODE, "npz")
    assert manager.get_resume_from_epoch_id(None) is None
    assert manager.get_resume_from_epoch_id(3) == 3
    assert manager.cp_accessible() is True
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert CheckpointManager(str(blocker / "x"), NODE, "npz").cp_accessible() is False


# -- reading from another prefix -------------------------------------------------------------


def test_load_from_another_prefix_with_path_prefix(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path / "main", {"w": np.arange(3.0)})
    session.run(manager.save(1))
    shutil.copytree(tmp_path / "main", tmp_path / "copy")
    session.workspace(NODE)["w"] = np.zeros(3)
    manager.overwrite = True  # replacing committed epoch 1 on purpose
    session.run(manager.save(1))  # the main prefix now holds zeros
    session.run(manager.load(1, path_prefix=str(tmp_path / "copy")))
    assert session.workspace(NODE)["w"].tolist() == [0.0, 1.0, 2.0]
    session.run(manager.load(1))
    assert session.workspace(NODE)["w"].tolist() == [0.0, 0.0, 0.0]


def test_set_params_path_prefix_redirects_reads_but_not_saves(tmp_path: Path) -> None:
    session, manager = initialised(tmp_path / "main", {"w": np.arange(3.0)})
    session.run(manager.save(1))
    shutil.copytree(tmp_path / "main", tmp_path / "copy")
    shutil.rmtree(tmp_path / "main")
    manager.set_params([NODE], path_prefix=str(tmp_path / "copy"))
    session.workspace(NODE)["w"] = np.zeros(3)
    session.run(manager.load(1))
    assert session.workspace(NODE)["w"].tolist() == [0.0, 1.0, 2.0]
    session.run(manager.save(2))
    assert (node_dir(tmp_path / "main", "trainer_0", 2)).is_dir()
    assert not (tmp_path / "copy" / "trainer_0.2").exists()


def test_the_workspace_saved_is_the_node_given_to_init(tmp_path: Path) -> None:
    session = LocalSession()
    session.workspace("a")["only_a"] = np.zeros(1)
    session.workspace("b")["only_b"] = np.zeros(1)
    manager = CheckpointManager(str(tmp_path), "a", "npz")
    with Node("b"):
        session.run(manager.init(["a"]))
        save = manager.save(1)
    assert save.node == "a"
    session.run(save)
    assert manager.blob_list() == ["only_a"]
    loaded = LocalSession()
    loaded.run(manager.load_blobs_from_checkpoint(["only_a"], 1))
    assert list(loaded.workspace("local")) == ["only_a"]
