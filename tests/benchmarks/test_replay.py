"""Recording a save's positional writes and replaying them bare."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peers import ckptstore_save
from benchmarks.replay import EARLY_WRITEBACK, Recording, Write, record, replay, source_for
from benchmarks.workload import make_workload, nbytes
from ckptstore.paths._local_path import EARLY_WRITEBACK_BYTES


def test_a_recorded_save_holds_every_byte_it_wrote_in_its_files(tmp_path: Path) -> None:
    blobs = make_workload("tiny")
    target = tmp_path / "ckpt"
    pwrite, pwritev = os.pwrite, os.pwritev
    writes = record(lambda: ckptstore_save("zarr", blobs, target))
    assert (os.pwrite, os.pwritev) == (pwrite, pwritev)  # put back
    assert writes.nbytes >= nbytes(blobs)
    archives = [path for path in writes.paths if Path(path).name.startswith("blobs.")]
    assert archives, writes.paths
    # the staging directory was renamed into place: the same files under their final name
    on_disk = {path.name: path.stat().st_size for path in target.rglob("blobs.*")}
    assert sorted(on_disk.values()) == sorted(
        size for path, size in zip(writes.paths, writes.sizes, strict=True) if path in archives
    )
    assert all(write.nbytes > 0 for calls in writes.threads.values() for write in calls)


def test_recording_puts_os_back_when_the_save_fails(tmp_path: Path) -> None:
    pwrite = os.pwrite

    def failing() -> None:
        fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
        try:
            os.pwrite(fd, b"abcd", 0)
        finally:
            os.close(fd)
        raise RuntimeError("the save failed")

    with pytest.raises(RuntimeError, match="the save failed"):
        record(failing)
    assert os.pwrite is pwrite


def test_a_replay_writes_each_threads_calls_into_files_of_the_recorded_sizes(
    tmp_path: Path,
) -> None:
    recording = Recording(
        paths=["/x/a", "/x/b"],
        sizes=[3 << 20, 8192],
        threads={
            1: [Write(0, 0, 1 << 20, False), Write(0, 2 << 20, 1 << 20, False)],
            2: [Write(0, 1 << 20, 1 << 20, False), Write(1, 0, 8192, False)],
        },
    )
    assert recording.nbytes == (3 << 20) + 8192
    assert sum(len(writes) for writes in recording.threads.values()) == 4
    seconds = replay(recording, tmp_path / "out", source_for(recording))
    assert seconds > 0
    sizes = sorted(path.stat().st_size for path in (tmp_path / "out").iterdir())
    assert sizes == [8192, 3 << 20]
    data = np.fromfile(tmp_path / "out" / "file-0", dtype=np.uint8)
    assert data.any()  # random bytes, not a hole


def test_every_recorded_thread_replays_at_once_on_a_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    together = threading.Barrier(4, timeout=30)  # broken unless all four write at once
    offsets: list[int] = []
    real = os.pwrite

    def spy(fd: int, data: memoryview, offset: int) -> int:
        together.wait()
        offsets.append(offset)
        return real(fd, data, offset)

    recording = Recording(
        paths=["/x/a"],
        sizes=[4 * 4096],
        threads={n: [Write(0, n * 4096, 4096, False)] for n in range(4)},
    )
    monkeypatch.setattr(os, "pwrite", spy)
    replay(recording, tmp_path / "out", source_for(recording))
    assert sorted(offsets) == [0, 4096, 8192, 12288]


def test_a_replay_refuses_a_source_smaller_than_its_largest_file(tmp_path: Path) -> None:
    recording = Recording(paths=["/x/a"], sizes=[8192], threads={1: [Write(0, 0, 8192, False)]})
    with pytest.raises(ValueError, match="smaller than the largest recorded file"):
        replay(recording, tmp_path / "out", memoryview(bytearray(4096)))


def test_the_early_write_back_is_ckptstores() -> None:
    assert EARLY_WRITEBACK == EARLY_WRITEBACK_BYTES
