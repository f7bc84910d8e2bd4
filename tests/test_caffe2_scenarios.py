"""Caffe2's checkpoint_test.py, test by test, with its original numbers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import zarr
from caffe2_pipeline import EXPECTED_TOTALS, build_download_job, build_pipeline, total_fetcher
from ckpt_helpers import node_dir

from ckptstore import (
    CheckpointManager,
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    TaskGroup,
    UploadTaskGroupBuilder,
    Workspace,
    db_name,
)
from ckptstore.checkpoint._manager import ManagerBase
from ckptstore.errors import StorageNotWritableError
from ckptstore.execution import WorkspaceType

Builder = Callable[[], tuple[LocalSession, ManagerBase]]
FORMATS = ["zarr", "npz"]


@pytest.fixture(params=FORMATS)
def db_type(request: pytest.FixtureRequest) -> str:
    """Every scenario runs once per built-in DB type."""
    return str(request.param)


def fetch_total(session: LocalSession, fetcher: Task) -> int:
    session.run(fetcher)
    return int(fetcher.outputs()[0].fetch()[0])


def run_with(builder: Builder) -> None:
    with Job() as job:
        build_pipeline(0)
    fetcher = total_fetcher(0)
    job.compile(LocalSession)

    session, manager = builder()
    assert JobRunner(job, manager).train(session) == 4
    assert fetch_total(session, fetcher) == 145

    for epoch in range(1, 5):  # a rewind re-saves committed epochs: on purpose, so overwrite
        session, manager = builder()
        JobRunner(job, manager, resume_from_epoch=epoch, overwrite=True).train(session)
        assert fetch_total(session, fetcher) == 145

    for epoch in range(1, 5):
        session.run(manager.load(epoch))
        assert fetch_total(session, fetcher) == EXPECTED_TOTALS[epoch - 1]


def test_single_checkpoint_with_single_node_manager(tmp_path: Path, db_type: str) -> None:
    run_with(lambda: (LocalSession(), CheckpointManager(str(tmp_path), "temp_node", db_type)))
    for epoch in range(5):  # files are named after the manager's node, not the job's
        assert (tmp_path / f"temp_node.{epoch}").is_dir()
    assert not list(tmp_path.glob("trainer_0.*"))


def test_single_checkpoint_with_multi_node_manager(tmp_path: Path, db_type: str) -> None:
    run_with(lambda: (LocalSession(), MultiNodeCheckpointManager(str(tmp_path), db_type)))
    assert sorted(p.name for p in tmp_path.glob("trainer_0.*")) == [
        f"trainer_0.{epoch}"
        for epoch in range(6)  # resume from 4 ran and saved epoch 5
    ]


def read_without_ckptstore(db_path: Path, db_type: str, blob: str) -> np.ndarray:
    """Read a blob with the format's own library only (zarr or numpy)."""
    if db_type == "zarr":
        store = zarr.storage.ZipStore(str(db_path / "blobs.zarr.zip"), mode="r")
        return np.asarray(zarr.open_group(store, mode="r")[blob][...])
    with np.load(db_path / "blobs.npz", allow_pickle=False) as npz:
        return np.asarray(npz[blob])


def test_checkpoint_k_holds_the_total_after_epoch_k(tmp_path: Path, db_type: str) -> None:
    with Job() as job:
        build_pipeline(0)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), db_type)).train(LocalSession())
    for epoch, expected in enumerate([100, *EXPECTED_TOTALS]):
        where = node_dir(tmp_path, "trainer_0", epoch)  # the attempt its commit record names
        total = read_without_ckptstore(where, db_type, "trainer_0/total")
        assert total.tolist() == [expected]


def test_resume_from_4_runs_one_more_epoch(tmp_path: Path, db_type: str) -> None:
    with Job() as job:
        build_pipeline(0)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), db_type)).train(LocalSession())
    session = LocalSession()
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), db_type), resume_from_epoch=4)
    assert runner.train(session) == 5
    assert session.workspace("trainer_0")["trainer_0/total"].tolist() == [145]


def test_ckpt_name_and_load_model_from_ckpts(tmp_path: Path, db_type: str) -> None:
    with Job() as job:
        for node_id in range(3):
            build_pipeline(node_id)
    job.compile(LocalSession)
    names_dir = tmp_path / "names"
    manager = MultiNodeCheckpointManager(str(names_dir), db_type)
    manager.init(job.nodes_to_checkpoint())
    for node_id in range(3):
        assert (
            manager.get_ckpt_db_name(f"trainer_{node_id}", 5) == f"{names_dir}/trainer_{node_id}.5"
        )

    ckpt_dir = str(tmp_path / "ckpt")
    for node_id in range(3):
        session = LocalSession()
        with Job() as node_job:
            build_pipeline(node_id)
        node_job.compile(LocalSession)
        assert (
            JobRunner(node_job, MultiNodeCheckpointManager(ckpt_dir, db_type)).train(session) == 4
        )
        # only the state init created is checkpointed, plus the epoch's declared output
        node = f"trainer_{node_id}"
        assert sorted(session.workspace(node)) == [
            f"{node}/cursor",
            f"{node}/data_finished",
            f"{node}/dataset",
            f"{node}/total",
        ]

    session = LocalSession()
    assert len(session.workspace()) == 0
    with Job() as job:
        for node_id in range(3):
            build_pipeline(node_id)
    job.compile(LocalSession)
    manager = MultiNodeCheckpointManager(ckpt_dir, db_type)
    runner = JobRunner(job, manager)
    model_blob_names = ["trainer_1/total", "trainer_2/total"]
    for epoch in range(1, 5):
        assert runner.load_blobs_from_checkpoints(model_blob_names, epoch, session)
        workspace = session.workspace()  # they land on the current node ("local")
        for name in model_blob_names:
            assert name in workspace
            assert np.array_equal(workspace[name], np.array([EXPECTED_TOTALS[epoch - 1]]))
    assert not runner.load_blobs_from_checkpoints(model_blob_names, 5, session)


