"""The layers of docs/design.md are the import-linter contract, and the code keeps it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    return [str(layer) for layer in layers["layers"]]


def test_design_doc_draws_the_contract() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    match = re.search(r"<!-- layers -->\n```\n(.*?)```\n<!-- /layers -->", text, re.S)
    assert match, "docs/design.md lost its layers diagram"
    assert match.group(1).split("\n")[:-1] == contract_layers()


def test_every_subpackage_is_in_a_layer() -> None:
    packages = {
        path.parent.name
        for path in (ROOT / "ckptstore").glob("*/__init__.py")
        if path.parent.name != "testing"
    }
    layered = {name.strip() for layer in contract_layers() for name in layer.split("|")}
    assert packages == layered


def test_every_subpackage_says_what_it_owns() -> None:
    for init in (ROOT / "ckptstore").glob("*/__init__.py"):
        source = init.read_text()
        assert source.startswith('"""'), f"{init} has no docstring"
        assert len(source.split('"""')[1].split()) >= 15, f"{init}'s docstring is too thin"


def test_import_contracts_are_kept() -> None:
    command = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run(
        [command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_plugins_use_only_public_ckptstore_modules() -> None:
    """The plugins are third-party code: no ``ckptstore.<x>._<y>`` import (the private
    modules contract checks ckptstore itself, whose graph does not hold the plugins)."""
    private = re.compile(r"^\s*(?:from|import)\s+(ckptstore(?:\.\w+)*\._\w+)", re.M)
    found = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "plugins").glob("*/ckptstore_*/**/*.py")
        for module in private.findall(path.read_text())
    }
    assert sorted(found) == []


MAX_MODULE_LINES = 900
"""Small modules with one job each: a module that grows past this is split by job."""


def test_every_module_stays_small() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / "ckptstore").rglob("*.py")
    }
    assert sizes, "no module found under ckptstore/"
    assert {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}
