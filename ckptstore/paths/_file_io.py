"""File descriptor I/O for the ``local`` path type: vectored writes and reads resumed
after short calls, write-back hints, ``O_DIRECT`` writes, and the positional reader and
writer that use them.

A positional writer sends the aligned interior of each large piece ``O_DIRECT`` from
the array's memory (see :mod:`ckptstore.io._direct`), the rest through the page cache.

Example::

    >>> views = [memoryview(b"head"), memoryview(b"tail")]
    >>> fd = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644)
    >>> _pwrite_all(fd, views, 0)
    8
    >>> os.close(fd)
    >>> open("f", "rb").read()
    b'headtail'
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import io
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptstore._types import Buffer, byte_view
from ckptstore.errors import CorruptCheckpointError
from ckptstore.io import DIRECT_ALIGN, DIRECT_FROM, plan_direct
from ckptstore.plugin import PositionalReader, PositionalWriter

if TYPE_CHECKING:
    from ckptstore.paths._local_path import LocalPath


_IOV_MAX = 512
_MAX_RW = 0x7FFFF000  # Linux moves at most this many bytes per read/write call
_MAX_DIRECT = _MAX_RW // DIRECT_ALIGN * DIRECT_ALIGN


@cache
def _libc() -> ctypes.CDLL | None:
    """The C library (``find_library`` runs ``ldconfig``: once per process)."""
    library = ctypes.util.find_library("c")
    return None if library is None else ctypes.CDLL(library, use_errno=True)


def _libc_function(name: str) -> Any:
    return getattr(_libc(), name, None)


_SYNC_FILE_RANGE = _libc_function("sync_file_range")
if _SYNC_FILE_RANGE is not None:
    _SYNC_FILE_RANGE.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_SYNC_FILE_RANGE_WRITE = 2
_FSTATFS = _libc_function("fstatfs")
_SYSCALL = _libc_function("syscall")
_CACHESTAT = 451  # cachestat(2), Linux 6.5 (the same number on every architecture)
_MEMORY_FILE_SYSTEMS = frozenset({0x01021994, 0x858458F6})  # TMPFS_MAGIC, RAMFS_MAGIC
EARLY_WRITEBACK_BYTES = 1 << 20
"""Files at least this large have their write-back started as soon as they are written
(``syncfs`` mode), so the disk works while the rest of the save is still being
written, instead of all at the final barrier."""


def _start_writeback(fd: int, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to start writing a file's dirty pages now (does not wait)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class _LocalPositionalReader(PositionalReader):
    """``preadv`` into the targets from one descriptor, opened (without following
    links) once for every range read through it.

    ``direct``: a range of :data:`~ckptstore.io.DIRECT_FROM` or more into one target
    whose memory and offset have the same remainder modulo
    :data:`~ckptstore.io.DIRECT_ALIGN` goes ``O_DIRECT`` (but for its unaligned head
    and end), from the device into the target, if the page cache holds none of it
    (:func:`_cached_pages`). Such reads cost the CPU nearly nothing, where a read
    through the cache copies every byte (1 GiB in 4 MiB chunk files, cold, on a loaded
    VM: 0.03-0.05 s of CPU against 0.31-0.39 s, and less time), and leave the cache to
    what it held. Whether it does is decided once per reader, at its first such range:
    a file in the cache is read from there, as one on a kernel without ``cachestat``
    (before 6.5)."""

    def __init__(self, storage: LocalPath, key: str, fd: int, *, direct: bool = False) -> None:
        super().__init__(key)
        self._storage = storage
        self._fd = fd
        self._direct = -2 if direct else -1  # -2: not decided yet; -1: not direct

    def read_into(self, offset: int, targets: Sequence[memoryview]) -> None:
        # the hot path of a checked load (one call per window): no context manager
        try:
            if self._direct != -1 and len(targets) == 1 and _direct_read_fits(offset, targets[0]):
                missing = self._read_direct(offset, byte_view(targets[0]))
            else:
                missing = _read_all(self._fd, targets, offset)
        except OSError as error:
            raise self._storage._typed_error("read", self.key, error) from error
        if missing:
            raise CorruptCheckpointError(
                f"the file ends {missing} bytes before the end of the recorded range",
                url=self._storage.display_url,
                file=self.key,
            )

    def _read_direct(self, offset: int, target: memoryview) -> int:
        """Fill ``target`` from ``offset``, its aligned middle ``O_DIRECT`` if the page
        cache lacks that middle (decided at the first call); the bytes missing at EOF."""
        head = -offset % DIRECT_ALIGN  # the memory has the same remainder
        middle = (target.nbytes - head) // DIRECT_ALIGN * DIRECT_ALIGN
        if self._direct == -2:
            # the middle only: the pages of the head and end hold an archive's headers,
            # which are cached whenever the rest of its file was written O_DIRECT
            cold = _cached_pages(self._fd, offset + head, middle) == 0
            self._direct = _reopen_direct(self._fd, os.O_RDONLY) if cold else -1
        if self._direct < 0:
            return _read_all(self._fd, [target], offset)
        missing = _read_all(self._fd, [target[:head]], offset) if head else 0
        if missing:  # the file ends inside the head
            return missing + target.nbytes - head
        try:
            count = os.preadv(self._direct, [target[head : head + middle]], offset + head)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            os.close(self._direct)  # a file system that opens O_DIRECT but refuses reads
            self._direct = -1
            return _read_all(self._fd, [target], offset)
        # the unaligned end, or what a short read (the end of the file) left
        done = head + count
        return _read_all(self._fd, [target[done:]], offset + done) if done < target.nbytes else 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._direct >= 0:
            os.close(self._direct)
            self._direct = -1


def _cached_pages(fd: int, offset: int, nbytes: int) -> int:
    """How many pages of the range the page cache holds (``cachestat``, which reads
    nothing and starts no read-ahead, unlike a ``RWF_NOWAIT`` read); -1 if unknown."""
    if _SYSCALL is None:
        return -1
    span = (ctypes.c_uint64 * 2)(offset, nbytes)
    found = (ctypes.c_uint64 * 5)()
    if _SYSCALL(_CACHESTAT, ctypes.c_int(fd), span, found, ctypes.c_uint(0)) != 0:
        return -1  # before Linux 6.5 (ENOSYS), or refused
    return int(found[0])


def _direct_read_fits(offset: int, target: memoryview) -> bool:
    """Whether reading ``target`` from ``offset`` may go ``O_DIRECT`` (but for an
    unaligned head and end): large, with memory and offset at the same remainder."""
    if target.nbytes < DIRECT_FROM or target.readonly:
        return False
    return (np.frombuffer(target, np.uint8).ctypes.data - offset) % DIRECT_ALIGN == 0


class _LocalPositionalWriter(PositionalWriter):
    """``pwritev`` of each piece into one open file; ``close`` fsyncs it once. With a
    second descriptor opened ``O_DIRECT`` (``direct`` >= 0), the aligned interior of
    each large piece goes through it (:func:`~ckptstore.io._direct.plan_direct`).
    ``early_writeback``: start the write-back of large cached writes at once."""

    def __init__(
        self,
        storage: LocalPath,
        key: str,
        size: int,
        fd: int,
        direct: int = -1,
        *,
        early_writeback: bool = False,
    ) -> None:
        super().__init__(key, size)
        self._storage = storage
        self._fd = fd
        self._direct = direct
        self._refused = False
        self._early_writeback = early_writeback

    def write_at(self, offset: int, parts: Sequence[Buffer]) -> None:
        views = [byte_view(part) for part in parts]
        with self._storage._errors("write", self.key):
            if self._direct < 0 or self._refused:
                self._write_cached(views, offset)
                return
            for at, segment, direct in plan_direct(offset, views):
                if direct:
                    self._write_direct(segment[0], at)
                else:
                    self._write_cached(segment, at)

    def _write_cached(self, views: list[memoryview], offset: int) -> None:
        """``pwritev`` through the page cache; the write-back of a range of
        ``EARLY_WRITEBACK_BYTES`` or more starts at once (where the file will be
        synced), so the disk works while the rest of the file is being written instead
        of all at ``close``."""
        written = _pwrite_all(self._fd, views, offset)
        if self._early_writeback and written >= EARLY_WRITEBACK_BYTES:
            _start_writeback(self._fd, offset, written)

    def _write_direct(self, view: memoryview, offset: int) -> None:
        """``pwrite`` ``view`` through the ``O_DIRECT`` descriptor. If the file system
        refuses (``EINVAL``), this file's writes go through the page cache from then
        on, starting with the rest of ``view``."""
        done = 0
        while done < view.nbytes and not self._refused:
            try:
                written = os.pwrite(self._direct, view[done : done + _MAX_DIRECT], offset + done)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
                self._refused = True
                break
            done += max(0, written)
            if written <= 0 or written % DIRECT_ALIGN:
                break  # a short write that left the alignment
        if done < view.nbytes:
            _pwrite_all(self._fd, [view[done:]], offset + done)

    def close(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        with self._storage._errors("write", self.key):
            try:
                if os.fstat(fd).st_size != self.size:
                    raise OSError(f"wrote {os.fstat(fd).st_size} bytes of {self.size}")
                if self._storage.durability == "fsync":
                    os.fsync(fd)
                elif self._storage.durability == "syncfs":
                    _start_writeback(fd)
            finally:
                os.close(fd)
                self._close_direct()

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._close_direct()

    def _close_direct(self) -> None:
        if self._direct >= 0:
            os.close(self._direct)
            self._direct = -1


def _in_memory(fd: int) -> bool:
    """Whether the file open in ``fd`` lives on tmpfs or ramfs (``fstatfs``'s
    ``f_type``, the first field of ``struct statfs``): there is no device to bypass the
    page cache for, and ``O_DIRECT`` writes there were measured slower than plain ones."""
    if _FSTATFS is None:
        return False
    status = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _FSTATFS(fd, status) != 0:
        return False
    return ctypes.c_long.from_buffer(status).value in _MEMORY_FILE_SYSTEMS


def _directory_in_memory(path: str) -> bool:
    """Whether ``path``, or the nearest directory above it that exists (a root is made
    on the first save), is on tmpfs or ramfs; False when that cannot be told."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _in_memory(fd)
    finally:
        os.close(fd)


