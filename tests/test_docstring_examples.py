"""Every ``Example::`` block in a docstring of ckptstore or a bundled plugin is a
doctest, and every doctest runs here, in a fresh temporary working directory with
``np`` (numpy) and the module's own names in scope."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

PACKAGES = ["ckptstore", "ckptstore_s3", "ckptstore_gcs", "ckptstore_lmdb", "ckptstore_prometheus"]


def module_names() -> list[str]:
    """Every module of the packages, sorted."""
    names: list[str] = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not info.name.endswith("__main__"):  # importing it runs the CLI
                names.append(info.name)
    return sorted(names)


EXAMPLE_HEADING = re.compile(r"Example( \(.*\))?::$")
"""``Example::``, or ``Example (what it shows)::``, ending a line."""


def unrun_examples(source: str) -> int:
    """How many ``Example::`` blocks in ``source`` hold no ``>>>`` line."""
    lines = source.splitlines()
    unrun = 0
    for number, line in enumerate(lines):
        if not EXAMPLE_HEADING.search(line.rstrip()):
            continue
        indent = len(line) - len(line.lstrip())
        block: list[str] = []
        for following in lines[number + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following)
        if not any(text.lstrip().startswith(">>>") for text in block):
            unrun += 1
    return unrun


def _source(module: ModuleType) -> str:
    assert module.__file__ is not None
    return Path(module.__file__).read_text()


MODULES = module_names()


def test_every_example_is_a_doctest() -> None:
    counts = {}
    for name in MODULES:
        unrun = unrun_examples(_source(importlib.import_module(name)))
        if unrun:
            counts[name] = unrun
    assert counts == {}, "these modules have Example:: blocks without a >>> line"


def test_the_unrun_example_count_sees_blocks() -> None:
    source = '"""Example::\n\n    f(1)\n\nExample::\n\n    >>> f(1)\n    2\n"""\n'
    assert unrun_examples(source) == 1
    assert unrun_examples('"""Example (a call)::\n\n    f(1)\n"""\n') == 1


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, globs={**vars(module), "np": np})
    if not any(test.examples for test in tests):
        return
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
