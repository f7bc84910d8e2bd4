"""A bare read of a checkpoint's files, with no ckptstore code: what checking costs when
nothing else does.

:func:`read_bare` reads every file under a directory into freshly allocated arrays (one
per range of ckptstore's chunk size there), on as many threads as ckptstore's engine
uses there (:func:`engine_settings`: fewer on tmpfs), with ``os.preadv`` from one
descriptor per range, the way ckptstore's loads read: unchecked, each range in one call;
with ``checksum``, in windows of :data:`~ckptstore.io.VERIFY_WINDOW`, each window's
CRC-32 taken right after it is read. ``python -m benchmarks.measure TOOL bare-read
WORKLOAD DIR`` runs it in a fresh process (TOOL: :data:`CHECKED` or :data:`UNCHECKED`).

The pair is the floor under the checksum target of ``benchmarks.local``: the same CRC
over the same bytes, read the same way, with no manifest, request or Python between the
system calls beyond the loop itself. The windows are part of the check's cost (a CRC
over a whole range would read it back from memory, not from the CPU's cache), so the
unchecked read does not take them.
"""

from __future__ import annotations

import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ckptstore.io import VERIFY_WINDOW, IOSettings, crc32_buffer
from ckptstore.protocol import CheckpointLocation

CHECKED = "bare preadv + CRC-32"
"""The bare read with a CRC-32 of each window (a tool name for ``benchmarks.measure``)."""
UNCHECKED = "bare preadv"
"""The bare read alone."""


def read_range(path: Path, offset: int, size: int, checksum: bool) -> np.ndarray:
    """``size`` bytes of ``path`` from ``offset`` in a new array (its pages fresh, as a
    restored array's: every array is kept until the end, so none reuses another's): in
    one call, or with ``checksum`` in windows, each checksummed right after it is read."""
    array = np.empty(size, dtype=np.uint8)
    view = memoryview(array)
    step = VERIFY_WINDOW if checksum else max(size, 1)
    value = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, size, step):
            window = view[start : start + step]
            if os.preadv(fd, [window], offset + start) != window.nbytes:
                raise OSError(f"{path} ended early")
            if checksum:  # the value is not compared: what it costs is the measure
                value = crc32_buffer(window, value)
    finally:
        os.close(fd)
    return array


def engine_settings(directory: Path) -> IOSettings:
    """The chunk size and concurrency ckptstore's engine uses under ``directory``, as a
    checkpoint location there takes them: the path type's defaults there (one request
    per usable CPU on tmpfs) with the ``CKPTSTORE_IO_*`` variables applied."""
    return CheckpointLocation.open(str(directory), "zarr").io_settings


def read_bare(directory: Path, checksum: bool) -> dict[str, float]:
    """Read every file under ``directory`` as the module says; the time, the CPU and
    the bytes read."""
    settings = engine_settings(directory)
    span = settings.chunk_bytes
    ranges = [
        (path, offset, min(span, path.stat().st_size - offset))
        for path in sorted(p for p in directory.rglob("*") if p.is_file())
        for offset in range(0, path.stat().st_size, span)
    ]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    with ThreadPoolExecutor(settings.concurrency) as pool:
        arrays = list(pool.map(lambda item: read_range(*item, checksum), ranges))
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu_before,
        "bytes": sum(array.nbytes for array in arrays),
    }
