"""The physical limits every checkpoint tool is compared with, measured in the same run.

* **disk**: the best of several raw writers of the same number of bytes, each durable
  (``fsync`` of every file written): 1, 2 and 4 threads ``os.pwrite``-ing 8 or 64 MiB
  blocks into one preallocated file, through the page cache and ``O_DIRECT`` (from
  page-aligned memory, straight to the device), and 2 or 4 files written in parallel
  (one thread each). Reading: the best of 1, 2 and 4 threads ``os.preadv``-ing 8 or 64
  MiB blocks into one preallocated buffer, after dropping the page cache (when allowed:
  root).
* **memory**: ``np.copyto`` of the bytes into preallocated (already faulted-in)
  buffers, with 1 and 2 threads: no tool can save to or load from ``/dev/shm`` faster
  than memory can copy.

The raw writers are also run on ``/dev/shm`` and reported, so the cost of tmpfs itself
(page allocation) is visible next to the copy. Two more writers, never a limit, show
the floor of a checksummed ZIP: 4 threads each computing the CRC-32 of a 16 MiB block
(what the ZIP format requires, and ckptstore's manifest records), then writing it into
one file; and 3 threads doing the same into 3 files (ckptstore shares a node's large
blobs among up to four archives).

    python -m benchmarks.limits            # 1 GiB, disk and /dev/shm
    python -m benchmarks.limits --smoke    # 64 MiB, seconds (CI)
    python -m benchmarks.limits --docs     # also write the section of docs/benchmarks-tables.md
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.report import BENCHMARKS_PAGE, update_docs_section
from benchmarks.system import drop_caches, memory_kept, syncfs
from ckptstore.io import crc32_of

MiB = 1 << 20
GiB = 1 << 30
PAGE = 4096
RESULTS = Path(__file__).resolve().parent / "results"
BLOCKS = (8 * MiB, 64 * MiB)
THREADS = (1, 2, 4)
FILES = (2, 4)


@dataclass(frozen=True)
class Trial:
    """One way of moving ``nbytes``: how, and how long it took (the best of its runs)."""

    method: str
    nbytes: int
    seconds: float

    @property
    def rate(self) -> float:
        """GiB/s."""
        return self.nbytes / self.seconds / GiB


@dataclass(frozen=True)
class Limit:
    """The best write (save) and read (load) of a location, and every trial run."""

    location: str
    save: Trial
    load: Trial
    trials: tuple[Trial, ...]


def _ranges(nbytes: int, parts: int, block: int) -> list[list[tuple[int, int]]]:
    """``parts`` contiguous shares of ``[0, nbytes)``, each cut into ``block``-sized pieces."""
    share = -(-nbytes // parts)
    result = []
    for part in range(parts):
        start, end = part * share, min(nbytes, (part + 1) * share)
        result.append([(offset, min(block, end - offset)) for offset in range(start, end, block)])
    return result


def pwrite_fully(fd: int, view: memoryview, offset: int) -> None:
    """``pwrite`` all of ``view`` at ``offset``, again after a short write."""
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _pwrite_all(
    fd: int, source: memoryview, pieces: list[tuple[int, int]], checksum: bool = False
) -> None:
    for offset, length in pieces:
        view = source[offset : offset + length]
        if checksum:  # what a save computes before writing
            crc32_of((view,))
        pwrite_fully(fd, view, offset)


def write_one_file(
    path: Path,
    source: memoryview,
    threads: int,
    block: int,
    direct: bool = False,
    checksum: bool = False,
) -> float:
    """``threads`` threads pwrite their share into one preallocated file, then fsync.
    ``direct``: the whole 4 KiB blocks go ``O_DIRECT`` (``source`` must then be page
    aligned), a last partial block through the page cache. ``checksum``: each block's
    CRC-32 is computed before it is written."""
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    aligned = len(source) // PAGE * PAGE if direct else 0
    try:
        os.posix_fallocate(fd, 0, len(source))
        direct_fd = os.open(path, os.O_WRONLY | os.O_DIRECT) if aligned else fd
        try:
            with ThreadPoolExecutor(threads) as pool:
                futures = [
                    pool.submit(_pwrite_all, direct_fd, source, share, checksum)
                    for share in _ranges(aligned or len(source), threads, block)
                ]
                if aligned and aligned < len(source):  # the last partial block
                    tail = [(aligned, len(source) - aligned)]
                    futures.append(pool.submit(_pwrite_all, fd, source, tail))
                for future in futures:
                    future.result()
        finally:
            if direct_fd != fd:
                os.close(direct_fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


CHECKSUMMED = "one file, 4 threads, 16 MiB CRC-32 + pwrite (a checksummed ZIP; not a limit)"
CHECKSUMMED_FILES = (
    "3 files in parallel, 16 MiB CRC-32 + pwrite (checksummed ZIPs, as ckptstore "
    "shares 1 GiB of large blobs; not a limit)"
)


def page_aligned(source: np.ndarray) -> np.ndarray:
    """A copy of ``source`` in page-aligned memory (for ``O_DIRECT`` writes)."""
    spare = np.empty(source.nbytes + PAGE, dtype=np.uint8)
    start = -spare.ctypes.data % PAGE
    aligned = spare[start : start + source.nbytes]
    np.copyto(aligned, source.reshape(-1).view(np.uint8))
    return aligned


def write_many_files(
    directory: Path, source: memoryview, files: int, block: int, checksum: bool = False
) -> float:
    """``files`` files, one thread each, written in parallel; every file fsync'd.
    ``checksum``: as :func:`write_one_file`."""

    def write(index: int, pieces: list[tuple[int, int]]) -> None:
        fd = os.open(directory / f"part-{index}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            base = pieces[0][0]
            os.posix_fallocate(fd, 0, sum(length for _, length in pieces))
            for offset, length in pieces:
                view = source[offset : offset + length]
                if checksum:
                    crc32_of((view,))
                pwrite_fully(fd, view, offset - base)
            os.fsync(fd)
        finally:
            os.close(fd)

    started = time.perf_counter()
    with ThreadPoolExecutor(files) as pool:
        for future in [
            pool.submit(write, index, share)
            for index, share in enumerate(_ranges(len(source), files, block))
        ]:
            future.result()
    return time.perf_counter() - started


def read_one_file(path: Path, target: memoryview, threads: int, block: int) -> float:
    """``threads`` threads preadv their share of ``path`` into ``target``."""

    def read(fd: int, pieces: list[tuple[int, int]]) -> None:
        for offset, length in pieces:
            view = target[offset : offset + length]
            position = offset
            while view:
                count = os.preadv(fd, [view], position)
                if count == 0:
                    raise OSError(f"{path} is shorter than expected")
                view, position = view[count:], position + count

    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            for future in [
                pool.submit(read, fd, share) for share in _ranges(len(target), threads, block)
            ]:
                future.result()
        return time.perf_counter() - started
    finally:
        os.close(fd)


def clear_trial(directory: Path) -> None:
    """Delete a trial's files, and have the file system commit the deletion (and trim
    the freed blocks on disks mounted with ``discard``) before the next trial's clock."""
    for path in directory.iterdir():
        path.unlink()
    syncfs(directory)


