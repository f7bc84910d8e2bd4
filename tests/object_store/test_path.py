"""The object-store path type on the in-memory fake: the whole path-type contract, one
request or parallel parts by size, streamed bodies, no listing on the save path, errors
that name the object, credential-free ``repr`` and pickling."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from object_store_fakes import (
    FakeHttpError,
    MemoryFilesystem,
    MemoryStorePath,
    new_filesystem,
)

from ckptstore import protocol
from ckptstore.errors import (
    CorruptCheckpointError,
    InvalidNameError,
    ObjectNotFoundError,
    StorageError,
)
from ckptstore.formats._npz_db import NpzDB
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.object_store import _ranged as object_ranged
from ckptstore.object_store._body import PartsReader
from ckptstore.plugin._path_type import PathType
from ckptstore.records import current_limits, set_limits
from ckptstore.testing.conformance import PathTypeConformance

SMALL_PARTS = {"part_size": 4096, "multipart_threshold": 16384, "buffer_bytes": 16384}


def open_path(memory: MemoryFilesystem, **options: object) -> MemoryStorePath:
    return MemoryStorePath("mem://bucket/run", store=memory.name, retry_base_delay=0, **options)


class TestMemoryStoreConformance(PathTypeConformance):
    @pytest.fixture
    def storage(self, memory: MemoryFilesystem) -> Iterator[PathType]:
        storage = open_path(memory, **SMALL_PARTS)
        yield storage
        storage.close()


def test_small_objects_are_one_request_large_ones_parallel_parts(
    memory: MemoryFilesystem,
) -> None:
    storage = open_path(memory, **SMALL_PARTS, max_concurrency=2)
    storage.write_parts("small", [b"a", np.arange(4, dtype=np.int64)])
    assert memory.kinds() == ["put"]
    data = np.arange(5000, dtype=np.int32)  # 20000 bytes: five 4 KiB parts
    storage.write_parts("large", [b"head", data])
    assert memory.kinds()[1:] == ["start", *["part"] * 5, "complete"]
    assert storage.read_bytes("large") == b"head" + data.tobytes()
    assert memory.buckets["bucket"]["run/large"] == b"head" + data.tobytes()


def test_bodies_below_the_threshold_are_streamed_when_large(memory: MemoryFilesystem) -> None:
    storage = open_path(memory)
    storage.write_parts("one-mib", [np.ones(1 << 20, dtype=np.uint8)])
    storage.put_document("doc", b"{}")
    assert memory.bodies == [PartsReader, bytes]


def test_a_failed_part_leaves_no_object_and_names_it(memory: MemoryFilesystem) -> None:
    storage = open_path(memory, **SMALL_PARTS, retries=0)
    memory.fail_next("part", FakeHttpError(500), count=1)
    with pytest.raises(StorageError, match="could not write mem://bucket/run/large") as caught:
        storage.write_parts("large", [bytes(20000)])
    assert "PART mem://bucket/run/large failed: HTTP 500" in str(caught.value)
    assert not storage.exists("large")
    assert [upload.state for upload in memory.uploads] == ["aborted"]


def test_missing_objects_and_sizes(memory: MemoryFilesystem) -> None:
    storage = open_path(memory)
    with pytest.raises(ObjectNotFoundError, match="HEAD mem://bucket/run/absent: no such object"):
        storage.size("absent")
    storage.write_bytes("present", b"12345")
    assert storage.size("present") == 5
    assert storage.read_bytes("present", 1, 0) == b""
    assert memory.kinds().count("get") == 0  # an empty range needs no request


def test_a_checkpoint_is_saved_and_loaded_without_listing(memory: MemoryFilesystem) -> None:
    storage = open_path(memory, **SMALL_PARTS)
    engine = ParallelIO(IOSettings(chunk_bytes=4096, memory_budget=1 << 20))
    blobs = {"w": np.arange(10000, dtype=np.float64), "step": np.array(3)}
    commit = protocol.write_node(storage, "trainer_0", 1, blobs, NpzDB(), engine)
    protocol.commit_epoch(storage, 1, [commit])
    manifest = protocol.open_node(storage, "trainer_0", 1)
    loaded = protocol.read_blobs(storage, manifest, None, NpzDB(), engine)
    assert np.array_equal(loaded["w"], blobs["w"])
    assert "list" not in memory.kinds()


def test_accessible_checks_the_bucket_only() -> None:
    memory = new_filesystem("present")
    assert MemoryStorePath("mem://present/x", store=memory.name).accessible()
    assert not MemoryStorePath("mem://absent/x", store=memory.name, retries=0).accessible()
    assert set(memory.kinds()) == {"bucket"}


def test_repr_pickling_closing_and_urls_without_a_bucket(memory: MemoryFilesystem) -> None:
    storage = open_path(memory, token="sekrit-token", endpoint_url="http://fake:9")
    assert repr(storage) == "MemoryStorePath('mem://bucket/run', endpoint_url='http://fake:9')"
    assert "sekrit-token" not in repr(storage.options)
    clone = pickle.loads(pickle.dumps(storage))
    assert (clone.bucket, clone.prefix, clone.options.token) == ("bucket", "run", "sekrit-token")
    clone.close()
    assert memory.closed == 1
    with pytest.raises(ValueError, match="a memory URL names a bucket: mem://BUCKET/prefix"):
        MemoryStorePath("mem://", store=memory.name)


@pytest.mark.parametrize("url", ["/tmp/ckpt", "./ckpt", "../ckpt", "~/ckpt", "file:///tmp/x"])
def test_a_local_path_is_refused_at_once_not_sent_to_a_bucket(
    memory: MemoryFilesystem, url: str
) -> None:
    """A local path given an object store's path type (``--path-type s3 /tmp/x``) would
    otherwise name a bucket ``tmp`` and retry requests to it for seconds."""
    with pytest.raises(ValueError, match="is a local path") as caught:
        MemoryStorePath(url, store=memory.name)
    assert "mem://BUCKET/prefix" in str(caught.value)
    assert memory.kinds() == []  # no request was made


# -- control documents are bounded before they are read ------------------------------------


@pytest.fixture
def small_documents() -> Iterator[int]:
    limit = 1000
    set_limits(replace(current_limits(), max_document_bytes=limit))
    yield limit
    set_limits(None)


def _body_reads(memory: MemoryFilesystem) -> int:
    return memory.kinds().count("read")


def test_a_document_is_one_download_of_at_most_the_limit(
    memory: MemoryFilesystem, small_documents: int
) -> None:
    storage = open_path(memory)
    storage.put_document("_ckptstore/doc.json", b'{"a": 1}')
    storage.put_document("_ckptstore/empty.json", b"")
    before = len(memory.requests)
    assert storage.read_document("_ckptstore/doc.json") == b'{"a": 1}'
    assert storage.read_document("_ckptstore/empty.json") == b""
    assert [kind for kind, _ in memory.requests[before:]].count("get") == 2
    assert "head" not in memory.kinds()[before:]  # no extra round trip


@pytest.mark.parametrize("ignores_range", [False, True], ids=["ranged", "whole-answer"])
def test_an_oversized_document_is_refused_before_its_body_is_read(
    memory: MemoryFilesystem, small_documents: int, ignores_range: bool
) -> None:
    memory.ignores_range = ignores_range
    storage = open_path(memory)
    storage.put_document("_ckptstore/big.json", b" " * (50 * small_documents))
    with pytest.raises(CorruptCheckpointError, match="50000 bytes, more than the limit") as caught:
        storage.get_document("_ckptstore/big.json")
    assert caught.value.file == "_ckptstore/big.json"
    assert caught.value.url == storage.display_url
    assert _body_reads(memory) == 0
    assert memory.kinds().count("get") == 1  # refused, not retried


def test_a_body_longer_than_its_declared_size_is_refused(
    memory: MemoryFilesystem, small_documents: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(object_ranged, "READ_PIECE", 16)
    storage = open_path(memory)
    storage.put_document("_ckptstore/doc.json", b" " * 500)
    memory.declared["run/_ckptstore/doc.json"] = 100  # the response understates the object
    with pytest.raises(CorruptCheckpointError, match="more than the 100 bytes its response"):
        storage.read_document("_ckptstore/doc.json")
    assert 16 * _body_reads(memory) <= 101 + 16  # read one byte past the declared size


def test_a_document_of_unknown_size_is_cut_one_byte_past_the_limit(
    memory: MemoryFilesystem, small_documents: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(object_ranged, "READ_PIECE", 64)
    memory.ignores_range = True  # a whole-object answer with no declared size at all
    storage = open_path(memory)
    storage.put_document("_ckptstore/big.json", b" " * (50 * small_documents))
    memory.declared["run/_ckptstore/big.json"] = None
    with pytest.raises(CorruptCheckpointError, match="more than 1000 bytes, more than the limit"):
        storage.read_document("_ckptstore/big.json")
    assert 64 * _body_reads(memory) <= small_documents + 64


def test_a_ranged_read_refuses_a_body_longer_than_asked(memory: MemoryFilesystem) -> None:
    memory.ignores_range = True  # the store sends the whole object
    storage = open_path(memory)
    storage.write_bytes("blob", b"x" * 4096)
    with pytest.raises(CorruptCheckpointError, match="more than the 10 bytes due") as caught:
        storage.read_bytes("blob", 0, 10)
    assert caught.value.file == "blob"
    assert storage.read_bytes("blob") == b"x" * 4096


@pytest.mark.parametrize("key", ["../x", "/x", "a//b", "a/./b", "a/", "x/..", "a\\..\\b"])
def test_a_key_leading_out_of_the_prefix_is_refused_before_any_request(
    memory: MemoryFilesystem, key: str
) -> None:
    storage = open_path(memory)
    calls = [
        lambda: storage.read_bytes(key),
        lambda: storage.read_document(key),
        lambda: storage.get_document(key),
        lambda: storage.read_into(key, 0, [memoryview(bytearray(4))]),
        lambda: storage.size(key),
        lambda: storage.exists(key),
        lambda: storage.write_bytes(key, b"x"),
        lambda: storage.put_document(key, b"{}"),
        lambda: storage.create_document(key, b"{}"),
        lambda: storage.delete([key]),
        lambda: storage.open_write(key),
    ]
    for call in calls:
        with pytest.raises(InvalidNameError):
            call()
    assert memory.requests == []
