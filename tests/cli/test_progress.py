"""Progress bars (tqdm) draw on a terminal's stderr only, unless asked for."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import Cli
from tqdm import tqdm

from ckptstore import CheckpointManager, LocalSession, protocol
from ckptstore.builtin import LocalPath
from ckptstore.cli._progress import ProgressBar
from ckptstore.io._settings import IOSettings
from ckptstore.protocol import committed_epochs, require_commit
from ckptstore.tools._checking import verify_epochs
from ckptstore.tools._replication import (
    CONVERT_PASSES,
    convert_epochs,
    copy_epochs,
    copy_passes,
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_draws_on_a_terminal_by_default() -> None:
    terminal = Terminal()
    with ProgressBar(4096, "copy", stream=terminal) as bar:
        bar.advance(4096)
    assert "copy: 100%" in terminal.getvalue()
    assert "4.00k/4.00k" in terminal.getvalue()
    assert bar.percent == 100


def test_silent_when_stderr_is_not_a_terminal() -> None:
    pipe = io.StringIO()
    with ProgressBar(3, "verify", unit="nodes", stream=pipe) as bar:
        bar.advance(2)
    assert pipe.getvalue() == ""
    assert bar.percent == 66


def test_commands_draw_nothing_into_a_pipe(cli: Cli, run_url: str) -> None:
    for argv in (["verify", run_url], ["convert", run_url, "--to", "zarr", "--json"]):
        result = cli(*argv)
        assert result.code == 0, result.err
        assert result.err == ""


def test_convert_counts_the_bytes_read_then_written(cli: Cli, run_url: str) -> None:
    stored = sum(
        node.stored_bytes
        for epoch in committed_epochs(LocalPath(run_url))
        for node in require_commit(LocalPath(run_url), epoch).nodes.values()
    )
    result = cli("convert", run_url, "--to", "zarr", "--progress")
    assert result.code == 0
    assert "convert to zarr: 100%" in result.err
    assert f"{tqdm.format_sizeof(2 * stored, divisor=1024)}/" in result.err  # read, then written
    assert "B/s" in result.err


# -- a node of many chunks moves the bar while it is moved -----------------------------

NODE = "trainer_0"
CHUNK = 512 << 10  # above the size from which a range is read alone


@pytest.fixture(params=["zarr", "npz"])
def big_node(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Epoch 0 of one node holding one 4 MiB blob, stored as 8 chunks of 512 KiB."""
    url = str(tmp_path / "run")
    session = LocalSession()
    session.workspace(NODE)["w"] = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    manager = CheckpointManager(url, NODE, request.param, io=IOSettings(chunk_bytes=CHUNK))
    session.run(manager.init([NODE]))
    session.run(manager.save(0))
    manifest = protocol.open_node(LocalPath(url), NODE, 0)
    assert len(manifest.blobs["w"].chunks) == 8
    return url


def stored_bytes(url: str) -> int:
    return require_commit(LocalPath(url), 0).nodes[NODE].stored_bytes


def assert_moves_in_steps(heard: list[int], total: int) -> None:
    """The counts add up to ``total`` in a step per chunk at least, each a part of it."""
    assert sum(heard) == total
    assert len(heard) >= 8, heard
    assert all(0 < step < total for step in heard)


def test_verify_reports_each_chunk_of_a_node(big_node: str) -> None:
    heard: list[int] = []
    (check,) = verify_epochs(LocalPath(big_node), [0], on_bytes=heard.append)
    assert check.ok
    assert_moves_in_steps(heard, stored_bytes(big_node))


@pytest.mark.parametrize("verify", [True, False])
def test_cp_reports_each_chunk_copied_then_read_back(
    big_node: str, tmp_path: Path, verify: bool
) -> None:
    heard: list[int] = []
    dest = LocalPath(str(tmp_path / "copy"))
    copy_epochs(LocalPath(big_node), dest, [0], verify=verify, on_bytes=heard.append)
    assert_moves_in_steps(heard, copy_passes(verify) * stored_bytes(big_node))
    again: list[int] = []  # already there: skipped, reported whole at once
    copy_epochs(LocalPath(big_node), dest, [0], verify=verify, on_bytes=again.append)
    assert again == [copy_passes(verify) * stored_bytes(big_node)]


def test_convert_reports_each_chunk_read_and_written(
    big_node: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTSTORE_IO_CHUNK_BYTES", str(CHUNK))  # written in chunks too
    heard: list[int] = []
    dest = LocalPath(str(tmp_path / "converted"))
    target = "npz" if protocol.open_node(LocalPath(big_node), NODE, 0).db_type == "zarr" else "zarr"
    convert_epochs(LocalPath(big_node), [0], target, dest=dest, on_bytes=heard.append)
    assert_moves_in_steps(heard, CONVERT_PASSES * stored_bytes(big_node))


def drawn_counts(err: str) -> list[str]:
    """The ``done/total`` counts tqdm drew, in order."""
    return re.findall(r"\| ([0-9.]+[kMG]?)/[0-9.]+[kMG]? \[", err)


@pytest.mark.parametrize("command", ["verify", "cp"])
def test_the_bar_of_one_node_shows_the_bytes_done_so_far(
    cli: Cli, big_node: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setattr(ProgressBar, "REFRESH_SECONDS", 0.0)  # draw every step
    dest = [str(tmp_path / "copy")] if command == "cp" else []
    result = cli(command, big_node, *dest, "--progress")
    assert result.code == 0, result.err
    counts = drawn_counts(result.err)
    assert counts[0] == "0.00"
    assert "100%" in result.err
    between = set(counts[1:-1]) - {counts[0], counts[-1]}
    assert len(between) >= 4, counts  # it moved inside the node, not 0 then 100%


def test_gc_counts_the_bytes_of_each_node_deleted(
    cli: Cli, run_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ProgressBar, "REFRESH_SECONDS", 0.0)  # draw every step
    result = cli("gc", run_url, "--keep-last", "1", "--progress")
    assert result.code == 0, result.err
    assert "gc: 100%" in result.err
    assert "B/s" in result.err
    counts = drawn_counts(result.err)
    assert counts[0] == "0.00"
    # epochs 0-2 go, two nodes each of two files: a step per file, inside each node
    assert len(set(counts[1:-1]) - {counts[0], counts[-1]}) == 11, counts
