"""Conformance tests for DB types (checkpoint formats).

Subclass :class:`DBTypeConformance` in a test module and give it a ``db_type``
fixture; override ``storage`` to run it against another root than a local temporary
directory (an object store, for formats that do not need renames).

Example::

    >>> import contextlib, io, pytest
    >>> kit = '''
    ... import pytest
    ... from ckptstore.builtin import ZarrDB
    ... from ckptstore.testing.conformance import DBTypeConformance
    ...
    ... class TestZarr(DBTypeConformance):
    ...     @pytest.fixture
    ...     def db_type(self):
    ...         return ZarrDB()
    ... '''
    >>> _ = open("test_zarr_conformance.py", "w").write(kit)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_zarr_conformance.py", "-k", "large_blob or long_blob"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '2 passed, ...')
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore import protocol
from ckptstore.errors import (
    BlobNotFoundError,
    CheckpointNotFoundError,
    CkptStoreError,
    CorruptCheckpointError,
    JobConfigurationError,
    UnsupportedBlobError,
)
from ckptstore.io import IOSettings, ParallelIO
from ckptstore.paths import FsspecPath, LocalPath
from ckptstore.plugin import DBLocation, DBType, PathType, WrittenDB
from ckptstore.protocol import CheckpointLocation, collect_garbage, copy_node, find_garbage
from ckptstore.records import NodeManifest, get_ckpt_filename
from ckptstore.testing.conformance.samples import (
    OPTIONAL_DTYPES,
    REQUIRED_DTYPES,
    SHAPES,
    assert_same_blob,
    dtype_sample,
)
from ckptstore.testing.conformance.storage import CountingPath, flip_byte, truncate

__all__ = ["Checkpoints", "DBTypeConformance"]

Array = np.ndarray[Any, Any]
NODE = "trainer_0"


class Checkpoints:
    """Saves and loads node checkpoints of one DB type on one storage, through the
    commit protocol, for the tests.

    Example::

        >>> from ckptstore import IOSettings
        >>> from ckptstore.builtin import LocalPath, NpzDB
        >>> checkpoints = Checkpoints(LocalPath("ckpt"), NpzDB(), IOSettings())
        >>> _ = checkpoints.save({"w": np.ones(3)}, epoch=1)
        >>> checkpoints.load(epoch=1)["w"]
        array([1., 1., 1.])
        >>> checkpoints.verify(epoch=1)  # no problems
        []
    """

    def __init__(self, storage: PathType, db_type: DBType, settings: IOSettings) -> None:
        self.storage = storage
        self.db_type = db_type
        self.settings = settings

    def engine(self) -> ParallelIO:
        return ParallelIO(self.settings)

    def save(
        self,
        blobs: Mapping[str, Any],
        *,
        epoch: int = 1,
        node: str = NODE,
        commit: bool = True,
        db_type: DBType | None = None,
    ) -> protocol.NodeCommit:
        protocol.retract_epoch(self.storage, epoch, [node])
        result = protocol.write_node(
            self.storage, node, epoch, blobs, db_type or self.db_type, self.engine()
        )
        if commit:
            protocol.commit_epoch(self.storage, epoch, [result])
        return result

    def manifest(self, *, epoch: int = 1, node: str = NODE) -> NodeManifest:
        return protocol.open_node(self.storage, node, epoch)

    def load(
        self,
        names: list[str] | None = None,
        *,
        epoch: int = 1,
        node: str = NODE,
        storage: PathType | None = None,
    ) -> dict[str, Array]:
        source = storage or self.storage
        manifest = protocol.open_node(source, node, epoch)
        return protocol.read_blobs(source, manifest, names, self.db_type, self.engine())

    def verify(self, *, epoch: int = 1, node: str = NODE) -> list[CorruptCheckpointError]:
        return protocol.verify_node(self.storage, node, epoch, self.db_type, self.engine())

    def key(self, relative: str, *, epoch: int = 1, node: str = NODE) -> str:
        """The storage key of ``relative`` inside a committed node checkpoint (in the
        attempt its commit record names)."""
        record = protocol.read_commit(self.storage, epoch, [node])
        assert record is not None, f"epoch {epoch} of {node} is not committed"
        return f"{record.nodes[node].data_key}/{relative}"


def _refusal(action: Callable[[], object]) -> str | None:
    """The message of the :class:`UnsupportedBlobError` ``action`` raises, if any."""
    try:
        action()
    except UnsupportedBlobError as error:
        return str(error)
    return None


class _FailsAfterWriting(DBType):
    """Writes like ``inner``, then fails as a crash before the manifest would."""

    name = "fails-after-writing"

    def __init__(self, inner: DBType) -> None:
        self.inner = inner

    @property
    def needs_rename(self) -> bool:  # type: ignore[override]
        return self.inner.needs_rename

    def write(self, db: DBLocation, blobs: Mapping[str, Array]) -> WrittenDB:
        self.inner.write(db, blobs)
        raise OSError("simulated crash after the data was written")


class DBTypeConformance:
    """The contract every DB type honours. Needs a ``db_type`` fixture.

    Class attribute ``refusable_dtypes`` lists optional dtypes the format may refuse
    (default: the whole of :data:`OPTIONAL_DTYPES`, each either round-trips or is
    refused up front with a clear :class:`UnsupportedBlobError`).

    Example::

        >>> import contextlib, io, pytest
        >>> kit = '''
        ... import pytest
        ... from ckptstore.builtin import NpzDB
        ... from ckptstore.testing.conformance import DBTypeConformance
        ...
        ... class TestNpz(DBTypeConformance):
        ...     @pytest.fixture
        ...     def db_type(self):
        ...         return NpzDB()
        ... '''
        >>> _ = open("test_npz_format.py", "w").write(kit)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     code = pytest.main(["-q", "test_npz_format.py", "-k", "many_small_blobs"])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '1 passed, ...')
    """

    refusable_dtypes: tuple[str, ...] = OPTIONAL_DTYPES

    # -- fixtures a subclass may override ---------------------------------------------

    @pytest.fixture
    def storage(self, tmp_path: Path) -> PathType:
        """The checkpoint root the tests write to (a fresh local directory)."""
        return LocalPath(str(tmp_path / "checkpoints"))

    @pytest.fixture
    def io_settings(self) -> IOSettings:
        """Small chunks, so that modest test arrays span several of them."""
        return IOSettings(chunk_bytes=4096, concurrency=4, memory_budget=1 << 20)

    @pytest.fixture
    def checkpoints(
        self, storage: PathType, db_type: DBType, io_settings: IOSettings
    ) -> Checkpoints:
        return Checkpoints(storage, db_type, io_settings)

    @pytest.fixture
    def other_storage(self) -> Iterator[PathType]:
        """A second root on another path type (in memory), for copies."""
        url = f"memory://ckptstore-conformance-{uuid.uuid4().hex}"
        storage = FsspecPath(url)
        yield storage
        if storage.fs.exists(storage.root):
            storage.fs.rm(storage.root, recursive=True)

    # -- round trips ------------------------------------------------------------------

    @pytest.mark.parametrize("dtype", REQUIRED_DTYPES)
    def test_required_dtype_round_trips(self, checkpoints: Checkpoints, dtype: str) -> None:
        blob = dtype_sample(dtype)
        checkpoints.save({"blob": blob})
        assert checkpoints.manifest().blobs["blob"].dtype == blob.dtype.str
        assert_same_blob(checkpoints.load()["blob"], blob)

    @pytest.mark.parametrize("dtype", OPTIONAL_DTYPES)
    def test_optional_dtype_round_trips_or_is_refused_up_front(
        self, checkpoints: Checkpoints, dtype: str
    ) -> None:
        blob = dtype_sample(dtype)
        refusal = _refusal(lambda: checkpoints.db_type.check_blob("blob", blob))
        if refusal is None:
            checkpoints.save({"blob": blob})
            assert_same_blob(checkpoints.load()["blob"], blob)
            return
        assert dtype in self.refusable_dtypes, f"{dtype} must be supported: {refusal}"
        assert "'blob'" in refusal, "the refusal names the blob"
        assert len(refusal) > 60, "the refusal says why, and what to do instead"
        with pytest.raises(UnsupportedBlobError):
            checkpoints.save({"blob": blob})
        assert checkpoints.storage.list_keys(get_ckpt_filename(NODE, 1)) == []  # no attempt left

    @pytest.mark.parametrize("shape", sorted(SHAPES))
    def test_shape_and_layout_round_trip(self, checkpoints: Checkpoints, shape: str) -> None:
        blob = SHAPES[shape]()
        checkpoints.save({"blob": blob})
        assert checkpoints.manifest().blobs["blob"].shape == blob.shape
        assert_same_blob(checkpoints.load()["blob"], blob)

    def test_large_blob_spans_several_chunks(self, checkpoints: Checkpoints) -> None:
        blob = dtype_sample("<f8", (97, 131))  # about 100 KiB, 4 KiB chunks
        checkpoints.save({"big": blob, "strided": blob[::3, ::2]})
        assert len(checkpoints.manifest().blobs["big"].chunks) > 1
        loaded = checkpoints.load()
        assert_same_blob(loaded["big"], blob)
        assert_same_blob(loaded["strided"], blob[::3, ::2])

    def test_many_small_blobs_with_nested_names(self, checkpoints: Checkpoints) -> None:
        blobs = {f"layer_{i // 10}/unit_{i % 10}/w": np.full(i % 7, i, "<i4") for i in range(300)}
        checkpoints.save(blobs)
        loaded = checkpoints.load()
        assert sorted(loaded) == sorted(blobs)
        for name, blob in blobs.items():
            assert_same_blob(loaded[name], blob)

    def test_name_nested_under_another_round_trips_or_is_refused(
        self, checkpoints: Checkpoints
    ) -> None:
        blobs = {"a": np.array([1.5]), "a/b": np.array([2.5])}
        refusal = _refusal(lambda: checkpoints.save(blobs))
        if refusal is not None:
            assert "'a'" in refusal, "the refusal names both blobs"
            assert "'a/b'" in refusal, "the refusal names both blobs"
            assert (
                checkpoints.storage.list_keys(get_ckpt_filename(NODE, 1)) == []
            )  # no attempt left
            return
        loaded = checkpoints.load()
        for name, blob in blobs.items():
            assert_same_blob(loaded[name], blob)

    def test_long_blob_name_round_trips(self, checkpoints: Checkpoints) -> None:
        name = "/".join(["segment-" + "x" * 90] * 10)
        checkpoints.save({name: np.arange(5)})
        assert_same_blob(checkpoints.load()[name], np.arange(5))

    def test_empty_checkpoint_round_trips(self, checkpoints: Checkpoints) -> None:
        result = checkpoints.save({})
        assert result.nblobs == 0
        assert checkpoints.load() == {}
        assert checkpoints.verify() == []

    def test_manifest_describes_what_was_saved(self, checkpoints: Checkpoints) -> None:
        blobs = {"w": dtype_sample("<f4", (40, 40)), "step": np.array(3)}
        result = checkpoints.save(blobs)
        manifest = checkpoints.manifest()
        assert manifest.db_type == checkpoints.db_type.name
        assert (manifest.node, manifest.epoch) == (NODE, 1)
        assert result.nbytes == manifest.nbytes == sum(b.nbytes for b in blobs.values())
        assert result.nblobs == 2
        assert result.stored_bytes >= manifest.stored_bytes > 0
        assert checkpoints.verify() == []

    # -- refusals ---------------------------------------------------------------------

    def test_object_arrays_are_refused_with_a_clear_error(self, checkpoints: Checkpoints) -> None:
        with pytest.raises(UnsupportedBlobError, match="pickle") as caught:
            checkpoints.save({"ok": np.ones(2), "names": np.array(["a", None], dtype=object)})
        assert caught.value.blob == "names"
        assert isinstance(caught.value, TypeError)
        assert checkpoints.storage.list_keys(get_ckpt_filename(NODE, 1)) == []  # no attempt left
        with pytest.raises(CheckpointNotFoundError):
            checkpoints.manifest()

    def test_structured_dtypes_are_refused(self, checkpoints: Checkpoints) -> None:
        record = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
        with pytest.raises(UnsupportedBlobError, match="field"):
            checkpoints.save({"record": record})

    def test_formats_needing_renames_refuse_other_storage(
        self, checkpoints: Checkpoints, other_storage: PathType
    ) -> None:
        copy = Checkpoints(other_storage, checkpoints.db_type, checkpoints.settings)
        if checkpoints.db_type.needs_rename:
            with pytest.raises(JobConfigurationError, match="local"):
                copy.save({"w": np.ones(3)})
        else:
            copy.save({"w": np.ones(3)})
            assert_same_blob(copy.load()["w"], np.ones(3))

    # -- partial loads ----------------------------------------------------------------

    def test_partial_load_reads_only_the_requested_blobs(self, checkpoints: Checkpoints) -> None:
        small = np.arange(10, dtype="<i8")
        big = dtype_sample("<f8", (256, 128))  # 256 KiB
        checkpoints.save({"big": big, "small": small, "other": small * 2})
        counting = CountingPath(checkpoints.storage)
        manifest = checkpoints.manifest()
        engine = checkpoints.engine()
        loaded = protocol.read_blobs(counting, manifest, ["small"], checkpoints.db_type, engine)
        assert list(loaded) == ["small"]
        assert_same_blob(loaded["small"], small)
        assert counting.bytes_read < big.nbytes // 8, f"read {counting.bytes_read} bytes"

    def test_missing_blob_names_raise_blob_not_found(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": np.ones(3)})
        with pytest.raises(BlobNotFoundError, match="nope") as caught:
            checkpoints.load(["w", "nope"])
        assert isinstance(caught.value, KeyError)
        manifest = checkpoints.manifest()
        engine = checkpoints.engine()
        db_type = checkpoints.db_type
        partial = protocol.read_blobs(
            checkpoints.storage, manifest, ["w", "nope"], db_type, engine, missing_ok=True
        )
        assert list(partial) == ["w"]

    # -- damage -----------------------------------------------------------------------

    def test_corrupted_chunk_is_detected_and_named(self, checkpoints: Checkpoints) -> None:
        good, bad = dtype_sample("<i8", (64,)), dtype_sample("<f4", (40, 40))
        checkpoints.save({"good": good, "bad": bad})
        chunk = checkpoints.manifest().blobs["bad"].chunks[1]
        flip_byte(checkpoints.storage, checkpoints.key(chunk.key), chunk.offset + chunk.stored // 2)
        with pytest.raises(CorruptCheckpointError) as caught:
            checkpoints.load(["bad"])
        assert caught.value.blob == "bad"
        assert_same_blob(checkpoints.load(["good"])["good"], good)
        problems = checkpoints.verify()
        named = [problem for problem in problems if problem.blob is not None]
        assert [problem.blob for problem in named] == ["bad"]
        assert named[0].chunk == 1
        assert "bad" in str(named[0])
        # a format range covering the chunk's bytes (allowed) is reported too, by file
        assert all(
            str(problem.file).endswith(chunk.key) for problem in problems if not problem.blob
        )

    def test_corrupted_format_file_is_detected(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": dtype_sample("<f8", (10, 10)), "v": np.arange(4)})
        manifest = checkpoints.manifest()
        if not manifest.files:
            target = manifest.blobs["v"].chunks[0]
            flip_byte(checkpoints.storage, checkpoints.key(target.key), target.offset)
            assert [p.blob for p in checkpoints.verify()] == ["v"]
            return
        for record in manifest.files:
            flip_byte(checkpoints.storage, checkpoints.key(record.key), record.offset)
        problems = checkpoints.verify()
        assert len(problems) == len(manifest.files)
        assert all(problem.file is not None for problem in problems)

    def test_missing_data_is_reported_not_misread(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": dtype_sample("<f8", (20, 20)), "v": np.arange(4)})
        manifest = checkpoints.manifest()
        keys = {chunk.key for chunk in manifest.blobs["w"].chunks}
        checkpoints.storage.delete(checkpoints.key(key) for key in sorted(keys))
        with pytest.raises((CorruptCheckpointError, FileNotFoundError)) as caught:
            checkpoints.load(["w"])
        assert isinstance(caught.value, CkptStoreError)
        problems = checkpoints.verify()
        assert problems
        assert {problem.file for problem in problems} >= {checkpoints.key(k) for k in keys} or all(
            "missing" in str(problem) for problem in problems
        )

    def test_truncated_data_is_detected(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": dtype_sample("<f8", (20, 20))})
        last = checkpoints.manifest().blobs["w"].chunks[-1]
        truncate(checkpoints.storage, checkpoints.key(last.key), last.offset + last.stored - 1)
        with pytest.raises(CorruptCheckpointError):
            checkpoints.load()
        assert checkpoints.verify()

    # -- the commit protocol ----------------------------------------------------------

    def test_uncommitted_save_is_invisible(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": np.ones(3)}, commit=False)
        assert protocol.committed_nodes(checkpoints.storage, 1) == set()
        with pytest.raises(CheckpointNotFoundError, match="ckptstore ls"):
            checkpoints.manifest()
        with pytest.raises(FileNotFoundError):
            checkpoints.load()

    def test_commit_record_pins_the_manifest(self, checkpoints: Checkpoints) -> None:
        result = checkpoints.save({"w": np.ones(3)})
        record = protocol.read_commit(checkpoints.storage, 1)
        assert record is not None
        assert record.nodes[NODE].manifest_crc32c == result.manifest_crc32c
        assert record.nodes[NODE].db_type == checkpoints.db_type.name

    def test_saving_an_epoch_again_replaces_it(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"old": np.ones(300), "kept": np.zeros(2)})
        checkpoints.save({"kept": np.arange(2.0), "new": np.full(5, 9)})
        loaded = checkpoints.load()
        assert sorted(loaded) == ["kept", "new"]
        assert_same_blob(loaded["kept"], np.arange(2.0))
        assert checkpoints.verify() == []
        garbage = find_garbage(checkpoints.storage)  # the first save's attempt, for gc
        assert [item.node for item in garbage] == [NODE]
        collect_garbage(checkpoints.storage, garbage)
        assert find_garbage(checkpoints.storage) == []
        assert_same_blob(checkpoints.load()["kept"], np.arange(2.0))

    def test_failed_save_leaves_nothing_visible(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": np.ones(3)}, epoch=1)
        failing = _FailsAfterWriting(checkpoints.db_type)
        with pytest.raises(OSError, match="simulated crash"):
            checkpoints.save({"w": np.zeros(3)}, epoch=2, db_type=failing)
        assert protocol.committed_nodes(checkpoints.storage, 2) == set()
        with pytest.raises(CheckpointNotFoundError):
            checkpoints.manifest(epoch=2)
        leftovers = checkpoints.storage.list_keys(get_ckpt_filename(NODE, 2))
        assert leftovers == []  # the failed save deleted its attempt
        assert_same_blob(checkpoints.load(epoch=1)["w"], np.ones(3))

    def test_retracted_epoch_is_invisible(self, checkpoints: Checkpoints) -> None:
        checkpoints.save({"w": np.ones(3)})
        protocol.retract_epoch(checkpoints.storage, 1, [NODE])
        with pytest.raises(CheckpointNotFoundError):
            checkpoints.load()

    def test_nodes_and_epochs_are_independent(self, checkpoints: Checkpoints) -> None:
        for epoch in (1, 2):
            for node in ("trainer_0", "trainer_1"):
                checkpoints.save(
                    {"w": np.full(3, epoch * 10 + int(node[-1]))}, epoch=epoch, node=node
                )
        for epoch in (1, 2):
            for node in ("trainer_0", "trainer_1"):
                expected = np.full(3, epoch * 10 + int(node[-1]))
                assert_same_blob(checkpoints.load(epoch=epoch, node=node)["w"], expected)

    def test_checkpoint_copies_to_another_storage(
        self, checkpoints: Checkpoints, other_storage: PathType
    ) -> None:
        blobs = {"w": dtype_sample("<f4", (50, 30)), "s": np.array(4), "e": np.zeros((0, 2))}
        checkpoints.save(blobs)
        location = CheckpointLocation(
            checkpoints.storage, checkpoints.db_type, checkpoints.settings
        )
        stats = copy_node(source=location, dest=other_storage, node=NODE, epoch=1)
        assert stats.commit is not None
        protocol.commit_epoch(other_storage, 1, [stats.commit])
        loaded = checkpoints.load(storage=other_storage)
        for name, blob in blobs.items():
            assert_same_blob(loaded[name], blob)
        engine = checkpoints.engine()
        db_type = checkpoints.db_type
        assert protocol.verify_node(other_storage, NODE, 1, db_type, engine) == []
