"""`ckptstore catalog rebuild`: a run's catalog recreated from its commit records."""

from __future__ import annotations

import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest
from cli_helpers import Cli

from ckptstore.builtin._json_catalog import CATALOG_DIR, JsonCatalog, entry_key
from ckptstore.builtin._sqlite_catalog import SqliteCatalog
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import CatalogCorruptError
from ckptstore.execution._session import LocalSession
from ckptstore.paths._local_path import LocalPath
from ckptstore.testing.conformance import NODES, counting_job


def json_epochs(url: str) -> list[int]:
    catalog = JsonCatalog()
    catalog.set_params(url, "npz", list(NODES), storage=LocalPath(url))
    return sorted(catalog._read_entries())


def test_rebuilds_a_deleted_json_catalog(cli: Cli, run_url: str) -> None:
    shutil.rmtree(Path(run_url) / CATALOG_DIR)
    result = cli("catalog", "rebuild", run_url)
    assert result.code == 0
    assert "json: " in result.out
    assert "added or corrected epochs [0, 1, 2, 3]" in result.out
    assert json_epochs(run_url) == [0, 1, 2, 3]


def test_json_output_says_what_changed(cli: Cli, run_url: str) -> None:
    (Path(run_url) / entry_key(2)).write_bytes(bytes(100))  # zero-filled entry
    result = cli("catalog", "rebuild", run_url, "--json")
    assert result.code == 0
    (report,) = result.json()["catalogs"]
    assert report["kind"] == "json"
    assert report["reset"] is True
    assert report["epochs"] == [0, 1, 2, 3]
    assert json_epochs(run_url) == [0, 1, 2, 3]
    again = cli("catalog", "rebuild", run_url, "--json").json()["catalogs"][0]
    assert again["changed"] is False


def test_rebuilds_a_zero_filled_sqlite_catalog(cli: Cli, tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    manager = MultiNodeCheckpointManager(url, "npz", metadata_handler=SqliteCatalog())
    JobRunner(counting_job(epochs=2), manager).train(LocalSession())
    database = Path(url) / "_ckptstore" / "catalog.sqlite"
    database.write_bytes(bytes(database.stat().st_size))
    result = cli("catalog", "rebuild", url, "--kind", "sqlite")
    assert result.code == 0
    assert "sqlite: " in result.out
    assert "discarded the unreadable catalog" in result.out
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT epoch FROM epochs ORDER BY epoch").fetchall()
    connection.close()
    assert rows == [(0,), (1,), (2,)]


def test_a_damaged_sqlite_catalog_kept_elsewhere_names_the_command_that_rebuilds_it(
    cli: Cli, tmp_path: Path
) -> None:
    """The error of an unreadable sqlite file outside the root names the root and the
    file: running the command it quotes rebuilds that file."""
    url = str(tmp_path / "run")
    database = tmp_path / "elsewhere" / "catalog.sqlite"
    manager = MultiNodeCheckpointManager(
        url, "npz", metadata_handler=SqliteCatalog(database=str(database))
    )
    JobRunner(counting_job(epochs=2), manager).train(LocalSession())
    database.write_bytes(b"not a database" * 100)
    catalog = SqliteCatalog(database=str(database))
    catalog.set_params(url, "npz", list(NODES), storage=LocalPath(url))
    with pytest.raises(CatalogCorruptError) as info:
        catalog.query("SELECT count(*) FROM epochs")
    command = shlex.split(str(info.value).split("`")[1])
    assert command[:3] == ["ckptstore", "catalog", "rebuild"]
    assert str(database) in command
    assert url in command
    result = cli(*command[1:])
    assert result.code == 0, result.err
    assert "discarded the unreadable catalog" in result.out
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT epoch FROM epochs ORDER BY epoch").fetchall()
    connection.close()
    assert rows == [(0,), (1,), (2,)]


def test_an_empty_root_gets_an_empty_catalog(cli: Cli, tmp_path: Path) -> None:
    result = cli("catalog", "rebuild", str(tmp_path), "--json")
    assert result.code == 0
    assert result.json()["catalogs"][0]["epochs"] == []
