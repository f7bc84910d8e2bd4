"""Fixtures of the operator-command tests: a trained run and a way to call the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import Cli, Result, train

from ckptstore.cli._main import main


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``ckptstore ARGS...`` in process; returns the exit code and output."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def run_url(tmp_path: Path) -> str:
    """A local run with epochs 0-3 committed on trainer_0 and trainer_1 (npz)."""
    url = str(tmp_path / "runs" / "alpha")
    train(url)
    return url
