"""Writing benchmark results into docs/benchmarks-tables.md, between named markers."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
BENCHMARKS_PAGE = DOCS / "benchmarks-tables.md"
RESULTS = Path(__file__).resolve().parent / "results"


def update_docs_section(path: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
    (appending the markers at the end of the file if they are missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{start}\n{body}\n{end}{tail}"
    else:
        text = f"{text.rstrip()}\n\n{start}\n{body}\n{end}\n"
    path.write_text(text)


def publish(text: str, name: str, section: str, *, smoke: bool, docs: bool) -> None:
    """Print a benchmark's report, save it as ``results/NAME.md`` (``NAME_smoke.md`` for a
    smoke run) and, with ``docs`` and never for a smoke run, put it in ``section`` of
    docs/benchmarks-tables.md."""
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}{'_smoke' if smoke else ''}.md").write_text(text + "\n")
    if docs and not smoke:
        update_docs_section(BENCHMARKS_PAGE, section, text)
