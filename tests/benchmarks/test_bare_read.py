"""The bare read under the checksum target: every byte of every file, in fresh arrays."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bare_read import (
    CHECKED,
    UNCHECKED,
    engine_settings,
    read_bare,
    read_range,
)
from benchmarks.measure import run
from ckptstore import CheckpointManager
from ckptstore.builtin import LocalPath
from ckptstore.io import VERIFY_WINDOW

RANGE_BYTES = LocalPath.default_io.chunk_bytes
"""A range of the bare read on local disk by default."""


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


@pytest.mark.parametrize(("checksum", "calls"), [(False, 1), (True, 4)])
def test_a_check_reads_in_windows_and_a_plain_read_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checksum: bool, calls: int
) -> None:
    """As ckptstore's loads read: the windows belong to the check's cost."""
    write_files(tmp_path)
    sizes: list[int] = []

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        sizes.append(sum(buffer.nbytes for buffer in buffers))
        return real_preadv(fd, buffers, offset)

    real_preadv = os.preadv
    monkeypatch.setattr(os, "preadv", preadv)
    read_range(tmp_path / "big", 0, 3 * VERIFY_WINDOW + 11, checksum)
    assert len(sizes) == calls
    assert sum(sizes) == 3 * VERIFY_WINDOW + 11


def test_a_range_past_the_end_of_its_file_is_an_error(tmp_path: Path) -> None:
    write_files(tmp_path)
    with pytest.raises(OSError, match="ended early"):
        read_range(tmp_path / "sub" / "small", 0, 1001, checksum=False)


def test_the_loop_reads_as_ckptstores_engine_does_there(
    tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges of the engine's chunk size, on as many threads, on disk and on tmpfs (one
    per usable CPU), with the environment's overrides: the floor is read the same way."""
    for root in (tmp_path / "disk", small_disk):
        root.mkdir(exist_ok=True)
        engine = CheckpointManager(str(root), "trainer_0", "zarr").location.io_settings
        assert engine_settings(root) == engine
    monkeypatch.setenv("CKPTSTORE_IO_CHUNK_BYTES", str(2 * VERIFY_WINDOW))
    assert engine_settings(tmp_path).chunk_bytes == 2 * VERIFY_WINDOW
    total = write_files(tmp_path / "files")
    assert read_bare(tmp_path / "files", checksum=True)["bytes"] == total
