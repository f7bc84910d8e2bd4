"""The S3 client's session handling, through s3fs's public ``set_session`` only."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from ckptstore_s3 import S3Path
from ckptstore_s3.client import S3Client

from ckptstore.object_store import PartsReader
from ckptstore.protocol import control_keys


def test_a_closed_path_opens_a_new_session_when_used_again(s3_url: str) -> None:
    storage = S3Path(s3_url)
    storage.write_bytes("a", b"first")
    storage.close()
    storage.close()  # closing twice is harmless
    storage.write_bytes("b", b"second")
    assert storage.read_bytes("a") == b"first"
    assert storage.read_bytes("b") == b"second"
    storage.close()


PAGE = 100


def test_listing_the_control_directory_leaves_the_chunk_store_unlisted(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Path(s3_url)
    chunks = [f"_ckptstore/chunks/{number:032x}" for number in range(250)]  # 3 pages
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: storage.write_bytes(key, b"c"), chunks))
    others = ["_ckptstore/epoch-1/t.commit.json", "_ckptstore/a", "_ckptstore/lease/t.json"]
    for key in others:
        storage.write_bytes(key, b"{}")
    listed: list[int] = []
    real = S3Client.call

    async def counted(self: S3Client, operation: str, *args: Any, **params: Any) -> Any:
        if operation == "list_objects_v2":
            params["MaxKeys"] = PAGE  # pages of 100 keys, not 1,000
        response = await real(self, operation, *args, **params)
        if operation == "list_objects_v2":
            listed.append(len(response.get("Contents", [])))
        return response

    monkeypatch.setattr(S3Client, "call", counted)
    assert control_keys(storage) == sorted(others)
    assert len(listed) == 2  # one page each side of the store (the whole: 3 pages)
    assert sum(listed) <= PAGE + len(others)
    listed.clear()
    assert len(storage.list_keys("_ckptstore")) == len(chunks) + len(others)
    assert len(listed) == 3
    listed.clear()
    storage.delete(chunks)
    assert control_keys(storage) == sorted(others)
    assert len(listed) == 1  # no chunk store (no incremental save): one LIST, as before


def test_a_large_upload_is_streamed_from_memory_not_read_into_copies(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Path(s3_url)
    data = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8)
    copied: list[int] = []
    real_read = PartsReader.read

    def read(self: PartsReader, size: int | None = -1) -> bytes:
        copied.append(size or -1)
        return real_read(self, size)

    monkeypatch.setattr(PartsReader, "read", read)
    monkeypatch.setattr(PartsReader, "readinto", None)  # never read into a buffer either
    storage.write_parts("big", [memoryview(data)[: 1 << 20], memoryview(data)[1 << 20 :]])
    assert copied == []
    assert storage.read_bytes("big") == data.tobytes()
