"""Asynchronous saves: the snapshot is what gets stored, the epoch becomes visible only
after its commit, saves queue behind each other, errors are never lost, and a runner
with ``async_save=True`` ends exactly where a synchronous one does, in every format, on
S3 and with a two-tier upload."""

from __future__ import annotations

import errno
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from ckpt_helpers import (
    build_counter_job,
    fail_epochs,
    fail_first,
    failing_local_path,
    files_under,
    register_storage,
)

from ckptstore import (
    AlreadyCommittedError,
    CheckpointManager,
    CheckpointNotFoundError,
    JobConfigurationError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    SaveFailedError,
    SaveFuture,
    Task,
    Workspace,
)
from ckptstore._types import Buffer
from ckptstore.builtin import CopyUpload
from ckptstore.checkpoint import _async_save
from ckptstore.checkpoint._manager import BACKGROUND_NICE
from ckptstore.errors import StorageNotWritableError, TooManySaveFailuresError
from ckptstore.io import ParallelIO
from ckptstore.io._priority import MAX_NICE, thread_nice
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin import get_registry
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import _commit as protocol

NODE = "trainer_0"
NODES = ["trainer_0", "trainer_1"]
GATE = threading.Event()
"""Closed: every data write of the ``gated_local`` path type waits until it opens."""


class GatedLocalPath(LocalPath):
    """Local disk whose data writes wait for :data:`GATE` (a save held mid-write)."""

    name = "gated_local"
    protocols: ClassVar[tuple[str, ...]] = ()

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        assert GATE.wait(60), "the test never opened the gate"
        super().write_parts(key, parts)

    def open_write(self, key: str) -> Any:
        assert GATE.wait(60), "the test never opened the gate"
        return super().open_write(key)


@pytest.fixture
def gate(registry: Registry) -> Iterator[threading.Event]:
    register_storage(registry, GatedLocalPath)
    GATE.clear()
    yield GATE
    GATE.set()  # never leave a background writer stuck


def stored(storage: PathType, node: str, epoch: int) -> dict[str, np.ndarray]:
    manifest = protocol.open_node(storage, node, epoch)
    reader = get_registry().db_type(manifest.db_type)
    return protocol.read_blobs(storage, manifest, None, reader, ParallelIO())


def single_node(root: str, session: LocalSession, **options: Any) -> CheckpointManager:
    session.workspace(NODE)["w"] = np.arange(1000, dtype=np.float64)
    manager = CheckpointManager(root, NODE, "npz", metadata_handler="json", **options)
    manager.set_params([NODE])
    session.run(manager.init([NODE]))
    return manager


def test_the_snapshot_is_stored_even_if_training_changes_the_blobs_meanwhile(
    tmp_path: Path, gate: threading.Event
) -> None:
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="gated_local")
    live = session.workspace(NODE)["w"]
    future = manager.save_async(1, session)
    assert not future.done()  # the write is held at the gate: save_async did not wait
    live += 100.0  # training changes the array in place
    assert manager.get_resume_from_epoch_id() is None  # not visible before its commit
    assert protocol.committed_nodes(manager.location.storage, 1) == set()
    gate.set()
    stats = future.result(timeout=60)
    assert [s.epoch for s in stats] == [1]
    assert stats[0].nbytes == live.nbytes
    assert repr(future) == "SaveFuture(epoch=1, committed)"
    assert np.array_equal(stored(manager.location.storage, NODE, 1)["w"], np.arange(1000.0))
    assert manager.get_resume_from_epoch_id() == 1


def test_a_new_save_waits_for_the_one_in_flight(tmp_path: Path, gate: threading.Event) -> None:
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="gated_local")
    first = manager.save_async(1, session)
    assert manager.saves_in_flight() == [first]
    waited = first._future.exception

    def open_then_wait(timeout: float | None = None) -> BaseException | None:
        gate.set()  # the second save is waiting for the first: let the first finish
        return waited(timeout)

    first._future.exception = open_then_wait  # type: ignore[method-assign]
    second = manager.save_async(2, session)  # back-pressure: returns after `first` ended
    assert first.done()
    manager.wait_for_saves(timeout=60)
    assert second.done()
    assert manager.saves_in_flight() == []
    assert manager.get_resume_from_epoch_id() == 2


def test_two_saves_may_be_in_flight_when_allowed(tmp_path: Path, gate: threading.Event) -> None:
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="gated_local")
    first = manager.save_async(1, session, max_in_flight=2)
    session.workspace(NODE)["w"] += 1.0
    second = manager.save_async(2, session, max_in_flight=2)
    assert not first.done()
    assert not second.done()
    gate.set()
    manager.wait_for_saves(timeout=60)
    storage = manager.location.storage
    assert np.array_equal(stored(storage, NODE, 1)["w"], np.arange(1000.0))
    assert np.array_equal(stored(storage, NODE, 2)["w"], np.arange(1000.0) + 1)


