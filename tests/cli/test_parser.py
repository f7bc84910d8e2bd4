"""The command-line parser: bounded numbers are usage errors (exit 2) for every option
that has a lower bound, refused before any storage is opened."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cli_helpers import Cli

from ckptstore.cli._common import EXIT_USAGE
from ckptstore.cli._parser import at_least

BOUNDED = [  # (command line before the option, option, smallest accepted value)
    (["gc", "{url}"], "--keep-last", 1),
    (["gc", "{url}", "--keep-last", "1"], "--keep-every", 1),
    (["cp", "{url}", "{url}-copy"], "--jobs", 1),
    (["demo", "--dir", "{url}"], "--nodes", 2),
    (["demo", "--dir", "{url}"], "--epochs", 1),
]


@pytest.mark.parametrize(("before", "option", "minimum"), BOUNDED, ids=[b[1] for b in BOUNDED])
@pytest.mark.parametrize("offset", [1, 2, 100])
def test_a_number_below_its_bound_is_a_usage_error(
    cli: Cli, tmp_path: Path, before: list[str], option: str, minimum: int, offset: int
) -> None:
    url = str(tmp_path / "nowhere")
    argv = [word.format(url=url) for word in before]
    result = cli(*argv, option, str(minimum - offset), "--json")
    assert result.code == EXIT_USAGE
    assert f"argument {option}: {minimum - offset} is too small" in result.err
    assert f">= {minimum}" in result.err
    assert "Traceback" not in result.err
    assert result.json()["error"]["exit_code"] == EXIT_USAGE
    assert not Path(url).exists()  # refused before anything was opened or created


def test_a_word_where_a_number_is_expected_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    result = cli("gc", str(tmp_path), "--keep-last", "two")
    assert result.code == EXIT_USAGE
    assert "argument --keep-last: 'two' is not a whole number" in result.err


def test_at_least_accepts_its_bound() -> None:
    assert at_least(2)("2") == 2
    with pytest.raises(argparse.ArgumentTypeError, match="1 is too small"):
        at_least(2)("1")
