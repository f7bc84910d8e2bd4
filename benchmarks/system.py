"""What the benchmarks ask of the operating system: durability, the page cache, disk usage."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

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
