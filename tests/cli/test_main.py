"""`ckptstore`: every sub-command is found and its --help renders."""

from __future__ import annotations

import pytest

from ckptstore.cli._main import command_modules, main

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