def _reopen_direct(fd: int, access: int = os.O_WRONLY) -> int:
    """A second descriptor of the file open in ``fd``, for ``O_DIRECT`` writes (or
    ``access``: reads) through ``/proc/self/fd`` (the same file, whatever happened to
    its name); -1 where the file system refuses ``O_DIRECT`` or ``/proc`` is missing.
    Writers leave out files in memory (:func:`_in_memory`)."""
    try:
        direct = os.open(f"/proc/self/fd/{fd}", access | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return -1
    if os.fstat(direct).st_ino != os.fstat(fd).st_ino:  # not the file we created
        os.close(direct)
        return -1
    return direct


def _pwrite_all(fd: int, views: list[memoryview], offset: int) -> int:
    """Write every view in order from ``offset`` (``pwritev``, resumed after short
    writes); returns the bytes written."""
    position = [offset]

    def pwrite(batch: list[memoryview]) -> int:
        written = os.pwritev(fd, batch, position[0])
        position[0] += written
        return written

    return _write_vectored(views, pwrite)


_ErrorScope = Callable[[], AbstractContextManager[None]]


class _SyncingFileIO(io.FileIO):
    """A raw file that fsyncs before closing when asked to, or (``early``) starts the
    write-back of every ``EARLY_WRITEBACK_BYTES`` written as it goes."""

    def __init__(
        self, fd: int, *, fsync: bool, early: bool = False, errors: _ErrorScope | None = None
    ) -> None:
        super().__init__(fd, "wb", closefd=True)
        self._fsync = fsync
        self._early = early
        self._written = 0
        self._kicked = 0
        self._errors = errors or contextlib.nullcontext

    def write(self, data: Any) -> int:
        with self._errors():
            return self._write(data)

    def _write(self, data: Any) -> int:
        count = super().write(data) or 0
        self._written += count
        if self._early and self._written - self._kicked >= EARLY_WRITEBACK_BYTES:
            _start_writeback(self.fileno(), self._kicked, self._written - self._kicked)
            self._kicked = self._written
        return count

    def close(self) -> None:
        try:
            if not self.closed and self._fsync:
                with self._errors():
                    os.fsync(self.fileno())
        finally:
            super().close()


def _write_all(fd: int, views: list[memoryview]) -> int:
    """Write every view in order at the file's position; returns the bytes written."""
    return _write_vectored(views, lambda batch: os.writev(fd, batch))


def _write_vectored(views: list[memoryview], write: Callable[[list[memoryview]], int]) -> int:
    """Hand ``views`` to ``write`` (``writev``/``pwritev``) in batches of at most
    ``_IOV_MAX`` buffers and ``_MAX_RW`` bytes, resuming after short writes; returns the
    bytes written."""
    views = [v for v in views if v.nbytes]
    total = sum(view.nbytes for view in views)
    while views:
        batch: list[memoryview] = []
        size = 0
        for view in views[:_IOV_MAX]:
            if size + view.nbytes > _MAX_RW:
                if not batch:
                    batch.append(view[:_MAX_RW])
                break
            batch.append(view)
            size += view.nbytes
        _advance(views, write(batch))
    return total


def _read_all(fd: int, targets: Sequence[memoryview], offset: int) -> int:
    """Fill ``targets`` from ``offset``, resuming after short reads; returns how many
    bytes were missing at EOF. A read that fills its targets at once (nearly all: a
    checked load makes one per window) costs one call and no conversions."""
    views = list(targets)
    while views:
        count = os.preadv(fd, views[:_IOV_MAX], offset)
        if count == 0:
            return sum(view.nbytes for view in views)
        offset += count
        _advance(views, count)
    return 0


def _advance(views: list[memoryview], count: int) -> None:
    """Drop the first ``count`` bytes of ``views`` (done by one vectored call) in place;
    a view cut in the middle is cut as bytes, whatever its format."""
    while count:
        head = views[0]
        if count >= head.nbytes:
            count -= head.nbytes
            views.pop(0)
        else:
            views[0] = byte_view(head)[count:]
            count = 0