def test_a_failed_background_save_raises_at_the_next_save_typed(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1)))
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="failing_local")
    failed = manager.save_async(1, session)
    with pytest.raises(SaveFailedError) as info:
        manager.save_async(2, session)
    assert info.value.epoch == 1
    assert info.value.failed_nodes == (NODE,)
    assert "background save of epoch 1" in "".join(info.value.__notes__)
    assert failed.done()
    assert not manager.saves_in_flight()
    manager.save_async(2, session).wait(timeout=60)  # reported once, then saving goes on
    assert manager.get_resume_from_epoch_id() == 2
    assert protocol.committed_nodes(manager.location.storage, 1) == set()


def test_an_observed_failure_is_not_raised_again(tmp_path: Path, registry: Registry) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1)))
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="failing_local")
    future = manager.save_async(1, session)
    with pytest.raises(SaveFailedError):
        future.wait(timeout=60)
    assert isinstance(future.exception(), SaveFailedError)
    manager.wait_for_saves(timeout=60)  # nothing left to raise


def test_wait_for_saves_raises_an_unobserved_failure(tmp_path: Path, registry: Registry) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1)))
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="failing_local")
    manager.save_async(1, session)
    with pytest.raises(SaveFailedError):
        manager.wait_for_saves(timeout=60)


