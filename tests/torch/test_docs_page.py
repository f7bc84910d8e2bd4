"""docs/torch-and-trees.md: its examples run as written."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_examples import python_blocks, run_as_test_module

pytest.importorskip("torch")


def test_the_page_examples_run(tmp_path: Path) -> None:
    assert len(python_blocks("torch-and-trees.md")) == 6
    result = run_as_test_module("torch-and-trees.md", tmp_path)
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: no test classes
    assert (tmp_path / "torch-ckpt" / "torch.3").is_dir()
    assert (tmp_path / "tree-ckpt" / "tree.7").is_dir()
    assert (tmp_path / "incr-ckpt" / "_ckptstore" / "chunks").is_dir()  # incremental=True
    assert (tmp_path / "resized" / "torch.1").is_dir()
    assert (tmp_path / "dcp-ckpt" / "rank_0.2").is_dir()
    assert (tmp_path / "fsdp-ckpt" / "rank_0.1").is_dir()  # the two-line API on FSDP2
