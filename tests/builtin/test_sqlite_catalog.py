"""The ``sqlite`` metadata handler: the conformance kit, plus what a shared, queryable
catalog adds (many runs in one file, nodes, sizes, checksums, durations, events)."""

from __future__ import annotations

import importlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from catalog_helpers import assert_repairs_damage, two_writers
from catalog_helpers import train as train_run
from ckpt_helpers import failing_local_path, register_storage

from ckptstore.builtin._sqlite_catalog import DATABASE_ENV, SqliteCatalog
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._retention import KeepLast
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import (
    CatalogCorruptError,
    JobConfigurationError,
    StorageError,
)
from ckptstore.execution._session import LocalSession
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import _commit as protocol
from ckptstore.testing.conformance import (
    NODES,
    HandlerFactory,
    MetadataHandlerConformance,
    counting_job,
)


@pytest.fixture(autouse=True)
def sqlite_registered(registry: Registry) -> None:
    """Until ``ckptstore.builtin._sqlite_catalog`` is in BUILTIN_PLUGINS, register it."""
    if "sqlite" not in registry.metadata_handlers:
        registry.register(importlib.import_module("ckptstore.builtin._sqlite_catalog"))


class TestSqliteBesideTheCheckpoints(MetadataHandlerConformance):
    @pytest.fixture
    def make_handler(self) -> HandlerFactory:
        return SqliteCatalog


class TestSqliteInASharedDatabase(MetadataHandlerConformance):
    @pytest.fixture
    def make_handler(self, tmp_path: Path) -> HandlerFactory:
        return lambda: SqliteCatalog(tmp_path / "shared" / "catalog.sqlite")


def train(url: str, handler: SqliteCatalog | str, epochs: int = 2) -> JobRunner:
    manager = MultiNodeCheckpointManager(url, "npz", metadata_handler=handler)
    runner = JobRunner(counting_job(epochs=epochs), manager)
    assert runner.train(LocalSession()) == epochs
    return runner


