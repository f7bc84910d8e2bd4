"""What the benchmarks ask of the operating system: durability, the page cache, disk usage,
memory that stays with the machine, environment variables set for a while."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import numpy as np

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def syncfs(path: Path) -> None:
    """Flush the whole file system holding ``path`` (for tools with no sync of their own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), str(path))
    finally:
        os.close(fd)


SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing back a range of an open file's dirty pages, without
    waiting (``sync_file_range`` with ``SYNC_FILE_RANGE_WRITE``)."""
    _libc.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(length), SYNC_FILE_RANGE_WRITE)


def fsync_file(path: Path) -> None:
    """fsync ``path`` and its directory."""
    for target in (path, path.parent):
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_caches() -> bool:
    """Drop the page cache (root only); False if not allowed."""
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3")
    except OSError:
        return False
    return True


PAGE_REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
NO_REPORTING = "11"  # above the buddy allocator's largest order: no free block is reported
WARM_LIMIT = 32 << 30
WARM_MARGIN = 2 << 30


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


@contextmanager
def memory_kept(enabled: bool = True) -> Iterator[str]:
    """Keep freed memory in this virtual machine for the run, with most of it touched
    first; yields a sentence for the report (empty when there is nothing to say).

    A VM whose balloon reports free pages to its host (virtio-balloon free page
    reporting, ``/sys/module/page_reporting``) gives memory back about a second after
    it is freed, and the next allocation faults it in from the host again: 1-2 s per
    GiB on the development machine, against 0.13 s for memory the guest kept. That cost
    lands on whichever tool allocates after a pause (a tmpfs file, the page cache, a
    restored state), and moved the same save by 2x between repeats. As root, the
    reporting is switched off for the run (its order set above the largest block) and
    restored afterwards; not as root, the report says the numbers carry that noise.
    ``enabled=False`` (smoke runs) leaves the machine alone.
    """
    if not enabled or not PAGE_REPORTING_ORDER.exists():
        yield ""
        return
    before = PAGE_REPORTING_ORDER.read_text().strip()
    try:
        PAGE_REPORTING_ORDER.write_text(NO_REPORTING)
    except OSError:
        yield (
            "This VM reports freed memory to its host and the run could not stop it (not "
            "root): fresh memory cost host page faults, and the times carry that noise."
        )
        return
    try:
        warm = max(0, min(WARM_LIMIT, _available_memory() - WARM_MARGIN))
        np.ones(warm, dtype=np.uint8)  # touched once, then freed: the guest keeps it
        yield (
            f"Free page reporting to the VM's host off for the run, {warm / 2**30:.0f} GiB "
            'touched first (docs/benchmarks.md, "Reading these numbers").'
        )
    finally:
        PAGE_REPORTING_ORDER.write_text(before)


BLKIO = Path("/sys/fs/cgroup/blkio")
"""cgroup v1's block I/O controller, whose throttle slows one group's reads and writes."""
BLOCK_DEVICES = Path("/sys/dev/block")


@contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` in this process meanwhile, then the environment as it
    was (``unittest.mock.patch.dict``): tools run in this process read ckptstore's
    ``CKPTSTORE_*`` settings when they start, and the next tool must not inherit them."""
    with patch.dict(os.environ, {name: value}):
        yield


def block_device(directory: Path) -> str:
    """``MAJOR:MINOR`` of the whole disk holding ``directory`` (a throttle takes disks, not
    partitions); ValueError if no block device holds it (tmpfs, for one)."""
    device = os.stat(directory).st_dev
    entry = BLOCK_DEVICES / f"{os.major(device)}:{os.minor(device)}"
    if not entry.exists():
        raise ValueError(f"{directory} is on no block device: a disk limit needs a disk")
    if (entry / "partition").exists():
        entry = entry.resolve().parent
    return (entry / "dev").read_text().strip()


def _blkio_group() -> Path:
    """The blkio cgroup this process is in now."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return BLKIO / group.lstrip("/")
    raise RuntimeError("this process is in no blkio cgroup")


@contextmanager
def disk_limited(directory: Path, mib_per_s: int | None) -> Iterator[str]:
    """Slow the disk holding ``directory`` to ``mib_per_s`` MiB/s of reads and of writes
    for this process and every process it starts, for the body; yields a sentence for
    the report (empty, and nothing touched, when ``mib_per_s`` is None).

    This machine's virtual disk writes 2-4 GiB/s, faster than most disks a training job
    checkpoints to: a network volume in a cloud writes a few hundred MiB/s (AWS gp3's
    baseline is 125 MiB/s). The process moves into a new blkio cgroup (cgroup v1, as
    root) whose throttle limits the I/O it submits: ``O_DIRECT`` writes, and the
    write-back an fsync starts. Write-back the kernel's flusher starts on its own, later,
    is not limited, which favours a tool that leaves data unsynced, never ckptstore.
    The process moves back and the group is removed afterwards, also on failure.
    """
    if mib_per_s is None:
        yield ""
        return
    if mib_per_s <= 0:
        raise ValueError(f"a disk limit must be positive, got {mib_per_s} MiB/s")
    device = block_device(directory)
    if not (BLKIO / "blkio.throttle.write_bps_device").exists():
        raise RuntimeError(
            f"no cgroup v1 blkio throttle at {BLKIO}: a disk limit needs one (and root)"
        )
    home = _blkio_group()
    group = BLKIO / f"ckptstore-bench-{os.getpid()}"
    group.mkdir()
    try:
        limit = f"{device} {mib_per_s << 20}"
        (group / "blkio.throttle.write_bps_device").write_text(limit)
        (group / "blkio.throttle.read_bps_device").write_text(limit)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield (
                f"The disk ({device}) limited to {mib_per_s} MiB/s of reads and of writes "
                "for the run, as a network volume in a cloud (a blkio cgroup throttle; "
                'docs/benchmarks.md, "Training loop with async saves").'
            )
        finally:
            (home / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        group.rmdir()


@dataclass(frozen=True)
class DiskUsage:
    """What a checkpoint occupies: files, bytes in them, bytes the file system allocated."""

    files: int
    directories: int
    size: int
    allocated: int


def disk_usage(root: Path) -> DiskUsage:
    """Files under ``root`` (symlinks not followed), their sizes and ``st_blocks * 512``."""
    files = directories = size = allocated = 0
    for directory, subdirectories, names in os.walk(root):
        directories += len(subdirectories)
        for name in names:
            stat = os.lstat(os.path.join(directory, name))
            files += 1
            size += stat.st_size
            allocated += stat.st_blocks * 512
    return DiskUsage(files, directories, size, allocated)


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def resident() -> int:
    """This process's resident memory now (bytes)."""
    return _status("VmRSS")


def peak_resident() -> int:
    """The most resident memory this process held since the last reset (bytes)."""
    return _status("VmHWM")


def reset_peak_resident() -> None:
    """Restart :func:`peak_resident` from the current resident size."""
    Path("/proc/self/clear_refs").write_text("5")
