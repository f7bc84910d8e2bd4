"""The commit protocol: one attempt per save, never renamed or replaced, commit records
naming the attempt they commit, and what readers accept."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import (
    RecordingMemoryPath,
    data_key,
    files_under,
    flip_byte,
    memory_keys,
    memory_root,
    node_dir,
)

from ckptstore import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobConfigurationError,
    Workspace,
    protocol,
)
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.checkpoint._node_tasks import CheckpointLocation, load_node
from ckptstore.errors import AlreadyCommittedError, BlobNotFoundError
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._db_type import DBLocation, DBType, WrittenDB
from ckptstore.plugin._path_type import PathType
from ckptstore.protocol._garbage import collect_garbage, find_garbage
from ckptstore.records._layout import commit_record_key, manifest_key, node_commit_key
from ckptstore.records._limits import Limits, set_limits

NODE = "trainer_0"
IO = IOSettings(chunk_bytes=4096, memory_budget=1 << 20)


def engine() -> ParallelIO:
    return ParallelIO(IO)


def load_w(storage: PathType, epoch: int = 1) -> np.ndarray:
    """Blob ``w`` of NODE's committed zarr checkpoint of ``epoch``, read back."""
    manifest = protocol.open_node(storage, NODE, epoch)
    return protocol.read_blobs(storage, manifest, ["w"], ZarrDB(), engine())["w"]


def blobs() -> dict[str, np.ndarray]:
    return {"w": np.arange(1500, dtype=np.float64), "step": np.array(3, dtype=np.int64)}


def save(
    storage: PathType,
    epoch: int,
    values: Mapping[str, Any] | None = None,
    db_type: DBType | None = None,
    node: str = NODE,
    *,
    overwrite: bool = False,
) -> protocol.NodeCommit:
    protocol.check_not_committed(storage, epoch, [node], overwrite=overwrite)
    commit = protocol.write_node(
        storage, node, epoch, values or blobs(), db_type or ZarrDB(), engine()
    )
    protocol.commit_epoch(storage, epoch, [commit])
    return commit


# -- staging and rename on local disk --------------------------------------------------------


class ObservingZarr(ZarrDB):
    """A zarr DB type that looks at the checkpoint root while it writes."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.seen: list[tuple[str, list[str]]] = []

    def write(self, db: DBLocation, values: Mapping[str, np.ndarray]) -> WrittenDB:
        written = super().write(db, values)
        self.seen.append((db.root, sorted(os.listdir(self.root))))
        return written


def test_a_save_is_written_under_its_own_attempt_and_never_renamed(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    observer = ObservingZarr(tmp_path)
    commit = protocol.write_node(storage, NODE, 1, blobs(), observer, engine())
    (root, listing), *_ = observer.seen
    assert root == commit.data_key
    assert root.startswith("trainer_0.1/attempt-")
    assert listing == ["trainer_0.1"]
    assert all(name.startswith(f"{root}/") for name in files_under(tmp_path))
    assert (tmp_path / root / "ckptstore.manifest.json").is_file()
    with pytest.raises(CheckpointNotFoundError, match="save of this epoch is not committed"):
        protocol.open_node(storage, NODE, 1)  # written, but not committed yet
    protocol.commit_epoch(storage, 1, [commit])
    record = json.loads((tmp_path / node_commit_key(1, NODE)).read_bytes())
    assert root == f"trainer_0.1/attempt-{record['attempt']}"  # the record names the attempt
    assert protocol.open_node(storage, NODE, 1).data_key == root


def test_a_save_never_touches_another_attempt_of_its_node_and_epoch(tmp_path: Path) -> None:
    """A crashed or concurrent save's attempt is not this save's to delete: it stays
    (gc collects it once another attempt is committed)."""
    storage = LocalPath(str(tmp_path))
    other = tmp_path / "trainer_0.1" / "attempt-0123456789ab"
    (other / "w").mkdir(parents=True)
    (other / "w" / "c.0").write_bytes(b"in flight")
    (tmp_path / ".trainer_0.1.staging-dead").mkdir()  # an earlier version's leftover
    save(storage, 1)
    assert (other / "w" / "c.0").read_bytes() == b"in flight"
    assert (tmp_path / ".trainer_0.1.staging-dead").is_dir()


class ExplodingZarr(ZarrDB):
    """Writes the first blob, then fails like a crash in the middle of a save."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def write(self, db: DBLocation, values: Mapping[str, np.ndarray]) -> WrittenDB:
        first = dict(list(values.items())[:1])
        super().write(db, first)
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_exception_mid_write_leaves_no_epoch_and_no_staging(
    tmp_path: Path, error: BaseException
) -> None:
    storage = LocalPath(str(tmp_path))
    with pytest.raises(type(error)):
        protocol.write_node(storage, NODE, 1, blobs(), ExplodingZarr(error), engine())
    assert files_under(tmp_path) == []  # its attempt deleted (an empty directory may stay)
    assert protocol.read_commit(storage, 1) is None


