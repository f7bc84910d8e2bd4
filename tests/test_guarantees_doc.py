"""Every promise in docs/guarantees.md names a test, and every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUARANTEES = ROOT / "docs" / "guarantees.md"
# `tests/x.py::test_name`, `tests/x.py` (a whole module), or `::test_name` (same module as
# the reference before it in the row)
REFERENCE = re.compile(
    r"`((?:tests|plugins|ckptstore/testing)/[\w/.-]+\.py)?(?:::(\w+))?(?:\[[^`\]]*\])?[^`]*`"
)


def promise_rows() -> list[str]:
    return [
        line
        for line in GUARANTEES.read_text().splitlines()
        if line.startswith("|") and not line.startswith(("| promise", "|---"))
    ]


def test_every_promise_names_a_test() -> None:
    rows = promise_rows()
    assert len(rows) >= 50
    for row in rows:
        proof = row.rstrip("|").rsplit("|", 1)[-1]
        assert re.search(r"`(tests|plugins|ckptstore/testing)/", proof), (
            f"no test named for: {row[:80]}"
        )


def test_every_named_test_exists() -> None:
    missing = []
    for row in promise_rows():
        proof = row.rstrip("|").rsplit("|", 1)[-1]
        module: Path | None = None
        for match in REFERENCE.finditer(proof):
            path, name = match.groups()
            if path:
                module = ROOT / path
                if not module.exists():
                    missing.append(path)
                    continue
            text = module.read_text() if module is not None else ""
            defined = f"def {name}(" in text or f"class {name}" in text  # or a test class
            if name and module is not None and not defined:
                missing.append(f"{module.relative_to(ROOT)}::{name}")
    assert missing == [], "\n".join(missing)
