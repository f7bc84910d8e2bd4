"""The parallel chunk mover: every DB type's bulk reads and writes go through here.

Requests are submitted lazily from an iterable, so a save of any size holds at most
``concurrency * 2`` requests and ``memory_budget`` bytes of copies at once. Each write
returns the CRC-32 of what was stored; each read is verified against the checksum the
manifest recorded and reported, on mismatch, with the blob, the chunk and the file.

Example (``storage`` is any path type, here a local directory)::

    >>> from ckptstore.builtin import LocalPath
    >>> storage = LocalPath("ckpt")
    >>> data = np.arange(4, dtype=np.uint8)
    >>> io = ParallelIO(IOSettings(concurrency=8))
    >>> results = io.write(storage, [WriteRequest("w/c.0", [data], data.nbytes)])
    >>> out = bytearray(4)
    >>> io.read(storage, [ReadRequest("w/c.0", 0, [memoryview(out)], results[0].nbytes,
    ...                               crc=results[0].crc)])
    >>> bytes(out)
    b'\\x00\\x01\\x02\\x03'
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from ckptstore._types import Buffer, byte_view
from ckptstore.errors import CkptStoreError, CorruptCheckpointError
from ckptstore.io._budget import MemoryBudget
from ckptstore.io._checksum import CHECKSUM_ALGORITHM, ChecksumFunction, checksum_of, crc32_of
from ckptstore.io._pools import borrowed_pool
from ckptstore.io._progress import ByteProgress
from ckptstore.io._settings import IOSettings
from ckptstore.io._shared_keys import resolve_key
from ckptstore.io._storage import EngineStorage, PositionalReader, PositionalWriter
from ckptstore.io._views import windows

__all__ = ["ParallelIO", "RangeCheck", "ReadRequest", "WriteRequest", "WriteResult"]

R = TypeVar("R")
Parts = Sequence[Buffer]


@dataclass
class WriteRequest:
    """Store the concatenation of ``parts`` as the object ``key`` (about ``nbytes`` long:
    the budget counts that much; the result reports the exact length).

    ``parts`` may be a callable producing them inside a worker, so that copies (for a
    non-contiguous array, or compression) are made only once the budget allows it;
    ``holds`` is how many bytes such a producer allocates.

    With ``target``, the parts are written at ``offset`` of that file instead (one
    piece of a file written in parallel); ``checksum=False`` skips the CRC-32 (the
    producer computed the checksums it needs itself; the result's ``crc`` is 0).
    """

    key: str
    parts: Parts | Callable[[], Parts]
    nbytes: int
    holds: int = 0
    blob: str | None = None
    chunk: int | None = None
    target: PositionalWriter | None = None
    offset: int = 0
    checksum: bool = True


@dataclass(frozen=True)
class WriteResult:
    """What one write stored: its key, its length and the CRC-32 of its bytes (the
    algorithm of a :class:`~ckptstore.records.ChunkRecord`'s default)."""

    key: str
    nbytes: int
    crc: int


@dataclass(frozen=True)
class RangeCheck:
    """The checksum one target of a :class:`ReadRequest` must have (``checks``), and what
    a mismatch names: the blob and the chunk the range holds."""

    crc: int
    blob: str | None = None
    chunk: int | None = None


@dataclass
class ReadRequest:
    """Read ``nbytes`` at ``offset`` of ``key`` into ``targets`` (views whose lengths add
    up to ``nbytes``) and check them against ``crc``, a checksum by ``algorithm`` (see
    :func:`~ckptstore.io.checksum_of`; ``crc=None``: no check).

    A request reading several checked ranges at once (neighbours in one file, so the
    device sees one long read) gives ``checks`` instead: per target, its
    :class:`RangeCheck`, or ``None`` for the bytes between ranges (read into scratch,
    unchecked); each range is checked on its own, in windows while in cache.

    ``targets`` may be a callable that allocates scratch buffers in the worker (``holds``
    bytes); ``finish`` then runs on the verified buffers, for instance to decompress.
    """

    key: str
    offset: int
    targets: Sequence[memoryview] | Callable[[], Sequence[memoryview]]
    nbytes: int
    crc: int | None = None
    holds: int = 0
    finish: Callable[[Sequence[memoryview]], None] | None = None
    blob: str | None = None
    chunk: int | None = None
    file: str | None = field(default=None)
    algorithm: str = CHECKSUM_ALGORITHM
    checks: Sequence[RangeCheck | None] | None = None


RequestT = TypeVar("RequestT", WriteRequest, ReadRequest)


class ParallelIO:
    """Moves chunks between memory and a path type with bounded concurrency and memory.

    Requests of at most ``SMALL_REQUEST`` bytes are grouped into batches run by one
    worker each, so thousands of tiny blobs cost a few hundred thread hand-offs, not
    thousands (unless the path type says each request is a round trip:
    ``batches_small_requests = False``). Keys are relative to ``prefix`` when given.
    ``progress`` hears the bytes of each request once it is done (read, checked and
    finished, or failed and handed to ``on_error``; written).

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> io = ParallelIO(IOSettings(concurrency=4, memory_budget=128 << 20))
        >>> requests = [WriteRequest(f"c.{i}", [bytes(1000)], 1000) for i in range(3)]
        >>> [r.nbytes for r in io.write(LocalPath("ckpt"), requests, prefix="trainer_0.3")]
        [1000, 1000, 1000]
        >>> io.peak_in_flight <= 128 << 20  # most bytes held at once by the last operation
        True
    """

    SMALL_REQUEST = 256 << 10
    BATCH_ITEMS = 32
    BATCH_BYTES = 4 << 20

    def __init__(
        self, settings: IOSettings | None = None, *, progress: ByteProgress | None = None
    ) -> None:
        self.settings = settings or IOSettings()
        self.progress = progress
        self.peak_in_flight = 0

    def reporting(self, progress: ByteProgress | None) -> ParallelIO:
        """An engine with these settings whose requests report to ``progress``."""
        return ParallelIO(self.settings, progress=progress)

    # -- writes -----------------------------------------------------------------------

    def write(
        self, storage: EngineStorage, requests: Iterable[WriteRequest], *, prefix: str = ""
    ) -> list[WriteResult]:
        """Perform every write; returns one result per request, in request order, keyed
        like the requests (relative to ``prefix``)."""
        copies = storage.copies_on_write
        progress = self.progress

        def cost(request: WriteRequest) -> int:
            return request.holds + (request.nbytes if copies else 0)

        def perform(request: WriteRequest) -> WriteResult:
            parts = request.parts() if callable(request.parts) else request.parts
            views = [byte_view(part) for part in parts]
            crc = crc32_of(views) if request.checksum else 0
            if request.target is not None:
                request.target.write_at(request.offset, views)
            else:
                storage.write_parts(_join(prefix, request.key), views)
            result = WriteResult(request.key, sum(view.nbytes for view in views), crc)
            if progress is not None:
                progress(result.nbytes)
            return result

        return self._run(requests, cost, perform, batch=storage.batches_small_requests)

    # -- reads ------------------------------------------------------------------------

    def read(
        self,
        storage: EngineStorage,
        requests: Iterable[ReadRequest],
        *,
        prefix: str = "",
        verify: bool | None = None,
        on_error: Callable[[ReadRequest, Exception], None] | None = None,
    ) -> None:
        """Perform every read, checking checksums unless ``verify`` (default: the
        settings') is off. With ``on_error``, a failed request is handed to it and the
        others go on; without, the first failure stops the operation and is raised."""
        copies = storage.copies_on_read
        check = self.settings.verify if verify is None else verify
        check = check or storage.always_verified
        progress = self.progress

        def cost(request: ReadRequest) -> int:
            return request.holds + (request.nbytes if copies else 0)

        def perform(request: ReadRequest) -> None:
            key = _join(prefix, request.key)
            try:
                targets = request.targets() if callable(request.targets) else request.targets
                if check and request.checks is not None:
                    _read_ranges_checked(storage, key, request, targets, windowed=not copies)
                elif check and request.crc is not None:
                    # a storage that reads straight into memory pays a system call per
                    # read, not a request: it reads in windows checked while in cache
                    actual = _read_checked(storage, key, request, targets, windowed=not copies)
                    if actual != request.crc:
                        raise CorruptCheckpointError(
                            f"the checksum ({request.algorithm}) of the {request.nbytes} "
                            f"bytes at offset {request.offset} differs from the one recorded "
                            "in the manifest",
                            url=storage.display_url,
                            file=request.file or key,
                            blob=request.blob,
                            chunk=request.chunk,
                        )
                else:
                    storage.read_into(key, request.offset, targets)
                if request.finish is not None:
                    try:
                        request.finish(targets)  # decoding stored bytes (decompression...)
                    except (CkptStoreError, MemoryError):
                        raise
                    except Exception as error:
                        raise CorruptCheckpointError(
                            f"the stored bytes cannot be decoded ({type(error).__name__})",
                            url=storage.display_url,
                            file=request.file or key,
                            blob=request.blob,
                            chunk=request.chunk,
                        ) from error
            except Exception as error:
                if on_error is None:
                    raise
                on_error(request, error)
            if progress is not None:
                progress(request.nbytes)

        self._run(requests, cost, perform, batch=storage.batches_small_requests)

    # -- shared scheduling ------------------------------------------------------------

    def _run(
        self,
        requests: Iterable[RequestT],
        cost: Callable[[RequestT], int],
        perform: Callable[[RequestT], R],
        *,
        batch: bool = True,
    ) -> list[R]:
        settings = self.settings
        budget = MemoryBudget(settings.memory_budget)
        slots = threading.BoundedSemaphore(settings.concurrency * 2)
        futures: list[Future[list[R]]] = []
        submitted: list[list[RequestT]] = []
        positions: dict[int, int] = {}  # id(request) -> its place in `requests`
        failed = threading.Event()

        def run_batch(batch: list[RequestT]) -> list[R]:
            return [_annotated(perform, request) for request in batch]

        def done(future: Future[list[R]], *, nbytes: int) -> None:
            if future.exception() is not None:
                failed.set()  # before the slot is freed: no new batch starts after a failure
            budget.release(nbytes)
            slots.release()

        with borrowed_pool("ckptstore-io", settings.concurrency, futures) as pool:

            def submit(batch: list[RequestT], nbytes: int) -> bool:
                slots.acquire()
                budget.acquire(nbytes)
                if failed.is_set():
                    budget.release(nbytes)
                    slots.release()
                    return False
                future = pool.submit(run_batch, batch)
                future.add_done_callback(partial(done, nbytes=nbytes))
                futures.append(future)
                submitted.append(batch)
                return True

            small: list[RequestT] = []
            small_cost = small_bytes = 0
            # a batch holds its requests' memory at once: never more than the budget
            most_cost = min(self.BATCH_BYTES, settings.memory_budget)
            for position, request in enumerate(requests):
                positions[id(request)] = position
                if not batch or request.nbytes > self.SMALL_REQUEST:
                    if not submit([request], cost(request)):
                        small = []
                        break
                    continue
                request_cost = cost(request)
                if small and (
                    len(small) >= self.BATCH_ITEMS
                    or small_bytes + request.nbytes > self.BATCH_BYTES
                    or small_cost + request_cost > most_cost
                ):
                    if not submit(small, small_cost):
                        small = []
                        break
                    small, small_cost, small_bytes = [], 0, 0
                small.append(request)
                small_cost += request_cost
                small_bytes += request.nbytes
            if small:
                submit(small, small_cost)
        self.peak_in_flight = budget.peak
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        # large requests are submitted at once, small ones batched: restore request order
        order = [positions[id(request)] for batch in submitted for request in batch]
        results = [result for future in futures for result in future.result()]
        return [result for _, result in sorted(zip(order, results, strict=True), key=_first)]


VERIFY_WINDOW = 1 << 20
"""A checked read from storage that reads straight into memory (local disk) goes in
windows of this many bytes, all read through one :meth:`PathType.open_reader`, each
checksummed right after it is read, while its bytes are still in the CPU's cache: a
second pass over a 16 MiB piece reads it back from memory. Measured (docs/design.md,
"Checksums"): loading the 1 GiB benchmark mix from ``/dev/shm``, checking in windows
added 7% where one pass added 14%; windows of 256 KiB cost more system calls than they
save."""


def _read_checked(
    storage: EngineStorage,
    key: str,
    request: ReadRequest,
    targets: Sequence[memoryview],
    *,
    windowed: bool,
) -> int:
    """Read ``request`` into ``targets`` and return the checksum of what was read (by
    the request's algorithm); ``windowed``: in windows of :data:`VERIFY_WINDOW`."""
    checksum = checksum_of(request.algorithm)
    if not windowed or request.nbytes <= VERIFY_WINDOW:
        storage.read_into(key, request.offset, targets)
        return checksum(targets)
    with storage.open_reader(key) as source:  # one open for every window
        views = [byte_view(target) for target in targets]
        return _read_in_windows(source, request.offset, views, checksum)


def _read_in_windows(
    source: PositionalReader,
    offset: int,
    views: Sequence[memoryview],
    checksum: ChecksumFunction,
) -> int:
    """Read ``views`` from ``offset`` of ``source`` in windows of
    :data:`VERIFY_WINDOW`, each checksummed right after it is read (still in cache);
    the checksum of them all."""
    value = 0
    # as little Python as can be between the calls that let go of the GIL: the I/O
    # threads share it, and a thread back from a read waits for it
    for window in windows(views, VERIFY_WINDOW):
        source.read_into(offset, window)
        value = checksum(window, value)
        offset += VERIFY_WINDOW  # every window is full but the last
    return value


def _read_ranges_checked(
    storage: EngineStorage,
    key: str,
    request: ReadRequest,
    targets: Sequence[memoryview],
    *,
    windowed: bool,
) -> None:
    """Read ``request`` into ``targets`` and check each against its :class:`RangeCheck`
    (``request.checks``); ``windowed``: each range in windows of :data:`VERIFY_WINDOW`
    through one reader, else all in one read and each range checked after it."""
    checks = request.checks or ()
    checksum = checksum_of(request.algorithm)
    values: list[int | None]
    if not windowed:
        storage.read_into(key, request.offset, targets)
        values = [
            None if expected is None else checksum([target])
            for target, expected in zip(targets, checks, strict=True)
        ]
    else:
        values = []
        offset = request.offset
        with storage.open_reader(key) as source:
            for target, expected in zip(targets, checks, strict=True):
                view = byte_view(target)
                if expected is None:
                    source.read_into(offset, [view])
                    values.append(None)
                    offset += view.nbytes
                    continue
                values.append(_read_in_windows(source, offset, [view], checksum))
                offset += view.nbytes
    position = request.offset
    for target, expected, found in zip(targets, checks, values, strict=True):
        if expected is not None and found != expected.crc:
            raise CorruptCheckpointError(
                f"the checksum ({request.algorithm}) of the {target.nbytes} bytes at offset "
                f"{position} differs from the one recorded in the manifest",
                url=storage.display_url,
                file=request.file or key,
                blob=expected.blob,
                chunk=expected.chunk,
            )
        position += target.nbytes


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def _join(prefix: str, key: str) -> str:
    return resolve_key(prefix, key)


def _annotated(perform: Callable[[RequestT], R], request: RequestT) -> R:
    try:
        return perform(request)
    except Exception as error:
        if request.blob is not None and not isinstance(error, CorruptCheckpointError):
            where = f"blob {request.blob!r}" + (
                f" chunk {request.chunk}" if request.chunk is not None else ""
            )
            error.add_note(f"while moving {where} ({request.key})")
        raise
