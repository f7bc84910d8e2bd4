"""Every ``pip install`` command the project documents or prints resolves as written.

The commands come from README.md, docs/*.md, the plugins' READMEs and the source (error
hints, docstrings) of ckptstore, the plugins and the benchmarks. Each is run with
``pip install --dry-run`` from the checkout's root, with the pip of this environment
(the one a fresh virtualenv ships, in CI), against what is installed and the package
registry: the named paths, extras and versions must exist and resolve. Local projects'
metadata is read with this environment's setuptools (``--no-build-isolation``), which
keeps each check to seconds. A documented command is also checked to install
ckptstore from the checkout before any plugin, as on a fresh machine the plugins'
``ckptstore>=0.1`` has nothing else to resolve to (printed hints run where ckptstore is
installed). The README's test command runs for real, in a new virtualenv, in .ci/run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP_TIMEOUT = 300


@dataclass(frozen=True)
class InstallCommand:
    """One ``pip install ...`` command and where it was found."""

    command: str
    where: str
    printed: bool
    """Printed by installed code (an error hint), not documented for a fresh machine."""


def documents() -> list[Path]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [ROOT / "README.md", *docs, *sorted((ROOT / "plugins").glob("*/README.md"))]


def sources() -> list[Path]:
    trees = [ROOT / "ckptstore", *sorted((ROOT / "plugins").glob("*/ckptstore_*"))]
    files = [path for tree in trees for path in sorted(tree.rglob("*.py"))]
    return files + sorted((ROOT / "benchmarks").glob("*.py"))


QUOTED = re.compile(r"`+(pip install [^`]+)`+")


def commands_in(path: Path) -> tuple[list[InstallCommand], list[str]]:
    """The install commands in ``path``, and the lines that mention ``pip install`` in a
    form the extraction does not understand (each must be fixed, not skipped)."""
    printed = path.suffix == ".py"
    found: list[InstallCommand] = []
    unparsed: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "pip install" not in line:
            continue
        where = f"{path.relative_to(ROOT)}:{number}"
        stripped = line.strip()
        if stripped.startswith("pip install") and not printed:  # a line of a code block
            texts = [stripped.split(" #", 1)[0]]
        else:
            texts = QUOTED.findall(line)
        if not texts:
            unparsed.append(f"{where}: {stripped}")
        for text in texts:
            for part in text.split("&&"):
                if part.strip().startswith("pip install"):
                    found.append(InstallCommand(part.strip(), where, printed))
    return found, unparsed


def all_commands() -> list[InstallCommand]:
    found: list[InstallCommand] = []
    for path in documents() + sources():
        found.extend(commands_in(path)[0])
    return found


def unique_commands() -> list[InstallCommand]:
    seen: dict[tuple[str, bool], InstallCommand] = {}
    for command in all_commands():
        seen.setdefault((command.command, command.printed), command)
    return list(seen.values())


def test_every_mention_of_pip_install_is_a_checkable_command() -> None:
    unparsed = [line for path in documents() + sources() for line in commands_in(path)[1]]
    assert unparsed == [], "write these as `pip install ...` (in backticks) or in a code block"


def test_the_readme_commands_and_the_plugin_hints_are_found() -> None:
    found = {command.command for command in all_commands()}
    assert {"pip install .", "pip install -r requirements-test.txt"} <= found
    assert "pip install ./plugins/ckptstore-s3" in found  # the registry's hint for s3://
    assert not any("ckptstore[" in command for command in found), "extras that do not exist"


CORE = re.compile(r"^\.(\[[\w,]+\])?$")
"""An argument installing ckptstore from the checkout: ``.``, ``'.[dask]'``, ``-e .``."""


def test_documented_plugin_installs_bring_ckptstore_first() -> None:
    for install in all_commands():
        arguments = shlex.split(install.command)[2:]
        plugins = [i for i, a in enumerate(arguments) if a.startswith("./plugins/")]
        if install.printed or not plugins:
            continue
        core = [i for i, a in enumerate(arguments) if CORE.match(a)]
        assert core, f"{install.where}: `{install.command}` needs `.` (ckptstore) too"
        assert core[0] < plugins[0], f"{install.where}: put `.` before the plugins"


@pytest.mark.parametrize(
    "install", unique_commands(), ids=lambda c: f"{c.where} {c.command}".replace(" ", "_")
)
def test_the_command_resolves(install: InstallCommand) -> None:
    arguments = shlex.split(install.command)[2:]
    dry_run = ["install", "--dry-run", "--quiet", "--no-build-isolation"]
    result = subprocess.run(
        [sys.executable, "-m", "pip", *dry_run, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"{install.where}: `{install.command}` fails:\n{result.stderr}"
    # pip only warns about an extra that does not exist, and installs without it
    assert "does not provide the extra" not in result.stderr, f"{install.where}: {result.stderr}"
