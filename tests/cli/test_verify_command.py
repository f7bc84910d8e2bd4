"""`ckptstore verify`: checksums; a non-zero exit naming the broken blob."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from ckpt_helpers import data_key
from cli_helpers import Cli

from ckptstore import CheckpointManager, LocalSession, protocol
from ckptstore.paths._local_path import LocalPath
from ckptstore.records._layout import node_commit_key
from ckptstore.testing.conformance import flip_byte


def test_a_sound_run_verifies(cli: Cli, run_url: str) -> None:
    result = cli("verify", run_url)
    assert result.code == 0
    assert "all 8 node checkpoint(s) of epochs [0, 1, 2, 3] verified" in result.out
    report = cli("verify", run_url, "--latest", "--json").json()
    assert report["ok"] is True
    assert [(n["epoch"], n["node"]) for n in report["nodes"]] == [
        (3, "trainer_0"),
        (3, "trainer_1"),
    ]


def test_a_flipped_byte_exits_3_naming_the_blob(cli: Cli, run_url: str) -> None:
    storage = LocalPath(run_url)
    chunk = protocol.open_node(storage, "trainer_1", 2).blobs["trainer_1/w"].chunks[0]
    flip_byte(storage, f"{data_key(storage, 'trainer_1', 2)}/{chunk.key}", chunk.offset + 5)

    result = cli("verify", run_url, "--epoch", "2")
    assert result.code == 3
    assert "BROKEN  epoch 2 node trainer_1: blob 'trainer_1/w', chunk 0" in result.out
    assert "ok      epoch 2 node trainer_0" in result.out

    report = cli("verify", run_url, "--json").json()
    assert report["ok"] is False
    broken = [n for n in report["nodes"] if not n["ok"]]
    assert [(n["epoch"], n["node"]) for n in broken] == [(2, "trainer_1")]
    assert broken[0]["problems"][0]["blob"] == "trainer_1/w"


def test_a_missing_file_exits_3(cli: Cli, run_url: str) -> None:
    LocalPath(run_url).delete([f"{data_key(LocalPath(run_url), 'trainer_0', 1)}/blobs.npz"])
    result = cli("verify", run_url, "--epoch", "1")
    assert result.code == 3
    assert "missing" in result.out


def test_an_uncommitted_epoch_exits_4(cli: Cli, run_url: str) -> None:
    assert cli("verify", run_url, "--epoch", "9").code == 4


def test_progress_goes_to_stderr(cli: Cli, run_url: str) -> None:
    result = cli("verify", run_url, "--progress")
    assert result.code == 0
    assert "verify: 100%" in result.err
    # the bar ends with done == total: every stored byte of the 8 node checkpoints
    assert re.search(r"100%\|.*\| (\S+)/\1 ", result.err), result.err
    assert "verify:" not in result.out
    assert cli("verify", run_url, "--no-progress").err == ""


def test_latest_verifies_a_damaged_newest_epoch_instead_of_an_older_one(
    cli: Cli, run_url: str
) -> None:
    (Path(run_url) / node_commit_key(3, "trainer_0")).write_bytes(b"{damaged")
    result = cli("verify", run_url, "--latest")
    assert result.code == 3
    assert "epoch 3" in result.out + result.err
    assert "epoch 2" not in result.out


def test_a_partial_epoch_is_not_verified(cli: Cli, run_url: str) -> None:
    """A node whose commit record is lost: `ls` says partial 1/2, verify exits 4."""
    LocalPath(run_url).delete([node_commit_key(2, "trainer_1")])
    assert re.search(r"2\s+partial\s+1/2", cli("ls", run_url).out)
    result = cli("verify", run_url, "--epoch", "2")
    assert result.code == 4
    assert "ok      epoch 2 node trainer_0" in result.out
    assert "PARTIAL epoch 2 node trainer_1" in result.out
    report = cli("verify", run_url, "--json").json()
    assert report["ok"] is False
    partial = [(n["epoch"], n["node"]) for n in report["nodes"] if not n["committed"]]
    assert partial == [(2, "trainer_1")]
    assert cli("verify", run_url, "--epoch", "1").code == 0


def test_verify_needs_no_optional_package_to_check_an_intact_checkpoint(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bfloat16 blob is checked (codec, dtype string, bytes) without ml_dtypes; only a
    load needs it."""
    session = LocalSession()
    session.workspace("trainer_0")["w"] = np.ones(4, dtype=ml_dtypes.bfloat16)
    manager = CheckpointManager(str(tmp_path / "bf16"), "trainer_0", "zarr")
    session.run(manager.init(["trainer_0"]))
    session.run(manager.save(1))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes -> ImportError
    assert cli("verify", str(tmp_path / "bf16"), "--deep").code == 0