def test_a_resave_replaces_the_old_checkpoint_whole(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    old = save(storage, 1, {"old": np.zeros(3), "kept": np.zeros(2)})
    new = save(storage, 1, {"kept": np.ones(2)}, overwrite=True)
    assert files_under(node_dir(tmp_path, NODE, 1)) == [
        "blobs.zarr.zip",
        "ckptstore.manifest.json",
    ]
    assert new.attempt != old.attempt
    # the superseded attempt is garbage, collected by gc
    assert [item.key for item in find_garbage(storage)] == [old.data_key]
    collect_garbage(storage, find_garbage(storage))
    assert not (tmp_path / old.data_key).exists()
    manifest = protocol.open_node(storage, NODE, 1)
    assert list(manifest.blobs) == ["kept"]
    loaded = protocol.read_blobs(storage, manifest, None, ZarrDB(), engine())
    assert loaded["kept"].tolist() == [1.0, 1.0]


def test_a_committed_epoch_is_write_once_without_overwrite(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1, {"w": np.zeros(2)})
    before = files_under(tmp_path / "trainer_0.1")
    with pytest.raises(AlreadyCommittedError, match=r"overwrite=True") as info:
        save(storage, 1, {"w": np.ones(2)})
    assert (info.value.epoch, info.value.nodes) == (1, (NODE,))
    assert isinstance(info.value, FileExistsError)
    assert files_under(tmp_path / "trainer_0.1") == before
    assert load_w(storage).tolist() == [0.0, 0.0]


def test_a_second_commit_of_one_node_and_epoch_is_refused(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    first = save(storage, 1)
    record = (tmp_path / node_commit_key(1, NODE)).read_bytes()
    with pytest.raises(AlreadyCommittedError):  # a racing writer that got past the check
        protocol.commit_epoch(storage, 1, [first])
    assert (tmp_path / node_commit_key(1, NODE)).read_bytes() == record


class RacedZarr(ZarrDB):
    """A zarr DB type whose write lets another writer save and commit the same node and
    epoch first: two jobs past the save's check at once (no lease between them)."""

    def __init__(self, storage: PathType) -> None:
        super().__init__()
        self.storage = storage

    def write(self, db: DBLocation, values: Mapping[str, np.ndarray]) -> WrittenDB:
        save(self.storage, 1, {"w": np.full(2, 7.0)})  # the other writer wins the race
        return super().write(db, values)


def test_a_writer_racing_another_never_replaces_what_the_other_committed(
    tmp_path: Path,
) -> None:
    """A save that passed its check, while a racing writer committed the same node and
    epoch, loses at its create-once commit record; the winner's data is untouched."""
    storage = LocalPath(str(tmp_path))
    with pytest.raises(AlreadyCommittedError):
        save(storage, 1, {"w": np.ones(2)}, RacedZarr(storage))
    assert load_w(storage).tolist() == [7.0, 7.0]  # the committed epoch loads whole
    winner = data_key(storage, NODE, 1)
    written = [f"trainer_0.1/{name}" for name in files_under(tmp_path / "trainer_0.1")]
    assert written
    assert all(key.startswith(f"{winner}/") for key in written)


@pytest.mark.parametrize("limit", ["max_document_bytes", "max_blobs"])
def test_a_save_its_own_loads_would_refuse_is_not_written(tmp_path: Path, limit: str) -> None:
    """A manifest beyond the limits loads enforce would read back as corrupt (and a
    resume would fall back past it): the save refuses it, naming the limit, and leaves
    the epoch uncommitted and nothing behind."""
    storage = LocalPath(str(tmp_path))
    values = {f"b{i}": np.ones(2) for i in range(20)}
    try:
        set_limits(replace(Limits(), **{limit: 10 if limit == "max_blobs" else 1000}))
        with pytest.raises(JobConfigurationError, match=f"CKPTSTORE_LIMIT_{limit.upper()}"):
            save(storage, 1, values)
    finally:
        set_limits(None)
    assert protocol.committed_nodes(storage, 1) == set()
    assert files_under(tmp_path) == []
    save(storage, 1, values)  # under the default limits, the same save goes through
    assert protocol.committed_nodes(storage, 1) == {NODE}


def test_control_documents_are_created_atomically_without_temporaries(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1)
    save(storage, 1, node="trainer_1")
    assert os.listdir(tmp_path / "_ckptstore") == ["epoch-1"]
    assert sorted(os.listdir(tmp_path / "_ckptstore" / "epoch-1")) == [
        "trainer_0.commit.json",
        "trainer_1.commit.json",
    ]


def test_commit_records_of_earlier_versions_are_still_read_and_retracted(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    first = save(storage, 1, node="trainer_0")
    second = save(storage, 1, node="trainer_1")
    legacy = protocol.EpochCommit(1, {"trainer_0": first, "trainer_1": second}, "then")
    protocol.retract_epoch(storage, 1, ["trainer_0", "trainer_1"])
    storage.put_document(commit_record_key(1), legacy.encode())
    assert protocol.committed_nodes(storage, 1) == {"trainer_0", "trainer_1"}
    assert protocol.committed_nodes(storage, 1, ["trainer_1"]) == {"trainer_1"}
    with pytest.raises(AlreadyCommittedError):
        save(storage, 1, node="trainer_1")
    save(storage, 1, node="trainer_1", overwrite=True)
    assert (tmp_path / node_commit_key(1, "trainer_1")).exists()
    assert protocol.committed_nodes(storage, 1) == {"trainer_0", "trainer_1"}
    protocol.retract_epoch(storage, 1, ["trainer_0"])
    assert not (tmp_path / commit_record_key(1)).exists()
    assert protocol.committed_nodes(storage, 1) == {"trainer_1"}


# -- commit records --------------------------------------------------------------------------


def test_commit_records_merge_across_jobs_sharing_a_prefix(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    first = save(storage, 2, node="trainer_0")
    second = save(storage, 2, node="trainer_1")
    record = protocol.read_commit(storage, 2)
    assert record is not None
    assert dict(record.nodes) == {"trainer_0": first, "trainer_1": second}
    assert record.nbytes == 2 * sum(a.nbytes for a in blobs().values())
    assert protocol.committed_nodes(storage, 2) == {"trainer_0", "trainer_1"}
    assert protocol.committed_nodes(storage, 3) == set()


def test_retract_removes_only_the_nodes_being_saved(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1, node="trainer_0")
    save(storage, 1, node="trainer_1")
    key = tmp_path / node_commit_key(1, "trainer_1")
    before = key.read_bytes()
    protocol.retract_epoch(storage, 1, ["trainer_9"])
    assert protocol.committed_nodes(storage, 1) == {"trainer_0", "trainer_1"}
    protocol.retract_epoch(storage, 1, ["trainer_0"])
    assert protocol.committed_nodes(storage, 1) == {"trainer_1"}
    assert key.read_bytes() == before  # the other node's record is untouched
    with pytest.raises(CheckpointNotFoundError, match=r"save of this epoch is not committed"):
        protocol.open_node(storage, "trainer_0", 1)
    protocol.retract_epoch(storage, 1, ["trainer_1"])
    assert not key.exists()
    assert protocol.read_commit(storage, 1) is None
    protocol.retract_epoch(storage, 1, ["trainer_1"])  # no record: nothing to do
    protocol.retract_epoch(storage, 7, ["trainer_1"])


def test_retract_then_commit_makes_the_new_save_visible(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1, {"w": np.zeros(2)})
    protocol.retract_epoch(storage, 1, [NODE])
    assert protocol.read_commit(storage, 1) is None
    save(storage, 1, {"w": np.ones(2)})
    assert load_w(storage).tolist() == [1.0, 1.0]


def test_a_corrupt_commit_record_is_reported(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1)
    flip_byte(tmp_path / node_commit_key(1, NODE), 20)
    with pytest.raises(CorruptCheckpointError, match=r"trainer_0\.commit\.json"):
        protocol.read_commit(storage, 1)
    with pytest.raises(CorruptCheckpointError):
        protocol.open_node(storage, NODE, 1)


def test_a_corrupt_commit_record_does_not_block_saving_the_epoch_again(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1)
    flip_byte(tmp_path / node_commit_key(1, NODE), 20)
    save(storage, 1, node="trainer_1")  # other nodes' records are independent
    assert protocol.committed_nodes(storage, 1, ["trainer_1"]) == {"trainer_1"}
    save(storage, 1)  # unreadable, so never visible: replaced without overwrite
    assert protocol.committed_nodes(storage, 1) == {NODE, "trainer_1"}


# -- the in-place protocol on object stores --------------------------------------------------


def test_object_store_saves_write_a_new_attempt_and_never_touch_the_old_one() -> None:
    chunked = ZarrDB(compression="zstd")  # a layout of one file per chunk
    with memory_root() as url:
        storage = RecordingMemoryPath(url)
        assert not storage.supports_rename
        old = save(storage, 1, {"w": np.arange(1500.0), "gone": np.zeros(600)}, chunked)
        old_keys = memory_keys(url)
        assert f"{old.data_key}/gone/c.0" in old_keys
        storage.calls.clear()
        new = save(storage, 1, {"w": np.arange(10.0)}, chunked, overwrite=True)
        assert storage.calls[0] == ("delete", "_ckptstore/epoch-1/trainer_0.commit.json")
        deletes = [key for action, key in storage.calls if action == "delete"]
        assert deletes == ["_ckptstore/epoch-1/trainer_0.commit.json"]  # no data deleted
        writes = [k for a, k in storage.calls if a == "write" and not k.startswith("_ckptstore")]
        assert writes
        assert all(key.startswith(f"{new.data_key}/") for key in writes)
        manifest_write = storage.calls.index(("write", f"{new.data_key}/ckptstore.manifest.json"))
        commit_put = storage.calls.index(("put", "_ckptstore/epoch-1/trainer_0.commit.json"))
        assert manifest_write < commit_put  # data, manifest, then the commit
        assert set(old_keys) - {"_ckptstore/epoch-1/trainer_0.commit.json"} <= set(
            memory_keys(url)
        )  # the old attempt is garbage now, for gc
        assert load_w(storage).size == 10


def test_an_in_place_save_that_fails_midway_leaves_the_epoch_invisible() -> None:
    with memory_root() as url:
        storage = RecordingMemoryPath(url)
        first = save(storage, 1)
        protocol.retract_epoch(storage, 1, [NODE])
        with pytest.raises(RuntimeError):
            protocol.write_node(storage, NODE, 1, blobs(), ExplodingZarr(RuntimeError()), engine())
        assert protocol.read_commit(storage, 1) is None
        assert [key for key in memory_keys(url) if "ckptstore.manifest.json" in key] == [
            manifest_key(first.data_key)
        ]


def test_rename_only_formats_are_refused_on_object_stores() -> None:
    class RenameOnly(NpzDB):
        name = "rename_only"
        needs_rename = True

    with memory_root() as url:
        with pytest.raises(JobConfigurationError, match="only on local disk"):
            protocol.write_node(RecordingMemoryPath(url), NODE, 1, blobs(), RenameOnly(), engine())
        assert memory_keys(url) == []


# -- readers ---------------------------------------------------------------------------------


def test_open_node_refuses_a_committed_epoch_whose_manifest_is_missing(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1)
    os.unlink(node_dir(tmp_path, NODE, 1) / "ckptstore.manifest.json")
    with pytest.raises(CorruptCheckpointError, match="manifest is missing"):
        protocol.open_node(storage, NODE, 1)


def test_open_node_refuses_a_manifest_whose_crc_differs_from_the_commit(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1)
    flip_byte(node_dir(tmp_path, NODE, 1) / "ckptstore.manifest.json", 40, mask=0x01)
    with pytest.raises(CorruptCheckpointError, match="differs from the one in the commit"):
        protocol.open_node(storage, NODE, 1)


def test_open_node_refuses_the_manifest_of_another_node(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    mine = save(storage, 1, node="trainer_0")
    other = save(storage, 1, node="trainer_1")
    stolen = (node_dir(tmp_path, "trainer_1", 1) / "ckptstore.manifest.json").read_bytes()
    (node_dir(tmp_path, NODE, 1) / "ckptstore.manifest.json").write_bytes(stolen)
    forged = protocol.NodeCommit(
        NODE, 1, other.db_type, other.manifest_crc32c, other.nbytes, other.stored_bytes, 2
    )
    forged = replace(forged, attempt=mine.attempt)
    protocol.retract_epoch(storage, 1, [NODE])
    protocol.commit_epoch(storage, 1, [forged])
    with pytest.raises(CorruptCheckpointError, match=r"belongs to trainer_1\.1"):
        protocol.open_node(storage, NODE, 1)


def test_loads_are_all_or_nothing(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    values = {"a": np.arange(4.0), "b": np.arange(4.0) + 10}
    save(storage, 1, values)
    offset = protocol.open_node(storage, NODE, 1).blobs["b"].chunks[0].offset
    flip_byte(node_dir(tmp_path, NODE, 1) / "blobs.zarr.zip", offset + 5)
    location = CheckpointLocation(storage, ZarrDB(), IO)
    ws = Workspace({"a": np.zeros(4), "b": np.zeros(4)})
    with pytest.raises(CorruptCheckpointError) as info:
        load_node(ws, location=location, node=NODE, epoch=1, names=["a", "b"])
    assert info.value.blob == "b"
    assert ws["a"].tolist() == [0.0] * 4  # "a" was read fine, but not assigned
    assert ws["b"].tolist() == [0.0] * 4


def test_read_blobs_reads_what_is_asked(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1)
    manifest = protocol.open_node(storage, NODE, 1)
    everything = protocol.read_blobs(storage, manifest, None, ZarrDB(), engine())
    assert sorted(everything) == ["step", "w"]
    with pytest.raises(BlobNotFoundError, match="nope"):
        protocol.read_blobs(storage, manifest, ["w", "nope"], ZarrDB(), engine())
    some = protocol.read_blobs(
        storage, manifest, ["nope", "step"], ZarrDB(), engine(), missing_ok=True
    )
    assert list(some) == ["step"]


def test_verify_node_reports_every_damaged_or_missing_piece(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1, None, ZarrDB(compression="zstd"))  # a layout of one file per chunk
    assert protocol.verify_node(storage, NODE, 1, ZarrDB(), engine()) == []
    flip_byte(node_dir(tmp_path, NODE, 1) / "w" / "c.1", 0)
    os.unlink(node_dir(tmp_path, NODE, 1) / "step" / "c")
    problems = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert sorted((p.blob, p.chunk) for p in problems) == [("step", 0), ("w", 1)]
    assert any("missing" in str(p) for p in problems)
    flip_byte(node_dir(tmp_path, NODE, 1) / "ckptstore.manifest.json", 30)
    (problem,) = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert "commit record" in str(problem)


def test_node_commit_accounts_for_data_and_manifest(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    commit = save(storage, 1)
    manifest_size = (node_dir(tmp_path, NODE, 1) / "ckptstore.manifest.json").stat().st_size
    data_size = sum(
        (node_dir(tmp_path, NODE, 1) / name).stat().st_size
        for name in files_under(node_dir(tmp_path, NODE, 1))
    )
    assert commit.nbytes == 1500 * 8 + 8
    assert commit.nblobs == 2
    assert commit.stored_bytes == data_size
    assert commit.stored_bytes > commit.nbytes + manifest_size - 1


def test_an_interrupted_multi_node_commit_does_not_block_saving_the_epoch_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, 1, node="trainer_0")  # trainer_1's record was never created
    with caplog.at_level("WARNING"):
        protocol.check_not_committed(storage, 1, ["trainer_0", "trainer_1"])
    assert "interrupted commit" in caplog.text
    assert protocol.read_commit(storage, 1) is None
    save(storage, 1, node="trainer_0")
    save(storage, 1, node="trainer_1")
    with pytest.raises(AlreadyCommittedError):  # complete now: write-once again
        protocol.check_not_committed(storage, 1, ["trainer_0", "trainer_1"])


def test_on_an_object_store_every_record_but_the_last_is_created_at_once(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each record is a round trip: the nodes' records go out together, the last one
    (DCP's metadata node, whose record makes the epoch visible) once they all exist.
    The barrier lets the first two through only together (one after another, the first
    would wait alone and fail)."""
    location = CheckpointLocation.open(s3_url, "npz")
    storage = location.storage
    nodes = ["rank_0", "rank_1", "dcp"]
    commits = [protocol.write_node(location, node, 1, {"w": np.ones(2)}) for node in nodes]
    together = threading.Barrier(2, timeout=60)
    existing_before_last: list[bool] = []
    create_document = type(storage).create_document

    def create(self: PathType, key: str, data: bytes) -> None:
        if key == node_commit_key(1, "dcp"):
            existing_before_last.extend(self.exists(node_commit_key(1, n)) for n in nodes[:2])
        else:
            together.wait()
        create_document(self, key, data)

    monkeypatch.setattr(type(storage), "create_document", create)
    record = protocol.commit_epoch(location, 1, commits)
    assert sorted(record.nodes) == sorted(nodes)
    assert existing_before_last == [True, True]
    assert protocol.committed_nodes(location, 1) == set(nodes)
