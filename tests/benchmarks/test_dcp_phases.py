"""benchmarks.dcp_phases: the storage that stores and reads nothing, and the phase table."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed.checkpoint as dcp

from benchmarks.dcp_phases import NullReader, NullWriter, table
from ckptstore.torch.dcp import Reader, Writer


def test_a_save_through_the_null_writer_plans_everything_and_stores_nothing() -> None:
    metadata = dcp.save({"w": torch.ones(3), "n": 2}, storage_writer=NullWriter(), no_dist=True)
    assert set(metadata.state_dict_metadata) == {"w", "n"}


def test_the_table_shows_each_rank_and_the_part_outside_the_storage() -> None:
    spent = {"write_data": 0.5, "finish": 0.1, "collectives": 0.2, "total": 1.0}
    medians = {0: {0: spent, 1: {**spent, "finish": 0.0, "total": 0.8}}}
    lines = table(["ours"], medians)
    assert lines[0] == "| phase (s) | ours, rank 0 | ours, rank 1 |"
    assert "| write_data | 0.500 | 0.500 |" in lines
    assert "| total | 1.000 | 0.800 |" in lines
    assert lines[-2] == "* ours, rank 0: outside the storage methods 0.400 s of 1.000 s (40%)"
    assert lines[-1] == "* ours, rank 1: outside the storage methods 0.300 s of 0.800 s (38%)"


def test_a_load_through_the_null_reader_plans_everything_and_reads_nothing(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "run")
    dcp.save({"w": torch.ones(3)}, storage_writer=Writer(root, epoch=1), no_dist=True)
    state = {"w": torch.zeros(3)}
    dcp.load(state, storage_reader=NullReader(root), no_dist=True)
    assert torch.equal(state["w"], torch.zeros(3))  # planned, never read
    dcp.load(state, storage_reader=Reader(root), no_dist=True)
    assert torch.equal(state["w"], torch.ones(3))  # the same checkpoint, read
