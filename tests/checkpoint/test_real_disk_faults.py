"""Full disks and failing devices on a real ext4 file system on a loop device (see
tests/loop_disks.py), not only tmpfs: ext4's defaults (journal, delayed allocation).

* A full ext4, filled to leave N bytes free for many N across one save.
* A thin-provisioned device (the image on a smaller tmpfs): ext4 believes it has
  room, the device runs out at writeback, so ENOSPC comes late, at ``fsync``.
* A device that dies (``EXT4_IOC_SHUTDOWN``, journal not flushed) at each
  ``fsync``/rename/link/mkdir of a save: every later operation fails with EIO; the
  file system is then checked and mounted again, as after a reboot.

Every case asserts: the save fails with a typed :class:`StorageError` (full or I/O),
every epoch committed before still loads exactly, no epoch without a complete record
is visible, the next resume picks the newest committed epoch, and once room is back a
save succeeds. Everything is checked through commit records, never file names.

``CKPTSTORE_LONG_TESTS=1`` tries every 4 KiB of room and every operation of a save;
the default run a spread of them.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_helpers import assert_loads_exactly, build_job, committed, resume_epoch
from loop_disks import Ext4Disk, require_loop_devices

from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore.errors import (
    SaveFailedError,
    StorageFullError,
    StorageIOError,
    TooManySaveFailuresError,
)

pytestmark = pytest.mark.loop_devices

LONG = os.environ.get("CKPTSTORE_LONG_TESTS") == "1"
DB_TYPES = ["zarr", "npz", "lmdb"]
MUTATIONS = ("fsync", "fdatasync", "rename", "replace", "link", "mkdir", "makedirs")


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Callable[..., Ext4Disk]]:
    """Opens :class:`Ext4Disk` s for the test; every one is unmounted and detached after
    it, whatever happened."""
    require_loop_devices()
    disks: list[Ext4Disk] = []

    def make(**kwargs: Any) -> Ext4Disk:
        disk = Ext4Disk(tmp_path / f"disk{len(disks)}", **kwargs)
        disks.append(disk)
        return disk.open()

    yield make
    for disk in disks:
        disk.close()


def run_job(root: str, db_type: str, epochs: int) -> JobRunner:
    """Train the one-node job to ``epochs``; one failed save stops it (no retries)."""
    manager = MultiNodeCheckpointManager(root, db_type, "json")
    runner = JobRunner(
        build_job(epochs),
        manager,
        save_retries=0,
        retry_backoff=0,
        max_consecutive_save_failures=1,
        lease_ttl=None,  # the lease's own writes are not what these tests fault
    )
    runner.train(LocalSession())
    return runner


def save_under_fault(root: str, db_type: str, errors: tuple[type[Exception], ...]) -> bool:
    """Save the epoch after the newest committed one while a fault is armed: ``True`` if
    it committed; otherwise the failure must be typed (one of ``errors``). Either way
    the resume picked the newest committed epoch."""
    before = resume_epoch(root)
    assert before is not None
    try:
        runner = run_job(root, db_type, before + 1)
    except TooManySaveFailuresError as failure:
        assert_typed(failure.last_error, errors)
        return False
    except errors:  # a write before the save (catalog repair) met the fault: typed
        return False
    assert runner.resumed_from_epoch == before
    assert runner.committed_epochs == [before + 1]
    return True


def assert_typed(error: BaseException | None, errors: tuple[type[Exception], ...]) -> None:
    """``error`` is one of ``errors``, or the :class:`SaveFailedError` of a node that
    failed with one of them (a save whose node work ran as a task group)."""
    if isinstance(error, SaveFailedError):
        causes = list(error.node_errors.values())
        assert causes, repr(error)
        assert all(cause.startswith(tuple(f"{e.__name__}:" for e in errors)) for cause in causes), (
            causes
        )
        return
    assert isinstance(error, errors), repr(error)


def assert_nothing_lost(root: str, db_type: str, before: dict[int, int]) -> dict[int, int]:
    """Every epoch committed before (epoch -> step) still loads exactly; every epoch
    committed now loads exactly; the resume picks the newest. Returns the new map."""
    now = committed(root)
    assert set(before) <= set(now), f"lost committed epochs: {set(before) - set(now)}"
    steps = {epoch: assert_loads_exactly(root, epoch, db_type) for epoch in now}
    assert all(steps[epoch] == step for epoch, step in before.items())
    assert resume_epoch(root) == max(now)
    return steps


def save_after_recovery(root: str, db_type: str, steps: dict[int, int]) -> dict[int, int]:
    """With room back, the next save succeeds and resumes from the newest epoch."""
    newest = max(steps)
    runner = run_job(root, db_type, newest + 1)
    assert runner.resumed_from_epoch == newest
    assert runner.committed_epochs == [newest + 1]
    return assert_nothing_lost(root, db_type, steps)


def fill_leaving(disk: Ext4Disk, room: int) -> Path:
    """A filler file that leaves about ``room`` bytes free (ext4 spends a few blocks on
    the filler's own extent tree)."""
    filler = disk.mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(disk.free_bytes() - room, 4096))
    finally:
        os.close(fd)
    assert abs(disk.free_bytes() - room) <= 64 << 10, (disk.free_bytes(), room)
    return filler


