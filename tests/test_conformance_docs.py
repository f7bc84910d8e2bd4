"""docs/conformance.md: its example test module runs, and passes."""

from __future__ import annotations

import re
from pathlib import Path

from doc_examples import run_as_test_module

from ckptstore.plugin._registry import get_registry


def test_the_documented_test_module_passes(tmp_path: Path) -> None:
    result = run_as_test_module("conformance.md", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"(\d+) passed", result.stdout)
    assert match, result.stdout[-500:]
    formats = 1 + len(get_registry().db_types)  # MyFormat, then every installed one
    passed = int(match.group(1))
    assert passed % formats == 0
    assert passed // formats >= 40, "the whole kit ran for each format"
