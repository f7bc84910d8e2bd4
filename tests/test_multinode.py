"""MultiNodeCheckpointManager: every node saves, the epoch is committed only when all
did, and partial loads are all or nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import (
    RecordingHandler,
    build_counter_job,
    failing_local_path,
    flip_byte,
    node_dir,
    register_storage,
)

from ckptstore import (
    CheckpointManager,
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    SaveFailedError,
    TaskGroup,
    protocol,
)
from ckptstore.errors import BlobNotFoundError
from ckptstore.plugin._registry import Registry

NODES = ["trainer_0", "trainer_1"]


def two_node_session(extra: dict[str, dict[str, Any]] | None = None) -> LocalSession:
    session = LocalSession()
    for index, node in enumerate(NODES):
        ws = session.workspace(node)
        ws[f"{node}/w"] = np.full(4, float(index))
        for name, value in (extra or {}).get(node, {}).items():
            ws[name] = value
    return session


def initialised(
    tmp_path: Path, session: LocalSession, db_type: str = "npz", **kwargs: Any
) -> MultiNodeCheckpointManager:
    manager = MultiNodeCheckpointManager(str(tmp_path), db_type, **kwargs)
    session.run(manager.init(NODES))
    return manager


def test_init_needs_nodes_and_everything_else_needs_init(tmp_path: Path) -> None:
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
    with pytest.raises(JobConfigurationError):
        manager.init([])
    for call in (
        manager.node_names,
        manager.node_managers,
        lambda: manager.save(1),
        lambda: manager.load(1),
        lambda: manager.get_ckpt_db_name("trainer_0", 1),
    ):
        with pytest.raises(JobConfigurationError, match="init"):
            call()


def test_init_creates_one_manager_per_node_without_handler(tmp_path: Path) -> None:
    handler = RecordingHandler()
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=handler)
    group = manager.init(NODES)
    assert [task.node for task in group.tasks()] == NODES
    assert manager.node_names() == NODES
    for node, node_manager in manager.node_managers():
        assert isinstance(node_manager, CheckpointManager)
        assert node_manager.node_name == node
        assert node_manager.metadata_handler is None
    assert manager.get_ckpt_db_name("trainer_1", 5) == f"{tmp_path}/trainer_1.5"
    assert manager.get_ckpt_db_name("trainer_9", 5) is None
    assert "trainer_1" in repr(manager) or "npz" in repr(manager)


def test_each_node_saves_its_own_workspace_and_the_epoch_commits_once(tmp_path: Path) -> None:
    session = two_node_session()
    manager = initialised(tmp_path, session)
    session.run(manager.save(1))
    record = protocol.read_commit(manager.location.storage, 1)
    assert record is not None
    assert sorted(record.nodes) == NODES
    for node in NODES:
        manifest = protocol.open_node(manager.location.storage, node, 1)
        assert list(manifest.blobs) == [f"{node}/w"]
    for node in NODES:
        session.workspace(node)[f"{node}/w"] = np.zeros(4)
    session.run(manager.load(1))
    assert session.workspace("trainer_1")["trainer_1/w"].tolist() == [1.0] * 4


def test_stats_of_every_node_are_aggregated(tmp_path: Path) -> None:
    handler = RecordingHandler()
    session = two_node_session()
    manager = initialised(tmp_path, session, metadata_handler=handler)
    manager.set_params(NODES)
    assert handler.node_names == NODES
    session.run(manager.save(3))
    manager.report_checkpoint_stats("checkpoint_save")
    action, stats = handler.reports[-1]
    assert action == "checkpoint_save"
    assert sorted(stats) == [f"{tmp_path}/trainer_0.3", f"{tmp_path}/trainer_1.3"]
    assert {s.node for s in stats.values()} == set(NODES)
    assert all(s.action == "checkpoint_save" and s.nbytes == 32 for s in stats.values())


def test_one_node_failing_names_it_and_leaves_the_epoch_uncommitted(
    tmp_path: Path, registry: Registry
) -> None:
    disk_full = [False]  # then trainer_1's disk fills up
    register_storage(registry, failing_local_path(lambda key: disk_full[0] and "trainer_1." in key))
    session = two_node_session()
    session.run(initialised(tmp_path, session, db_type="zarr", path_type="failing_local").save(1))
    disk_full[0] = True
    manager = initialised(tmp_path, session, db_type="zarr", path_type="failing_local")
    manager.overwrite = True  # replacing committed epoch 1 on purpose
    with pytest.raises(SaveFailedError) as info:
        session.run(manager.save(1))  # the re-save retracts the old epoch 1 first
    error = info.value
    assert error.failed_nodes == ("trainer_1",)
    assert error.epoch == 1
    assert "Connection reset" in error.node_errors["trainer_1"]
    assert "trainer_0" not in error.node_errors
    storage = manager.location.storage
    assert protocol.committed_nodes(storage, 1) == set()
    checks = [m.check_db_exists(1) for _, m in manager.node_managers()]
    for check in checks:
        session.run(check)
    assert [check.outputs()[0].fetch() for check in checks] == [False, False]
    leftovers = [p.name for p in tmp_path.iterdir() if ".staging-" in p.name]
    assert leftovers == []


def test_an_epoch_is_committed_only_when_every_node_saved(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    for node in NODES:  # two separate single-node jobs share one prefix
        job, _ = build_counter_job(nodes=(node,), epochs=3 if node == "trainer_0" else 1)
        JobRunner(job, MultiNodeCheckpointManager(prefix, "npz")).train(LocalSession())
    storage = MultiNodeCheckpointManager(prefix, "npz").location.storage
    assert protocol.committed_nodes(storage, 1) == set(NODES)
    assert protocol.committed_nodes(storage, 3) == {"trainer_0"}

    manager = MultiNodeCheckpointManager(prefix, "npz")
    session = LocalSession()
    names = ["trainer_0/w", "trainer_1/w"]
    assert manager.load_blobs_locally(NODES, names, 3, session) is False
    assert list(session.workspace()) == []  # nothing loaded, not even trainer_0's
    assert manager.load_blobs_locally(NODES, names, 1, session) is True
    assert session.workspace()["trainer_0/w"].tolist() == [1.0] * 4
    assert session.workspace()["trainer_1/w"].tolist() == [1.0] * 4


def test_load_blobs_locally_lands_on_the_current_node_and_needs_no_init(tmp_path: Path) -> None:
    session = two_node_session()
    initialised_manager = initialised(tmp_path, session)
    session.run(initialised_manager.save(2))
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
    target = LocalSession()
    with Node("evaluator"):
        assert manager.load_blobs_locally(NODES, ["trainer_1/w"], 2, target)
    assert list(target.workspace("evaluator")) == ["trainer_1/w"]
    with pytest.raises(JobConfigurationError, match="initialised for nodes"):
        manager.load_blobs_locally(["trainer_0"], ["trainer_0/w"], 2, target)


def test_a_blob_found_nowhere_raises_and_loads_nothing(tmp_path: Path) -> None:
    session = two_node_session()
    manager = initialised(tmp_path, session)
    session.run(manager.save(1))
    target = LocalSession()
    with pytest.raises(BlobNotFoundError) as info:
        manager.load_blobs_locally(NODES, ["trainer_0/w", "nowhere/w"], 1, target)
    assert info.value.blobs == ("nowhere/w",)
    assert list(target.workspace()) == []


def test_reinit_on_the_same_nodes_reuses_the_blob_lists(tmp_path: Path) -> None:
    session = two_node_session()
    manager = initialised(tmp_path, session)
    session.workspace("trainer_0")["created_after_init"] = np.zeros(1)
    again = manager.init(NODES)
    assert isinstance(again, TaskGroup)
    assert again.tasks() == []
    session.run(again)
    session.run(manager.save(1))
    manifest = protocol.open_node(manager.location.storage, "trainer_0", 1)
    assert list(manifest.blobs) == ["trainer_0/w"]
    with pytest.raises(JobConfigurationError, match="initialised for nodes"):
        manager.init(["trainer_0"])


def test_reinit_with_retrieve_from_epoch_rereads_the_blob_lists(tmp_path: Path) -> None:
    session = two_node_session()
    manager = initialised(tmp_path, session)
    other_session = two_node_session({"trainer_1": {"trainer_1/extra": np.arange(2)}})
    other = initialised(tmp_path, other_session)
    other_session.run(other.save(5))
    group = manager.init(NODES, retrieve_from_epoch=5)
    assert len(group.tasks()) == 2
    session.run(group)
    node_manager = dict(manager.node_managers())["trainer_1"]
    assert node_manager.blob_list() == ["trainer_1/extra", "trainer_1/w"]
    session.run(manager.load(5))
    assert session.workspace("trainer_1")["trainer_1/extra"].tolist() == [0, 1]


def test_a_multi_node_load_is_per_node_and_all_or_nothing(tmp_path: Path) -> None:
    session = two_node_session()
    manager = initialised(tmp_path, session)
    session.run(manager.save(1))
    chunk = protocol.open_node(manager.location.storage, "trainer_1", 1).blobs["trainer_1/w"]
    flip_byte(node_dir(tmp_path, "trainer_1", 1) / "blobs.npz", chunk.chunks[0].offset + 3)
    for node in NODES:
        session.workspace(node)[f"{node}/w"] = np.full(4, 7.0)
    with pytest.raises(ValueError, match="corrupt checkpoint"):
        session.run(manager.load(1))
    assert session.workspace("trainer_1")["trainer_1/w"].tolist() == [7.0] * 4
    # the healthy node's load still ran (nodes load independently)
    assert session.workspace("trainer_0")["trainer_0/w"].tolist() == [0.0] * 4


def test_set_params_passes_every_node_to_the_handler(tmp_path: Path) -> None:
    handler = RecordingHandler()
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler=handler)
    manager.set_params(NODES, path_prefix=str(tmp_path / "read"))
    assert handler.calls == [
        (
            "set_params",
            {
                "db_prefix": str(tmp_path),
                "db_type": "npz",
                "node_names": NODES,
                "path_prefix": str(tmp_path / "read"),
                "path_type": None,
                "storage": manager.location.storage,
            },
        )
    ]
