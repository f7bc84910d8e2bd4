"""`ckptstore gc`: retention from the command line."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import Cli, train

from ckptstore.builtin._local_path import LocalPath
from ckptstore.protocol._inventory import committed_epochs


def test_dry_run_deletes_nothing(cli: Cli, run_url: str) -> None:
    result = cli("gc", run_url, "--keep-last", "2", "--dry-run", "--json")
    assert result.code == 0
    plan = result.json()
    assert plan["dry_run"] is True
    assert [removal["epoch"] for removal in plan["delete"]] == [0, 1]
    assert plan["keep"] == [2, 3]
    assert plan["freed_bytes"] > 0
    assert committed_epochs(LocalPath(run_url)) == [0, 1, 2, 3]


def test_keeps_the_last_n_and_every_kth(cli: Cli, tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    train(url, epochs=7)
    result = cli("gc", url, "--keep-last", "2", "--keep-every", "3")
    assert result.code == 0
    assert "deleted 4 epoch(s)" in result.out
    assert committed_epochs(LocalPath(url)) == [0, 3, 6, 7]
    kept = sorted(f"trainer_{n}.{e}" for e in (0, 3, 6, 7) for n in (0, 1))
    assert sorted(path.name for path in Path(url).iterdir()) == ["_ckptstore", *kept]
    assert cli("verify", url).code == 0


def test_keep_last_must_be_positive(cli: Cli, run_url: str) -> None:
    result = cli("gc", run_url, "--keep-last", "0")
    assert result.code == 1
    assert "keep-last must be at least 1" in result.err
