"""Docs and docstrings read in short sentences, what and why first (issue 42, "Prose").

What a machine can check: every public docstring opens with one short line ending with
a period, then a blank line before the details; no sentence of a page a user reads runs
over ``MAX_WORDS`` words (code blocks, tables and headings left out).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RECORDS = {"benchmarks-history.md", "benchmarks-tables.md"}
"""Pages that are records, not prose: dated runs and full tables."""

PAGES = ["README.md"] + [
    f"docs/{page.name}" for page in sorted((ROOT / "docs").glob("*.md")) if page.name not in RECORDS
]
"""Every page a user reads: a new page is checked without being listed here."""

MAX_WORDS = 30
"""The longest sentence a page may hold, in words (an inline code span counts as one)."""

MAX_FIRST_LINE = 100
"""The longest first line of a public docstring, in characters."""

PUBLIC_MODULES = [
    "ckptstore",
    "ckptstore.plugin",
    "ckptstore.torch",
    "ckptstore.tree",
    "ckptstore.testing",
]

_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][)\"']))\s+(?=[A-Z0-9(\[\"*_])")


def paragraphs(text: str) -> Iterator[str]:
    """The prose of a Markdown page, one paragraph or list item at a time: fenced and
    indented code, tables, headings and HTML comments are left out."""
    fenced = False
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
        code = fenced or stripped.startswith(("```", "~~~"))
        indented_code = line.startswith("    ") and not current and not _LIST_ITEM.match(line)
        if code or indented_code or not stripped or stripped.startswith(("|", "#", "<!--")):
            if current:
                yield " ".join(current)
                current = []
            continue
        if _LIST_ITEM.match(line) and current:
            yield " ".join(current)
            current = []
        current.append(_LIST_ITEM.sub("", line).strip())
    if current:
        yield " ".join(current)


def sentences(text: str) -> Iterator[str]:
    """The sentences of a page's prose, inline code and link targets reduced to a word."""
    for paragraph in paragraphs(text):
        paragraph = re.sub(r"`[^`]*`", "CODE", paragraph)
        paragraph = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", paragraph)
        yield from _SENTENCE_END.split(paragraph)


def test_the_sentence_splitter_leaves_code_and_tables_out() -> None:
    page = (
        "A short one. (Aside.) Another `with code. Inside` it.\n\n"
        "```\nnot. Prose.\n```\n| a. | B. |\n"
    )
    assert list(sentences(page)) == ["A short one.", "(Aside.)", "Another CODE it."]


@pytest.mark.parametrize("page", PAGES)
def test_no_sentence_of_a_page_is_too_long(page: str) -> None:
    long = [
        f"{len(sentence.split())} words: {sentence[:120]}..."
        for sentence in sentences((ROOT / page).read_text())
        if len(sentence.split()) > MAX_WORDS
    ]
    assert long == [], f"{page}: split these sentences"


MAX_LINES = {"README.md": 150, "docs/benchmarks.md": 250}
"""Pages a newcomer reads first stay short (issue 42): dated runs go to the records."""


@pytest.mark.parametrize("page", sorted(MAX_LINES))
def test_the_front_pages_stay_short(page: str) -> None:
    lines = len((ROOT / page).read_text().splitlines())
    assert lines <= MAX_LINES[page], f"{page}: {lines} lines; move detail to a record page"


def public_objects() -> Iterator[tuple[str, object]]:
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        yield name, module
        names = getattr(module, "__all__", None) or [n for n in vars(module) if n[0] != "_"]
        for attribute in names:
            value = getattr(module, attribute)
            if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value):
                yield f"{name}.{attribute}", getattr(value, "__wrapped__", value)


def test_every_public_docstring_says_what_in_one_short_first_line() -> None:
    problems = []
    for name, value in public_objects():
        lines = (inspect.getdoc(value) or "").splitlines()
        if not lines:
            problems.append(f"{name}: no docstring")
        elif len(lines[0]) > MAX_FIRST_LINE or not lines[0].endswith("."):
            problems.append(f"{name}: first line {lines[0]!r}")
        elif len(lines) > 1 and lines[1].strip():
            problems.append(f"{name}: no blank line after the first ({lines[0]!r})")
    assert problems == []