def test_default_database_lives_beside_local_checkpoints(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    train(url, "sqlite")
    database = tmp_path / "run" / "_ckptstore" / "catalog.sqlite"
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT epoch, nnodes FROM epochs ORDER BY epoch").fetchall()
    assert rows == [(0, 2), (1, 2), (2, 2)]


def test_one_database_catalogs_many_runs(tmp_path: Path) -> None:
    database = tmp_path / "team.sqlite"
    for name, epochs in (("a", 1), ("b", 3)):
        train(str(tmp_path / name), SqliteCatalog(database), epochs)
    catalog = SqliteCatalog(database)
    assert catalog.runs() == [str(tmp_path / "a"), str(tmp_path / "b")]
    per_run = catalog.query(
        "SELECT r.url, count(*), max(e.epoch) FROM epochs e JOIN runs r USING (run_id) "
        "GROUP BY r.url ORDER BY r.url"
    )
    assert per_run == [(str(tmp_path / "a"), 2, 1), (str(tmp_path / "b"), 4, 3)]


def test_nodes_hold_sizes_checksums_and_durations(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    catalog = SqliteCatalog(tmp_path / "c.sqlite")
    train(url, catalog)
    record = protocol.read_commit(LocalPath(url), 2)
    assert record is not None
    rows = catalog.query(
        "SELECT node, db_type, nbytes, stored_bytes, nblobs, manifest_crc32c, save_duration_ns "
        "FROM nodes WHERE epoch = 2 ORDER BY node"
    )
    assert rows == [
        (
            name,
            "npz",
            node.nbytes,
            node.stored_bytes,
            node.nblobs,
            node.manifest_crc32c,
            node.duration_ns,
        )
        for name, node in sorted(record.nodes.items())
    ]
    assert all(row[6] > 0 for row in rows)
    assert catalog.epochs()[2].nodes == tuple(NODES)


def test_reports_and_failures_are_events(tmp_path: Path, registry: Registry) -> None:
    catalog = SqliteCatalog(tmp_path / "c.sqlite")
    train(str(tmp_path / "run"), catalog, epochs=1)
    actions = catalog.query("SELECT action, count(*) FROM events GROUP BY action")
    assert dict(actions) == {"checkpoint_save": 4}

    register_storage(registry, failing_local_path(lambda key: True))
    failing = SqliteCatalog(tmp_path / "c.sqlite")
    manager = MultiNodeCheckpointManager(
        str(tmp_path / "other"), "npz", metadata_handler=failing, path_type="failing_local"
    )
    runner = JobRunner(counting_job(epochs=1), manager, retry_backoff=0)
    runner.train(LocalSession())
    errors = failing.query("SELECT node, error FROM events WHERE action = 'checkpoint_save_failed'")
    assert len(errors) == 4
    assert all(error for _, error in errors)


def test_retention_makes_the_catalog_forget_deleted_epochs(tmp_path: Path) -> None:
    catalog = SqliteCatalog(tmp_path / "c.sqlite")
    manager = MultiNodeCheckpointManager(str(tmp_path / "run"), "npz", metadata_handler=catalog)
    runner = JobRunner(counting_job(epochs=4), manager, retention=KeepLast(2))
    runner.train(LocalSession())
    assert sorted(catalog.epochs()) == [3, 4]
    assert catalog.query("SELECT DISTINCT epoch FROM nodes ORDER BY epoch") == [(3,), (4,)]


def test_object_store_roots_need_a_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    manager = MultiNodeCheckpointManager(
        "memory://sqlite-test/run", "npz", metadata_handler="sqlite"
    )
    manager.set_params(list(NODES))
    with pytest.raises(JobConfigurationError, match=DATABASE_ENV):
        manager.get_resume_from_epoch_id(None)
    monkeypatch.setenv(DATABASE_ENV, str(tmp_path / "env.sqlite"))
    assert manager.get_resume_from_epoch_id(None) is None
    assert (tmp_path / "env.sqlite").exists()


# -- storage is the truth: a damaged or stale catalog never makes a job start over ------


def _catalog_file(path: Path) -> bool:
    return "catalog.sqlite" in path.name


def _database(root: Path) -> Path:
    return root / "_ckptstore" / "catalog.sqlite"


def _damage_deleted(root: Path) -> None:
    _database(root).unlink()


def _damage_truncated(root: Path) -> None:
    data = _database(root).read_bytes()
    _database(root).write_bytes(data[: len(data) // 3])


def _damage_truncated_to_nothing(root: Path) -> None:
    _database(root).write_bytes(b"")


def _damage_zero_filled(root: Path) -> None:
    _database(root).write_bytes(bytes(_database(root).stat().st_size))


def _damage_stale(root: Path) -> None:
    with sqlite3.connect(_database(root)) as connection:  # lists fewer epochs than storage
        connection.execute("PRAGMA foreign_keys = ON")
        connection.execute("DELETE FROM epochs WHERE epoch >= 3")
    connection.close()


@pytest.mark.parametrize(
    "damage",
    [
        _damage_deleted,
        _damage_truncated,
        _damage_truncated_to_nothing,
        _damage_zero_filled,
        _damage_stale,
    ],
    ids=["deleted", "truncated", "emptied", "zero-filled", "stale"],
)
def test_a_damaged_catalog_resumes_from_the_newest_epoch_and_is_repaired(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    assert_repairs_damage(tmp_path / "run", SqliteCatalog, damage, _catalog_file, caplog)


def test_a_zero_filled_database_is_a_typed_error_then_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "run"
    train_run(str(root), SqliteCatalog, epochs=2)
    _damage_zero_filled(root)
    catalog = SqliteCatalog()
    catalog.set_params(str(root), "npz", list(NODES), storage=LocalPath(str(root)))
    with pytest.raises(CatalogCorruptError, match="ckptstore catalog rebuild") as info:
        catalog.query("SELECT count(*) FROM epochs")
    assert isinstance(info.value, ValueError)
    assert sorted(catalog.epochs()) == [0, 1, 2]  # rebuilt from the commit records
    assert "moved the unreadable sqlite catalog" in caplog.text
    aside = [p for p in (root / "_ckptstore").iterdir() if ".unreadable-" in p.name]
    assert len(aside) == 1
    assert aside[0].read_bytes() == bytes(aside[0].stat().st_size)


def test_a_locked_database_is_a_typed_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ckptstore.builtin._sqlite_catalog.BUSY_TIMEOUT_S", 0.01)
    database = tmp_path / "c.sqlite"
    catalog = SqliteCatalog(database)
    catalog.set_params(str(tmp_path), "npz", list(NODES), storage=LocalPath(str(tmp_path)))
    assert catalog.epochs() == {}
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StorageError, match="locked"):
            catalog.epochs()
    finally:
        holder.close()


def test_two_writer_processes_lose_no_catalog_entry(tmp_path: Path) -> None:
    root = tmp_path / "run"
    database = tmp_path / "shared.sqlite"
    written = two_writers(str(root), str(database), per_writer=24)
    catalog = SqliteCatalog(database)
    catalog.set_params(str(root), "npz", ["trainer_0"], storage=LocalPath(str(root)))
    entries = catalog._read_entries()  # as stored, not repaired
    assert set(entries) == written  # 48 epochs, none lost
    assert all(entries[epoch].nodes == (f"trainer_{epoch % 2}",) for epoch in written)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_linked_database_inside_the_root_is_moved_aside_never_written_through(
    tmp_path: Path, link: str
) -> None:
    """docs/security.md: SQLite writes in place, so a catalog file linked to one
    outside the root would be written through; it is refused as an unreadable catalog,
    the link moved aside and the catalog rebuilt from the commit records, and the
    outside file keeps its bytes."""
    url = str(tmp_path / "run")
    train(url, "sqlite")
    database = tmp_path / "run" / "_ckptstore" / "catalog.sqlite"
    outside = tmp_path / "outside.sqlite"
    outside.write_bytes(database.read_bytes())
    database.unlink()
    if link == "symlink":
        database.symlink_to(outside)
    else:
        database.hardlink_to(outside)
    before = outside.read_bytes()
    handler = SqliteCatalog()
    handler.set_params(url, "npz", ["trainer_0"], storage=LocalPath(url))
    assert sorted(handler.epochs()) == [0, 1, 2]
    assert not database.is_symlink()
    assert database.stat().st_nlink == 1
    assert outside.read_bytes() == before
    assert len(list(database.parent.glob("catalog.sqlite.unreadable-*"))) == 1
