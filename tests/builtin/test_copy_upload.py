"""The ``copy`` upload builder: a second checkpoint tier, restorable with
``manager.load(epoch, path_prefix=...)``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from ckpt_helpers import (
    build_counter_job,
    data_key,
    files_under,
    flip_byte,
    memory_keys,
    memory_root,
    node_dir,
)

from ckptstore import (
    AlreadyCommittedError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    protocol,
)
from ckptstore.builtin import CopyUpload, FsspecPath, LocalPath
from ckptstore.plugin._path_type import PathType

NODES = ("trainer_0", "trainer_1")
FORMATS = ["npz", "zarr"]


@pytest.fixture(params=["local", "memory"])
def dest(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The upload tier: another local directory, or a memory:// bucket."""
    if request.param == "local":
        yield str(tmp_path / "upload")
    else:
        with memory_root("upload") as url:
            yield url


def open_dest(url: str) -> PathType:
    return FsspecPath(url) if url.startswith("memory://") else LocalPath(url)


def train_with_upload(source: Path, dest: str, db_type: str) -> MultiNodeCheckpointManager:
    job, _ = build_counter_job(nodes=NODES, epochs=3)
    manager = MultiNodeCheckpointManager(str(source), db_type)
    runner = JobRunner(job, manager, upload_task_group_builder=CopyUpload(dest))
    assert runner.train(LocalSession()) == 3
    return manager


@pytest.mark.parametrize("db_type", FORMATS)
def test_the_final_epoch_is_copied_and_committed_in_the_upload_tier(
    tmp_path: Path, dest: str, db_type: str
) -> None:
    source = tmp_path / "ckpt"
    train_with_upload(source, dest, db_type)
    target = open_dest(dest)
    record = protocol.read_commit(target, 3)
    assert record is not None
    assert sorted(record.nodes) == list(NODES)
    assert [e for e in range(4) if protocol.read_commit(target, e)] == [3]
    source_record = protocol.read_commit(LocalPath(str(source)), 3)
    assert source_record is not None
    for node in NODES:
        assert record.nodes[node].manifest_crc32c == source_record.nodes[node].manifest_crc32c
        origin, copy = source_record.nodes[node].data_key, record.nodes[node].data_key
        for name in files_under(source / origin):
            assert target.read_bytes(f"{copy}/{name}") == (source / origin / name).read_bytes()
    if isinstance(target, FsspecPath):  # one attempt per node: the copy's own
        assert {key.split("/")[1] for key in memory_keys(dest) if ".3/" in key} == {
            record.nodes[node].data_key.split("/")[1] for node in NODES
        }


@pytest.mark.parametrize("db_type", FORMATS)
def test_restore_from_the_upload_tier(tmp_path: Path, dest: str, db_type: str) -> None:
    source = tmp_path / "ckpt"
    train_with_upload(source, dest, db_type)
    shutil.rmtree(source)  # the first tier is lost
    manager = MultiNodeCheckpointManager(str(source), db_type)
    session = LocalSession()
    session.run(manager.init(list(NODES), retrieve_from_epoch=3, path_prefix=dest))
    session.run(manager.load(3, path_prefix=dest))
    for node in NODES:
        ws = session.workspace(node)
        assert ws[f"{node}/w"].tolist() == [3.0] * 4
        assert ws[f"{node}/step"].item() == 3


def test_a_corrupt_source_chunk_aborts_the_copy_without_committing(
    tmp_path: Path, dest: str
) -> None:
    source = tmp_path / "ckpt"
    job, _ = build_counter_job(nodes=NODES, epochs=1)
    manager = MultiNodeCheckpointManager(str(source), "zarr")
    JobRunner(job, manager).train(LocalSession())
    chunk = protocol.open_node(LocalPath(str(source)), "trainer_1", 1).blobs["trainer_1/w"]
    flip_byte(node_dir(source, "trainer_1", 1) / "blobs.zarr.zip", chunk.chunks[0].offset + 3)
    upload = CopyUpload(dest)
    with pytest.raises(CorruptCheckpointError) as info:
        LocalSession().run(upload.build(1, manager))
    assert info.value.file is not None
    assert info.value.file == f"{data_key(LocalPath(str(source)), 'trainer_1', 1)}/blobs.zarr.zip"
    target = open_dest(dest)
    assert protocol.read_commit(target, 1) is None
    keys = memory_keys(dest) if dest.startswith("memory://") else files_under(Path(dest))
    assert not any(key.startswith("trainer_1.1/") for key in keys), keys  # attempt deleted


def test_a_corrupt_archive_aborts_the_streamed_copy(tmp_path: Path) -> None:
    source = tmp_path / "ckpt"
    job, _ = build_counter_job(nodes=NODES, epochs=1)
    manager = MultiNodeCheckpointManager(str(source), "npz")
    JobRunner(job, manager).train(LocalSession())
    flip_byte(node_dir(source, "trainer_0", 1) / "blobs.npz", 10)  # a zip header byte
    dest = tmp_path / "upload"
    with pytest.raises(CorruptCheckpointError, match="differs from the one recorded"):
        LocalSession().run(CopyUpload(str(dest)).build(1, manager))
    assert protocol.read_commit(LocalPath(str(dest)), 1) is None
    assert files_under(dest / "trainer_0.1") == []


