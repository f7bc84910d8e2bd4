"""LMDB checkpoints on an object store (moto S3): they get there by ``ckptstore cp``
(LMDB is written on local disk only) and load from there; a save there is refused
before anything committed is retracted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from ckptstore import (
    CheckpointManager,
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import CommitListing
from ckptstore.testing.conformance.jobs import NODES, counting_job, expected_state
from ckptstore.tools import copy_epochs
from ckptstore.tree import load_tree, save_tree

EPOCHS = [0, 1, 2]


def _copied_run(local: Path, url: str) -> None:
    """A job's LMDB run trained on local disk and copied to ``url`` (as ``cp`` does)."""
    manager = MultiNodeCheckpointManager(str(local), "lmdb")
    JobRunner(counting_job(epochs=EPOCHS[-1]), manager).train(LocalSession())
    copy_epochs(LocalPath(str(local)), get_registry().open_path(url), EPOCHS)


def test_a_copied_run_loads_from_the_store(s3_url: str, tmp_path: Path) -> None:
    _copied_run(tmp_path / "run", s3_url)
    session = LocalSession()
    manager = MultiNodeCheckpointManager(s3_url, "lmdb")
    session.run(manager.init(list(NODES), retrieve_from_epoch=1))
    session.run(manager.load(1))
    for node in NODES:
        for name, value in expected_state(node, 1).items():
            assert np.array_equal(session.workspace(node)[name], value)


def test_overwriting_on_the_store_is_refused_before_anything_is_retracted(
    s3_url: str, tmp_path: Path
) -> None:
    _copied_run(tmp_path / "run", s3_url)
    runner = JobRunner(
        counting_job(epochs=EPOCHS[-1]), MultiNodeCheckpointManager(s3_url, "lmdb"), overwrite=True
    )
    with pytest.raises(JobConfigurationError, match="works only on local disk"):
        runner.train(LocalSession())
    storage = get_registry().open_path(s3_url)
    assert CommitListing.of(storage).complete(NODES) == EPOCHS  # epoch 0 still committed


def _committed_zarr_epoch_1(url: str, nodes: Sequence[str]) -> None:
    """Epoch 1 of ``nodes`` committed at ``url`` in zarr, which the store can hold."""
    session = LocalSession()
    for node in nodes:
        session.workspace(node).update(expected_state(node, 1))
    manager = MultiNodeCheckpointManager(url, "zarr")
    session.run(manager.init(list(nodes)))
    session.run(manager.save(1))


@pytest.mark.parametrize("save", ["save", "save_async"])
@pytest.mark.parametrize(
    "nodes", [NODES[:1], NODES], ids=["CheckpointManager", "MultiNodeCheckpointManager"]
)
def test_an_overwriting_lmdb_save_on_the_store_is_refused_before_the_epoch_is_retracted(
    s3_url: str, nodes: tuple[str, ...], save: str
) -> None:
    """A manager's own save (no runner, no save_tree checking first) with
    ``overwrite=True`` is refused before it uncommits the epoch it would replace."""
    _committed_zarr_epoch_1(s3_url, nodes)
    session = LocalSession()
    for node in nodes:
        session.workspace(node).update(expected_state(node, 2))
    manager: CheckpointManager | MultiNodeCheckpointManager
    if len(nodes) == 1:
        manager = CheckpointManager(s3_url, nodes[0], "lmdb", overwrite=True)
    else:
        manager = MultiNodeCheckpointManager(s3_url, "lmdb", overwrite=True)
    session.run(manager.init(list(nodes)))

    def save_epoch_1() -> object:
        if save == "save":
            return session.run(manager.save(1))
        return manager.save_async(1, session)

    with pytest.raises(JobConfigurationError, match="works only on local disk"):
        save_epoch_1()
    storage = get_registry().open_path(s3_url)
    assert CommitListing.of(storage).complete(nodes) == [1]  # still committed
    reader = MultiNodeCheckpointManager(s3_url, "zarr")
    restored = LocalSession()
    restored.run(reader.init(list(nodes), retrieve_from_epoch=1))
    restored.run(reader.load(1))
    for node in nodes:
        for name, value in expected_state(node, 1).items():
            assert np.array_equal(restored.workspace(node)[name], value)


def test_a_job_saving_lmdb_to_the_store_stops_before_its_first_epoch(s3_url: str) -> None:
    session = LocalSession()
    runner = JobRunner(counting_job(epochs=2), MultiNodeCheckpointManager(s3_url, "lmdb"))
    with pytest.raises(JobConfigurationError, match="works only on local disk"):
        runner.train(session)
    assert all(len(session.workspace(node)) == 0 for node in NODES)  # not even the init ran
    assert runner.committed_epochs == []
    assert CommitListing.of(get_registry().open_path(s3_url)).epochs == []


def test_saving_a_tree_over_a_copied_one_is_refused_before_anything_is_retracted(
    s3_url: str, tmp_path: Path
) -> None:
    local = tmp_path / "tree"
    save_tree(str(local), 1, {"w": np.arange(3.0)}, db_type="lmdb")
    copy_epochs(LocalPath(str(local)), get_registry().open_path(s3_url), [1])
    with pytest.raises(JobConfigurationError, match="works only on local disk"):
        save_tree(s3_url, 1, {"w": np.zeros(3)}, db_type="lmdb", overwrite=True)
    assert load_tree(s3_url, db_type="lmdb")["w"].tolist() == [0.0, 1.0, 2.0]  # type: ignore[index]
