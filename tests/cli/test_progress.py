"""Progress bars (tqdm) draw on a terminal's stderr only, unless asked for."""

from __future__ import annotations

import io

from cli_helpers import Cli

from ckptstore.cli._progress import ProgressBar


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


def test_counts_nodes_when_asked(cli: Cli, run_url: str) -> None:
    result = cli("convert", run_url, "--to", "zarr", "--progress")
    assert result.code == 0
    assert "convert to zarr: 100%" in result.err
    assert "8/8 [" in result.err
    assert "nodes/s" in result.err