def test_uploading_an_uncommitted_epoch_fails(tmp_path: Path) -> None:
    job, _ = build_counter_job(nodes=NODES, epochs=1)
    manager = MultiNodeCheckpointManager(str(tmp_path / "ckpt"), "npz")
    JobRunner(job, manager).train(LocalSession())
    with pytest.raises(CheckpointNotFoundError):
        LocalSession().run(CopyUpload(str(tmp_path / "up")).build(5, manager))


def _attempts(root: Path) -> dict[str, str | None]:
    record = protocol.read_commit(LocalPath(str(root)), 1, NODES)
    assert record is not None
    return {node: commit.attempt for node, commit in record.nodes.items()}


def _uploaded_once(tmp_path: Path) -> tuple[MultiNodeCheckpointManager, CopyUpload, Path]:
    """A one-epoch job's manager, its epoch uploaded once, and the destination."""
    dest = tmp_path / "upload"
    job, _ = build_counter_job(nodes=NODES, epochs=1)
    manager = MultiNodeCheckpointManager(str(tmp_path / "ckpt"), "npz")
    JobRunner(job, manager).train(LocalSession())
    upload = CopyUpload(str(dest))
    LocalSession().run(upload.build(1, manager))
    return manager, upload, dest


def test_a_reupload_of_the_same_epoch_changes_nothing(tmp_path: Path) -> None:
    manager, upload, dest = _uploaded_once(tmp_path)
    first = _attempts(dest)
    LocalSession().run(upload.build(1, manager))
    assert _attempts(dest) == first  # nothing retracted, nothing written again
    assert sorted(p.name for p in dest.iterdir()) == ["_ckptstore", "trainer_0.1", "trainer_1.1"]


def test_an_interrupted_upload_resumes_without_retracting_what_it_committed(
    tmp_path: Path,
) -> None:
    """A copy killed between its nodes' commit records leaves one node committed: the
    next copy keeps that record and commits the other."""
    manager, upload, dest = _uploaded_once(tmp_path)
    first = _attempts(dest)
    protocol.retract_epoch(LocalPath(str(dest)), 1, [NODES[1]])
    LocalSession().run(upload.build(1, manager))
    again = _attempts(dest)
    assert again[NODES[0]] == first[NODES[0]]
    assert set(again) == set(NODES)
    assert_loads(dest, "npz")


def test_an_upload_never_replaces_another_job_s_epoch(tmp_path: Path) -> None:
    """The destination holds another checkpoint of the epoch (another job's, in
    another format): the copy fails with ``AlreadyCommittedError`` and leaves it."""
    source, dest = tmp_path / "ckpt", tmp_path / "upload"
    for root, db_type in ((source, "npz"), (dest, "zarr")):
        job, _ = build_counter_job(nodes=NODES, epochs=1)
        JobRunner(job, MultiNodeCheckpointManager(str(root), db_type)).train(LocalSession())
    theirs = _attempts(dest)
    manager = MultiNodeCheckpointManager(str(source), "npz")
    manager.init(list(NODES))
    with pytest.raises(AlreadyCommittedError):
        LocalSession().run(CopyUpload(str(dest)).build(1, manager))
    assert _attempts(dest) == theirs
    assert_loads(dest, "zarr")


def assert_loads(root: Path, db_type: str) -> None:
    manager = MultiNodeCheckpointManager(str(root), db_type)
    session = LocalSession()
    session.run(manager.init(list(NODES)))
    session.run(manager.load(1))


def test_the_builder_opens_its_destination_lazily(tmp_path: Path) -> None:
    upload = CopyUpload(str(tmp_path / "later"), verify=False)
    assert not (tmp_path / "later").exists()
    assert repr(upload) == f"CopyUpload({str(tmp_path / 'later')!r})"
    assert isinstance(upload.storage, LocalPath)
    assert upload.storage is upload.storage
    assert upload.verify is False


def test_any_upload_source_is_copied_not_only_a_ckptstore_manager(tmp_path: Path) -> None:
    """The builder asks its source only what ``UploadSource`` promises: node names and
    a root with storage, format and I/O settings."""
    manager = train_with_upload(tmp_path / "run", str(tmp_path / "first"), "npz")

    class Root:
        storage = manager.location.storage
        db_type = manager.location.db_type
        io_settings = manager.location.io_settings

    class Source:
        location = Root()

        def node_names(self) -> list[str]:
            return list(NODES)

    LocalSession().run(CopyUpload(str(tmp_path / "second")).build(3, Source()))
    first = protocol.read_commit(LocalPath(str(tmp_path / "first")), 3, NODES)
    second = protocol.read_commit(LocalPath(str(tmp_path / "second")), 3, NODES)
    assert first is not None
    assert second is not None
    crcs = {node: commit.manifest_crc32c for node, commit in first.nodes.items()}
    assert {node: commit.manifest_crc32c for node, commit in second.nodes.items()} == crcs
    assert sorted(crcs) == sorted(NODES)
