"""`ckptstore convert`: rewrite committed epochs in another format."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_helpers import data_key
from cli_helpers import Cli

from ckptstore import protocol
from ckptstore.errors import CorruptCheckpointError
from ckptstore.io._engine import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import get_registry
from ckptstore.testing.conformance import NODES, assert_same_blob, expected_state, flip_byte


@pytest.mark.parametrize("target", ["zarr", "lmdb"])
def test_converts_in_place(cli: Cli, run_url: str, target: str) -> None:
    result = cli("convert", run_url, "--to", target, "--json")
    assert result.code == 0
    assert len(result.json()["converted"]) == 8
    storage = LocalPath(run_url)
    for node in NODES:
        manifest = protocol.open_node(storage, node, 2)
        assert manifest.db_type == target
        blobs = protocol.read_blobs(
            storage, manifest, None, get_registry().db_type(target), ParallelIO()
        )
        for name, blob in expected_state(node, 2).items():
            assert_same_blob(blobs[name], blob)
    assert cli("verify", run_url).code == 0
    again = cli("convert", run_url, "--to", target, "--json").json()
    assert again["converted"] == []
    assert len(again["skipped"]) == 8


def test_converts_into_another_root(cli: Cli, run_url: str, tmp_path: Path) -> None:
    dest = str(tmp_path / "as-zarr")
    assert cli("convert", run_url, "--to", "zarr", "--latest", "--dest", dest).code == 0
    assert protocol.open_node(LocalPath(dest), "trainer_0", 3).db_type == "zarr"
    assert protocol.open_node(LocalPath(run_url), "trainer_0", 3).db_type == "npz"


def test_a_failed_rewrite_restores_the_original(
    cli: Cli, run_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptstore_lmdb.db import LmdbDB

    def broken(self: LmdbDB, db: object, blobs: object) -> None:
        raise CorruptCheckpointError("simulated failure", url=run_url)

    monkeypatch.setattr(LmdbDB, "write", broken)
    result = cli("convert", run_url, "--to", "lmdb", "--epoch", "1")
    assert result.code == 3
    storage = LocalPath(run_url)
    assert protocol.committed_nodes(storage, 1) == set(NODES)
    assert protocol.open_node(storage, "trainer_0", 1).db_type == "npz"


def test_an_unknown_format_is_an_error(cli: Cli, run_url: str) -> None:
    result = cli("convert", run_url, "--to", "parquet")
    assert result.code == 1
    assert "unknown db type 'parquet'" in result.err
    assert "did you mean" not in result.err  # nothing installed is alike


def test_a_mistyped_format_gets_the_closest_installed_one(cli: Cli, run_url: str) -> None:
    result = cli("convert", run_url, "--to", "nzp")
    assert result.code == 1
    assert "unknown db type 'nzp' (did you mean 'npz'?); installed: " in result.err
    demo = cli("demo", "--db-type", "zar", "--dir", f"{run_url}-demo")
    assert demo.code == 1
    assert "unknown db type 'zar' (did you mean 'zarr'?)" in demo.err


def test_a_damaged_node_leaves_nothing_committed_at_the_destination(
    cli: Cli, run_url: str, tmp_path: Path
) -> None:
    """trainer_0 is intact and written first: it is not committed alone (all or nothing)."""
    storage = LocalPath(run_url)
    chunk = protocol.open_node(storage, "trainer_1", 2).blobs["trainer_1/w"].chunks[0]
    flip_byte(storage, f"{data_key(storage, 'trainer_1', 2)}/{chunk.key}", chunk.offset + 5)
    dest = tmp_path / "as-zarr"
    result = cli("convert", run_url, "--to", "zarr", "--epoch", "2", "--dest", str(dest))
    assert result.code == 3
    assert protocol.read_commit(LocalPath(str(dest)), 2) is None
    assert "2  uncommitted    0/1" in cli("ls", str(dest)).out  # written, never committed
