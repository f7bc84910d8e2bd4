"""What checkpoint tasks do on a node: save, commit, load, partial load, existence."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from ckptstore import (
    CheckpointManager,
    IOSettings,
    LocalSession,
    SaveFailedError,
    Workspace,
    protocol,
)
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.checkpoint._node_tasks import (
    CheckpointLocation,
    Hooks,
    check_not_committed,
    commit_saves,
    list_blob_names,
    load_node,
    node_exists,
    partial_load,
    read_blob_names,
    run_alone,
    save_node,
)
from ckptstore.errors import BlobNotFoundError
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.records._stats import NodeStats

IO = IOSettings(chunk_bytes=4096, memory_budget=1 << 20)


def location(root: Path, db_type: NpzDB | ZarrDB | None = None) -> CheckpointLocation:
    return CheckpointLocation(LocalPath(str(root)), db_type or NpzDB(), IO)


def save_alone(
    ws: Workspace, where: CheckpointLocation, node: str, epoch: int, names: Sequence[str]
) -> NodeStats:
    """A single-node save: the node's work between the check and the commit."""
    return run_alone(
        ws,
        work=partial(save_node, location=where, node=node, epoch=epoch, names=names),
        hooks=Hooks(
            partial(
                check_not_committed,
                location=where,
                epoch=epoch,
                nodes=[node],
                overwrite=False,
            ),
            partial(commit_saves, storage=where, epoch=epoch),
        ),
    )


def test_db_path_is_the_caffe2_name_without_credentials(tmp_path: Path) -> None:
    assert location(tmp_path).db_path("trainer_0", 3) == f"{tmp_path}/trainer_0.3"


def test_list_blob_names_is_sorted() -> None:
    assert list_blob_names(Workspace({"b": 1, "a": 2, "c/d": 3})) == ["a", "b", "c/d"]


def test_save_commit_then_read_back(tmp_path: Path) -> None:
    where = location(tmp_path)
    ws = Workspace({"a": np.arange(3), "b": np.ones(2), "not_listed": 0})
    stats = save_alone(ws, where, "n", 2, ["a", "b"])
    assert stats.action == "checkpoint_save"
    assert stats.blobs == ("a", "b")
    assert stats.nblobs == 2
    assert stats.nbytes == 3 * 8 + 2 * 8
    assert stats.error is None
    assert node_exists(ws, location=where, node="n", epoch=2)
    assert not node_exists(ws, location=where, node="n", epoch=3)
    assert read_blob_names(ws, location=where, node="n", epoch=2) == ["a", "b"]
    target = Workspace()
    loaded = load_node(target, location=where, node="n", epoch=2, names=["b"])
    assert list(target) == ["b"]
    assert loaded.action == "checkpoint_load"


def test_an_uncommitted_node_save_reports_its_failure_instead_of_raising(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    where = location(tmp_path / "file" / "ckpt")
    ws = Workspace({"a": np.zeros(1)})
    stats = save_node(ws, location=where, node="n", epoch=1, names=["a"])
    assert stats.action == "checkpoint_save_failed"
    assert stats.error is not None
    assert "Not a directory" in stats.error
    assert stats.commit is None
    with pytest.raises(SaveFailedError) as info:
        save_alone(ws, where, "n", 1, ["a"])
    assert info.value.failed_nodes == ("n",)
    assert isinstance(info.value.__cause__, OSError)  # the storage error, chained


def test_commit_saves_commits_only_when_every_node_succeeded(tmp_path: Path) -> None:
    where = location(tmp_path)
    good = save_node(Workspace({"a": np.zeros(1)}), location=where, node="n0", epoch=1, names=["a"])
    failed = NodeStats("n1", 1, where.db_path("n1", 1), "checkpoint_save_failed", error="disk full")
    with pytest.raises(SaveFailedError) as info:
        commit_saves([good, failed], storage=where.storage, epoch=1)
    assert info.value.node_errors == {"n1": "disk full"}
    assert protocol.read_commit(where.storage, 1) is None
    commit_saves([good], storage=where.storage, epoch=1)
    assert protocol.committed_nodes(where.storage, 1) == {"n0"}


def test_partial_load_gathers_from_several_nodes_and_the_last_wins(tmp_path: Path) -> None:
    where = location(tmp_path)
    for index, node in enumerate(["n0", "n1"]):
        ws = Workspace({"shared": np.array([index]), f"{node}/own": np.array([index])})
        save_alone(ws, where, node, 1, sorted(ws))
    target = Workspace()
    stats = partial_load(
        target, location=where, nodes=["n0", "n1"], epoch=1, names=["shared", "n0/own"]
    )
    assert target["shared"].tolist() == [1]
    assert target["n0/own"].tolist() == [0]
    assert [s.blobs for s in stats] == [("shared", "n0/own"), ("shared",)]
    with pytest.raises(BlobNotFoundError):
        partial_load(target, location=where, nodes=["n0"], epoch=1, names=["n1/own"])


def test_checkpoints_stay_readable_after_a_job_changes_its_db_type(tmp_path: Path) -> None:
    session = LocalSession()
    session.workspace("n")["w"] = np.arange(4.0)
    npz = CheckpointManager(str(tmp_path), "n", "npz")
    session.run(npz.init(["n"]))
    session.run(npz.save(1))
    zarr = CheckpointManager(str(tmp_path), "n", "zarr")
    fresh = LocalSession()
    fresh.run(zarr.init(["n"], retrieve_from_epoch=1))
    fresh.run(zarr.load(1))
    assert fresh.workspace("n")["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_locations_pickle_for_distributed_sessions(tmp_path: Path) -> None:
    where = location(tmp_path, ZarrDB(compression="zstd"))
    copy = pickle.loads(pickle.dumps(where))
    assert copy.db_path("n", 1) == where.db_path("n", 1)
    assert isinstance(copy.db_type, ZarrDB)
    assert copy.db_type.compression == "zstd"
    assert copy.io_settings == IO
