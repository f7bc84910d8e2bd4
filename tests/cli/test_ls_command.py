"""`ckptstore ls`: runs and epochs, committed or not, with sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from cli_helpers import Cli, train, train_with_limiter_outside_nodes

from ckptstore import protocol
from ckptstore.cli._common import DEFAULT_NODE_NOTE
from ckptstore.formats._npz_db import NpzDB
from ckptstore.io._engine import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.testing.servers import free_port


def test_lists_every_epoch_of_a_run(cli: Cli, run_url: str) -> None:
    result = cli("ls", run_url, "--json")
    assert result.code == 0
    (run,) = result.json()["runs"]
    assert run["prefix"] == ""
    assert [e["epoch"] for e in run["epochs"]] == [0, 1, 2, 3]
    assert {e["state"] for e in run["epochs"]} == {"committed"}
    epoch = run["epochs"][3]
    assert [n["node"] for n in epoch["nodes"]] == ["trainer_0", "trainer_1"]
    assert epoch["nbytes"] == sum(n["nbytes"] for n in epoch["nodes"]) > 2 * 64 * 4
    assert all(n["db_type"] == "npz" for n in epoch["nodes"])


def test_lists_runs_below_a_prefix_and_uncommitted_epochs(cli: Cli, tmp_path: Path) -> None:
    train(str(tmp_path / "runs" / "alpha"), epochs=1)
    beta = LocalPath(str(tmp_path / "runs" / "team" / "beta"))
    commit = protocol.write_node(beta, "trainer_0", 7, {"w": np.ones(3)}, NpzDB(), ParallelIO())
    protocol.write_node(beta, "trainer_1", 7, {"w": np.ones(3)}, NpzDB(), ParallelIO())
    protocol.commit_epoch(beta, 7, [commit])  # trainer_1 wrote but never committed
    protocol.write_node(beta, "trainer_0", 8, {"w": np.ones(3)}, NpzDB(), ParallelIO())
    beta.write_bytes(".trainer_0.9.staging-abc/blobs.npz", b"x" * 100)  # a save in progress

    result = cli("ls", str(tmp_path / "runs"), "--json")
    assert result.code == 0
    runs = {run["prefix"]: run for run in result.json()["runs"]}
    assert sorted(runs) == ["alpha", "team/beta"]
    states = {e["epoch"]: e["state"] for e in runs["team/beta"]["epochs"]}
    assert states == {7: "partial", 8: "uncommitted", 9: "uncommitted"}
    nine = runs["team/beta"]["epochs"][2]["nodes"][0]
    assert (nine["state"], nine["stored_bytes"]) == ("writing", 100)

    text = cli("ls", str(tmp_path / "runs"), "--nodes").out
    assert "team/beta" in text
    assert "partial" in text
    assert "writing" in text


def test_an_empty_location_lists_nothing(cli: Cli, tmp_path: Path) -> None:
    result = cli("ls", str(tmp_path))
    assert result.code == 0
    assert "no checkpoints" in result.out
    assert cli("ls", str(tmp_path), "--json").json()["runs"] == []


def test_an_unknown_scheme_is_an_error_with_a_hint(cli: Cli) -> None:
    result = cli("ls", "nosuchscheme://bucket/x")
    assert result.code == 1
    assert "unknown path type 'nosuchscheme'" in result.err


def test_a_location_that_cannot_be_reached_is_an_error_not_an_empty_one(cli: Cli) -> None:
    url = f"http://127.0.0.1:{free_port()}/runs"
    result = cli("ls", url)
    assert result.code == 1
    assert f"could not list {url}" in result.err
    assert "ECONNREFUSED" in result.err
    assert "nothing at" not in result.err
    assert "Traceback" not in result.err


def test_a_user_waiting_on_an_unreachable_object_store_sees_the_retries() -> None:
    """After two seconds of retries against a closed port, the command says on stderr
    what it is waiting for, before it fails."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "ckptstore.cli", "ls", "s3://bucket/run"),
            *("-o", f"endpoint_url={endpoint}", "-o", "key=testing", "-o", "secret=testing"),
            *("-o", "retries=13", "-o", "retry_base_delay=0.4", "-o", "retry_max_delay=0.4"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull},
    )
    assert result.returncode == 1
    waiting = [line for line in result.stderr.splitlines() if line.startswith("Still retrying")]
    assert waiting, result.stderr
    assert waiting[0].startswith("Still retrying LIST s3://bucket/run/ after ")
    assert "of 14 in" in waiting[-1]
    assert "Traceback" not in result.stderr


def test_the_default_node_is_listed_and_said_what_it_is(cli: Cli, tmp_path: Path) -> None:
    """A two-node job whose epoch_limiter was created outside any Node has a third node
    checkpoint, ``local``: listed (never hidden), marked, and explained once."""
    url = str(tmp_path / "run")
    train_with_limiter_outside_nodes(url)
    listing = cli("ls", url, "--json").json()
    nodes = listing["runs"][0]["epochs"][-1]["nodes"]
    assert [(n["node"], n["default_node"]) for n in nodes] == [
        ("local", True),
        ("trainer_0", False),
        ("trainer_1", False),
    ]
    text = cli("ls", url, "--nodes").out
    local = [line for line in text.splitlines() if line.split()[:1] == ["local"]]
    assert len(local) == 3  # epochs 0, 1 and 2
    assert all(line.endswith("(default node)") for line in local)
    assert not any("(default node)" in line for line in text.splitlines() if "trainer_" in line)
    assert text.splitlines()[-1] == DEFAULT_NODE_NOTE
    assert text.count(DEFAULT_NODE_NOTE) == 1
    assert "epoch_limiter" in DEFAULT_NODE_NOTE
    assert "outside any `with Node" in DEFAULT_NODE_NOTE
    assert cli("ls", url).out.splitlines()[-1] == DEFAULT_NODE_NOTE  # it explains 3/3


def test_no_note_without_a_default_node(cli: Cli, run_url: str) -> None:
    assert "(default node)" not in cli("ls", run_url, "--nodes").out


def test_tier_shows_which_roots_hold_each_epoch(cli: Cli, tmp_path: Path, s3_url: str) -> None:
    from ckptstore.tree import save_tree

    fast = str(tmp_path / "fast")
    save_tree([fast, s3_url], 1, {"w": np.ones(2)})
    save_tree(fast, 2, {"w": np.ones(2)})  # on the fast root only
    result = cli("ls", fast, "--tier", s3_url, "--json")
    assert result.code == 0
    assert result.json()["epochs"] == [
        {"epoch": 1, "roots": {fast: "committed", s3_url: "committed"}},
        {"epoch": 2, "roots": {fast: "committed", s3_url: None}},
    ]
    table = cli("ls", fast, "--tier", s3_url).out.splitlines()
    assert table[0].split() == ["EPOCH", fast, s3_url]
    assert table[2].split() == ["2", "committed", "-"]


def test_ls_shows_each_incremental_epochs_own_and_shared_bytes(cli: Cli, tmp_path: Path) -> None:
    from ckptstore.tree import save_tree

    url = str(tmp_path / "run")
    for epoch in (0, 1):
        save_tree(url, epoch, {"base": np.ones(1 << 18), "x": np.arange(3)}, incremental=True)
    result = cli("ls", url)
    assert result.code == 0
    assert result.out.count("2.0 MiB shared)") == 2
    epochs = cli("ls", url, "--json").json()["runs"][0]["epochs"]
    assert [epoch["shared_bytes"] for epoch in epochs] == [2 << 20, 2 << 20]
