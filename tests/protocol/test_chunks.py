"""Incremental saves (issue 40): chunks stored once per content, loaded, verified and
collected safely (``ckptstore/protocol/_chunks.py``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import build_counter_job, recorded_fsyncs
from test_values import VALUES, assert_same

from ckptstore import CheckpointManager, JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore.builtin import LocalPath, NpzDB, ZarrDB
from ckptstore.errors import CorruptCheckpointError, JobConfigurationError
from ckptstore.io import CHUNK_STORE_DIR, WRITE_WATCH_ENV, ParallelIO, chunk_object_key
from ckptstore.protocol import (
    CheckpointLocation,
    _chunks,
    collect_chunks,
    commit_epoch,
    shared_chunk_keys,
    write_node,
)
from ckptstore.protocol._commit import committed_nodes, open_node, read_blobs, verify_node
from ckptstore.protocol._inventory import committed_epochs
from ckptstore.testing.fixtures import (
    gcs_server,
    gcs_storage_options,
    gcs_url,
    s3_server,
    s3_storage_options,
    s3_url,
)
from ckptstore.tree import load_tree, save_tree

__all__ = [
    "gcs_server",
    "gcs_storage_options",
    "gcs_url",
    "s3_server",
    "s3_storage_options",
    "s3_url",
]  # the fixtures this module uses

Array = np.ndarray[Any, Any]
MiB = 1 << 20
CHILD = Path(__file__).with_name("chunks_crash_child.py")
EVERY_KILL_POINT = os.environ.get("CKPTSTORE_CHUNK_KILLS") == "all"
"""``CKPTSTORE_CHUNK_KILLS=all`` kills the crash children at every step (about 10 s
more); by default at the first, the last and a few steps between."""


def chunk_objects(root: Path | str) -> list[str]:
    return LocalPath(str(root)).list_keys(CHUNK_STORE_DIR)


def save(root: Path, epoch: int, blobs: dict[str, Array], db: Any = None, node: str = "t") -> None:
    storage = LocalPath(str(root))
    commit = write_node(storage, node, epoch, blobs, db or ZarrDB(), ParallelIO(), incremental=True)
    commit_epoch(storage, epoch, [commit])


def load(root: Path, epoch: int, node: str = "t", db: Any = None) -> dict[str, Array]:
    storage = LocalPath(str(root))
    manifest = open_node(storage, node, epoch)
    return read_blobs(storage, manifest, None, db or ZarrDB(), ParallelIO())


def assert_every_committed_node_verifies(root: Path) -> None:
    storage = LocalPath(str(root))
    for epoch in committed_epochs(storage):
        for node in committed_nodes(storage, epoch):
            assert verify_node(storage, node, epoch, ZarrDB(), ParallelIO()) == [], (epoch, node)


@pytest.fixture(autouse=True)
def every_save_through_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blobs that change whole at every save stay in the chunk store (the collection
    tests need their chunks); one test below takes the archive path on purpose."""
    monkeypatch.setattr(_chunks, "PROBE_EVERY", 1)


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every non-empty blob into the chunk store, in chunks of 4 KiB."""
    monkeypatch.setattr(_chunks, "INCREMENTAL_FROM", 1)
    monkeypatch.setattr(_chunks, "CHUNK_BYTES", 4096)


@pytest.fixture
def unwatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk not declared frozen is read (no write watch: see
    test_chunks_write_watch.py), so that the counts of reads below are frozen='s."""
    monkeypatch.setenv(WRITE_WATCH_ENV, "off")


@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_every_value_round_trips_bit_for_bit_in_incremental_mode(
    tmp_path: Path, tiny_chunks: None, db_type: str
) -> None:
    session = LocalSession()
    workspace = session.workspace("trainer_0")
    for name, value in VALUES.items():
        workspace[name] = value
    manager = CheckpointManager(str(tmp_path), "trainer_0", db_type, incremental=True)
    session.run(manager.init(["trainer_0"]))
    session.run(manager.save(1))
    session.run(manager.save(2))
    assert chunk_objects(tmp_path)
    for epoch in (1, 2):
        fresh = LocalSession()
        reader = CheckpointManager(str(tmp_path), "trainer_0", db_type)  # today's call
        fresh.run(reader.init(["trainer_0"], retrieve_from_epoch=epoch))
        fresh.run(reader.load(epoch))
        got = dict(fresh.workspace("trainer_0"))
        for name, value in VALUES.items():
            assert_same(got[name], value, name)


