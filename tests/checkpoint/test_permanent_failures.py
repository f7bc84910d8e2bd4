"""Errors that retrying cannot fix stop the job at once, typed, with the fix in the
message: a read-only filesystem (a real tmpfs remounted ``ro``), a name the
filesystem refuses, an object store refusing writes (401/403 from a real server behind
the fault proxy); transient ones (an I/O error here; test_runner.py) are retried and
then counted."""

from __future__ import annotations

import errno
import re
import subprocess
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from ckpt_helpers import fail_epochs, failing_local_path, register_storage

from ckptstore import (
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
    protocol,
)
from ckptstore.errors import (
    InvalidNameError,
    RequestError,
    SaveFailedError,
    StorageError,
    StorageNotWritableError,
    is_disk_full,
    is_permanent,
)
from ckptstore.io import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin import get_registry
from ckptstore.plugin._registry import Registry
from ckptstore.testing import FaultProxy

NODE = "trainer_0"


def remount(mount: Path, mode: str) -> None:
    """Remount the tmpfs at ``mount`` read-only (``"ro"``) or read-write (``"rw"``)."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


def counting_job(
    epochs: int, in_epoch: list[object] | None = None, initialized: list[int] | None = None
) -> Job:
    """A node counting epochs in blob ``n``; callables in ``in_epoch`` run once each, in
    epochs 1, 2... before that epoch's save; the init group appends to ``initialized``."""
    pending = in_epoch or []
    inits = [] if initialized is None else initialized

    def init(ws: object) -> None:
        inits.append(1)
        ws.update(n=np.zeros(1))  # type: ignore[attr-defined]

    def step(ws: object) -> None:
        if pending:
            action = pending.pop(0)
            assert callable(action)
            action()
        ws["n"] = ws["n"] + 1  # type: ignore[index]

    with Job() as job, Node(NODE):
        with job.init_group:
            Task(init)
        Task(step)
        epoch_limiter(job, epochs)
    return job


def test_a_read_only_filesystem_stops_train_before_anything_runs(small_disk: Path) -> None:
    """Before the init group too (it may load a dataset for minutes): ``train`` checks
    that the storage is writable first."""
    epochs_run: list[int] = []
    initialized: list[int] = []
    job = counting_job(3, [lambda: epochs_run.append(1)], initialized)
    remount(small_disk, "ro")
    runner = JobRunner(job, MultiNodeCheckpointManager(str(small_disk), "zarr"))
    with pytest.raises(StorageNotWritableError) as info:
        runner.train(LocalSession())
    assert info.value.errno == errno.EROFS
    assert "EROFS" in str(info.value)
    assert "remount it read-write" in str(info.value)
    assert isinstance(info.value, PermissionError)
    assert initialized == []
    assert epochs_run == []
    assert runner.save_failures == []


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("db_type", ["zarr", "npz", "lmdb"])
def test_a_filesystem_turning_read_only_stops_train_at_the_next_save(
    small_disk: Path, db_type: str, async_save: bool
) -> None:
    root = small_disk / "ckpt"

    def turn_read_only() -> None:
        runner.collect_saves(0)
        remount(small_disk, "ro")

    job = counting_job(5, [turn_read_only])
    runner = JobRunner(
        job,
        MultiNodeCheckpointManager(str(root), db_type, "json"),
        save_retries=5,
        async_save=async_save,
    )
    with pytest.raises(StorageNotWritableError) as info:
        runner.train(LocalSession())
    assert info.value.errno == errno.EROFS
    assert runner.committed_epochs == [0]
    assert runner.save_failures == []  # raised at once: not retried, not counted
    remount(small_disk, "rw")
    storage = LocalPath(str(root))
    assert protocol.read_commit(storage, 1) is None
    assert "n" in protocol.open_node(storage, NODE, 0).blobs
    again = JobRunner(counting_job(5), MultiNodeCheckpointManager(str(root), db_type, "json"))
    assert again.train(LocalSession()) == 5
    assert again.committed_epochs[0] == 1  # resumed from epoch 0