def spread(stop: int, step: int, default_count: int) -> list[int]:
    """Every ``step`` up to ``stop`` with CKPTSTORE_LONG_TESTS=1, else ``default_count``
    of them spread evenly."""
    every = list(range(0, stop + 1, step))
    if LONG or len(every) <= default_count:
        return every
    return [every[i * (len(every) - 1) // (default_count - 1)] for i in range(default_count)]


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_a_full_ext4_at_many_points_of_a_save_fails_typed_and_loses_nothing(
    ext4: Callable[..., Ext4Disk], db_type: str
) -> None:
    disk = ext4()
    root = str(disk.mount / "ckpt")
    run_job(root, db_type, 1)
    free = disk.free_bytes()
    steps = assert_nothing_lost(root, db_type, {})
    steps = save_after_recovery(root, db_type, steps)
    one_save = free - disk.free_bytes()  # what one epoch's save takes on this disk
    outcomes = []
    for room in spread(one_save + (16 << 10), 4096, 6):
        filler = fill_leaving(disk, room)
        outcomes.append(save_under_fault(root, db_type, (StorageFullError,)))
        steps = assert_nothing_lost(root, db_type, steps)
        filler.unlink()
        steps = save_after_recovery(root, db_type, steps)
    assert outcomes[0] is False, outcomes  # no room fails
    assert outcomes[-1] is True, outcomes  # enough room succeeds


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_a_thin_device_that_runs_out_at_writeback_fails_typed_and_loses_nothing(
    ext4: Callable[..., Ext4Disk], db_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rooms = spread(512 << 10, 32 << 10, 3)
    outcomes = []
    late: list[int] = []  # the errnos of failed fsyncs: the device ran out at writeback
    plain_fsync = os.fsync

    def fsync(fd: int) -> None:
        try:
            plain_fsync(fd)
        except OSError as error:
            late.append(error.errno)
            raise

    monkeypatch.setattr(os, "fsync", fsync)
    for room in rooms:
        disk = ext4(thin_backing_bytes=64 << 20)
        root = str(disk.mount / "ckpt")
        run_job(root, db_type, 1)
        steps = assert_nothing_lost(root, db_type, {})
        os.sync()
        disk.grow_backing(disk.backing_used_bytes() + room)  # shrink to what is used + room
        assert disk.free_bytes() > 16 << 20  # ext4 itself sees plenty of room
        outcomes.append(save_under_fault(root, db_type, (StorageFullError, StorageIOError)))
        disk.grow_backing(64 << 20)  # the operator extends the volume
        disk.remount()  # and checks the file system
        steps = assert_nothing_lost(root, db_type, steps)
        save_after_recovery(root, db_type, steps)
        disk.close()
    assert outcomes[0] is False, outcomes  # no room fails
    assert outcomes[-1] is True, outcomes  # enough room succeeds
    if db_type != "lmdb":  # LMDB syncs inside its C library, out of this test's sight
        assert errno.ENOSPC in late, late  # ENOSPC, late: ext4 had accepted the writes


class ShutDownAt:
    """Counts the mutating file-system calls of this process (``os.fsync``, renames,
    links, mkdirs); at the ``at``-th (1-based; 0 never) it shuts the disk down first,
    so that call and every later one fail with a real EIO."""

    def __init__(self, disk: Ext4Disk, at: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.disk, self.at, self.calls = disk, at, 0
        self._lock = threading.Lock()
        for name in MUTATIONS:
            monkeypatch.setattr(os, name, self._counted(getattr(os, name)))

    def _counted(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls += 1
                if self.calls == self.at:
                    self.disk.shut_down()
            return function(*args, **kwargs)

        return wrapper


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_a_device_that_dies_at_each_step_of_a_save_fails_with_eio_and_loses_nothing(
    ext4: Callable[..., Ext4Disk], db_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = ext4()
    root = str(disk.mount / "ckpt")
    run_job(root, db_type, 1)
    steps = assert_nothing_lost(root, db_type, {})
    with monkeypatch.context() as patch:
        counter = ShutDownAt(disk, 0, patch)
        steps = save_after_recovery(root, db_type, steps)
        calls = counter.calls  # the mutating calls of one save
    assert calls >= 4, calls
    outcomes = []
    for at in spread(calls, 1, 5)[1:]:
        with monkeypatch.context() as patch:
            ShutDownAt(disk, at, patch)
            outcomes.append(save_under_fault(root, db_type, (StorageIOError,)))
        disk.remount()  # reboot: the journal is replayed, the file system checked
        steps = assert_nothing_lost(root, db_type, steps)
        steps = save_after_recovery(root, db_type, steps)
    assert not outcomes[0], "a device that dies in the middle of a save must fail it"
