"""The bare read under the checksum target: every byte of every file, in fresh arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.bare_read import CHECKED, RANGE_BYTES, UNCHECKED, read_bare, read_range
from benchmarks.measure import run
from ckptstore.io import VERIFY_WINDOW


def content(size: int) -> bytes:
    return (np.arange(size) % 251).astype(np.uint8).tobytes()


def write_files(root: Path) -> int:
    """Files of several ranges, of part of a window and empty, one in a subdirectory."""
    sizes = {"big": RANGE_BYTES + VERIFY_WINDOW + 5, "sub/small": 1000, "empty": 0}
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content(size))
    return sum(sizes.values())


@pytest.mark.parametrize("checksum", [True, False])
def test_every_byte_of_every_file_is_read(tmp_path: Path, checksum: bool) -> None:
    total = write_files(tmp_path)
    measured = read_bare(tmp_path, checksum=checksum)
    assert measured["bytes"] == total
    assert measured["seconds"] > 0
    assert measured["cpu_seconds"] >= 0


def test_the_measure_module_runs_it_by_tool_name(tmp_path: Path) -> None:
    total = write_files(tmp_path)
    for tool in (CHECKED, UNCHECKED):
        assert run(tool, "bare-read", "mixed-1g", tmp_path)["bytes"] == total


@pytest.mark.parametrize("checksum", [True, False])
def test_a_range_is_read_whole_into_its_array(tmp_path: Path, checksum: bool) -> None:
    write_files(tmp_path)
    offset, size = 7, 3 * VERIFY_WINDOW + 11  # windows not aligned to the file
    array = read_range(tmp_path / "big", offset, size, checksum)
    assert array.tobytes() == content(RANGE_BYTES + VERIFY_WINDOW + 5)[offset : offset + size]


def test_a_range_past_the_end_of_its_file_is_an_error(tmp_path: Path) -> None:
    write_files(tmp_path)
    with pytest.raises(OSError, match="ended early"):
        read_range(tmp_path / "sub" / "small", 0, 1001, checksum=False)
