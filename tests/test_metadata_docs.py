"""docs/metadata.md: its handler and reporter examples run, and the handler passes the
conformance kit."""

from __future__ import annotations

from pathlib import Path

from doc_examples import python_blocks, run_as_test_module


def test_the_page_has_a_handler_a_reporter_and_a_conformance_class() -> None:
    code = "\n".join(python_blocks("metadata.md"))
    assert "class TextCatalog(IndexCatalog)" in code
    assert "def ckptstore_report(self, action_name, stats)" in code
    assert "class TestTextCatalog(MetadataHandlerConformance)" in code


def test_the_examples_run_and_the_handler_conforms(tmp_path: Path) -> None:
    result = run_as_test_module("metadata.md", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "11 passed" in result.stdout
    assert (tmp_path / "catalog.jsonl").exists()