def test_unchanged_chunks_are_stored_once_across_epochs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal(4 * MiB).astype(np.float32)  # 16 MiB: 4 chunks
    save(tmp_path, 0, {"base": base, "small": np.arange(3.0)})
    assert len(chunk_objects(tmp_path)) == 4
    changed = base.copy()
    changed[:1000] += 1  # the first chunk only
    save(tmp_path, 1, {"base": changed, "small": np.arange(3.0)})
    assert len(chunk_objects(tmp_path)) == 5
    np.testing.assert_array_equal(load(tmp_path, 0)["base"], base)
    np.testing.assert_array_equal(load(tmp_path, 1)["base"], changed)
    assert_every_committed_node_verifies(tmp_path)


def test_identical_blobs_are_stored_once_within_a_node_and_across_nodes(tmp_path: Path) -> None:
    same = np.random.default_rng(1).standard_normal(MiB // 8)  # 1 MiB, one chunk
    save(tmp_path, 0, {"a": same, "b": same.copy()}, NpzDB())
    assert len(chunk_objects(tmp_path)) == 1
    session = LocalSession()
    for node in ("trainer_0", "trainer_1"):
        session.workspace(node)["w"] = same
    manager = MultiNodeCheckpointManager(str(tmp_path), "zarr", incremental=True)
    session.run(manager.init(["trainer_0", "trainer_1"]))
    session.run(manager.save(5))
    assert len(chunk_objects(tmp_path)) == 1
    for node in ("trainer_0", "trainer_1"):
        np.testing.assert_array_equal(load(tmp_path, 5, node)["w"], same)


@pytest.mark.parametrize("alone", [False, True], ids=["beside-a-base", "alone"])
def test_a_blob_that_changes_whole_goes_to_the_archive_until_a_probe_finds_it_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alone: bool
) -> None:
    monkeypatch.setattr(_chunks, "PROBE_EVERY", 2)
    rng = np.random.default_rng(9)
    base = rng.standard_normal(MiB // 8)  # 1 MiB, never changes
    dense = rng.standard_normal(MiB // 8)
    saved, placement = [], ""
    for epoch in range(9):
        if epoch <= 4:
            dense = dense + 1.0  # every byte changes, then no more after epoch 4
        save(tmp_path, epoch, {"dense": dense} if alone else {"base": base, "dense": dense})
        saved.append(dense)
        manifest = open_node(LocalPath(str(tmp_path)), "t", epoch)
        shared = shared_chunk_keys(manifest)
        if not alone:  # alone: no blob goes to the store at the archived saves
            assert {chunk.key for chunk in manifest.blobs["base"].chunks} <= shared
        in_store = {chunk.key for chunk in manifest.blobs["dense"].chunks} <= shared
        placement += "S" if in_store else "A"
    # S: chunk store; A: the node's archive, unhashed (every chunk changed at the save
    # before); every second save probes; once unchanged, it stays in the store
    assert placement == "SSASASASS"
    for epoch, value in enumerate(saved):
        loaded = load(tmp_path, epoch)
        np.testing.assert_array_equal(loaded["dense"], value)
        np.testing.assert_array_equal(loaded.get("base", base), base)
    assert_every_committed_node_verifies(tmp_path)


def test_blobs_declared_frozen_are_not_read_and_a_broken_promise_is_caught(
    tmp_path: Path, tiny_chunks: None, unwatched: None, hashed: list[int]
) -> None:
    rng = np.random.default_rng(10)
    tree = {"base": {"w": rng.standard_normal(2048)}, "head": rng.standard_normal(512)}
    save_tree(str(tmp_path), 0, tree, incremental=True)
    assert len(hashed) == 4 + 1 + 1  # chunks of 4 KiB: the base, the head, the tree's spec
    tree["head"] += 1.0
    hashed.clear()
    save_tree(str(tmp_path), 1, tree, incremental=True, frozen=["base"])
    assert len(hashed) == 3  # the head, the spec, and one chunk of the base as a check
    storage = LocalPath(str(tmp_path))
    base_chunks = open_node(storage, "tree", 1).blobs["base/w"].chunks
    storage.delete([chunk_object_key(chunk.key) for chunk in base_chunks])  # gone
    hashed.clear()
    save_tree(str(tmp_path), 2, tree, incremental=True, frozen=["base"])
    assert len(hashed) == 2 + 4 + 1  # a chunk to write again is checked before it is
    for epoch in (0, 1, 2):
        got = load_tree(str(tmp_path), epoch)
        np.testing.assert_array_equal(got["base"]["w"], tree["base"]["w"])
    assert_every_committed_node_verifies(tmp_path)
    tree["base"]["w"][:] += 1.0  # the promise broken: the check of the next save finds it
    with pytest.raises(JobConfigurationError, match="declared frozen"):
        save_tree(str(tmp_path), 3, tree, incremental=True, frozen=["base"])
    assert committed_epochs(storage) == [0, 1, 2]
    assert storage.list_keys(_chunks.INTENTS_DIR) == []
    with pytest.raises(JobConfigurationError, match="does not have"):
        save_tree(str(tmp_path), 3, tree, incremental=True, frozen=["nothing"])
    with pytest.raises(JobConfigurationError, match="incremental=True"):
        save_tree(str(tmp_path), 3, tree, frozen=["base"])


def test_a_save_looks_up_the_chunks_it_did_not_write_together_and_its_intent_unsynced(
    tmp_path: Path, tiny_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On local disk the chunks a save did not write are looked up in one call, after
    its intent (not a file walk each); the intent is not fsynced (it matters only while
    the save's process lives), the commit record still is."""
    tree = {"base": np.arange(8192.0), "head": np.zeros(512)}
    save_tree(str(tmp_path), 0, tree, incremental=True)
    asked: list[list[str]] = []
    real_existing = LocalPath.existing

    def existing(storage: LocalPath, keys: Any) -> set[str]:
        asked.append(list(keys))
        return real_existing(storage, keys)

    def exists(storage: LocalPath, key: str) -> bool:
        raise AssertionError(f"looked up alone: {key}")

    monkeypatch.setattr(LocalPath, "existing", existing)
    monkeypatch.setattr(LocalPath, "exists", exists)
    synced = recorded_fsyncs(monkeypatch)
    tree["head"] += 1.0
    save_tree(str(tmp_path), 1, tree, incremental=True, frozen=["base"])
    assert len(asked) == 1
    assert len(asked[0]) == 16 + 1  # the base's 16 chunks, the spec
    assert not any(_chunks.INTENTS_DIR in path for path in synced)
    assert any(path.endswith("tree.commit.json") or "epoch-1" in path for path in synced)
    monkeypatch.undo()
    np.testing.assert_array_equal(load_tree(str(tmp_path), 1)["head"], tree["head"])


def test_frozen_takes_paths_into_the_tree(
    tmp_path: Path, tiny_chunks: None, unwatched: None, hashed: list[int]
) -> None:
    tree = {"model": {"base": np.ones(2048), "lora": np.zeros(512)}}
    save_tree(str(tmp_path), 0, tree, incremental=True)
    hashed.clear()
    save_tree(str(tmp_path), 1, tree, incremental=True, frozen=[("model", "base")])
    assert len(hashed) == 1 + 1 + 1  # the adapter, the spec, one chunk of the base
    np.testing.assert_array_equal(load_tree(str(tmp_path), 1)["model"]["base"], np.ones(2048))
    with pytest.raises(JobConfigurationError, match="does not have"):
        save_tree(str(tmp_path), 2, tree, incremental=True, frozen=[("model", "head")])


def test_managers_take_frozen_blobs_for_every_node_holding_them(
    tmp_path: Path, tiny_chunks: None, unwatched: None, hashed: list[int]
) -> None:
    session = LocalSession()
    session.workspace("trainer_0").update(base=np.ones(2048), head=np.zeros(512))
    session.workspace("trainer_1").update(head=np.zeros(512))  # no base: ignored there
    manager = MultiNodeCheckpointManager(str(tmp_path), "zarr", incremental=True, frozen=["base"])
    session.run(manager.init(["trainer_0", "trainer_1"]))
    session.run(manager.save(1))  # the first save reads everything
    assert len(hashed) == 4 + 1 + 1
    hashed.clear()
    session.run(manager.save(2))
    assert len(hashed) == 1 + 1 + 1  # each node's head, and one chunk of the base
    single = CheckpointManager(str(tmp_path), "trainer_0", incremental=True, frozen=["base"])
    session.run(single.init(["trainer_0"]))
    hashed.clear()
    session.run(single.save(3))
    assert len(hashed) == 1 + 1
    for epoch in (1, 2, 3):
        got = load(tmp_path, epoch, "trainer_0")["base"]
        np.testing.assert_array_equal(got, np.ones(2048))
    assert_every_committed_node_verifies(tmp_path)
    with pytest.raises(JobConfigurationError, match="incremental=True"):
        CheckpointManager(str(tmp_path), "trainer_0", frozen=["base"])


def test_save_tree_round_trips_incrementally(tmp_path: Path) -> None:
    tree = {"w": np.ones((512, 512)), "step": 3}
    save_tree(str(tmp_path), 1, tree, incremental=True)
    save_tree(str(tmp_path), 2, tree, incremental=True)
    assert len(chunk_objects(tmp_path)) == 1  # 2 MiB of ones: one content, twice
    loaded = load_tree(str(tmp_path), 2)
    assert isinstance(loaded, dict)
    np.testing.assert_array_equal(loaded["w"], tree["w"])
    assert loaded["step"] == 3


def test_a_format_that_cannot_save_incrementally_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(JobConfigurationError, match="cannot save incrementally"):
        CheckpointManager(str(tmp_path), "t", ZarrDB(compression="zstd"), incremental=True)
    with pytest.raises(JobConfigurationError, match="'lmdb' cannot save incrementally"):
        CheckpointManager(str(tmp_path), "t", "lmdb", incremental=True)


def test_collection_frees_only_what_no_committed_epoch_refers_to(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    base = rng.standard_normal(MiB // 4).astype(np.float32)  # 1 MiB, kept in every epoch
    for epoch in range(3):
        save(tmp_path, epoch, {"base": base, "step": rng.standard_normal(MiB // 8)})
    assert len(chunk_objects(tmp_path)) == 4
    dry = collect_chunks(LocalPath(str(tmp_path)), dry_run=True, deleting=[(0, "t"), (1, "t")])
    assert len(dry.freed) == 2
    assert dry.freed_bytes == 2 * MiB
    assert len(chunk_objects(tmp_path)) == 4
    storage = LocalPath(str(tmp_path))
    storage.delete(["_ckptstore/epoch-0/t.commit.json", "_ckptstore/epoch-1/t.commit.json"])
    done = collect_chunks(storage)
    assert sorted(done.freed) == sorted(dry.freed)
    assert len(chunk_objects(tmp_path)) == 2
    np.testing.assert_array_equal(load(tmp_path, 2)["base"], base)
    assert_every_committed_node_verifies(tmp_path)
    assert storage.list_keys(_chunks.COLLECTIONS_DIR) == []  # its marker is gone


def test_a_save_in_flight_keeps_its_chunks_and_a_save_beside_a_collection_reuses_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalPath(str(tmp_path))
    blob = np.random.default_rng(3).standard_normal(MiB // 8)
    # a save whose intent a collection sees: its chunks stay though nothing commits them
    store = _chunks.ChunkStore(storage, "t", 0)
    from ckptstore.plugin import DBLocation

    store.store(DBLocation(storage, "t.0", ParallelIO(), store), {"w": blob})
    assert collect_chunks(storage).freed == ()
    store.withdraw()
    # a collection in progress (its marker): a save writes its own copies, which the
    # collection's earlier listing cannot hold
    storage.create_document(f"{_chunks.COLLECTIONS_DIR}/0123456789ab.json", b"{}")
    save(tmp_path, 1, {"w": blob})
    assert "0123456789ab.json" in caplog.text  # said, as a marker of a dead host stays
    names = chunk_objects(tmp_path)
    assert len(names) == 2
    assert any("." in name.rpartition("/")[2] for name in names)
    storage.delete([f"{_chunks.COLLECTIONS_DIR}/0123456789ab.json"])
    freed = collect_chunks(storage).freed
    assert len(freed) == 1  # the uncommitted save's chunk; epoch 1's own copy stays
    np.testing.assert_array_equal(load(tmp_path, 1)["w"], blob)


def test_collections_running_beside_saves_never_free_a_referenced_chunk(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    base = rng.standard_normal(MiB // 4).astype(np.float32)
    stop = threading.Event()
    errors: list[BaseException] = []

    def collect() -> None:
        storage = LocalPath(str(tmp_path))
        while not stop.is_set():
            try:
                collect_chunks(storage)
            except BaseException as error:  # reported below
                errors.append(error)
                return

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        for epoch in range(12):
            save(tmp_path, epoch, {"base": base, "new": rng.standard_normal(MiB // 8)})
            if epoch >= 2:  # an old epoch goes: its own chunk becomes garbage
                LocalPath(str(tmp_path)).delete([f"_ckptstore/epoch-{epoch - 2}/t.commit.json"])
    finally:
        stop.set()
        collector.join()
    assert errors == []
    assert_every_committed_node_verifies(tmp_path)
    storage = LocalPath(str(tmp_path))
    collect_chunks(storage)
    referenced = {
        chunk_object_key(key)
        for epoch in committed_epochs(storage)
        for key in shared_chunk_keys(open_node(storage, "t", epoch))
    }
    assert set(chunk_objects(tmp_path)) == referenced  # all garbage went, nothing else


class ListingHook(LocalPath):
    """A local root that runs ``during`` once, as a collection lists ``prefix`` (just
    before the listing, or with ``after`` just after it): a save that slips into the
    time a collection's listings take."""

    def __init__(self, root: Path, prefix: str, during: Any, *, after: bool = False) -> None:
        super().__init__(str(root))
        self.prefix = prefix
        self.during = during
        self.after = after

    def list_keys(self, prefix: str = "") -> list[str]:
        during = self.during if prefix == self.prefix else None
        if during is not None:
            self.during = None
            if not self.after:
                during()
        keys = super().list_keys(prefix)
        if during is not None and self.after:
            during()
        return keys


def test_a_save_starting_after_a_collection_listed_the_intents_keeps_its_chunks(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(8)
    save(tmp_path, 0, {"w": rng.standard_normal(MiB // 8)})
    blobs = {"w": rng.standard_normal(MiB // 8)}
    commits = []

    def write() -> None:  # sees the marker: its chunks go under names of its own
        storage = LocalPath(str(tmp_path))
        commits.append(write_node(storage, "t", 1, blobs, ZarrDB(), ParallelIO(), incremental=True))

    hooked = ListingHook(tmp_path, _chunks.INTENTS_DIR, write, after=True)
    assert collect_chunks(hooked).freed == ()  # not listed: written after the chunk store was
    assert any("." in key.rpartition("/")[2] for key in chunk_objects(tmp_path))
    commit_epoch(LocalPath(str(tmp_path)), 1, commits)
    np.testing.assert_array_equal(load(tmp_path, 1)["w"], blobs["w"])
    assert_every_committed_node_verifies(tmp_path)


def test_a_save_committed_while_a_collection_lists_the_intents_keeps_its_chunks(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(9)
    blobs = {"w": rng.standard_normal(MiB // 8)}
    storage = LocalPath(str(tmp_path))
    # written before the collection starts (its intent names the chunk), committed and
    # its intent deleted just before the collection lists the intents
    commit = write_node(storage, "t", 0, blobs, ZarrDB(), ParallelIO(), incremental=True)
    hooked = ListingHook(tmp_path, _chunks.INTENTS_DIR, lambda: commit_epoch(storage, 0, [commit]))
    assert storage.list_keys(_chunks.INTENTS_DIR) != []
    assert collect_chunks(hooked).freed == ()
    assert storage.list_keys(_chunks.INTENTS_DIR) == []  # released at commit
    np.testing.assert_array_equal(load(tmp_path, 0)["w"], blobs["w"])


def test_a_damaged_shared_chunk_is_named_in_every_epoch_that_uses_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    shared = rng.standard_normal(MiB // 8)
    save(tmp_path, 0, {"w": rng.standard_normal(MiB // 8)})
    for epoch in (1, 2):
        save(tmp_path, epoch, {"w": shared})
    storage = LocalPath(str(tmp_path))
    manifest = open_node(storage, "t", 1)
    key = chunk_object_key(manifest.blobs["w"].chunks[0].key)
    path = tmp_path / key
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    for epoch in (1, 2):
        problems = verify_node(storage, "t", epoch, ZarrDB(), ParallelIO())
        assert problems, epoch
        assert problems[0].blob == "w"
        with pytest.raises(CorruptCheckpointError):
            load(tmp_path, epoch)
    assert verify_node(storage, "t", 0, ZarrDB(), ParallelIO()) == []


def test_resume_falls_back_past_an_epoch_whose_shared_chunk_is_damaged(
    tmp_path: Path, tiny_chunks: None
) -> None:
    root = str(tmp_path)
    job, _ = build_counter_job(epochs=3)
    JobRunner(job, MultiNodeCheckpointManager(root, "zarr", incremental=True)).train(LocalSession())
    storage = LocalPath(root)
    w = open_node(storage, "trainer_0", 3).blobs["trainer_0/w"]
    path = tmp_path / chunk_object_key(w.chunks[0].key)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    job, _ = build_counter_job(epochs=3)
    session = LocalSession()
    runner = JobRunner(job, MultiNodeCheckpointManager(root, "zarr", incremental=True))
    assert runner.train(session) == 3
    assert [failure.epoch for failure in runner.restore_failures] == [3]
    assert runner.resumed_from_epoch == 2
    assert session.workspace("trainer_0")["trainer_0/w"].tolist() == [3.0] * 4


def run_child(directory: Path, what: str, kill_at: int) -> str:
    result = subprocess.run(
        [sys.executable, str(CHILD), str(directory), what, str(kill_at)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == (0 if kill_at == 0 else -signal.SIGKILL), result.stderr
    return result.stdout


def every_kill_point(template: Path, scratch: Path, what: str) -> list[Path]:
    """Copies of ``template`` after the child ran ``what`` and was killed at each of
    its file-system mutations in turn (the last copy: never killed)."""
    shutil.copytree(template, scratch / "count")
    total = int(run_child(scratch / "count", what, 0).split("=")[1])
    assert total >= 3
    points = range(1, total + 1)
    if not EVERY_KILL_POINT:  # the first, last and middle steps, and a few between
        points = range(1, total + 1, max(1, total // 4))
    copies = []
    for kill_at in sorted({*points, total, 0}):
        copy = scratch / f"kill-{kill_at}"
        shutil.copytree(template, copy)
        run_child(copy, what, kill_at)
        copies.append(copy)
    return copies


def test_sigkill_at_steps_of_a_collection_leaves_every_committed_epoch_loadable(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    rng = np.random.default_rng(6)
    base = rng.standard_normal(MiB // 4).astype(np.float32)
    for epoch in range(6):
        save(template, epoch, {"base": base, "new": rng.standard_normal(MiB // 8)})
    LocalPath(str(template)).delete([f"_ckptstore/epoch-{e}/t.commit.json" for e in range(4)])
    for copy in every_kill_point(template, tmp_path, "gc"):
        assert_every_committed_node_verifies(copy)
        collect_chunks(LocalPath(str(copy)))  # a collection after the crash finishes the work
        assert len(chunk_objects(copy)) == 1 + 2, copy.name
        assert_every_committed_node_verifies(copy)
        # the killed collection's marker is gone (its process is): saves reuse again
        assert LocalPath(str(copy)).list_keys(_chunks.COLLECTIONS_DIR) == []


def test_sigkill_at_steps_of_an_incremental_save_leaves_earlier_epochs_loadable(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    rng = np.random.default_rng(7)
    base = rng.standard_normal(MiB // 4)
    save(template, 0, {"base": base})
    for copy in every_kill_point(template, tmp_path, "save"):
        storage = LocalPath(str(copy))
        collect_chunks(storage)  # the killed save's intent, temporaries and chunks go
        assert_every_committed_node_verifies(copy)
        assert storage.list_keys(_chunks.INTENTS_DIR) == []
        assert not any("/tmp-" in key for key in storage.list_keys(CHUNK_STORE_DIR))
        np.testing.assert_array_equal(load(copy, 0)["base"], base)
        if 1 in committed_epochs(storage):
            assert load(copy, 1)["small"].tolist() == [0.0, 1.0, 2.0]


def test_an_incremental_multi_node_save_on_s3_round_trips_and_collects(
    s3_url: str, s3_storage_options: dict[str, Any]
) -> None:
    rng = np.random.default_rng(9)
    same = rng.standard_normal(MiB // 4).astype(np.float32)  # replicated on both nodes
    session = LocalSession()
    options: dict[str, Any] = {"storage_options": s3_storage_options, "incremental": True}
    manager = MultiNodeCheckpointManager(s3_url, "npz", **options)
    for node in ("trainer_0", "trainer_1"):
        session.workspace(node)["w"] = same
    session.workspace("trainer_0")["own"] = np.zeros(MiB // 8)
    session.run(manager.init(["trainer_0", "trainer_1"]))
    for epoch in (1, 2):
        session.workspace("trainer_0")["own"][:] = rng.standard_normal(MiB // 8)
        session.run(manager.save(epoch))
    storage = manager.location.storage
    assert len(storage.list_keys(CHUNK_STORE_DIR)) == 1 + 2  # w once, trainer_0's own twice
    fresh = LocalSession()
    reader = MultiNodeCheckpointManager(s3_url, "npz", storage_options=s3_storage_options)
    fresh.run(reader.init(["trainer_0", "trainer_1"], retrieve_from_epoch=2))
    fresh.run(reader.load(2))
    np.testing.assert_array_equal(fresh.workspace("trainer_1")["w"], same)
    np.testing.assert_array_equal(
        fresh.workspace("trainer_0")["own"], session.workspace("trainer_0")["own"]
    )
    storage.delete(
        [f"_ckptstore/epoch-1/{node}.commit.json" for node in ("trainer_0", "trainer_1")]
    )
    assert len(collect_chunks(storage).freed) == 1
    assert storage.list_keys(_chunks.INTENTS_DIR) == []  # released at commit


def test_incremental_saves_on_gcs_store_unchanged_chunks_once_and_load(
    gcs_url: str, gcs_storage_options: dict[str, Any]
) -> None:
    location = CheckpointLocation.open(gcs_url, "zarr", storage_options=gcs_storage_options)
    rng = np.random.default_rng(10)
    base = rng.standard_normal(MiB // 8)
    for epoch in (0, 1):
        save_tree(
            location, epoch, {"base": base, "step": np.full(MiB // 8, epoch)}, incremental=True
        )
    assert len(location.storage.list_keys(CHUNK_STORE_DIR)) == 1 + 2
    tree = load_tree(location, 1)
    assert isinstance(tree, dict)
    np.testing.assert_array_equal(tree["base"], base)
    assert verify_node(location.storage, "tree", 1, ZarrDB(), ParallelIO()) == []
