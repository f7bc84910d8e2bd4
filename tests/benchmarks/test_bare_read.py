"""The bare read under the checksum target: every byte of every file, in fresh arrays."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bare_read import CHECKED, RANGE_BYTES, UNCHECKED, read_bare
from benchmarks.measure import run
from ckptstore.io import VERIFY_WINDOW


def write_files(root: Path) -> int:
    """Files of several ranges, of part of a window and empty, one in a subdirectory."""
    sizes = {"big": RANGE_BYTES + VERIFY_WINDOW + 5, "sub/small": 1000, "empty": 0}
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(index % 251 for index in range(size)))
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
