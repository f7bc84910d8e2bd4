"""An object already in memory goes up in parts: at most ``limit`` at once, completed in
index order, aborted on any failure."""

from __future__ import annotations

import asyncio

import pytest
from object_store_fakes import FakeHttpError, MemoryClient, MemoryFilesystem, MemoryOptions

from ckptstore.object_store._body import Body
from ckptstore.object_store._failures import RequestError
from ckptstore.object_store._multipart import MultipartUpload, upload_in_parts


def client_on(memory: MemoryFilesystem) -> MemoryClient:
    return MemoryClient(
        memory, MemoryOptions.resolve({"store": memory.name, "retries": 0}, {}), "bucket"
    )


def parts_of(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_parts_are_completed_in_index_order(memory: MemoryFilesystem) -> None:
    client = client_on(memory)
    parts = parts_of(bytes(range(250)), 64)
    client.run(lambda: upload_in_parts(client.multipart("k"), 4, parts.__getitem__, limit=2))
    assert memory.buckets["bucket"]["k"] == bytes(range(250))
    assert memory.kinds() == ["start", "part", "part", "part", "part", "complete"]
    assert [upload.state for upload in memory.uploads] == ["completed"]


def test_a_failed_part_aborts_the_upload(memory: MemoryFilesystem) -> None:
    client = client_on(memory)
    memory.fail_next("part", FakeHttpError(403, "AccessDenied"))
    with pytest.raises(RequestError, match="HTTP 403 AccessDenied"):
        client.run(
            lambda: upload_in_parts(
                client.multipart("k"), 3, [b"a", b"b", b"c"].__getitem__, limit=1
            )
        )
    assert "k" not in memory.buckets["bucket"]
    assert [upload.state for upload in memory.uploads] == ["aborted"]
    assert memory.kinds()[-1] == "abort"


class GatedUpload(MultipartUpload):
    """Holds every part until ``limit`` of them are in flight at once.

    Example::

        asyncio.run(upload_in_parts(GatedUpload(3), 10, lambda i: b"x", limit=3))
    """

    def __init__(self, limit: int) -> None:
        super().__init__("k")
        self.limit = limit
        self.active = self.peak = 0
        self.done: list[int] = []
        self.gate = asyncio.Event()

    async def upload_part(self, index: int, body: Body) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self.active >= self.limit:
            self.gate.set()
        await self.gate.wait()
        self.active -= 1
        self.done.append(index)

    async def complete(self) -> None:
        self.done.append(-1)

    async def abort(self) -> None:
        self.done.append(-2)


def test_at_most_limit_parts_are_in_flight() -> None:
    upload = GatedUpload(limit=3)
    asyncio.run(upload_in_parts(upload, 10, lambda index: b"x", limit=3))
    assert upload.peak == 3
    assert sorted(upload.done[:-1]) == list(range(10))
    assert upload.done[-1] == -1  # completed, after every part
