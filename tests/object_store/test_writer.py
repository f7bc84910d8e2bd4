"""A write stream sends small objects in one request and larger ones in parts, in
order; any failure, an exception in its ``with`` block or being dropped aborts it, and
no partial object appears."""

from __future__ import annotations

import pytest
from object_store_fakes import FakeHttpError, MemoryClient, MemoryFilesystem, MemoryOptions

from ckptstore.errors import StorageError
from ckptstore.object_store._writer import MultipartWriter

PART = 1024


def writer_on(memory: MemoryFilesystem, key: str = "k") -> MultipartWriter:
    client = MemoryClient(
        memory,
        MemoryOptions.resolve({"store": memory.name, "retries": 1, "retry_base_delay": 0}, {}),
        "bucket",
    )
    return MultipartWriter(
        client,
        key,
        part_size=PART,
        max_in_flight=2,
        wrap_error=lambda error: StorageError("mem://bucket", key, "write", error),
    )


def write_through(out: MultipartWriter, chunks: list[bytes], failure: str | None = None) -> None:
    """Write ``chunks`` in a ``with`` block, then raise ``failure`` inside it if given."""
    with out:
        for chunk in chunks:
            out.write(chunk)
        if failure is not None:
            raise RuntimeError(failure)


def test_a_small_object_is_one_request(memory: MemoryFilesystem) -> None:
    with writer_on(memory) as out:
        out.write(b"hello ")
        out.write(memoryview(b"world"))
        assert out.tell() == 11
        assert not out.seekable()
    assert memory.buckets["bucket"]["k"] == b"hello world"
    assert memory.kinds() == ["put"]
    assert memory.uploads == []


def test_a_large_object_goes_up_in_parts_in_order(memory: MemoryFilesystem) -> None:
    data = bytes(range(256)) * 14  # 3.5 parts
    with writer_on(memory) as out:
        for start in range(0, len(data), 300):
            out.write(data[start : start + 300])
    assert memory.buckets["bucket"]["k"] == data
    assert memory.kinds() == ["start", "part", "part", "part", "part", "complete"]
    assert [upload.state for upload in memory.uploads] == ["completed"]


def test_a_failed_part_aborts_the_upload_and_names_the_object(memory: MemoryFilesystem) -> None:
    memory.fail_next("part", FakeHttpError(503), count=100)  # every attempt of every part
    out = writer_on(memory)
    with pytest.raises(StorageError, match="could not write mem://bucket/k") as caught:
        write_through(out, [b"x" * PART] * 6)
    assert "after 2 attempts" in str(caught.value)
    assert "k" not in memory.buckets["bucket"]
    assert [upload.state for upload in memory.uploads] == ["aborted"]


def test_a_failure_of_the_last_part_on_close_aborts_the_upload(memory: MemoryFilesystem) -> None:
    out = writer_on(memory)
    out.write(b"x" * (PART + 10))
    memory.fail_next("part", FakeHttpError(403), count=1)
    memory.fail_next("part", FakeHttpError(403), count=1)
    with pytest.raises(StorageError):
        out.close()
    assert out.closed
    assert "k" not in memory.buckets["bucket"]
    assert [upload.state for upload in memory.uploads] == ["aborted"]


def test_an_exception_in_the_block_aborts(memory: MemoryFilesystem) -> None:
    with pytest.raises(RuntimeError, match="the format failed"):
        write_through(writer_on(memory), [b"y" * (2 * PART)], failure="the format failed")
    assert "k" not in memory.buckets["bucket"]
    assert [upload.state for upload in memory.uploads] == ["aborted"]


def test_a_dropped_stream_is_aborted_and_a_closed_one_refuses_writes(
    memory: MemoryFilesystem,
) -> None:
    out = writer_on(memory)
    out.write(b"z" * PART)
    del out  # abandoned without close(): never completed
    assert [upload.state for upload in memory.uploads] == ["aborted"]
    closed = writer_on(memory, "other")
    closed.close()
    with pytest.raises(ValueError, match="write to a closed Memory object stream"):
        closed.write(b"late")
