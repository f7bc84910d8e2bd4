"""save_tree / load_tree: committed, verified, found by epoch, readable by the CLI."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import RequestCountingPath, files_under, node_dir, register_storage

from ckptstore import (
    AlreadyCommittedError,
    CheckpointManager,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)
from ckptstore.errors import CheckpointKindError, InvalidEpochError
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import CheckpointLocation, open_node, retract_epoch, verify_node
from ckptstore.records._layout import CONTROL_DIR, MANIFEST_NAME, node_commit_key
from ckptstore.tree import SPEC_BLOB, latest_tree_epoch, load_tree, save_tree


@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_a_tree_round_trips_through_each_format(tmp_path: Path, db_type: str) -> None:
    tree = {"params": {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, "step": 3, "lr": 0.1}
    save_tree(str(tmp_path), 3, tree, db_type=db_type)
    out = load_tree(str(tmp_path), db_type=db_type)
    assert isinstance(out, dict)
    assert out["step"] == 3
    assert out["lr"] == 0.1
    assert np.array_equal(out["params"]["w"], tree["params"]["w"])
    location = CheckpointLocation.open(str(tmp_path), db_type)
    manifest = open_node(location.storage, "tree", 3)
    assert sorted(manifest.blobs) == [SPEC_BLOB, "params/w"]
    assert verify_node(location.storage, "tree", 3, location.db_type, location.engine()) == []


def test_the_newest_epoch_is_loaded_unless_one_is_named(tmp_path: Path) -> None:
    for epoch in (1, 2, 5):
        save_tree(str(tmp_path), epoch, {"epoch": epoch})
    save_tree(str(tmp_path), 9, {"other": True}, node="other")
    assert latest_tree_epoch(str(tmp_path)) == 5
    assert load_tree(str(tmp_path)) == {"epoch": 5}
    assert load_tree(str(tmp_path), 2) == {"epoch": 2}
    assert load_tree(str(tmp_path), node="other") == {"other": True}


def test_a_manager_is_a_target(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), "trainer_0", "npz")
    save_tree(manager, 0, [np.ones(2), "x"])
    assert load_tree(manager)[1] == "x"  # type: ignore[index]
    assert (tmp_path / "tree.0").is_dir()


def test_nothing_saved_is_a_typed_error_that_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="save_tree"):
        load_tree(str(tmp_path))


def test_an_overwritten_epoch_holds_only_the_new_tree(tmp_path: Path) -> None:
    save_tree(str(tmp_path), 1, {"a": np.ones(3), "b": np.ones(3)}, db_type="npz")
    save_tree(str(tmp_path), 1, {"a": np.zeros(3)}, db_type="npz", overwrite=True)
    out = load_tree(str(tmp_path), 1, db_type="npz")
    assert isinstance(out, dict)
    assert list(out) == ["a"]
    assert out["a"].tolist() == [0.0] * 3


def test_a_committed_epoch_is_write_once_and_nothing_is_written(tmp_path: Path) -> None:
    """As a manager's: saving a committed epoch again raises AlreadyCommittedError
    before anything is written; the first tree stays."""
    save_tree(str(tmp_path), 1, {"a": np.ones(3)})
    files = files_under(tmp_path)
    with pytest.raises(AlreadyCommittedError, match="overwrite=True") as raised:
        save_tree(str(tmp_path), 1, {"a": np.zeros(3)})
    assert (raised.value.epoch, raised.value.nodes) == (1, ("tree",))
    assert files_under(tmp_path) == files
    assert load_tree(str(tmp_path), 1)["a"].tolist() == [1.0] * 3  # type: ignore[index]
    save_tree(str(tmp_path), 1, {"a": np.ones(3)}, node="other")  # another node: its own


@pytest.mark.parametrize("epoch", ["2", 4.0, True, -1, None, 2**63], ids=repr)
def test_an_epoch_that_is_not_one_is_refused_naming_it(tmp_path: Path, epoch: object) -> None:
    """Before: '2', 4.0 and True were written (``tree.4.0``), then read back as corrupt
    or not found; -1 wrote a directory ``ls`` ignores."""
    root = tmp_path / "ckpt"
    with pytest.raises(InvalidEpochError, match=r"^epoch=.* is not an epoch") as raised:
        save_tree(str(root), epoch, {"a": 1})  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)
    assert not isinstance(raised.value, CorruptCheckpointError)
    assert "non-negative integer" in str(raised.value)
    assert not root.exists()
    save_tree(str(root), 2, {"a": 1})
    if epoch is not None:
        with pytest.raises(InvalidEpochError, match=r"^epoch="):
            load_tree(str(root), epoch)  # type: ignore[arg-type]


def test_a_numpy_integer_epoch_is_saved_as_an_int(tmp_path: Path) -> None:
    """Before: a raw TypeError from JSON, half-way through the save."""
    save_tree(str(tmp_path), np.int64(3), {"a": 1})  # type: ignore[arg-type]
    assert (tmp_path / "tree.3").is_dir()
    assert load_tree(str(tmp_path), np.int32(3)) == {"a": 1}  # type: ignore[arg-type]
    assert type(latest_tree_epoch(str(tmp_path))) is int


def test_a_job_checkpoint_is_not_mistaken_for_a_tree(tmp_path: Path) -> None:
    from ckpt_helpers import build_counter_job

    from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager

    job, _ = build_counter_job(epochs=1)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz")).train(LocalSession())
    with pytest.raises(CheckpointKindError, match="save_tree did not write it") as raised:
        load_tree(str(tmp_path), 1, node="trainer_0")
    assert isinstance(raised.value, ValueError)
    assert not isinstance(raised.value, CorruptCheckpointError)
    assert "trainer_0.1" in str(raised.value)


def test_the_newest_epoch_is_one_listing_and_the_newest_record(
    tmp_path: Path, registry: Registry
) -> None:
    """The same question as resume (``CommitListing.newest_complete``): one listing of
    the control directory, then only the newest candidate's records; epochs another
    node saved later are passed over without being read."""
    for epoch in (1, 2, 3):
        save_tree(str(tmp_path), epoch, {"epoch": epoch})
    save_tree(str(tmp_path), 9, {"other": True}, node="other")
    register_storage(registry, RequestCountingPath)
    location = CheckpointLocation.open(str(tmp_path), "zarr", path_type="request_counting")
    storage = location.storage
    assert isinstance(storage, RequestCountingPath)
    assert latest_tree_epoch(location) == 3
    assert storage.listings == [CONTROL_DIR]
    assert set(storage.record_reads) == {3}


def test_a_damaged_newest_record_falls_back_to_the_newest_intact_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for epoch in (1, 2):
        save_tree(str(tmp_path), epoch, {"epoch": epoch})
    (tmp_path / node_commit_key(2, "tree")).write_bytes(b"{damaged")
    with caplog.at_level(logging.WARNING):
        assert latest_tree_epoch(str(tmp_path)) == 1
        assert load_tree(str(tmp_path)) == {"epoch": 1}
    assert "Skipping epoch 2" in caplog.text
    with pytest.raises(CorruptCheckpointError, match="epoch 2"):  # named: still loud
        load_tree(str(tmp_path), 2)


def test_a_newest_epoch_with_a_damaged_manifest_fails_loudly(tmp_path: Path) -> None:
    """Its commit record is intact, so it is the newest committed epoch: loading it
    raises, naming it, instead of quietly loading an older tree."""
    for epoch in (1, 2):
        save_tree(str(tmp_path), epoch, {"epoch": epoch})
    (node_dir(tmp_path, "tree", 2) / MANIFEST_NAME).unlink()
    assert latest_tree_epoch(str(tmp_path)) == 2
    with pytest.raises(CorruptCheckpointError, match="epoch 2"):
        load_tree(str(tmp_path))


def test_an_epoch_retracted_for_the_tree_is_passed_over(tmp_path: Path) -> None:
    for epoch in (1, 2):
        save_tree(str(tmp_path), epoch, {"epoch": epoch})
    retract_epoch(CheckpointLocation.open(str(tmp_path), "zarr").storage, 2, ["tree"])
    assert latest_tree_epoch(str(tmp_path)) == 1
    assert load_tree(str(tmp_path)) == {"epoch": 1}


def test_the_readme_tree_example_reads_the_state_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    match = re.search(r"<!-- tree-example -->\n```python\n(.*?)```", readme, re.S)
    assert match, "README.md lost its tree example"
    monkeypatch.chdir(tmp_path)
    params = {"w": np.arange(6, dtype=np.float32)}
    namespace: dict[str, object] = {"epoch": 3, "params": params, "step": 300}
    exec(compile(match.group(1), "README.md", "exec"), namespace)
    tree = namespace["tree"]
    assert isinstance(tree, dict)
    assert tree["step"] == 300
    assert np.array_equal(tree["params"]["w"], params["w"])
    assert latest_tree_epoch("./ckpt") == 3


def test_frozen_names_keys_and_the_blobs_under_them_only() -> None:
    from ckptstore.tree._store import _frozen_blobs

    tree = {"model": {"base": 1, "base2": 2}, "model2": 3, "a/b": 4}
    arrays = dict.fromkeys(["model/base", "model/base2", "model2", "a%2Fb"])
    assert _frozen_blobs(tree, ["model"], arrays) == ["model/base", "model/base2"]
    assert _frozen_blobs(tree, [("model", "base")], arrays) == ["model/base"]
    assert _frozen_blobs(tree, ["a/b", "model2"], arrays) == ["model2", "a%2Fb"]
    assert _frozen_blobs(tree, [], arrays) == []