class UploadToLocalFile(UploadTaskGroupBuilder):
    """The Caffe2 test double: copy each node's final checkpoint to dest/<node>."""

    name = "upload_to_local_file"

    def __init__(self, dest_dir: str) -> None:
        self.dest_dir = dest_dir

    def build(self, epoch: int, checkpoint_manager: ManagerBase) -> TaskGroup:
        assert isinstance(checkpoint_manager, MultiNodeCheckpointManager)
        group = TaskGroup(WorkspaceType.GLOBAL)
        for node, manager in checkpoint_manager.node_managers():
            source = db_name(epoch, manager.node_name, manager.db_prefix)
            with Node(node), group:
                Task(partial(_copy_tree, source, os.path.join(self.dest_dir, node)))
        return group


def _copy_tree(source: str, dest: str, ws: Workspace) -> None:
    shutil.copytree(source, dest)


def test_upload_checkpoint(tmp_path: Path, db_type: str) -> None:
    upload_dir = tmp_path / "upload"
    for node_id in range(3):
        assert not (upload_dir / f"trainer_{node_id}").exists()
    ckpt_dir = str(tmp_path / "ckpt")
    for node_id in range(3):
        with Job() as job:
            build_pipeline(node_id)
        job.compile(LocalSession)
        runner = JobRunner(
            job,
            MultiNodeCheckpointManager(ckpt_dir, db_type),
            upload_task_group_builder=UploadToLocalFile(str(upload_dir)),
        )
        assert runner.train(LocalSession()) == 4
    for node_id in range(3):
        uploaded = upload_dir / f"trainer_{node_id}"
        original = Path(ckpt_dir) / f"trainer_{node_id}.4"
        assert uploaded.is_dir()
        files = [path for path in original.rglob("*") if path.is_file()]
        assert files
        for file in files:
            assert (uploaded / file.relative_to(original)).read_bytes() == file.read_bytes()


def test_ckpt_save_failure(tmp_path: Path, db_type: str) -> None:
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("a file where the checkpoint directory should be")
    for node_id in range(3):
        with Job() as job:
            build_pipeline(node_id)
        job.compile(LocalSession)
        manager = MultiNodeCheckpointManager(str(blocker / "ckpt"), db_type)
        runner = JobRunner(job, manager, retry_backoff=0)
        # Caffe2 logged and trained on without checkpoints; ckptstore stops at once: a
        # directory that cannot be created is not fixed by retrying
        with pytest.raises(StorageNotWritableError, match="could not create the checkpoint"):
            runner.train(LocalSession())
        assert runner.save_failures == []
        assert runner.committed_epochs == []


def test_download_group_simple() -> None:
    session = LocalSession()
    JobRunner(build_download_job()).train(session)
    workspace = session.workspace("trainer:0")
    expected = np.full(8, 2.0, dtype=np.float32)
    assert np.array_equal(workspace["output"], expected)
    assert np.array_equal(workspace["download_result"], expected)
    assert workspace["download_result"].dtype == np.float32


def test_reuse_checkpoint_manager(tmp_path: Path, db_type: str) -> None:
    session = LocalSession()
    manager = MultiNodeCheckpointManager(str(tmp_path), db_type)
    with Job() as job:
        build_pipeline(0)
    fetcher = total_fetcher(0)
    job.compile(LocalSession)
    assert JobRunner(job, manager).train(session) == 4
    for epoch in range(1, 5):  # rewinding re-saves committed epochs: on purpose
        JobRunner(job, manager, resume_from_epoch=epoch, overwrite=True).train(session)
        assert fetch_total(session, fetcher) == 145


@pytest.mark.parametrize("epoch", [1, 2, 3])
def test_resume_into_an_empty_workspace_restores_the_cursor(
    tmp_path: Path, db_type: str, epoch: int
) -> None:
    with Job() as job:
        build_pipeline(0)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), db_type)).train(LocalSession())
    session = LocalSession()
    JobRunner(  # rewinding re-saves the later, committed epochs: on purpose
        job,
        MultiNodeCheckpointManager(str(tmp_path), db_type),
        resume_from_epoch=epoch,
        overwrite=True,
    ).train(session)
    workspace = session.workspace("trainer_0")
    assert workspace["trainer_0/cursor"].item() == 10
    assert workspace["trainer_0/total"].tolist() == [145]
