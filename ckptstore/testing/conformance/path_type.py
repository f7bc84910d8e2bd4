"""Conformance tests for path types (storage back ends).

Subclass :class:`PathTypeConformance` and give it a ``storage`` fixture: a path type
rooted at a fresh, empty location.

Create-only writes (:meth:`PathType.create_document`, which commit records and writer
leases rely on) are held to their contract: a second create of a key raises
:class:`~ckptstore.errors.KeyExistsError` and changes nothing; and a path type that
claims ``atomic_create`` must let exactly one of several racing creates win. A test
server that ignores the store's precondition overrides
:meth:`PathTypeConformance.races_are_refused` (and says so in its docs); the race then
only has to leave one whole document. Conditional replaces
(:meth:`PathType.replace_document`, which writer leases rely on) likewise: a replace
from a stale version raises :class:`~ckptstore.errors.DocumentChangedError` and changes
nothing, and a path type that claims ``atomic_replace`` lets exactly one of several
racing replaces from one version win (:meth:`PathTypeConformance.replaces_are_refused`).

In the example an fsspec in-memory root stands in for a store's fresh URL.

Example::

    >>> import contextlib, io, pytest
    >>> kit = '''
    ... import uuid
    ... import pytest
    ... from ckptstore.builtin import FsspecPath
    ... from ckptstore.testing.conformance import PathTypeConformance
    ...
    ... class TestMemory(PathTypeConformance):
    ...     @pytest.fixture
    ...     def storage(self):
    ...         return FsspecPath(f"memory://kit-{uuid.uuid4().hex}")
    ... '''
    >>> _ = open("test_memory_store_kit.py", "w").write(kit)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     selected = "create_document_creates_once or documents_round_trip"  # a few of the tests
    ...     code = pytest.main(["-q", "test_memory_store_kit.py", "-k", selected])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '2 passed, ...')
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ckptstore import protocol
from ckptstore._types import Buffer
from ckptstore.errors import (
    CorruptCheckpointError,
    DocumentChangedError,
    InvalidNameError,
    KeyExistsError,
    ObjectNotFoundError,
)
from ckptstore.formats import NpzDB
from ckptstore.io import IOSettings, ParallelIO
from ckptstore.plugin import PathType, redact_url
from ckptstore.testing.conformance.samples import assert_same_blob, dtype_sample

__all__ = ["PathTypeConformance"]


class PathTypeConformance:
    """The contract every path type honours. Needs a ``storage`` fixture (empty root).

    Example::

        >>> import contextlib, io, pytest
        >>> kit = '''
        ... import pytest
        ... from ckptstore.builtin import LocalPath
        ... from ckptstore.testing.conformance import PathTypeConformance
        ...
        ... class TestLocal(PathTypeConformance):
        ...     @pytest.fixture
        ...     def storage(self, tmp_path):
        ...         return LocalPath(str(tmp_path))
        ... '''
        >>> _ = open("test_local_path_kit.py", "w").write(kit)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     selected = "ranges_and_scatter or delete_ignores_missing"  # a few of the tests
        ...     code = pytest.main(["-q", "test_local_path_kit.py", "-k", selected])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '2 passed, ...')
    """

    RACERS = 8

    def races_are_refused(self, storage: PathType) -> bool:
        """Whether racing creates must have exactly one winner: the path type's
        ``atomic_create`` claim, unless the test server is known to ignore it."""
        return storage.atomic_create

    def test_create_document_creates_once(self, storage: PathType) -> None:
        storage.create_document("_ckptstore/once.json", b"first")
        with pytest.raises(KeyExistsError) as caught:
            storage.create_document("_ckptstore/once.json", b"second")
        assert isinstance(caught.value, FileExistsError)
        assert caught.value.key == "_ckptstore/once.json"
        assert storage.get_document("_ckptstore/once.json") == b"first"
        assert storage.list_keys("_ckptstore") == ["_ckptstore/once.json"]  # no temporaries
        storage.delete(["_ckptstore/once.json"])
        storage.create_document("_ckptstore/once.json", b"third")
        assert storage.get_document("_ckptstore/once.json") == b"third"

    def test_racing_creates_have_one_winner(self, storage: PathType) -> None:
        won = self.race(
            lambda index: storage.create_document("_ckptstore/race.json", b"writer-%d" % index),
            KeyExistsError,
        )
        stored = storage.get_document("_ckptstore/race.json")
        self.assert_one_winner(won, stored, refused=self.races_are_refused(storage))

    def race(self, attempt: Callable[[int], None], refusal: type[Exception]) -> list[int]:
        """Run ``attempt(i)`` from :attr:`RACERS` threads released at once; the indexes
        of those that were not refused with ``refusal``."""
        start = threading.Barrier(self.RACERS)

        def run(index: int) -> bool:
            start.wait()
            try:
                attempt(index)
            except refusal:
                return False
            return True

        with ThreadPoolExecutor(self.RACERS) as pool:
            return [i for i, ok in enumerate(pool.map(run, range(self.RACERS))) if ok]

    @staticmethod
    def assert_one_winner(won: list[int], stored: bytes | None, *, refused: bool) -> None:
        """Exactly one racer won and its bytes are stored (``refused``: the store
        refuses the losers); else at least one won and the document is whole."""
        if refused:
            assert len(won) == 1, f"{len(won)} racing writers all succeeded"
            assert stored == b"writer-%d" % won[0]
        else:  # a check-then-write fallback: at least one wins, the document is whole
            assert won
            assert stored in {b"writer-%d" % i for i in won}

    def replaces_are_refused(self, storage: PathType) -> bool:
        """Whether racing replaces must have exactly one winner: the path type's
        ``atomic_replace`` claim, unless the test server is known to ignore it."""
        return storage.atomic_replace

    def test_replace_document_checks_the_version(self, storage: PathType) -> None:
        key = "_ckptstore/lease/n.json"
        assert storage.get_versioned_document(key) is None
        storage.replace_document(key, b"first", None)  # None: create
        with pytest.raises(DocumentChangedError):
            storage.replace_document(key, b"again", None)
        first = storage.get_versioned_document(key)
        assert first is not None
        assert first[0] == b"first"
        storage.replace_document(key, b"second", first[1])
        second = storage.get_versioned_document(key)
        assert second is not None
        assert second == (b"second", second[1])
        assert second[1] != first[1]
        with pytest.raises(DocumentChangedError) as caught:
            storage.replace_document(key, b"stale", first[1])
        assert isinstance(caught.value, FileExistsError)
        assert caught.value.key == key
        assert storage.get_document(key) == b"second"
        assert storage.list_keys("_ckptstore") == [key]  # no temporaries
        storage.delete([key])
        with pytest.raises(DocumentChangedError):  # gone since it was read
            storage.replace_document(key, b"late", second[1])
        assert storage.get_document(key) is None

    def test_racing_replaces_have_one_winner(self, storage: PathType) -> None:
        key = "_ckptstore/lease/race.json"
        storage.create_document(key, b"start")
        current = storage.get_versioned_document(key)
        assert current is not None
        won = self.race(
            lambda index: storage.replace_document(key, b"writer-%d" % index, current[1]),
            DocumentChangedError,
        )
        stored = storage.get_document(key)
        self.assert_one_winner(won, stored, refused=self.replaces_are_refused(storage))

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

    def test_a_reader_reads_many_ranges_of_one_object(self, storage: PathType) -> None:
        data = bytes(range(256)) * 40
        storage.write_bytes("blob", data)
        late, early = bytearray(1000), bytearray(10)
        with storage.open_reader("blob") as reader:
            reader.read_into(5000, [memoryview(late)])  # in any order
            reader.read_into(3, [memoryview(early)])
            with pytest.raises(CorruptCheckpointError, match="before the end"):
                reader.read_into(len(data) - 2, [memoryview(bytearray(10))])
        assert (bytes(early), bytes(late)) == (data[3:13], data[5000:6000])
        with pytest.raises(FileNotFoundError), storage.open_reader("no/such/key") as missing:
            missing.read_into(0, [memoryview(bytearray(4))])

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

    def test_list_keys_except_leaves_out_one_prefix_only(self, storage: PathType) -> None:
        keys = ["c/a", "c/chunks-x/1", "c/chunks/1", "c/chunks/sub/2", "c/chunks0", "c/d/3"]
        for key in keys:
            storage.write_bytes(key, b"x")
        assert storage.list_keys_except("c", "c/chunks") == [
            "c/a",
            "c/chunks-x/1",
            "c/chunks0",
            "c/d/3",
        ]
        assert storage.list_keys_except("c", "c/missing") == keys
        assert storage.list_keys_except("nothing-here", "nothing-here/x") == []

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
