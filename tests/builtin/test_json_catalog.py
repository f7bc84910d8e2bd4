"""The ``json`` metadata handler: a catalog of committed epochs beside the checkpoints."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from catalog_helpers import assert_repairs_damage, assert_resumes_from, snapshot, train, two_writers
from ckpt_helpers import build_counter_job

from ckptstore import (
    CheckpointNotFoundError,
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.builtin import JsonCatalog, LocalPath
from ckptstore.builtin._json_catalog import CATALOG_DIR, entry_key
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import _commit as protocol
from ckptstore.records._layout import node_commit_key

NODES = ["trainer_0", "trainer_1"]  # the conformance job's nodes too


def run_jobs(prefix: Path, epochs: dict[str, int]) -> None:
    """One single-node job per node, sharing ``prefix``, each running its epochs."""
    for node, count in epochs.items():
        job, _ = build_counter_job(nodes=(node,), epochs=count)
        manager = MultiNodeCheckpointManager(str(prefix), "npz", metadata_handler="json")
        JobRunner(job, manager).train(LocalSession())


def catalog_for(prefix: Path, nodes: list[str]) -> JsonCatalog:
    handler = JsonCatalog()
    handler.set_params(str(prefix), "npz", nodes, storage=LocalPath(str(prefix)))
    return handler


def test_the_catalog_lists_every_committed_epoch(tmp_path: Path) -> None:
    run_jobs(tmp_path, {"trainer_0": 2})
    epochs = catalog_for(tmp_path, ["trainer_0"]).epochs()
    assert sorted(epochs) == [0, 1, 2]
    assert epochs[2].nodes == ("trainer_0",)
    assert epochs[2].db_types == ("npz",)
    assert epochs[2].nbytes == 4 * 8 + 8 + 8  # w, step and the epoch limiter
    assert sorted(p.name for p in (tmp_path / CATALOG_DIR).iterdir()) == [
        "epoch-0.json",
        "epoch-1.json",
        "epoch-2.json",
    ]


def test_last_epoch_is_the_newest_complete_on_every_node(tmp_path: Path) -> None:
    run_jobs(tmp_path, {"trainer_0": 3, "trainer_1": 1})
    assert catalog_for(tmp_path, NODES).last_epoch() == 1
    assert catalog_for(tmp_path, ["trainer_0"]).last_epoch() == 3
    assert catalog_for(tmp_path, ["trainer_1"]).last_epoch() == 1


def test_a_users_epoch_is_validated_never_replaced(tmp_path: Path) -> None:
    run_jobs(tmp_path, {"trainer_0": 3, "trainer_1": 1})
    handler = catalog_for(tmp_path, NODES)
    assert handler.last_epoch(user_epoch=0) == 0
    assert handler.last_epoch(user_epoch=1) == 1
    with pytest.raises(CheckpointNotFoundError) as info:
        handler.last_epoch(user_epoch=3)
    message = str(info.value)
    assert "not committed for nodes ['trainer_1']" in message
    assert "Complete epochs: [0, 1]" in message
    assert info.value.epoch == 3


def test_a_newest_epoch_whose_commit_record_is_gone_is_skipped(tmp_path: Path) -> None:
    run_jobs(tmp_path, {"trainer_0": 3})
    os.unlink(tmp_path / node_commit_key(3, "trainer_0"))
    handler = catalog_for(tmp_path, ["trainer_0"])
    assert 3 in handler.epochs()  # the catalog still lists it...
    assert handler.last_epoch() == 2  # ...but the commit record decides


def test_a_corrupt_catalog_is_rebuilt_from_the_commit_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_jobs(tmp_path, {"trainer_0": 2})
    handler = catalog_for(tmp_path, ["trainer_0"])
    before = handler.epochs()
    (tmp_path / entry_key(1)).write_bytes(b'{"crc32c":1,"garbage":true}')
    (tmp_path / "_ckptstore" / "unrelated.txt").write_text("ignored")
    assert handler.epochs() == before
    assert "rebuilding it" in caplog.text
    caplog.clear()
    assert handler.epochs() == before
    assert "rebuilding" not in caplog.text  # the rebuilt catalog was stored
    assert handler.last_epoch() == 2


def test_write_refuses_an_epoch_not_committed_on_every_node(tmp_path: Path) -> None:
    run_jobs(tmp_path, {"trainer_0": 1})
    handler = catalog_for(tmp_path, NODES)
    with pytest.raises(CheckpointNotFoundError, match=r"lacks nodes \['trainer_1'\]"):
        handler.write(1)
    with pytest.raises(CheckpointNotFoundError, match="refusing to catalog epoch 7"):
        handler.write(7)
    assert sorted(handler.epochs()) == [0, 1]


def test_without_checkpoints_there_is_nothing_to_resume(tmp_path: Path) -> None:
    handler = catalog_for(tmp_path, NODES)
    assert handler.epochs() == {}
    assert handler.last_epoch() is None
    assert handler.cp_accessible() is True


def test_the_catalog_needs_set_params_first() -> None:
    with pytest.raises(JobConfigurationError, match="set_params"):
        JsonCatalog().last_epoch()


def test_json_is_the_registered_name(registry: Registry) -> None:
    assert isinstance(registry.metadata_handler("json"), JsonCatalog)
    assert registry.metadata_handler(None) is None


def test_a_rerun_with_no_arguments_resumes_from_the_newest_complete_epoch(tmp_path: Path) -> None:
    run_jobs(tmp_path, {"trainer_0": 3, "trainer_1": 1})
    job, _ = build_counter_job(nodes=tuple(NODES), epochs=3)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(job, manager)
    session = LocalSession()
    runner.train(session)
    assert runner.committed_epochs[0] == 2  # resumed from 1, the newest complete on both


def test_a_corrupt_newest_commit_record_falls_back_and_is_replaced_by_the_next_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_jobs(tmp_path, {"trainer_0": 3})
    record = tmp_path / node_commit_key(3, "trainer_0")
    data = bytearray(record.read_bytes())
    data[25] ^= 0x01
    record.write_bytes(bytes(data))
    assert catalog_for(tmp_path, ["trainer_0"]).last_epoch() == 2
    assert "epoch 3" in caplog.text
    job, _ = build_counter_job(nodes=("trainer_0",), epochs=3)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(job, manager, save_retries=0)
    assert runner.train(LocalSession()) == 3  # resumed from 2: epoch 3 runs again
    assert runner.save_failures == []
    assert runner.committed_epochs == [3]
    assert catalog_for(tmp_path, ["trainer_0"]).last_epoch() == 3


# -- storage is the truth: a damaged or stale catalog never makes a job start over ------


def _catalog_file(path: Path) -> bool:
    return CATALOG_DIR in str(path) or path.name == "catalog.json"


def _damage_deleted(root: Path) -> None:
    shutil.rmtree(root / CATALOG_DIR)


def _damage_truncated(root: Path) -> None:
    for entry in (root / CATALOG_DIR).iterdir():
        entry.write_bytes(entry.read_bytes()[:7])


def _damage_zero_filled(root: Path) -> None:
    for entry in (root / CATALOG_DIR).iterdir():
        entry.write_bytes(bytes(len(entry.read_bytes())))


def _damage_empty(root: Path) -> None:
    for entry in (root / CATALOG_DIR).iterdir():
        entry.write_bytes(b"")


def _damage_stale(root: Path) -> None:
    for epoch in (3, 4, 5):  # lists fewer epochs than storage
        (root / entry_key(epoch)).unlink()


def _damage_legacy_only(root: Path) -> None:
    shutil.rmtree(root / CATALOG_DIR)
    (root / "_ckptstore" / "catalog.json").write_bytes(b'{"epochs": {"0": {}}}')


@pytest.mark.parametrize(
    "damage",
    [
        _damage_deleted,
        _damage_truncated,
        _damage_zero_filled,
        _damage_empty,
        _damage_stale,
        _damage_legacy_only,
    ],
    ids=["deleted", "truncated", "zero-filled", "empty", "stale", "legacy"],
)
def test_a_damaged_catalog_resumes_from_the_newest_epoch_and_is_repaired(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    assert_repairs_damage(tmp_path / "run", JsonCatalog, damage, _catalog_file, caplog)


def test_a_catalog_listing_epochs_no_longer_committed_is_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "run"
    runner = train(str(root), JsonCatalog, epochs=6)
    assert runner.checkpoint_manager is not None
    storage = runner.checkpoint_manager.location.storage
    protocol.retract_epoch(storage, 6, NODES)  # as an interrupted re-save leaves it
    assert 6 in catalog_for(root, list(NODES)).epochs()
    # epoch 6's uncommitted data is redone by the resumed job; everything else stays
    before = {k: v for k, v in snapshot(root, _catalog_file).items() if ".6/" not in k}
    assert_resumes_from(root, JsonCatalog, 5, before, _catalog_file, caplog)
    assert "dropped epochs [6]" in caplog.text


def test_rebuild_reports_what_it_changed(tmp_path: Path) -> None:
    root = tmp_path / "run"
    train(str(root), JsonCatalog, epochs=3)
    handler = catalog_for(root, list(NODES))
    (root / entry_key(1)).unlink()
    report = handler.rebuild()
    assert report.added == (1,)
    assert report.dropped == ()
    assert report.epochs == (0, 1, 2, 3)
    assert not handler.rebuild().changed


def test_two_writer_processes_lose_no_catalog_entry(tmp_path: Path) -> None:
    root = tmp_path / "run"
    written = two_writers(str(root), None, per_writer=24)
    entries = catalog_for(root, ["trainer_0"]).epochs()
    assert set(entries) == written  # 48 epochs, none lost
    assert all(entries[epoch].nodes == (f"trainer_{epoch % 2}",) for epoch in written)


def test_a_catalog_that_cannot_be_repaired_never_stops_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "run"
    train(str(root), JsonCatalog, epochs=3)
    shutil.rmtree(root / CATALOG_DIR)

    def read_only(self: LocalPath, key: str, data: bytes) -> None:
        raise PermissionError(f"read-only: {key}")

    monkeypatch.setattr(LocalPath, "put_document", read_only)
    assert catalog_for(root, list(NODES)).last_epoch() == 3
    assert "could not repair the catalog (resuming anyway)" in caplog.text