@pytest.mark.parametrize("db_type", ["zarr", "npz", "lmdb"])
def test_a_blob_name_too_long_for_local_disk_is_refused_at_init(
    tmp_path: Path, db_type: str
) -> None:
    long_name = "w" * 300  # a valid blob name, but longer than a path component may be
    epochs_run: list[int] = []
    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ws.update({long_name: np.zeros(3)}))
        Task(lambda ws: epochs_run.append(1))
        epoch_limiter(job, 3)
    manager = MultiNodeCheckpointManager(str(tmp_path), db_type)
    runner = JobRunner(job, manager, save_retries=5)
    with pytest.raises(InvalidNameError) as info:
        runner.train(LocalSession())
    assert "255" in str(info.value)
    assert "local disk" in str(info.value)
    assert info.value.name == long_name
    assert epochs_run == []
    assert runner.save_failures == []
    assert protocol.read_commit(LocalPath(str(tmp_path)), 0) is None


def test_a_node_name_is_checked_against_the_path_types_own_limit(
    tmp_path: Path, registry: Registry
) -> None:
    class ShortNamesPath(LocalPath):
        name = "short_names"
        protocols: ClassVar[tuple[str, ...]] = ()
        max_component_bytes: ClassVar[int | None] = 40

    register_storage(registry, ShortNamesPath)
    node = "n" * 30  # fits alone, not with a 10-digit epoch suffix
    with Job() as job, Node(node):
        with job.init_group:
            Task(lambda ws: ws.update(w=np.zeros(3)))
        epoch_limiter(job, 3)
    manager = MultiNodeCheckpointManager(str(tmp_path), "zarr", path_type="short_names")
    runner = JobRunner(job, manager)
    with pytest.raises(InvalidNameError, match="40-byte limit of 'short_names' storage"):
        runner.train(LocalSession())
    assert runner.save_failures == []


def test_object_store_keys_are_limited_to_1024_bytes_with_the_prefix() -> None:
    from ckptstore_s3 import S3Path

    storage = S3Path("s3://bucket/" + "p" * 1000, endpoint_url="http://127.0.0.1:9")
    storage.check_key_limits("trainer_0.1/w", "blob name", "w")  # 1013 bytes: fits
    with pytest.raises(InvalidNameError, match="1024-byte limit of 's3' storage"):
        storage.check_key_limits("trainer_0.1/" + "w" * 20, "blob name", "w" * 20)
    # no per-component limit on object stores
    S3Path("s3://bucket/run", endpoint_url="http://127.0.0.1:9").check_key_limits(
        "x" * 600, "blob name", "x" * 600
    )


def test_the_filesystems_own_name_limit_is_permanent_too(small_disk: Path) -> None:
    storage = LocalPath(str(small_disk))
    with pytest.raises(StorageNotWritableError) as info:
        storage.write_parts("a" * 300, [b"x"])
    assert info.value.errno == errno.ENAMETOOLONG
    assert "shorten the node and blob names" in str(info.value)
    assert is_permanent(info.value)


def test_an_io_error_is_typed_retried_counted_and_the_job_goes_on(
    tmp_path: Path, registry: Registry
) -> None:
    """EIO may be a passing fault of the device: a save meeting it is retried, then counted
    as failed (never committed) with the device named as the cause; the next save and the
    last committed epoch are untouched. (Simulated: no device here fails on demand.)"""
    attempts: list[str] = []
    epoch_1 = fail_epochs(1)

    def fails(key: str) -> bool:
        if epoch_1(key) and key.endswith("ckptstore.manifest.json"):
            attempts.append(key)
        return epoch_1(key)

    register_storage(registry, failing_local_path(fails, errno.EIO))
    job = counting_job(2)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", path_type="failing_local")
    runner = JobRunner(job, manager, save_retries=2, retry_backoff=0)
    assert runner.train(LocalSession()) == 2
    assert len(attempts) == 3  # 1 + 2 retries
    (failure,) = runner.save_failures
    assert failure.epoch == 1
    assert isinstance(failure.error, SaveFailedError)
    message = failure.error.node_errors[NODE]
    assert "Input/output error" in message
    assert "check the disk (dmesg, SMART)" in message  # StorageIOError's fix
    assert runner.committed_epochs == [0, 2]
    storage = LocalPath(str(tmp_path))
    assert protocol.read_commit(storage, 1) is None
    manifest = protocol.open_node(storage, NODE, 2)
    npz = get_registry().db_type("npz")
    assert protocol.read_blobs(storage, manifest, ["n"], npz, ParallelIO())["n"] == 2


