"""Every third-party import of ckptstore and of each plugin is declared in that
distribution's pyproject.toml (as a dependency or in an extra), and nothing is declared
as a runtime dependency that the distribution never imports."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FIRST_PARTY = {
    "ckptstore": "ckptstore",
    "ckptstore_s3": "ckptstore-s3",
    "ckptstore_gcs": "ckptstore-gcs",
    "ckptstore_lmdb": "ckptstore-lmdb",
    "ckptstore_prometheus": "ckptstore-prometheus",
}
"""Import name -> distribution of this repository's own packages (editable installs do
not always show up in ``packages_distributions()``)."""

RUNTIME_ONLY = {
    "ckptstore-s3": {"s3fs", "aiobotocore", "botocore", "aiohttp"},
    "ckptstore-gcs": {"aiohttp"},
}
"""Declared runtime dependencies a distribution does not import itself, and why they are
declared: the S3 plugin opens s3fs through ``fsspec.filesystem("s3")``, s3fs and gcsfs run
on the others, and the plugins rely on their behaviour (hence the floors)."""


@dataclass(frozen=True)
class Distribution:
    name: str
    pyproject: Path
    package: Path


DISTRIBUTIONS = [
    Distribution("ckptstore", ROOT / "pyproject.toml", ROOT / "ckptstore"),
    *(
        Distribution(
            path.name,
            path / "pyproject.toml",
            path / path.name.replace("-", "_"),
        )
        for path in sorted((ROOT / "plugins").glob("ckptstore-*"))
    ),
]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return normalized(match.group(0))


def declared(distribution: Distribution) -> tuple[set[str], set[str]]:
    """The distribution's runtime dependencies and everything its extras add."""
    project = tomllib.loads(distribution.pyproject.read_text())["project"]
    runtime = {requirement_name(r) for r in project.get("dependencies", [])}
    extras = {
        requirement_name(r)
        for requirements in project.get("optional-dependencies", {}).values()
        for r in requirements
    }
    return runtime, extras


def imported_modules(package: Path) -> dict[str, str]:
    """Top-level names of the absolute imports in ``package`` -> one file importing it."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def third_party(package: Path) -> dict[str, str]:
    """Distribution -> a file importing it, for the imports of ``package`` outside the
    standard library."""
    mapping = packages_distributions()
    found: dict[str, str] = {}
    for module, where in imported_modules(package).items():
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        if module in FIRST_PARTY:
            found.setdefault(FIRST_PARTY[module], where)
            continue
        providers = mapping.get(module)
        assert providers, f"{where} imports {module!r}, which no installed distribution provides"
        for provider in providers:
            found.setdefault(normalized(provider), where)
    return found


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.name)
def test_every_import_is_declared(distribution: Distribution) -> None:
    runtime, extras = declared(distribution)
    imported = third_party(distribution.package)
    imported.pop(distribution.name, None)
    missing = {name: where for name, where in imported.items() if name not in runtime | extras}
    assert missing == {}, f"{distribution.pyproject.relative_to(ROOT)} does not declare these"


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.name)
def test_every_runtime_dependency_is_imported(distribution: Distribution) -> None:
    runtime, _ = declared(distribution)
    imported = set(third_party(distribution.package))
    unused = runtime - imported - RUNTIME_ONLY.get(distribution.name, set())
    assert unused == set(), f"{distribution.pyproject.relative_to(ROOT)} declares, never imports"


def test_one_crc32c_implementation_with_a_compatible_license() -> None:
    imported = set(third_party(ROOT / "ckptstore"))
    assert "google-crc32c" in imported
    assert "crc32c" not in imported  # LGPL
