"""Conformance tests for path types (storage back ends).

Subclass :class:`PathTypeConformance` and give it a ``storage`` fixture: a path type
rooted at a fresh, empty location.

Example::

    class TestMyStore(PathTypeConformance):
        @pytest.fixture
        def storage(self, my_server) -> PathType:
            return MyStore(my_server.fresh_url())
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from ckptstore import protocol
from ckptstore._types import Buffer
from ckptstore.builtin._npz_db import NpzDB
from ckptstore.errors import CorruptCheckpointError, InvalidNameError, ObjectNotFoundError
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._path_type import PathType, redact_url
from ckptstore.records._layout import staging_key
from ckptstore.testing.conformance.samples import assert_same_blob, dtype_sample

__all__ = ["PathTypeConformance"]


class PathTypeConformance:
    """The contract every path type honours. Needs a ``storage`` fixture (empty root).

    Example::

        class TestLocal(PathTypeConformance):
            @pytest.fixture
            def storage(self, tmp_path) -> PathType:
                return LocalPath(str(tmp_path))
    """

    def test_write_parts_stores_their_concatenation(self, storage: PathType) -> None:
        parts: list[Buffer] = [b"head-", bytearray(b"middle-"), np.arange(4, dtype="<u2")]
        storage.write_parts("a/b/object", parts)
        expected = b"head-middle-" + np.arange(4, dtype="<u2").tobytes()
        assert storage.read_bytes("a/b/object") == expected
        assert storage.exists("a/b/object")
        assert storage.size("a/b/object") == len(expected)

    def test_writing_again_replaces_the_object(self, storage: PathType) -> None:
        storage.write_bytes("k", b"a long first version")
        storage.write_bytes("k", b"short")
        assert storage.read_bytes("k") == b"short"

    def test_ranges_and_scatter_reads(self, storage: PathType) -> None:
        data = bytes(range(256)) * 40
        storage.write_bytes("blob", data)
        assert storage.read_bytes("blob", 1000, 24) == data[1000:1024]
        assert storage.read_bytes("blob", 10_000) == data[10_000:]
        first, second = bytearray(100), bytearray(3000)
        storage.read_into("blob", 7, [memoryview(first), memoryview(second)])
        assert bytes(first) + bytes(second) == data[7:3107]

    def test_missing_objects_raise_object_not_found(self, storage: PathType) -> None:
        with pytest.raises(ObjectNotFoundError) as caught:
            storage.read_bytes("no/such/key")
        assert isinstance(caught.value, FileNotFoundError)
        with pytest.raises(FileNotFoundError):
            storage.read_into("no/such/key", 0, [memoryview(bytearray(4))])
        assert not storage.exists("no/such/key")
        assert storage.get_document("no/such/key") is None

    def test_short_objects_raise_corrupt_checkpoint(self, storage: PathType) -> None:
        storage.write_bytes("short", b"12345")
        with pytest.raises(CorruptCheckpointError, match="before the end"):
            storage.read_into("short", 2, [memoryview(bytearray(10))])

    def test_delete_ignores_missing_keys(self, storage: PathType) -> None:
        storage.write_bytes("x/1", b"1")
        storage.write_bytes("x/2", b"2")
        storage.delete(["x/1", "x/never"])
        assert storage.list_keys("x") == ["x/2"]

    def test_delete_tree_removes_only_that_prefix(self, storage: PathType) -> None:
        for key in ("run/a/1", "run/a/sub/2", "run/ab/3", "run/b"):
            storage.write_bytes(key, b"x")
        storage.delete_tree("run/a")
        assert storage.list_keys() == ["run/ab/3", "run/b"]
        storage.delete_tree("run/missing")

    def test_list_keys_is_recursive_and_sorted(self, storage: PathType) -> None:
        for key in ("b/2", "a/1", "b/sub/3", "c"):
            storage.write_bytes(key, b"x")
        assert storage.list_keys() == ["a/1", "b/2", "b/sub/3", "c"]
        assert storage.list_keys("b") == ["b/2", "b/sub/3"]
        assert storage.list_keys("nothing-here") == []

    def test_open_write_streams_an_object(self, storage: PathType) -> None:
        with storage.open_write("stream/object") as stream:
            for i in range(50):
                stream.write(bytes([i]) * 1000)
        assert storage.read_bytes("stream/object") == b"".join(bytes([i]) * 1000 for i in range(50))

    def test_documents_round_trip(self, storage: PathType) -> None:
        storage.put_document("_ckptstore/doc.json", b'{"a": 1}')
        storage.put_document("_ckptstore/doc.json", b'{"a": 2}')
        assert storage.get_document("_ckptstore/doc.json") == b'{"a": 2}'

    @pytest.mark.parametrize("key", ["../escape", "/absolute", "a//b", "a/./b", "a/../b", ""])
    def test_keys_that_could_escape_the_root_are_refused(self, storage: PathType, key: str) -> None:
        with pytest.raises(InvalidNameError):
            storage.write_bytes(key, b"x")

    def test_display_url_carries_no_credentials(self, storage: PathType) -> None:
        assert storage.display_url == redact_url(storage.display_url)
        assert storage.display_url in repr(storage)

    def test_pickled_storage_reads_the_same_objects(self, storage: PathType) -> None:
        storage.write_bytes("k", b"value")
        clone = pickle.loads(pickle.dumps(storage))
        assert clone.read_bytes("k") == b"value"

    def test_accessible_root(self, storage: PathType) -> None:
        assert storage.accessible()
        storage.sync()

    def test_renames_replace_a_whole_prefix(self, storage: PathType) -> None:
        if not storage.supports_rename:
            with pytest.raises(TypeError, match="rename"):
                storage.replace_tree("a", "b")
            return
        storage.write_bytes("node.1/old", b"old")
        staging = staging_key("node.1", "abc123")
        storage.write_bytes(f"{staging}/new", b"new")
        assert storage.staging_keys("node.1") == [staging]
        storage.replace_tree(staging, "node.1")
        assert storage.list_keys() == ["node.1/new"]
        assert storage.staging_keys("node.1") == []

    def test_checkpoints_round_trip_through_the_commit_protocol(self, storage: PathType) -> None:
        engine = ParallelIO(IOSettings(chunk_bytes=4096, memory_budget=1 << 20))
        blobs = {"w": dtype_sample("<f8", (64, 64)), "step": np.array(3)}
        commit = protocol.write_node(storage, "trainer_0", 2, blobs, NpzDB(), engine)
        protocol.commit_epoch(storage, 2, [commit])
        manifest = protocol.open_node(storage, "trainer_0", 2)
        loaded = protocol.read_blobs(storage, manifest, None, NpzDB(), engine)
        for name, blob in blobs.items():
            assert_same_blob(loaded[name], blob)
        assert protocol.verify_node(storage, "trainer_0", 2, NpzDB(), engine) == []