def test_a_dropped_manager_ends_its_commit_thread(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    session = LocalSession()
    manager = single_node(str(tmp_path), session)
    manager.save_async(1, session).result(timeout=60)
    [committer] = [t for t in set(threading.enumerate()) - before if t.name == "ckptstore-commit"]
    del manager  # each manager used to leave a thread waiting for work for good
    committer.join(timeout=60)
    assert not committer.is_alive()


def test_saves_to_one_location_after_another_keep_one_staging_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the writers (and the staging buffers they keep for the next save) were per
    # location: a process saving run after run to new directories kept a copy of its
    # state for each of them
    monkeypatch.setattr(_async_save, "_writers", {})  # this process's writers, from none
    session = LocalSession()
    for run in range(3):
        manager = single_node(str(tmp_path / f"run{run}"), session)
        manager.save_async(1, session).result(timeout=60)
    held = [writer.pool.nbytes for writer in _async_save._writers.values()]
    assert held == [session.workspace(NODE)["w"].nbytes]


def test_a_multi_node_epoch_is_committed_only_when_every_node_wrote(
    tmp_path: Path, gate: threading.Event
) -> None:
    session = LocalSession()
    nodes = ["trainer_0", "trainer_1"]
    for index, node in enumerate(nodes):
        session.workspace(node)[f"{node}/w"] = np.full(10, float(index))
    manager = MultiNodeCheckpointManager(str(tmp_path), "zarr", "json", path_type="gated_local")
    manager.set_params(nodes)
    session.run(manager.init(nodes))
    future: SaveFuture = manager.save_async(4, session)
    for node in nodes:
        session.workspace(node)[f"{node}/w"][:] = -1.0
    assert protocol.committed_nodes(manager.location.storage, 4) == set()
    gate.set()
    assert len(future.result(timeout=60)) == 2
    assert protocol.committed_nodes(manager.location.storage, 4) == set(nodes)
    for index, node in enumerate(nodes):
        blobs = stored(manager.location.storage, node, 4)
        assert np.array_equal(blobs[f"{node}/w"], np.full(10, float(index)))


def two_nodes(root: str, session: LocalSession, **options: Any) -> MultiNodeCheckpointManager:
    for index, node in enumerate(NODES):
        session.workspace(node)[f"{node}/w"] = np.full(10, float(index))
    manager = MultiNodeCheckpointManager(root, "zarr", "json", **options)
    manager.set_params(NODES)
    session.run(manager.init(NODES))
    return manager


def file_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its content."""
    return {name: (root / name).read_bytes() for name in files_under(root)}


@pytest.mark.parametrize("nodes", ["one node", "two nodes"])
def test_an_async_save_of_a_committed_epoch_is_refused_before_anything_is_written(
    tmp_path: Path, nodes: str
) -> None:
    """Write-once holds for async saves too: refused at ``save_async`` (the check runs
    before the snapshot), and the committed epoch stays byte for byte."""
    session = LocalSession()
    build = single_node if nodes == "one node" else two_nodes
    manager = build(str(tmp_path), session)
    manager.save_async(1, session).wait(timeout=60)
    before = file_bytes(tmp_path)
    saved = {
        node: {name: value.copy() for name, value in session.workspace(node).items()}
        for node in manager.node_names()
    }
    for node in manager.node_names():
        for value in session.workspace(node).values():
            value += 100.0  # training went on: a re-save would store other values
    with pytest.raises(AlreadyCommittedError, match=r"overwrite=True") as info:
        manager.save_async(1, session)
    assert info.value.epoch == 1
    assert manager.saves_in_flight() == []  # nothing was queued
    manager.wait_for_saves(timeout=60)  # and nothing failed in the background
    assert file_bytes(tmp_path) == before
    storage = manager.location.storage
    assert protocol.committed_nodes(storage, 1) == set(manager.node_names())
    session.run(manager.load(1))
    for node, blobs in saved.items():
        for name, value in blobs.items():
            loaded = session.workspace(node)[name]
            assert loaded.tobytes() == value.tobytes(), (node, name)


def test_an_async_multi_node_save_with_one_failing_node_names_it_and_commits_nothing(
    tmp_path: Path, registry: Registry
) -> None:
    """Every node must write before the background commit: one node's failed write
    fails the future, naming that node, and the previous epoch stays the newest."""
    register_storage(registry, failing_local_path(lambda key: "trainer_1.2" in key))
    session = LocalSession()
    manager = two_nodes(str(tmp_path), session, path_type="failing_local")
    manager.save_async(1, session).wait(timeout=60)
    future = manager.save_async(2, session)
    with pytest.raises(SaveFailedError) as info:
        future.result(timeout=60)
    assert info.value.epoch == 2
    assert info.value.failed_nodes == ("trainer_1",)
    assert "Connection reset" in info.value.node_errors["trainer_1"]
    assert repr(future) == "SaveFuture(epoch=2, failed)"
    storage = manager.location.storage
    assert protocol.committed_nodes(storage, 2) == set()  # not even trainer_0, which wrote
    assert protocol.committed_nodes(storage, 1) == set(NODES)
    assert manager.get_resume_from_epoch_id() == 1
    with pytest.raises(CheckpointNotFoundError):
        session.run(manager.load(2))


def test_a_permanent_error_in_a_background_write_is_never_retried(
    tmp_path: Path, registry: Registry
) -> None:
    """A background save's retries are for hiccups: a read-only disk fails the future at
    once, typed, after one attempt, however many retries were asked for."""
    manifests: list[str] = []

    def read_only_manifests(key: str) -> bool:
        if key.endswith("ckptstore.manifest.json"):
            manifests.append(key)
            return True
        return False

    register_storage(registry, failing_local_path(read_only_manifests, errno.EROFS))
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="failing_local")
    future = manager.save_async(1, session, retries=3, backoff=0)
    with pytest.raises(StorageNotWritableError, match="Read-only file system"):
        future.result(timeout=60)
    assert len(manifests) == 1  # one attempt: not retried
    assert protocol.committed_nodes(manager.location.storage, 1) == set()


# -- JobRunner(async_save=True) ------------------------------------------------------------


def final_states(root: Path, epochs: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
    storage = get_registry().open_path(str(root))
    return {epoch: stored(storage, NODE, epoch) for epoch in epochs}


@pytest.mark.parametrize("db_type", sorted(get_registry().db_types))
def test_async_training_stores_what_sync_training_stores(tmp_path: Path, db_type: str) -> None:
    runs = {}
    for mode in (False, True):
        root = tmp_path / f"async-{mode}"
        job, _ = build_counter_job(epochs=4, size=256)
        manager = MultiNodeCheckpointManager(str(root), db_type, metadata_handler="json")
        runner = JobRunner(job, manager, async_save=mode)
        assert runner.train(LocalSession()) == 4
        assert runner.committed_epochs == [0, 1, 2, 3, 4]
        assert manager.saves_in_flight() == []  # train() waited for the last save
        assert manager.get_resume_from_epoch_id() == 4
        runs[mode] = final_states(root, range(5))
    for epoch in range(5):
        assert runs[True][epoch].keys() == runs[False][epoch].keys()
        for name, value in runs[False][epoch].items():
            assert np.array_equal(runs[True][epoch][name], value), (epoch, name)
        assert runs[True][epoch][f"{NODE}/step"] == epoch


def test_an_async_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    job, _ = build_counter_job(epochs=3)
    first = JobRunner(
        job, MultiNodeCheckpointManager(str(tmp_path), "npz", "json"), async_save=True
    )
    assert first.train(LocalSession()) == 3
    longer, _ = build_counter_job(epochs=4)  # the limit raised by one epoch
    again = JobRunner(
        longer, MultiNodeCheckpointManager(str(tmp_path), "npz", "json"), async_save=True
    )
    assert again.train(LocalSession()) == 4  # resumed from 3 (as a synchronous run does)
    assert again.committed_epochs == [4]
    assert np.array_equal(final_states(tmp_path, [4])[4][f"{NODE}/w"], np.full(4, 4.0))


def test_a_transient_background_failure_is_retried_from_the_staged_copy(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_first(1)))
    job, _ = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, save_retries=1, retry_backoff=0, async_save=True)
    assert runner.train(LocalSession()) == 2
    assert runner.save_failures == []
    assert runner.committed_epochs == [0, 1, 2]
    assert final_states(tmp_path, [0])[0][f"{NODE}/step"] == 0


def test_background_failures_count_toward_the_runner_policy(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1, 3)))
    job, _ = build_counter_job(epochs=4)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(
        job,
        manager,
        save_retries=1,
        retry_backoff=0,
        async_save=True,
        max_consecutive_save_failures=2,
    )
    assert runner.train(LocalSession()) == 4
    assert [failure.epoch for failure in runner.save_failures] == [1, 3]
    assert all(isinstance(f.error, SaveFailedError) for f in runner.save_failures)
    assert runner.committed_epochs == [0, 2, 4]


def test_too_many_background_failures_stop_the_job(tmp_path: Path, registry: Registry) -> None:
    register_storage(registry, failing_local_path(fail_epochs(1, 2, 3, 4)))
    job, _ = build_counter_job(epochs=6)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(
        job, manager, save_retries=0, async_save=True, max_consecutive_save_failures=2
    )
    with pytest.raises(TooManySaveFailuresError) as info:
        runner.train(LocalSession())
    assert isinstance(info.value.last_error, SaveFailedError)
    assert [failure.epoch for failure in runner.save_failures] == [1, 2]
    assert runner.committed_epochs == [0]


def test_a_failure_of_the_last_save_surfaces_when_train_ends(
    tmp_path: Path, registry: Registry
) -> None:
    register_storage(registry, failing_local_path(fail_epochs(3)))
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(build_counter_job(epochs=3)[0], manager, save_retries=0, async_save=True)
    assert runner.train(LocalSession()) == 3  # no later save collects it: train() does
    assert [failure.epoch for failure in runner.save_failures] == [3]
    assert runner.committed_epochs == [0, 1, 2]
    strict = JobRunner(
        build_counter_job(epochs=3)[0],
        MultiNodeCheckpointManager(str(tmp_path / "b"), "npz", path_type="failing_local"),
        save_retries=0,
        async_save=True,
        max_consecutive_save_failures=1,
    )
    with pytest.raises(TooManySaveFailuresError) as info:
        strict.train(LocalSession())
    assert isinstance(info.value.last_error, SaveFailedError)
    assert info.value.last_error.epoch == 3


def test_ctrl_c_waits_for_the_save_in_flight_and_says_so(
    tmp_path: Path, gate: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    job, _ = build_counter_job(epochs=10)
    epochs = [0]

    def interrupt_at_epoch_2(ws: Workspace) -> None:
        epochs[0] += 1
        if epochs[0] == 1:
            gate.set()  # epoch 0's save may finish
        if epochs[0] == 2:
            gate.clear()  # ...but epoch 1's is held mid-write when Ctrl-C comes
            raise KeyboardInterrupt

    with Node(NODE):
        Task(interrupt_at_epoch_2, group=job.epoch_group)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", "json", path_type="gated_local")
    runner = JobRunner(job, manager, async_save=True)
    gate.set()
    opener = _OnLog("waiting for the background save", gate.set)  # once it says it waits
    logging.getLogger("ckptstore").addHandler(opener)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
            runner.train(LocalSession())
    finally:
        logging.getLogger("ckptstore").removeHandler(opener)
    assert "waiting for the background save of epoch(s) [1]" in caplog.text
    assert "The background save of epoch(s) [1] finished" in caplog.text
    assert runner.committed_epochs == [0, 1]
    assert manager.get_resume_from_epoch_id() == 1


# -- S3, and the two-tier builder -------------------------------------------------------------


def test_async_saves_to_s3(s3_url: str) -> None:
    job, _outputs = build_counter_job(epochs=3, size=64)
    manager = MultiNodeCheckpointManager(s3_url, "zarr", metadata_handler="json")
    runner = JobRunner(job, manager, async_save=True)
    assert runner.train(LocalSession()) == 3
    assert runner.committed_epochs == [0, 1, 2, 3]
    assert manager.get_resume_from_epoch_id() == 3
    blobs = stored(manager.location.storage, NODE, 2)
    assert np.array_equal(blobs[f"{NODE}/w"], np.full(64, 2.0))


def test_async_saves_with_the_two_tier_copy_upload(tmp_path: Path, s3_url: str) -> None:
    job, _ = build_counter_job(epochs=3, size=64)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    upload = CopyUpload(s3_url)
    runner = JobRunner(job, manager, upload_task_group_builder=upload, async_save=True)
    assert runner.train(LocalSession()) == 3
    assert protocol.committed_nodes(upload.storage, 3) == {NODE}
    blobs = stored(upload.storage, NODE, 3)
    assert np.array_equal(blobs[f"{NODE}/w"], np.full(64, 3.0))


class _OnLog(logging.Handler):
    """Notes (``seen``) and acts on (``action``) each record containing ``text``."""

    def __init__(self, text: str, action: Callable[[], object] = lambda: None) -> None:
        super().__init__()
        self.text, self.action, self.seen = text, action, False

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen = True
            self.action()


def test_a_second_ctrl_c_abandons_the_save_in_flight_which_never_commits(
    tmp_path: Path,
    gate: threading.Event,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job, _ = build_counter_job(epochs=10)

    def interrupt(ws: Workspace) -> None:
        raise KeyboardInterrupt

    with Node(NODE):
        Task(interrupt, group=job.epoch_group)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", "json", path_type="gated_local")
    runner = JobRunner(job, manager, async_save=True)
    waiting = _OnLog("waiting for the background save")
    real_exception = SaveFuture.exception

    def pressed_again(future: SaveFuture, timeout: float | None = None) -> Any:
        """Ctrl-C again as the runner, having said it waits, starts waiting for the
        save: the KeyboardInterrupt Python raises there. (A real SIGINT from
        ``os.kill`` did not always wake the wait in a full run: the signal may be
        taken by another thread while the main one sleeps in a lock.)"""
        if waiting.seen and not future.done():
            waiting.seen = False
            raise KeyboardInterrupt
        return real_exception(future, timeout)

    monkeypatch.setattr(SaveFuture, "exception", pressed_again)
    logging.getLogger("ckptstore").addHandler(waiting)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
            runner.train(LocalSession())  # epoch 0's save is held at the gate
    finally:
        logging.getLogger("ckptstore").removeHandler(waiting)
    assert "Abandoned the background save of epoch(s) [0]" in caplog.text
    assert runner.committed_epochs == []
    assert protocol.committed_nodes(manager.location.storage, 0) == set()
    assert manager.get_resume_from_epoch_id() is None


NICE_SEEN: list[int] = []


class NiceRecordingLocalPath(LocalPath):
    """Local disk recording the nice value of each thread writing data."""

    name = "nice_recording_local"
    protocols: ClassVar[tuple[str, ...]] = ()

    def open_positional(self, key: str, size: int) -> Any:
        NICE_SEEN.append(thread_nice())
        return super().open_positional(key, size)

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        NICE_SEEN.append(thread_nice())
        super().write_parts(key, parts)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice: Linux")
@pytest.mark.parametrize("background_nice", [BACKGROUND_NICE, 3, 10])
def test_the_background_write_runs_below_the_training_threads_priority(
    tmp_path: Path, registry: Registry, background_nice: int
) -> None:
    register_storage(registry, NiceRecordingLocalPath)
    NICE_SEEN.clear()
    session = LocalSession()
    manager = single_node(str(tmp_path), session, path_type="nice_recording_local")
    training = thread_nice()
    options: dict[str, Any] = (
        {} if background_nice == BACKGROUND_NICE else {"background_nice": background_nice}
    )
    manager.save_async(1, session, **options).result(timeout=60)
    assert NICE_SEEN, "the save wrote nothing through the path type"
    assert set(NICE_SEEN) == {min(MAX_NICE, training + background_nice)}
    assert thread_nice() == training  # the training thread's own priority is untouched


def test_a_negative_background_nice_is_refused(tmp_path: Path) -> None:
    session = LocalSession()
    manager = single_node(str(tmp_path), session)
    with pytest.raises(JobConfigurationError, match="background_nice must be >= 0"):
        manager.save_async(1, session, background_nice=-5)
    job, _ = build_counter_job()
    with pytest.raises(JobConfigurationError, match="background_nice must be >= 0"):
        JobRunner(job, manager, async_save=True, background_nice=-1)
