"""Which pages of this process's memory were written since a save last read them, so
that an incremental save need not read unchanged memory to know it is unchanged.

The kernel keeps the record: memory is write-protected through ``userfaultfd`` in its
asynchronous mode (Linux 6.7+), where the first write to a page lifts the protection
without stopping the writer, and ``PAGEMAP_SCAN`` on ``/proc/self/pagemap`` lists the
pages written since (and protects them again, in the same call). This is the
write-tracking CRIU-style incremental memory dumps rely on.

Nothing here guesses. Memory the kernel cannot watch (shared or file-backed mappings,
an older kernel, userfaultfd forbidden, a forked child's inherited state) answers
"unknown", and the caller reads the bytes as before. A page whose content the kernel
dropped (``MADV_DONTNEED``, unmapped) counts as written.

What the kernel does not see: a device writing into memory pinned for DMA (RDMA
buffers, ``cudaHostRegister``, io_uring fixed buffers). ``CKPTSTORE_WRITE_WATCH=off``
turns watching off. Each first write to a watched page after a save costs a page fault
(about 1.4 us here): the callers let go of memory written all over between saves.

Example::

    >>> import numpy as np
    >>> watch = write_watch()
    >>> array = np.ones(1 << 20, np.uint8)  # written: pages never written count as dropped
    >>> first = watch.look("example", array.ctypes.data, array.nbytes, stamp=0)
    >>> first.unchanged(0, 4096)  # nothing known before the first look
    False
    >>> array[600_000] = 2
    >>> second = watch.look("example", array.ctypes.data, array.nbytes, first.stamp)
    >>> if first.stamp:  # watched (Linux 6.7+)
    ...     assert second.unchanged(8192, 4096) and not second.unchanged(600_000, 1)
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import platform
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field, replace

import numpy as np
from xxhash import xxh3_128_intdigest as _hash

from ckptstore._environment import choice_variable

__all__ = ["ENV", "Ends", "Look", "WriteWatch", "write_watch"]

log = logging.getLogger(__name__)
ENV = "CKPTSTORE_WRITE_WATCH"
"""``off``: never watch memory (every incremental save reads every chunk)."""
MAX_RANGES = 4096
"""Watched ranges kept at most; the oldest is forgotten first (its next look: unknown)."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SYSCALL = {"x86_64": 323, "aarch64": 282}.get(platform.machine())
"""The number of the ``userfaultfd`` system call on this machine (None: not supported)."""


