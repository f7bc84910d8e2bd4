"""benchmarks.dcp_phases: the storage that stores nothing, and the phase table."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed.checkpoint as dcp

from benchmarks.dcp_phases import NullWriter, table


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
