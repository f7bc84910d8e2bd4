"""Byte progress: the engine reports each request once it is done, from its I/O
threads; a node's count never passes its size and ends exactly at it."""

from __future__ import annotations

import threading
from pathlib import Path

from ckptstore import CorruptCheckpointError
from ckptstore.builtin import LocalPath
from ckptstore.io._engine import ParallelIO, ReadRequest, WriteRequest
from ckptstore.io._progress import NodeProgress
from ckptstore.io._settings import IOSettings

SIZES = [300 << 10, 5, 1 << 20, 70, 400 << 10]  # large requests alone, small ones batched


def test_the_engine_reports_every_request_written_and_read(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    heard: list[int] = []
    threads: set[str] = set()

    def progress(nbytes: int) -> None:
        heard.append(nbytes)
        threads.add(threading.current_thread().name)

    engine = ParallelIO(IOSettings(concurrency=4), progress=progress)
    requests = [WriteRequest(f"c.{i}", [bytes(size)], size) for i, size in enumerate(SIZES)]
    results = engine.write(storage, requests)
    assert sorted(heard) == sorted(SIZES)  # one call per request, its bytes
    assert all(name.startswith("ckptstore-io") for name in threads)
    heard.clear()
    reads = [
        ReadRequest(r.key, 0, [memoryview(bytearray(r.nbytes))], r.nbytes, crc=r.crc)
        for r in results
    ]
    engine.read(storage, reads)
    assert sorted(heard) == sorted(SIZES)


def test_a_failed_read_handed_to_on_error_still_counts(tmp_path: Path) -> None:
    """``verify`` lists a damaged chunk and goes on: its bytes were checked all the same."""
    storage = LocalPath(str(tmp_path))
    storage.write_bytes("c.0", bytes(100))
    heard: list[int] = []
    failed: list[Exception] = []
    engine = ParallelIO(progress=heard.append)
    bad = ReadRequest("c.0", 0, [memoryview(bytearray(100))], 100, crc=1)
    engine.read(storage, [bad], on_error=lambda request, error: failed.append(error))
    assert [type(error) for error in failed] == [CorruptCheckpointError]
    assert heard == [100]


def test_a_node_counted_from_many_threads_ends_exactly_at_its_size() -> None:
    heard: list[int] = []
    node = NodeProgress(heard.append, total=10_000)

    def count() -> None:
        for _ in range(1000):
            node(3)

    workers = [threading.Thread(target=count) for _ in range(4)]  # 12,000 bytes offered
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    node.finish()
    assert sum(heard) == node.reported == 10_000
    assert NodeProgress(None, 5).reported == 0  # nowhere to report: only counts