@pytest.mark.parametrize(
    ("error", "permanent", "full"),
    [
        (PermissionError(errno.EACCES, "denied"), True, False),
        (OSError(errno.EPERM, "not permitted"), True, False),
        (OSError(errno.EROFS, "read-only"), True, False),
        (OSError(errno.ENAMETOOLONG, "too long"), True, False),
        (OSError(errno.ENOSPC, "full"), False, True),
        (OSError(errno.EDQUOT, "quota"), False, True),
        (OSError(errno.EIO, "i/o"), False, False),
        (ConnectionResetError(errno.ECONNRESET, "reset"), False, False),
        (TimeoutError("slow"), False, False),
    ],
)
def test_errors_are_classified_by_errno(error: OSError, permanent: bool, full: bool) -> None:
    assert is_permanent(error) is permanent
    assert is_disk_full(error) is full


@pytest.mark.parametrize("status", [401, 403])
def test_s3_refusing_writes_stops_train_at_once(
    s3_url: str, s3_faults: FaultProxy, status: int
) -> None:
    refused_writes_stop_train(s3_url, s3_faults, status)


@pytest.mark.parametrize("status", [401, 403])
def test_gcs_refusing_writes_stops_train_at_once(
    gcs_url: str, gcs_faults: FaultProxy, status: int
) -> None:
    refused_writes_stop_train(gcs_url, gcs_faults, status)


def refused_writes_stop_train(url: str, faults: FaultProxy, status: int) -> None:
    """A real server behind a proxy that starts answering every write with 401 or 403
    after epoch 0: the job stops at the next save, typed, after one attempt at the data
    (neither the client nor the runner retries; the clean-up that follows is refused
    too), and epoch 0 stays committed."""

    def refuse_writes() -> None:
        faults.clear()
        faults.fail_next(10_000, status=status, methods=["PUT", "POST", "DELETE"])

    job = counting_job(4, [refuse_writes])
    manager = MultiNodeCheckpointManager(url, "npz", "json")
    runner = JobRunner(job, manager, save_retries=3, retry_backoff=0)
    with pytest.raises(StorageError) as info:
        runner.train(LocalSession())
    assert is_permanent(info.value)
    assert f"HTTP {status}" in str(info.value)
    refused = [f"{r.path}?{r.query}" for r in faults.requests if r.outcome == "failed"]
    data = [
        target for target in refused if re.search(r"trainer_0\.1/attempt-\w+/blobs\.npz", target)
    ]
    assert len(data) == 1, refused  # the data write, refused once: not retried
    assert runner.save_failures == []  # raised at once: not counted
    assert runner.committed_epochs == [0]
    faults.clear_faults()
    storage = manager.location.storage
    assert protocol.read_commit(storage, 1) is None
    assert protocol.open_node(storage, NODE, 0).blobs


def test_an_object_store_access_denied_is_permanent_a_503_is_not() -> None:
    denied = RequestError("HTTP 403 AccessDenied", status=403, attempts=1, retryable=False)
    slow = RequestError("HTTP 503 SlowDown", status=503, attempts=8, retryable=True)
    assert is_permanent(denied)
    assert not is_permanent(slow)
    for cause, permanent in ((denied, True), (slow, False)):
        wrapped = StorageError("s3://bucket/run", "k", "write", cause)
        wrapped.__cause__ = cause  # as raised: `raise StorageError(...) from cause`
        assert is_permanent(wrapped) is permanent
