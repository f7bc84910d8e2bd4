"""`ckptstore`: every sub-command is found and its --help renders, and every command
that reads manifests reads gzip-compressed ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import node_dir
from cli_helpers import Cli

from ckptstore import protocol
from ckptstore.cli._main import command_modules, main
from ckptstore.formats._npz_db import NpzDB
from ckptstore.io._engine import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.records._documents import GZIP_MAGIC
from ckptstore.records._layout import MANIFEST_NAME

COMMANDS = [
    module.__name__.rsplit(".", 1)[1].removeprefix("_").removesuffix("_command")
    for module in command_modules()
]


def test_every_documented_command_is_registered() -> None:
    assert set(COMMANDS) == {
        "catalog",
        "convert",
        "cp",
        "demo",
        "gc",
        "inspect",
        "lease",
        "ls",
        "plugins",
        "verify",
    }


@pytest.mark.parametrize("command", COMMANDS)
def test_help_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert f"usage: ckptstore {command}" in capsys.readouterr().out


SMALL_BLOBS = {f"small/{i}": np.full(4, i, dtype=np.float32) for i in range(2000)}
"""Enough small blobs for a node's manifest to be stored gzip-compressed."""


def test_every_command_reads_compressed_manifests(cli: Cli, tmp_path: Path) -> None:
    """``ls`` (committed and uncommitted nodes), ``inspect``, ``verify``, ``cp`` (byte
    for byte, and skipping what is there), ``convert`` and ``catalog rebuild`` on a run
    whose manifests are gzip-compressed."""
    url = str(tmp_path / "run")
    storage = LocalPath(url)
    for epoch in (1, 2):
        commit = protocol.write_node(
            storage, "trainer_0", epoch, SMALL_BLOBS, NpzDB(), ParallelIO()
        )
        protocol.commit_epoch(storage, epoch, [commit])
    protocol.write_node(storage, "trainer_0", 3, SMALL_BLOBS, NpzDB(), ParallelIO())
    manifest = (node_dir(tmp_path / "run", "trainer_0", 2) / MANIFEST_NAME).read_bytes()
    assert manifest.startswith(GZIP_MAGIC)

    (run,) = cli("ls", url, "--json").json()["runs"]
    states = {e["epoch"]: (e["state"], e["nodes"][0]["nblobs"]) for e in run["epochs"]}
    assert states == {1: ("committed", 2000), 2: ("committed", 2000), 3: ("uncommitted", 2000)}
    described = cli("inspect", url, "--epoch", "2", "--json")
    assert described.code == 0
    assert "small/1999" in described.out
    assert cli("verify", url).code == 0

    dest = str(tmp_path / "copy")
    assert cli("cp", url, dest).code == 0
    assert (node_dir(tmp_path / "copy", "trainer_0", 2) / MANIFEST_NAME).read_bytes() == manifest
    assert len(cli("cp", url, dest, "--json").json()["skipped"]) == 2
    assert cli("verify", dest).code == 0

    converted = str(tmp_path / "as-zarr")
    assert cli("convert", url, "--to", "zarr", "--dest", converted).code == 0
    assert (node_dir(tmp_path / "as-zarr", "trainer_0", 2) / MANIFEST_NAME).read_bytes()[
        :2
    ] == GZIP_MAGIC
    assert cli("verify", converted).code == 0
    assert cli("catalog", "rebuild", url, "--kind", "json").code == 0