def _iowr(kind: int, number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (kind << 8) | number


_UFFD_USER_MODE_ONLY = 1
_UFFDIO_API = _iowr(0xAA, 0x3F, 24)
_UFFDIO_REGISTER = _iowr(0xAA, 0x00, 32)
_UFFDIO_WRITEPROTECT = _iowr(0xAA, 0x06, 24)
_UFFD_FEATURE_WP_UNPOPULATED = 1 << 13
_UFFD_FEATURE_WP_ASYNC = 1 << 15
_REGISTER_MODE_WP = 1 << 1
_PROTECT = 1
_PAGEMAP_SCAN = _iowr(ord("f"), 16, 96)
_PAGE_IS_WRITTEN = 1 << 1
_PAGE_IS_PRESENT = 1 << 3
_PAGE_IS_SWAPPED = 1 << 4
_SCAN_PROTECT = 1 << 0  # PM_SCAN_WP_MATCHING: protect again what was found written
_SCAN_CHECK = 1 << 1  # PM_SCAN_CHECK_WPASYNC: EPERM if a page is not watched
_REGIONS = 1024
Pages = np.ndarray[tuple[int], np.dtype[np.bool_]]
"""A flag per page of a range."""
Ends = tuple[int, int]
"""Hashes of a range's own bytes in its first and last pages."""


@dataclass(frozen=True)
class Look:
    """What one look at a range found: ``stamp`` names the look (0: not watched), and
    ``written`` flags, per page from the one holding the range's first byte, those
    written since this consumer's previous look (None: unknown)."""

    stamp: int
    written: Pages | None = None
    head: int = 0
    """The range's first byte's offset in its first page."""

    def settle_ends(self, data: memoryview, ends: Ends | None) -> tuple[Look, Ends]:
        """This look with the range's first and last pages counted unwritten where the
        range's own bytes in them (``data``: the range) hash as they did after the
        consumer's previous look (``ends``). On the heap, a neighbouring allocation
        shares those pages, and the allocator writes its records there. Also the ends'
        hashes now, for the next look."""
        last = (self.head + data.nbytes - 1) // _PAGE * _PAGE - self.head  # its last page
        now = (_hash(data[: _PAGE - self.head]), _hash(data[max(0, last) :]))
        if self.written is None or ends is None or not data.nbytes:
            return self, now
        written = self.written.copy()
        if written[0] and now[0] == ends[0]:
            written[0] = False
        if written[-1] and now[1] == ends[1]:
            written[-1] = False
        return replace(self, written=written), now

    def unchanged(self, offset: int, length: int) -> bool:
        """Whether the range's bytes ``offset`` to ``offset + length`` are known to
        hold what they held at the consumer's previous look."""
        if self.written is None:
            return False
        first = (self.head + offset) // _PAGE
        last = -(-(self.head + offset + length) // _PAGE)
        return not bool(self.written[first:last].any())


@dataclass
class _Range:
    start: int
    end: int
    seen: dict[Hashable, tuple[int, Pages]] = field(default_factory=dict)
    """Per consumer: the stamp of its last look, and the pages written since."""

    def mark(self, start: int, end: int) -> None:
        first = max(start, self.start) - self.start
        last = min(end, self.end) - self.start
        if first < last:
            for _, written in self.seen.values():
                written[first // _PAGE : -(-last // _PAGE)] = True


class WriteWatch:
    """The write-protection watch of this process's memory (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: dict[tuple[int, int], _Range] = {}
        self._refused: dict[tuple[int, int], None] = {}
        """Ranges the kernel cannot watch (not asked again)."""
        self._stamps = itertools.count(1)
        self._uffd: int | None = None
        self._pagemap: int | None = None
        self._unavailable = False
        self._libc: ctypes.CDLL | None = None
        self._pid = os.getpid()

    def look(self, consumer: Hashable, address: int, nbytes: int, stamp: int) -> Look:
        """Start or go on watching ``nbytes`` at ``address`` for ``consumer``, whose
        previous look returned ``stamp``: the pages written since that look. Call it
        before reading the bytes (a write after the call shows in the next look)."""
        start = address - address % _PAGE
        end = -(-(address + nbytes) // _PAGE) * _PAGE
        with self._lock:
            if not self._ready():
                return Look(0)
            watched = self._ranges.get((start, end))
            if watched is not None and not self._collect(start, end):
                del self._ranges[(start, end)]  # unmapped and mapped again, say
                watched = None
            if watched is None:
                watched = self._watch(start, end)
                if watched is None:
                    return Look(0)
            before = watched.seen.get(consumer)
            written = before[1] if before is not None and before[0] == stamp else None
            fresh = next(self._stamps)
            watched.seen[consumer] = (fresh, np.zeros((end - start) // _PAGE, np.bool_))
            return Look(fresh, written, address - start)

    def disable(self, why: str) -> None:
        """Stop watching for good in this process: memory changed that the kernel did
        not see written (``why`` names it)."""
        with self._lock:
            if not self._unavailable:
                log.warning(
                    "Memory of %s changed without a write the kernel saw (a device writing "
                    "into pinned memory?): incremental saves of this process read every "
                    "chunk from now on",
                    why,
                )
            self._unavailable = True
            self._ranges = {}

    def close(self) -> None:
        """Stop watching everything and let the kernel go (the next look starts again)."""
        with self._lock:
            self._forget_in_child()

    def release(self, address: int, nbytes: int) -> None:
        """Stop watching the range (memory that changes all over: no more page faults
        on its writes); its next look starts again."""
        start = address - address % _PAGE
        end = -(-(address + nbytes) // _PAGE) * _PAGE
        with self._lock:
            if self._ranges.pop((start, end), None) is not None and self._uffd is not None:
                self._protect(start, end, on=False)

    # -- the kernel -------------------------------------------------------------------

    def _ready(self) -> bool:
        if self._pid != os.getpid():
            self._forget_in_child()
        if self._unavailable or _SYSCALL is None:
            return False
        if choice_variable(os.environ, ENV, ("on", "off")) == "off":
            return False
        if self._uffd is not None:
            return True
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
        self._libc = libc
        uffd = int(libc.syscall(_SYSCALL, os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY))
        if uffd < 0:
            return self._give_up("userfaultfd", ctypes.get_errno())
        wanted = _UFFD_FEATURE_WP_ASYNC | _UFFD_FEATURE_WP_UNPOPULATED
        api = (ctypes.c_uint64 * 3)(0xAA, wanted, 0)
        if libc.ioctl(uffd, _UFFDIO_API, ctypes.addressof(api)) < 0:
            os.close(uffd)
            return self._give_up("UFFDIO_API (WP_ASYNC)", ctypes.get_errno())
        try:
            pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            os.close(uffd)
            return self._give_up("/proc/self/pagemap", error.errno or 0)
        self._uffd, self._pagemap = uffd, pagemap
        return True

    def _give_up(self, what: str, code: int) -> bool:
        log.info("Memory is not watched for writes (%s: %s)", what, os.strerror(code))
        self._unavailable = True
        return False

    def _ioctl(self, fd: int, request: int, argument: ctypes.Array[ctypes.c_uint64]) -> int:
        assert self._libc is not None
        result = int(self._libc.ioctl(fd, request, ctypes.addressof(argument)))
        return result if result >= 0 else -ctypes.get_errno()

    def _watch(self, start: int, end: int) -> _Range | None:
        """Register and protect a new range (None: the kernel cannot watch it)."""
        assert self._uffd is not None
        if (start, end) in self._refused:
            return None
        register = (ctypes.c_uint64 * 4)(start, end - start, _REGISTER_MODE_WP, 0)
        if (
            not _private_anonymous(start, end)
            or self._ioctl(self._uffd, _UFFDIO_REGISTER, register) < 0
        ):  # shared, backed by a file, or watched by another userfaultfd
            self._refused[(start, end)] = None
            while len(self._refused) > MAX_RANGES:
                del self._refused[next(iter(self._refused))]
            return None
        # pages it shares with watched ranges may hold writes they have not collected:
        # collected first, protecting them again does not hide those writes
        if not self._collect(start, end) or not self._protect(start, end, on=True):
            return None
        while len(self._ranges) >= MAX_RANGES:
            del self._ranges[next(iter(self._ranges))]
        watched = self._ranges[(start, end)] = _Range(start, end)
        return watched

    def _protect(self, start: int, end: int, *, on: bool) -> bool:
        assert self._uffd is not None
        protect = (ctypes.c_uint64 * 3)(start, end - start, _PROTECT if on else 0)
        return self._ioctl(self._uffd, _UFFDIO_WRITEPROTECT, protect) >= 0

    def _collect(self, start: int, end: int) -> bool:
        """Mark, for every consumer of every range they touch, the pages of
        ``start``-``end`` written (and protect them again) or dropped since the last
        scan of them; False if the kernel no longer watches them all."""
        written = self._scan(start, end, _SCAN_PROTECT | _SCAN_CHECK, 0, _PAGE_IS_WRITTEN)
        gone = _PAGE_IS_PRESENT | _PAGE_IS_SWAPPED  # neither: the content was dropped
        dropped = self._scan(start, end, _SCAN_CHECK, gone, gone)
        if written is None or dropped is None:
            return False
        for first, last in written + dropped:
            for watched in self._ranges.values():
                watched.mark(first, last)
        return True

    def _scan(
        self, start: int, end: int, flags: int, inverted: int, mask: int
    ) -> list[tuple[int, int]] | None:
        """The page ranges of ``start``-``end`` that match (None: some page there is
        not watched)."""
        assert self._pagemap is not None
        regions = (ctypes.c_uint64 * (3 * _REGIONS))()
        found: list[tuple[int, int]] = []
        while start < end:
            argument = (ctypes.c_uint64 * 12)(
                96, flags, start, end, 0, ctypes.addressof(regions), _REGIONS, 0,
                inverted, mask, 0, mask,
            )  # fmt: skip
            count = self._ioctl(self._pagemap, _PAGEMAP_SCAN, argument)
            if count == -errno.EPERM:
                return None
            if count < 0:  # never seen: reading every chunk is always right
                self._give_up("PAGEMAP_SCAN", -count)
                return None
            found += [(regions[3 * i], regions[3 * i + 1]) for i in range(count)]
            if argument[4] <= start:  # walk_end: where the kernel stopped
                break
            start = argument[4]
        return found

    def _forget_in_child(self) -> None:
        """Close the userfaultfd and pagemap, and forget every range: in a forked child,
        where both are the parent's, it starts over with its own."""
        self._pid = os.getpid()
        if self._uffd is not None:
            os.close(self._uffd)
        if self._pagemap is not None:
            os.close(self._pagemap)
        self._uffd = self._pagemap = None
        self._ranges, self._refused = {}, {}


def _private_anonymous(start: int, end: int) -> bool:
    """Whether ``start``-``end`` is all private memory backed by no file: another
    process may write shared memory, and another writer change a file, unseen here."""
    covered = start
    with open("/proc/self/maps", "rb") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(bound, 16) for bound in fields[0].split(b"-"))
            if high <= covered or low >= end:
                continue
            if low > covered or fields[1][3:4] != b"p" or fields[4] != b"0":
                return False
            covered = high
            if covered >= end:
                return True
    return False


_WATCH = WriteWatch()


def _after_fork() -> None:
    _WATCH._lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def write_watch() -> WriteWatch:
    """This process's watch (one per process: the kernel's protection is per page)."""
    return _WATCH
