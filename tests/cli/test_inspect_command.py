"""`ckptstore inspect`: an epoch's nodes and blobs."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import Cli


def test_describes_nodes_and_blobs(cli: Cli, run_url: str) -> None:
    result = cli("inspect", run_url, "--epoch", "2", "--json")
    assert result.code == 0
    described = result.json()
    assert described["epoch"] == 2
    nodes = {node["node"]: node for node in described["nodes"]}
    assert sorted(nodes) == ["trainer_0", "trainer_1"]
    blobs = {blob["name"]: blob for blob in nodes["trainer_1"]["blobs"]}
    assert blobs["trainer_1/w"] == {
        "name": "trainer_1/w",
        "dtype": "<f4",
        "shape": [64],
        "nbytes": 256,
        "stored_bytes": 256,
        "chunks": 1,
        "codec": "raw",
    }
    assert blobs["trainer_1/step"]["shape"] == []


def test_defaults_to_the_newest_epoch_and_filters_nodes(cli: Cli, run_url: str) -> None:
    result = cli("inspect", run_url, "--node", "trainer_0")
    assert result.code == 0
    assert "epoch 3" in result.out
    assert "trainer_0/w" in result.out
    assert "<f4" in result.out
    assert "(64,)" in result.out
    assert "trainer_1/w" not in result.out


def test_an_uncommitted_epoch_exits_4(cli: Cli, run_url: str, tmp_path: Path) -> None:
    result = cli("inspect", run_url, "--epoch", "12")
    assert result.code == 4
    assert "epoch 12 is not committed" in result.err
    assert cli("inspect", str(tmp_path / "empty")).code == 4
