"""docs/cli.md documents every command and exactly the exit codes the CLI uses."""

from __future__ import annotations

import re
from pathlib import Path

from ckptstore.cli._common import EXIT_CODES
from ckptstore.cli._main import build_parser

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


def test_every_command_has_a_section() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands is not None
    for name in commands:
        assert re.search(rf"^## `ckptstore {name}\b", PAGE, re.M), f"docs/cli.md lacks {name}"


def test_the_exit_code_table_matches_the_code() -> None:
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", PAGE, re.M))
    assert {int(code): text for code, text in table.items()} == EXIT_CODES
