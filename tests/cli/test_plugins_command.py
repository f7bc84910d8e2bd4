"""`ckptstore plugins`, and every command beside broken installed plugins: real
distributions found through their entry points (``plugin_helpers``), real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import Cli
from plugin_helpers import BROKEN, GOOD, RAISING_HOOK, install, installed

from ckptstore.plugin import _loading, reset_registry


@pytest.fixture
def broken_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working and four broken plugin distributions on ``sys.path``."""
    monkeypatch.delenv("CKPTSTORE_DISABLE_PLUGINS", raising=False)
    monkeypatch.setattr(_loading, "_warned", set())
    with installed(tmp_path / "site", GOOD, *BROKEN) as site:
        reset_registry()
        yield site


def test_plugins_lists_broken_plugins_with_their_errors(broken_site: Path, cli: Cli) -> None:
    result = cli("plugins")
    assert result.code == 0
    lines = result.out.splitlines()
    for broken in BROKEN:
        heading = lines.index(f"{broken.entry_point}  [{broken.label}]")
        assert lines[heading + 1].startswith("    broken, left out: ")
        assert f"CKPTSTORE_DISABLE_PLUGINS={broken.entry_point}" in lines[heading + 2]
    assert "testfmt  [ckptstore-testfmt 1.2.3]\n    db types: testfmt\n" in result.out
    assert "db types: npz" in result.out

    listed = {entry["name"]: entry for entry in cli("plugins", "--json").json()}
    assert listed["raising"]["error"] == (
        "RuntimeError: the raising plugin's DB types are not configured"
    )
    assert listed["missingdep"]["distribution"] == "ckptstore-missingdep 0.1"
    assert listed["testfmt"]["error"] is None
    assert listed["ckptstore.formats._npz_db"]["db_types"] == ["npz"]


def ckptstore(site: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``ckptstore ARGS...`` in a fresh process, with the distributions of ``site``
    installed (or none but the usual ones)."""
    env = {key: value for key, value in os.environ.items() if key != "CKPTSTORE_DISABLE_PLUGINS"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_commands_work_and_exit_as_before_beside_broken_plugins(tmp_path: Path) -> None:
    site = install(tmp_path / "site", GOOD, *BROKEN)
    clean_run, broken_run = str(tmp_path / "clean"), str(tmp_path / "broken")
    saved = ckptstore(site, "demo", "--epochs", "1", "--dir", broken_run)
    assert (
        saved.returncode == ckptstore(None, "demo", "--epochs", "1", "--dir", clean_run).returncode
    )
    assert saved.returncode == 0, saved.stderr
    assert "checkpoint saved: 3 nodes" in saved.stdout
    assert "Traceback" not in saved.stderr
    for broken in BROKEN:
        warning = f"ckptstore plugin {broken.entry_point!r} from {broken.label} is broken"
        assert saved.stderr.count(warning) == 1, saved.stderr
        assert f"CKPTSTORE_DISABLE_PLUGINS={broken.entry_point}" in saved.stderr
    for args in (
        ("ls", broken_run),
        ("ls", clean_run, "--json"),
        ("verify", broken_run),
        ("ls", str(tmp_path / "nothing")),
        ("ls", "--no-such-option", clean_run),
    ):
        beside, alone = ckptstore(site, *args), ckptstore(None, *args)
        assert (beside.returncode, beside.stdout) == (alone.returncode, alone.stdout), args
        assert "Traceback" not in beside.stderr
    listing = ckptstore(site, "plugins")
    assert listing.returncode == 0
    assert "broken, left out: ModuleNotFoundError" in listing.stdout


def test_a_command_needing_a_broken_plugin_fails_with_its_error(tmp_path: Path) -> None:
    site = install(tmp_path / "site", RAISING_HOOK)
    result = ckptstore(site, "ls", "raising://bucket/run", "--json")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        "ckptstore: error: path type 'raising' comes from a broken plugin that was left out: "
        "plugin 'raising' (ckptstore-raising 0.1): RuntimeError: the raising plugin's DB "
        "types are not configured." in result.stderr
    )
    assert "CKPTSTORE_DISABLE_PLUGINS=raising" in result.stderr
    assert '"type": "BrokenPluginError"' in result.stdout