def source_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` of random bytes (zero pages would be free to read)."""
    return np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8)


def one_file_method(threads: int, block: int, direct: bool = False) -> str:
    """The name of :func:`write_one_file`'s method with these settings, as tables show it."""
    name = f"one file, {threads} thread{'s' * (threads > 1)}, {block // MiB} MiB pwrite"
    return name + " O_DIRECT" if direct else name


def disk_trials(
    location: Path, nbytes: int, repeat: int = 1
) -> tuple[list[Trial], list[Trial], list[Trial]]:
    """Every raw writer and reader at ``location``, each the best of ``repeat`` runs, and
    the checksummed writer (:data:`CHECKSUMMED`, never a limit)."""
    source = source_bytes(nbytes).data
    aligned_source = page_aligned(np.frombuffer(source, dtype=np.uint8)).data
    writes: dict[str, float] = {}
    reads: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="ckptlimit-", dir=location))
    runs: list[tuple[str, Callable[[], float]]] = []
    for threads in THREADS:
        for block in BLOCKS:
            runs.append(
                (
                    one_file_method(threads, block),
                    partial(write_one_file, work / "raw.bin", source, threads, block),
                )
            )
            if not is_memory(location):
                runs.append(
                    (
                        one_file_method(threads, block, direct=True),
                        partial(
                            write_one_file, work / "raw.bin", aligned_source, threads, block, True
                        ),
                    )
                )
    for files in FILES:
        runs.append(
            (
                f"{files} files in parallel, 64 MiB pwrite",
                partial(write_many_files, work, source, files, 64 * MiB),
            )
        )
    floors: dict[str, float] = {}
    try:
        for _ in range(repeat):
            for method, run in runs:
                seconds = run()
                writes[method] = min(writes.get(method, seconds), seconds)
                clear_trial(work)
            seconds = write_one_file(work / "raw.bin", source, 4, 16 * MiB, checksum=True)
            floors[CHECKSUMMED] = min(floors.get(CHECKSUMMED, seconds), seconds)
            clear_trial(work)
            seconds = write_many_files(work, source, 3, 16 * MiB, checksum=True)
            floors[CHECKSUMMED_FILES] = min(floors.get(CHECKSUMMED_FILES, seconds), seconds)
            clear_trial(work)
        write_one_file(work / "raw.bin", source, 4, 64 * MiB)
        target = np.ones(nbytes, dtype=np.uint8)  # faulted in: the reader's buffer is ready
        cold = "" if is_memory(location) else "cold " if drop_caches() else "warm "
        for _ in range(repeat):
            for threads in THREADS:
                for block in BLOCKS:
                    drop_caches()
                    seconds = read_one_file(work / "raw.bin", target.data, threads, block)
                    method = (
                        f"{cold}read, {threads} thread{'s' * (threads > 1)}, "
                        f"{block // MiB} MiB preadv"
                    )
                    reads[method] = min(reads.get(method, seconds), seconds)
        if not np.array_equal(target[:4096], np.asarray(source[:4096])):
            raise RuntimeError("the raw file did not read back as written")
    finally:
        clear_trial(work)
        work.rmdir()
    return (
        [Trial(m, nbytes, s) for m, s in writes.items()],
        [Trial(m, nbytes, s) for m, s in reads.items()],
        [Trial(m, nbytes, s) for m, s in floors.items()],
    )


def _copy(target: np.ndarray, source: np.ndarray, start: int, length: int) -> None:
    np.copyto(target[start : start + length], source[start : start + length])


def copy_trials(nbytes: int, repeat: int = 1) -> list[Trial]:
    """``np.copyto`` of ``nbytes`` into a preallocated buffer, with 1 and 2 threads."""
    source = source_bytes(nbytes)
    target = np.ones(nbytes, dtype=np.uint8)
    best: dict[str, float] = {}
    for _ in range(repeat):
        for threads in (1, 2):
            shares = [pieces[0] for pieces in _ranges(nbytes, threads, nbytes)]
            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda share: _copy(target, source, *share), shares))
            seconds = time.perf_counter() - started
            method = f"np.copyto, {threads} thread{'s' * (threads > 1)}"
            best[method] = min(best.get(method, seconds), seconds)
    if not np.array_equal(target, source):
        raise RuntimeError("np.copyto did not copy")
    return [Trial(m, nbytes, s) for m, s in best.items()]


def _fastest(trials: list[Trial]) -> Trial:
    return min(trials, key=lambda trial: trial.seconds)


def disk_limit(location: Path, nbytes: int, repeat: int = 1) -> Limit:
    """The best durable raw write and cold raw read of ``nbytes`` at ``location``."""
    writes, reads, floors = disk_trials(location, nbytes, repeat)
    return Limit(str(location), _fastest(writes), _fastest(reads), (*writes, *floors, *reads))


def memory_limit(location: Path, nbytes: int, repeat: int = 1) -> Limit:
    """For a location in memory: the best ``np.copyto`` both ways; the raw writers to
    ``location`` are listed among the trials."""
    copies = copy_trials(nbytes, repeat)
    writes, reads, floors = disk_trials(location, nbytes, repeat)
    best = _fastest(copies)
    return Limit(str(location), best, best, (*copies, *writes, *floors, *reads))


def is_memory(location: Path) -> bool:
    """Whether ``location`` is on a tmpfs (its contents live in memory)."""
    best, kind = "", ""
    resolved = str(location.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            mount, fs_type = fields[1], fields[2]
            if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) and len(
                mount
            ) >= len(best):
                best, kind = mount, fs_type
    return kind == "tmpfs"


def location_limit(location: Path, nbytes: int, repeat: int = 1) -> Limit:
    """:func:`memory_limit` on a tmpfs, :func:`disk_limit` elsewhere."""
    if is_memory(location):
        return memory_limit(location, nbytes, repeat)
    return disk_limit(location, nbytes, repeat)


def table(limits: list[Limit]) -> str:
    """Every trial, the best marked as the location's limit."""
    lines = [
        "| location | method | GiB/s | seconds | limit |",
        "|---|---|---:|---:|---|",
    ]
    for limit in limits:
        for trial in limit.trials:
            marks = [
                name for name, best in (("save", limit.save), ("load", limit.load)) if best is trial
            ]
            lines.append(
                f"| {limit.location} | {trial.method} | {trial.rate:.2f} | {trial.seconds:.3f} "
                f"| {' and '.join(marks)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=1024, help="bytes moved by each trial")
    parser.add_argument(
        "--disk", default=str(RESULTS / "scratch"), help="directory on the real disk"
    )
    parser.add_argument("--shm", default="/dev/shm", help="directory in memory (tmpfs)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each trial (best kept)")
    parser.add_argument("--smoke", action="store_true", help="64 MiB, one run")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/")
    args = parser.parse_args(argv)
    with memory_kept(not args.smoke) as memory:
        if args.smoke:
            args.mib, args.repeat = 64, 1
        Path(args.disk).mkdir(parents=True, exist_ok=True)
        nbytes = args.mib * MiB
        limits = [
            location_limit(Path(args.disk), nbytes, args.repeat),
            location_limit(Path(args.shm), nbytes, args.repeat),
        ]
        text = "\n".join(
            [
                f"{args.mib} MiB per trial, best of {args.repeat}; "
                f"`python -m benchmarks.limits{' --smoke' if args.smoke else ''}`. {memory}".rstrip(),
                "",
                table(limits),
            ]
        )
        print(text)
        if args.docs and not args.smoke:
            update_docs_section(BENCHMARKS_PAGE, "limits", text)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
