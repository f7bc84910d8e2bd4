"""benchmarks.dcp's report: medians, ratios against each peer, resharded loads."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks.dcp import Row, table


def test_the_table_gives_medians_and_ratios() -> None:
    ours = Row("ckptstore", save=[1.0, 2.0, 9.0], blocked=[0.1], async_total=[3.0])
    ours.loads = {"2>2": [4.0], "2>1": [2.0], "2>4": [6.0], "4>4": [5.0], "4>2": [6.0]}
    ours.read = {"2>2": 1.0, "2>1": 1.0, "2>4": 1.5, "4>4": 1.0, "4>2": 1.05}
    peer = Row("DCP", save=[3.0], blocked=[0.2], async_total=[4.0], loads={"2>2": [2.0]})
    lines = table([ours, peer], 1 << 30)
    assert lines[2].startswith("| ckptstore | 2.00 | 0.10 | 3.00 | 4.00 | 2.00 | 6.00 | 5.00 |")
    assert "ckptstore saves 1.50x as fast, loads (2 -> 2) 0.50x as fast" in lines[5]
    assert "2 -> 1: 0.50x the time of the 2 -> 2 load, reading 1.00x" in lines[6]
    assert "2 -> 4: 1.50x the time of the 2 -> 2 load, reading 1.50x" in lines[7]
    assert "4 -> 2: 1.20x the time of the 4 -> 4 load, reading 1.05x" in lines[8]
    assert lines[3].endswith("| -, -, -, -, - |")  # bytes read not measured for the peer
