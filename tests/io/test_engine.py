"""The parallel chunk mover: order, memory budget, errors, batching, verification."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from ckpt_helpers import CountingReader, memory_root

from ckptstore import CorruptCheckpointError, StorageError
from ckptstore._types import Buffer, byte_view
from ckptstore.builtin import FsspecPath, LocalPath
from ckptstore.io import _engine
from ckptstore.io._checksum import crc32_of
from ckptstore.io._engine import ParallelIO, RangeCheck, ReadRequest, WriteRequest
from ckptstore.io._settings import IOSettings
from ckptstore.plugin import PositionalReader

KiB = 1 << 10
LARGE = 300 * KiB  # above ParallelIO.SMALL_REQUEST: never batched


class GatedMemoryPath(FsspecPath):
    """A copying storage (memory://) that records how many bytes its transfers hold at
    once. With a ``gate``, transfers wait at a barrier until ``gate`` of them are in
    progress together, which pushes the engine to its limit without timing games."""

    name = "gated_memory"
    protocols: ClassVar[tuple[str, ...]] = ()

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.barrier: threading.Barrier | None = None
        self.held = 0
        self.peak = 0
        self.held_by_others: dict[str, int] = {}
        self._lock = threading.Lock()

    def set_gate(self, gate: int) -> None:
        self.barrier = threading.Barrier(gate)
        self.peak = 0

    @contextmanager
    def _transfer(self, key: str, nbytes: int) -> Iterator[None]:
        with self._lock:
            self.held_by_others[key] = self.held
            self.held += nbytes
            self.peak = max(self.peak, self.held)
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=30)
            yield
        finally:
            with self._lock:
                self.held -= nbytes

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        with self._transfer(key, sum(byte_view(p).nbytes for p in parts)):
            super().write_parts(key, parts)

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        with self._transfer(key, sum(t.nbytes for t in targets)):
            super().read_into(key, offset, targets)


def payload(index: int, size: int) -> np.ndarray:
    return np.full(size, index % 251, dtype=np.uint8)


def test_writes_return_results_in_request_order_with_crcs() -> None:
    with memory_root() as url:
        storage = FsspecPath(url)
        sizes = [10, LARGE, 20, LARGE + 1, 30, 40]  # small ones are batched, large are not
        requests = [WriteRequest(f"k{i}", [payload(i, size)], size) for i, size in enumerate(sizes)]
        results = ParallelIO(IOSettings(concurrency=3)).write(storage, requests, prefix="p")
        assert [r.key for r in results] == [f"k{i}" for i in range(len(sizes))]
        assert [r.nbytes for r in results] == sizes
        for i, result in enumerate(results):
            data = storage.read_bytes(f"p/k{i}")
            assert data == payload(i, sizes[i]).tobytes()
            assert result.crc == crc32_of([data])


def test_many_small_requests_are_batched_and_keep_their_order() -> None:
    calls: list[str] = []

    class Counting(LocalPath):
        def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
            calls.append(threading.current_thread().name)
            super().write_parts(key, parts)

    import tempfile

    with tempfile.TemporaryDirectory() as root:
        storage = Counting(root)
        requests = [WriteRequest(f"k/{i:03d}", [bytes([i % 256]) * 8], 8) for i in range(100)]
        results = ParallelIO(IOSettings(concurrency=4)).write(storage, requests)
        assert [r.key for r in results] == [f"k/{i:03d}" for i in range(100)]
        assert storage.read_bytes("k/042") == bytes([42]) * 8
    assert len(calls) == 100


def test_write_parts_may_be_produced_in_the_worker() -> None:
    produced: list[str] = []

    def produce() -> list[Buffer]:
        produced.append(threading.current_thread().name)
        return [b"abc", np.arange(2, dtype=np.uint8)]

    with memory_root() as url:
        storage = FsspecPath(url)
        (result,) = ParallelIO().write(storage, [WriteRequest("k", produce, 5, holds=5)])
        assert storage.read_bytes("k") == b"abc\x00\x01"
        assert result.nbytes == 5
    assert produced[0].startswith("ckptstore-io")


@pytest.mark.parametrize("direction", ["write", "read"])
def test_bytes_in_flight_never_exceed_the_budget(direction: str) -> None:
    allowed = 3
    settings = IOSettings(chunk_bytes=4096, concurrency=8, memory_budget=allowed * LARGE)
    with memory_root() as url:
        storage = GatedMemoryPath(url)
        data = [payload(i, LARGE) for i in range(4 * allowed)]
        if direction == "write":
            storage.set_gate(allowed)
        engine = ParallelIO(settings)
        engine.write(storage, [WriteRequest(f"k{i}", [d], LARGE) for i, d in enumerate(data)])
        if direction == "read":
            storage.set_gate(allowed)
            targets = [bytearray(LARGE) for _ in data]
            requests = [
                ReadRequest(f"k{i}", 0, [memoryview(t)], LARGE, crc=crc32_of([d]))
                for i, (t, d) in enumerate(zip(targets, data, strict=True))
            ]
            engine.read(storage, requests)
            assert all(bytes(t) == d.tobytes() for t, d in zip(targets, data, strict=True))
        assert storage.peak == allowed * LARGE  # the gate proves the engine got there
        assert engine.peak_in_flight == allowed * LARGE


def test_an_oversize_request_goes_through_alone() -> None:
    settings = IOSettings(chunk_bytes=4096, concurrency=4, memory_budget=2 * LARGE)
    sizes = [LARGE, LARGE, 5 * LARGE, LARGE, LARGE, LARGE]
    with memory_root() as url:
        storage = GatedMemoryPath(url)
        engine = ParallelIO(settings)
        results = engine.write(
            storage, [WriteRequest(f"k{i}", [payload(i, s)], s) for i, s in enumerate(sizes)]
        )
        assert [r.nbytes for r in results] == sizes
        assert storage.held_by_others["k2"] == 0  # it waited for the others to finish
        others = [held for key, held in storage.held_by_others.items() if key != "k2"]
        assert max(others) < 5 * LARGE  # and nothing started while it was in flight
        assert storage.peak == 5 * LARGE
        assert engine.peak_in_flight == 5 * LARGE


def test_the_first_error_stops_the_operation_and_names_the_blob() -> None:
    pulled: list[int] = []

    class Failing(FsspecPath):
        def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
            if key.endswith("k3"):
                raise StorageError(self.display_url, key, "write", OSError("disk on fire"))
            super().write_parts(key, parts)

    def requests() -> Iterator[WriteRequest]:
        for i in range(200):
            pulled.append(i)
            yield WriteRequest(f"k{i}", [b"x" * 16], 16, blob=f"b{i}", chunk=0)

    engine = ParallelIO(IOSettings(concurrency=1))
    engine.SMALL_REQUEST = 0  # one request per hand-off, so the stop is visible
    with memory_root() as url, pytest.raises(StorageError, match="disk on fire") as info:
        engine.write(Failing(url), requests(), prefix="root")
    assert "while moving blob 'b3' chunk 0 (k3)" in info.value.__notes__
    assert len(pulled) < 50


def _reads(data: list[bytes], crcs: list[int]) -> tuple[list[bytearray], list[ReadRequest]]:
    targets = [bytearray(len(d)) for d in data]
    requests = [
        ReadRequest(f"k{i}", 0, [memoryview(t)], len(t), crc=crc, blob=f"b{i}", chunk=i)
        for i, (t, crc) in enumerate(zip(targets, crcs, strict=True))
    ]
    return targets, requests


def stored(url: str, count: int) -> tuple[FsspecPath, list[bytes]]:
    storage = FsspecPath(url)
    data = [bytes([i]) * (10 + i) for i in range(count)]
    for i, d in enumerate(data):
        storage.write_bytes(f"k{i}", d)
    return storage, data


def test_reads_are_verified_and_a_mismatch_names_blob_chunk_and_file() -> None:
    with memory_root() as url:
        storage, data = stored(url, 4)
        crcs = [crc32_of([d]) for d in data]
        crcs[2] ^= 1
        _, requests = _reads(data, crcs)
        with pytest.raises(CorruptCheckpointError) as info:
            ParallelIO().read(storage, requests)
        assert (info.value.blob, info.value.chunk, info.value.file) == ("b2", 2, "k2")
        assert not hasattr(info.value, "__notes__")  # already says where


def test_verification_can_be_turned_off() -> None:
    with memory_root() as url:
        storage, data = stored(url, 3)
        wrong = [0, 0, 0]
        targets, requests = _reads(data, wrong)
        ParallelIO().read(storage, requests, verify=False)
        assert [bytes(t) for t in targets] == data
        targets, requests = _reads(data, wrong)
        ParallelIO(IOSettings(verify=False)).read(storage, requests)
        assert [bytes(t) for t in targets] == data
        targets, requests = _reads(data, wrong)
        with pytest.raises(CorruptCheckpointError):
            ParallelIO(IOSettings(verify=False)).read(storage, requests, verify=True)


def test_on_error_collects_every_failure_and_the_rest_complete() -> None:
    with memory_root() as url:
        storage, data = stored(url, 6)
        crcs = [crc32_of([d]) for d in data]
        crcs[1] ^= 1
        crcs[4] ^= 1
        targets, requests = _reads(data, crcs)
        requests.append(ReadRequest("absent", 0, [memoryview(bytearray(1))], 1, blob="gone"))
        failures: list[tuple[str, type[Exception]]] = []
        ParallelIO().read(
            storage, requests, on_error=lambda r, e: failures.append((r.key, type(e)))
        )
        assert sorted(failures, key=str) == sorted(
            [
                ("k1", CorruptCheckpointError),
                ("k4", CorruptCheckpointError),
                ("absent", type(_missing(storage))),
            ],
            key=str,
        )
        for i in (0, 2, 3, 5):
            assert bytes(targets[i]) == data[i]


def _missing(storage: FsspecPath) -> Exception:
    try:
        storage.read_bytes("absent")
    except Exception as error:
        return error
    raise AssertionError("expected a missing key")


def test_reads_may_allocate_in_the_worker_and_finish_there() -> None:
    finished: list[bytes] = []
    with memory_root() as url:
        storage, data = stored(url, 2)
        request = ReadRequest(
            "k1",
            2,
            lambda: [memoryview(bytearray(5)), memoryview(bytearray(4))],
            9,
            crc=crc32_of([data[1][2:11]]),
            holds=9,
            finish=lambda buffers: finished.append(b"".join(bytes(b) for b in buffers)),
        )
        ParallelIO().read(storage, [request])
    assert finished == [data[1][2:11]]


def test_a_short_object_is_reported_as_corrupt(tmp_path: Any) -> None:
    storage = LocalPath(str(tmp_path))
    storage.write_bytes("k", b"12345")
    target = memoryview(bytearray(10))
    with pytest.raises(CorruptCheckpointError, match="ends 5 bytes before"):
        ParallelIO().read(storage, [ReadRequest("k", 0, [target], 10)])


class RoundTripPath(FsspecPath):
    """A memory root whose every call is a 'round trip': small requests must each get
    their own worker slot, so ``concurrency`` of them meet at the barrier together."""

    name = "round_trip"
    protocols = ()
    batches_small_requests = False

    def __init__(self, url: str, barrier: threading.Barrier) -> None:
        super().__init__(url)
        self.barrier = barrier

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        self.barrier.wait(timeout=30)  # raises BrokenBarrierError if they run one by one
        super().write_parts(key, parts)


def test_object_stores_get_each_small_request_its_own_slot() -> None:
    with memory_root() as url:
        concurrency = 4
        storage = RoundTripPath(url, threading.Barrier(concurrency))
        engine = ParallelIO(IOSettings(concurrency=concurrency))
        results = engine.write(
            storage, [WriteRequest(f"k{i}", [b"x" * 10], 10) for i in range(concurrency * 3)]
        )
        assert [result.key for result in results] == [f"k{i}" for i in range(concurrency * 3)]


class ReadCountingLocalPath(LocalPath):
    """Local disk that records the byte count of every read and how many times a file
    was opened for reading."""

    name = "read_counting_local"
    protocols: ClassVar[tuple[str, ...]] = ()

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[int] = []
        self.opens = 0

    def open_reader(self, key: str) -> PositionalReader:
        self.opens += 1
        return CountingReader(super().open_reader(key), self.reads.append)


def test_checked_reads_from_local_disk_go_in_windows_checked_as_read(tmp_path: Any) -> None:
    """A checked read of more than ``VERIFY_WINDOW`` bytes from storage that reads
    straight into memory goes in windows of that size (views of any dtype, small ones
    sharing a window) from a file opened once, each window checksummed right after it
    is read; the bytes and the verdict are the same as one read and one checksum,
    damage in the last window included. Unchecked reads, and storages that copy, read
    in one call."""
    window = _engine.VERIFY_WINDOW
    data = np.random.default_rng(8).integers(0, 255, 2 * window + 100, dtype=np.uint8)
    storage = ReadCountingLocalPath(str(tmp_path))
    storage.write_bytes("k", data.tobytes())
    head = np.empty(10, np.uint8)
    body = np.empty((data.nbytes - 10) // 2, np.uint16)  # not bytes: cut by bytes

    def request(crc: int) -> ReadRequest:
        return ReadRequest("k", 0, [memoryview(head), memoryview(body)], data.nbytes, crc)

    ParallelIO().read(storage, [request(crc32_of([data]))])
    assert head.tobytes() + body.tobytes() == data.tobytes()
    assert storage.reads == [window, window, 100]
    assert storage.opens == 1
    storage.reads.clear()
    ParallelIO().read(storage, [request(0)], verify=False)
    assert storage.reads == [data.nbytes]
    assert storage.opens == 2
    damaged = data.copy()
    damaged[-1] ^= 1
    storage.write_bytes("k", damaged.tobytes())
    with pytest.raises(CorruptCheckpointError, match="differs"):
        ParallelIO().read(storage, [request(crc32_of([data]))])
    with memory_root() as url:
        copying = GatedMemoryPath(url)
        copying.write_bytes("k", data.tobytes())
        held: list[int] = []
        real = copying.read_into

        def counting(key: str, offset: int, targets: Sequence[memoryview]) -> None:
            held.append(sum(t.nbytes for t in targets))
            real(key, offset, targets)

        copying.read_into = counting  # type: ignore[method-assign]
        ParallelIO().read(copying, [request(crc32_of([data]))])
        assert held == [data.nbytes]


def test_several_ranges_in_one_request_are_each_checked_and_a_bad_one_named(
    tmp_path: Any,
) -> None:
    """A request reading two large ranges and the header between them (``checks``) opens
    the file once, reads each range in windows checked as read and the gap unchecked,
    and a damaged second range names its own blob and chunk; a copying storage reads
    all in one call and checks each range after."""
    window = _engine.VERIFY_WINDOW
    rng = np.random.default_rng(9)
    first, gap, second = (rng.integers(0, 255, n, dtype=np.uint8) for n in (window + 7, 30, 5))
    stored = np.concatenate([first, gap, second])

    def request(second_crc: int) -> ReadRequest:
        a, b = np.empty_like(first), np.empty_like(second)
        checks = [RangeCheck(crc32_of([first]), "a", 0), None, RangeCheck(second_crc, "b", 3)]
        targets = [memoryview(a), memoryview(bytearray(gap.nbytes)), memoryview(b)]
        return ReadRequest("k", 0, targets, stored.nbytes, checks=checks)

    storage = ReadCountingLocalPath(str(tmp_path))
    storage.write_bytes("k", stored.tobytes())
    good = request(crc32_of([second]))
    ParallelIO().read(storage, [good])
    assert bytes(good.targets[0]) + bytes(good.targets[2]) == first.tobytes() + second.tobytes()
    assert storage.opens == 1
    assert storage.reads == [window, 7, 30, 5]
    with pytest.raises(CorruptCheckpointError) as info:
        ParallelIO().read(storage, [request(crc32_of([second]) ^ 1)])
    assert (info.value.blob, info.value.chunk) == ("b", 3)
    assert f"at offset {first.nbytes + gap.nbytes}" in str(info.value)
    with memory_root() as url:
        copying = GatedMemoryPath(url)
        copying.write_bytes("k", stored.tobytes())
        ParallelIO().read(copying, [request(crc32_of([second]))])
        with pytest.raises(CorruptCheckpointError) as info:
            ParallelIO().read(copying, [request(0)])
        assert (info.value.blob, info.value.chunk) == ("b", 3)


def test_calls_reuse_their_threads_and_a_call_inside_a_request_gets_its_own(
    tmp_path: Path,
) -> None:
    """The I/O threads of a call are kept for the next one (not started again); a call
    made from inside a request of another, on a single thread, gets threads of its own
    instead of waiting on the busy ones for good."""
    storage = LocalPath(str(tmp_path))
    engine = ParallelIO(IOSettings(concurrency=1))
    seen: list[int] = []

    def parts() -> list[bytes]:
        seen.append(threading.get_ident())
        return [b"x"]

    for n in range(3):
        engine.write(storage, [WriteRequest(f"a.{n}", parts, 1)])
    assert len(set(seen)) == 1
    inner: list[int] = []

    def nested() -> list[bytes]:
        inner.append(threading.get_ident())
        engine.write(storage, [WriteRequest("inner", parts, 1)])
        return [b"y"]

    engine.write(storage, [WriteRequest("outer", nested, 1)])
    assert seen[-1] != inner[0]  # the inner call ran on another thread, and returned
    assert storage.read_bytes("inner") == b"x"
    assert storage.read_bytes("outer") == b"y"
