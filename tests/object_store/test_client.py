"""The reads every backend gets from its ranged download: whole objects, ranges, ranges
past the end, scattered targets, bodies cut off mid-way; sizes and missing objects."""

from __future__ import annotations

import concurrent.futures

import pytest
from object_store_fakes import MemoryClient, MemoryFilesystem, MemoryOptions

from ckptstore.object_store._failures import MissingObjectError


@pytest.fixture
def client(memory: MemoryFilesystem) -> MemoryClient:
    memory.buckets["bucket"]["k"] = bytes(range(100))
    return MemoryClient(
        memory, MemoryOptions.resolve({"store": memory.name, "retry_base_delay": 0}, {}), "bucket"
    )


def test_whole_objects_ranges_and_ranges_past_the_end(client: MemoryClient) -> None:
    assert client.run(lambda: client.get("k", 0, None)) == bytes(range(100))
    assert client.run(lambda: client.get("k", 90, None)) == bytes(range(90, 100))
    assert client.run(lambda: client.get("k", 10, 5)) == bytes(range(10, 15))
    assert client.run(lambda: client.get("k", 100, 5)) == b""
    target = bytearray(4)
    assert client.run(lambda: client.get_into("k", 200, [memoryview(target)])) == 0


def test_scattered_reads_and_a_body_cut_off_mid_way(
    client: MemoryClient, memory: MemoryFilesystem
) -> None:
    memory.fail_next("read", ConnectionResetError("cut off"))
    first, second = bytearray(3), bytearray(5)
    received = client.run(lambda: client.get_into("k", 1, [memoryview(first), memoryview(second)]))
    assert received == 8
    assert bytes(first + second) == bytes(range(1, 9))
    assert memory.kinds().count("get") == 2  # the whole download again


def test_sizes_and_missing_objects(client: MemoryClient) -> None:
    assert client.run(lambda: client.size("k")) == 100
    with pytest.raises(MissingObjectError) as caught:
        client.run(lambda: client.size("absent"))
    assert str(caught.value) == "HEAD mem://bucket/absent: no such object"
    assert caught.value.code == "NoSuchKey"
    with pytest.raises(MissingObjectError, match="GET mem://bucket/absent failed: HTTP 404"):
        client.run(lambda: client.get("absent", 0, None))


def test_requests_run_on_the_loop_from_any_thread(client: MemoryClient) -> None:
    future = client.submit(lambda: client.get("k", 0, 2))
    assert isinstance(future, concurrent.futures.Future)
    assert future.result(timeout=30) == b"\x00\x01"
    assert client.endpoint == "memory"
    assert client.describe("PUT", "a/b") == "PUT mem://bucket/a/b"
