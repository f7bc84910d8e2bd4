"""`ckptstore inspect`: an epoch's nodes and blobs."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import Cli, train_with_limiter_outside_nodes

from ckptstore import protocol
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.cli._common import DEFAULT_NODE_NOTE
from ckptstore.execution._session import LocalSession
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.paths._local_path import LocalPath
from ckptstore.records._layout import node_commit_key
from ckptstore.testing.conformance import counting_job


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


def test_a_damaged_newest_epoch_is_reported_not_passed_over(cli: Cli, run_url: str) -> None:
    """The default epoch is the newest with a commit record (``CommitListing``, as for
    resume), but unlike resume, inspect does not fall back past a damaged one."""
    (Path(run_url) / node_commit_key(3, "trainer_1")).write_bytes(b"{damaged")
    result = cli("inspect", run_url)
    assert result.code == 3
    assert "epoch 3" in result.err
    assert "epoch 2" not in result.out
    assert cli("inspect", run_url, "--epoch", "2").code == 0


def test_a_retracted_newest_epoch_is_passed_over(cli: Cli, run_url: str) -> None:
    protocol.retract_epoch(LocalPath(run_url), 3, ["trainer_0", "trainer_1"])
    result = cli("inspect", run_url)
    assert result.code == 0
    assert "epoch 2" in result.out


def test_shows_each_blobs_codec(cli: Cli, run_url: str) -> None:
    """docs/cli.md promises dtype, shape, bytes, chunks and codec per blob."""
    lines = cli("inspect", run_url, "--node", "trainer_1").out.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["BLOB"])
    assert header.split() == ["BLOB", "DTYPE", "SHAPE", "BYTES", "CHUNKS", "CODEC"]
    row = next(line for line in lines if line.split()[:1] == ["trainer_1/w"])
    assert row.split() == ["trainer_1/w", "<f4", "(64,)", "256", "B", "1", "raw"]


def test_shows_a_compressed_blobs_codec(cli: Cli, tmp_path: Path) -> None:
    url = str(tmp_path / "zstd")
    manager = MultiNodeCheckpointManager(url, ZarrDB(compression="zstd"))
    JobRunner(counting_job(epochs=1), manager).train(LocalSession())
    described = cli("inspect", url, "--json").json()
    assert {blob["codec"] for node in described["nodes"] for blob in node["blobs"]} == {"zstd"}
    row = next(line for line in cli("inspect", url).out.splitlines() if "trainer_0/w" in line)
    assert row.split()[-1] == "zstd"


def test_the_default_node_is_marked_and_explained(cli: Cli, tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    train_with_limiter_outside_nodes(url)
    described = cli("inspect", url, "--json").json()
    assert {n["node"]: n["default_node"] for n in described["nodes"]} == {
        "local": True,
        "trainer_0": False,
        "trainer_1": False,
    }
    text = cli("inspect", url).out
    assert "  node local (default node)  npz" in text
    assert "node trainer_0 (default node)" not in text
    assert text.splitlines()[-1] == DEFAULT_NODE_NOTE


def test_inspect_shows_a_nodes_own_and_shared_bytes(cli: Cli, tmp_path: Path) -> None:
    import numpy as np

    from ckptstore.tree import save_tree

    url = str(tmp_path / "run")
    save_tree(url, 0, {"base": np.ones(1 << 18), "x": np.arange(3)}, incremental=True)
    result = cli("inspect", url)
    assert result.code == 0
    assert "2.0 MiB in shared chunks)" in result.out
    assert cli("inspect", url, "--json").json()["nodes"][0]["shared_bytes"] == 2 << 20
