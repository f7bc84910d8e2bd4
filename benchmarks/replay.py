"""A save's own writes, replayed with nothing around them.

:func:`record` runs a save with ``os.pwrite`` and ``os.pwritev`` watched: each call's
file, offset and length, whether its descriptor was opened ``O_DIRECT``, and the
thread that made it. :func:`replay` makes the same calls again into new files of the
same sizes, each recorded thread's calls in their order on a thread of its own, from
one page-aligned buffer of random bytes (:func:`source_for`), then fsyncs every file: the save's I/O
pattern (how many files, pieces of which sizes on how many threads, which bytes through
the page cache) with none of the work around it (checksums, the ZIP's members and
headers, the manifest, the commit).

Set beside the save and the disk's limit in the same rounds
(:mod:`benchmarks.against_limit`), it splits what the save lacks of the limit into what
its layout costs (the replay against the limit) and what the process around the writes
costs (the save against its replay).

A write through the page cache of :data:`EARLY_WRITEBACK` bytes or more starts its
write-back at once (``sync_file_range``), as ckptstore's local path type does.

"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.limits import page_aligned, pwrite_fully, source_bytes
from benchmarks.system import start_writeback

EARLY_WRITEBACK = 1 << 20
"""ckptstore's ``EARLY_WRITEBACK_BYTES`` (``ckptstore/paths/_local_path.py``)."""


@dataclass(frozen=True)
class Write:
    """One recorded ``pwrite``/``pwritev``: ``nbytes`` at ``offset`` of file number
    ``file``, through an ``O_DIRECT`` descriptor or not."""

    file: int
    offset: int
    nbytes: int
    direct: bool


@dataclass
class Recording:
    """What :func:`record` saw: the files written (their paths and sizes, in the order
    first written) and each thread's writes, in order."""

    paths: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    threads: dict[int, list[Write]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes written by every recorded call."""
        return sum(write.nbytes for writes in self.threads.values() for write in writes)


def record(save: Callable[[], object]) -> Recording:
    """Run ``save`` and return every positional write it made (``os.pwrite`` and
    ``os.pwritev``, from any thread); ``os`` is left as it was, even if ``save`` fails."""
    recording = Recording()
    lock = threading.Lock()
    numbers: dict[str, int] = {}

    def note(fd: int, offset: int, nbytes: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        with lock:
            number = numbers.get(path)
            if number is None:
                number = numbers[path] = len(recording.paths)
                recording.paths.append(path)
                recording.sizes.append(0)
            recording.sizes[number] = max(recording.sizes[number], offset + nbytes)
            writes = recording.threads.setdefault(threading.get_ident(), [])
            writes.append(Write(number, offset, nbytes, direct))

    pwrite, pwritev = os.pwrite, os.pwritev

    def watched_pwrite(fd: int, data: bytes, offset: int, /) -> int:
        written = pwrite(fd, data, offset)
        note(fd, offset, written)
        return written

    def watched_pwritev(fd: int, buffers: list[bytes], offset: int, *flags: int) -> int:
        written = pwritev(fd, buffers, offset, *flags)
        note(fd, offset, written)
        return written

    with _replaced(watched_pwrite, watched_pwritev):
        save()
    return recording


@contextmanager
def _replaced(pwrite: Callable[..., int], pwritev: Callable[..., int]) -> Iterator[None]:
    saved = os.pwrite, os.pwritev
    os.pwrite, os.pwritev = pwrite, pwritev
    try:
        yield
    finally:
        os.pwrite, os.pwritev = saved


def source_for(recording: Recording) -> memoryview:
    """Random bytes in page-aligned memory, as many as ``recording``'s largest file: what
    :func:`replay` writes (the bytes at a file offset come from the same offset here, so
    an aligned write stays aligned for ``O_DIRECT``). Made once for any number of
    replays."""
    return page_aligned(source_bytes(max(recording.sizes, default=0))).data


def replay(recording: Recording, directory: Path, source: memoryview) -> float:
    """Make ``recording``'s writes again into new files in ``directory`` (created if
    needed; the files are left there), from ``source`` (:func:`source_for`), then fsync
    each; returns the seconds taken, from the first open to the last fsync. A file
    system that refuses ``O_DIRECT`` gets those writes through the page cache."""
    if len(source) < max(recording.sizes, default=0):
        raise ValueError("the source is smaller than the largest recorded file")
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    descriptors: list[tuple[int, int]] = []
    try:
        for number in range(len(recording.paths)):
            descriptors.append(_open(directory / f"file-{number}"))

        def run(writes: list[Write]) -> None:
            for write in writes:
                cached, direct = descriptors[write.file]
                fd = direct if write.direct else cached
                end = write.offset + write.nbytes
                pwrite_fully(fd, source[write.offset : end], write.offset)
                if not write.direct and write.nbytes >= EARLY_WRITEBACK:
                    start_writeback(cached, write.offset, write.nbytes)

        _on_threads_of_their_own(run, list(recording.threads.values()))
        for cached, _ in descriptors:
            os.fsync(cached)
        return time.perf_counter() - started
    finally:
        for cached, direct in descriptors:
            if direct != cached:
                os.close(direct)
            os.close(cached)


def _on_threads_of_their_own(run: Callable[[list[Write]], None], work: list[list[Write]]) -> None:
    """``run(writes)`` for each item of ``work``, all at once, each on a new thread (a
    pool would hand a finished thread the next item); the first error is raised."""
    errors: list[BaseException] = []

    def guarded(writes: list[Write]) -> None:
        try:
            run(writes)
        except BaseException as error:  # raised again below, in the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(writes,)) for writes in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _open(path: Path) -> tuple[int, int]:
    """A new file, and a second descriptor of it opened ``O_DIRECT`` (the first one again
    where the file system refuses)."""
    cached = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError as error:
        if error.errno != errno.EINVAL:
            os.close(cached)
            raise
        direct = cached
    return cached, direct
