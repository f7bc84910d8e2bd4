"""Asynchronous saves: snapshot the blobs into staging buffers, write in the background.

Two halves, each with one background thread:

* **On each node** (the process holding the workspace: this one under a
  ``LocalSession``, the Dask worker under a ``DaskSession``), :func:`stage_node` copies
  the listed blobs into a reusable :class:`~ckptstore.io.StagingPool` slot and queues the
  write of that copy (checksums, data, fsync, manifest) on the node's writer thread. It
  returns a ticket at once; the training task may then change the live arrays.
  :func:`await_node_save` waits for a ticket's write.
* **On the driver**, :class:`AsyncSaver` runs the snapshot group (blocking: the copy
  only), then, on its own thread, the group awaiting every node's write, the commit
  (once every node succeeded), the catalog update, and the caller's after-commit work
  (stats, retention). :class:`SaveFuture` is the handle on all of it.

Ordering and back-pressure: the driver keeps at most ``max_in_flight`` saves
unfinished (a new save first waits for the oldest), and each node has that many
staging slots. An epoch becomes visible only when its commit record is written, after
every node's data is durable, exactly as for a synchronous save.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(3)
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> future = manager.save_async(3, session)  # returns once the blobs are copied
    >>> session.workspace("trainer_0")["w"] += 1  # ...train epoch 4...
    >>> [stats.epoch for stats in future.result()]  # raises SaveFailedError if it failed
    [3]
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from ckptstore.checkpoint._node_tasks import blobs_to_save, save_arrays
from ckptstore.checkpoint._peer_copies import note_saved
from ckptstore.errors import (
    CorruptCheckpointError,
    SaveFailedError,
    is_disk_full,
    is_permanent,
)
from ckptstore.execution import Runnable, Session, Workspace
from ckptstore.io import StagingPool, lower_thread_priority
from ckptstore.protocol import CheckpointLocation
from ckptstore.records import NodeStats

__all__ = ["AsyncSaver", "SaveFuture", "await_node_save", "stage_node"]

log = logging.getLogger(__name__)


class _Worker:
    """One daemon thread running queued jobs in order, ``nice`` levels below the thread
    that starts it (:func:`~ckptstore.io.lower_thread_priority`: so are the I/O threads
    it starts). Daemon: a process that exits (or is interrupted and gives up) abandons
    an unfinished write, which is never committed and so never resumed from."""

    def __init__(self, name: str, nice: int = 0) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._nice = nice
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((job, future))
        return future

    def close(self) -> None:
        """End the thread once the jobs queued before this call have run."""
        self._jobs.put(None)

    def _loop(self) -> None:
        lower_thread_priority(self._nice)
        while (queued := self._jobs.get()) is not None:
            job, future = queued
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as error:  # handed to whoever waits on the future
                    future.set_exception(error)
            # let go of the job before waiting for the next: its closure holds the session
            # it saved from, and so every blob of its workspaces
            del queued, job, future


# -- node side ------------------------------------------------------------------------


class _NodeWriter:
    """A node's staging pool and writer thread in this process."""

    def __init__(self, node: str, slots: int, nice: int) -> None:
        self.pool = StagingPool(slots)
        self.worker = _Worker(f"ckptstore-save-{node}", nice)


_lock = threading.Lock()
_writers: dict[tuple[str, int, int], _NodeWriter] = {}
"""A node's writer in this process, by node, slots and nice level; not by location: its
staging buffers are kept for the next save, and a process saving to one new location
after another (a sweep of runs) would otherwise keep a copy of its state for each."""
_tickets: dict[int, Future[NodeStats]] = {}
_ticket_ids = itertools.count(1)


def _writer(node: str, slots: int, nice: int) -> _NodeWriter:
    key = (node, slots, nice)
    with _lock:
        writer = _writers.get(key)
        if writer is None:
            writer = _writers[key] = _NodeWriter(node, slots, nice)
        return writer


def stage_node(
    ws: Workspace,
    *,
    location: CheckpointLocation,
    node: str,
    epoch: int,
    names: Sequence[str],
    slots: int = 1,
    retries: int = 0,
    backoff: float = 0.5,
    nice: int = 0,
) -> int:
    """Copy the listed blobs into a staging slot (waiting for a free one: the node's
    back-pressure) and queue their write (:func:`save_arrays`: uncommitted, as every
    node's part of a save); returns the ticket :func:`await_node_save` takes.

    The write is retried ``retries`` times on storage errors, from the same staged copy,
    on a writer thread ``nice`` levels below the calling thread's priority.
    """
    arrays = blobs_to_save(ws, node, epoch, names)
    note_saved(location, node, epoch)
    writer = _writer(node, slots, nice)
    slot = writer.pool.acquire()
    try:
        staged = slot.stage(arrays)
    except BaseException:
        writer.pool.release(slot)
        raise

    def write() -> NodeStats:
        try:
            return _write_with_retries(staged, location, node, epoch, retries, backoff)
        finally:
            writer.pool.release(slot)

    future: Future[NodeStats] = writer.worker.submit(write)
    with _lock:
        ticket = next(_ticket_ids)
        _tickets[ticket] = future
    return ticket


def _write_with_retries(
    staged: dict[str, Any],
    location: CheckpointLocation,
    node: str,
    epoch: int,
    retries: int,
    backoff: float,
) -> NodeStats:
    for attempt in range(retries + 1):
        try:
            stats = save_arrays(staged, location=location, node=node, epoch=epoch)
        except (OSError, CorruptCheckpointError) as error:
            if attempt == retries or is_permanent(error) or is_disk_full(error):
                raise  # retrying at once cannot fix a permanent error or a full disk
            problem = f"{type(error).__name__}: {error}"
        else:
            if stats.error is None or attempt == retries:
                return stats
            problem = stats.error
        log.warning(
            "Background save of %s.%d failed (attempt %d of %d), retrying: %s",
            node,
            epoch,
            attempt + 1,
            retries + 1,
            problem,
        )
        time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def await_node_save(ws: Workspace, *, ticket: int, node: str, epoch: int, url: str) -> NodeStats:
    """Wait for the background write :func:`stage_node` queued as ``ticket`` on this
    process; its stats, or the error it raised. On a Dask worker the wait gives its
    thread slot back (``secede``), so the node's training tasks keep running."""
    with _lock:
        future = _tickets.pop(ticket, None)
    if future is None:
        raise SaveFailedError(
            epoch,
            url,
            {
                node: "the process that staged this save no longer holds it (it restarted); "
                "the epoch was not committed"
            },
        )
    with _seceded():
        return future.result()


@contextlib.contextmanager
def _seceded() -> Iterator[None]:
    """Leave the Dask worker's thread pool while blocking (no-op outside a worker)."""
    try:
        from distributed import get_worker, rejoin, secede

        get_worker()
    except (ImportError, ValueError):
        yield
        return
    secede()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        rejoin()  # type: ignore[no-untyped-call]


# -- driver side ----------------------------------------------------------------------


class SaveFuture:
    """The handle on one asynchronous save, like a :class:`concurrent.futures.Future`.

    It completes when the epoch is committed and the catalog updated (result: each
    node's :class:`~ckptstore.records.NodeStats`), or when the save failed (the error, typically
    :class:`~ckptstore.errors.SaveFailedError`; the epoch is then not committed). An
    error nobody looked at (with :meth:`result`, :meth:`wait` or :meth:`exception`) is
    raised by the manager's next ``save_async`` or ``wait_for_saves``.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(3)
        >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> future = manager.save_async(5, session)
        >>> future.wait()          # blocks; raises if the save failed
        >>> future.done()
        True
        >>> future.result()[0].nbytes
        24
    """

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self._future: Future[list[NodeStats]] = Future()
        self._observed = False

    def __repr__(self) -> str:
        if not self._future.done():
            state = "pending"
        elif self._future.exception() is not None:
            state = "failed"
        else:
            state = "committed"
        return f"SaveFuture(epoch={self.epoch}, {state})"

    def done(self) -> bool:
        """Whether the save finished (committed or failed)."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> list[NodeStats]:
        """Each node's stats once the epoch is committed; raises the save's error, or
        :class:`TimeoutError` after ``timeout`` seconds."""
        self._observed = True
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The save's error (None if it committed), waiting up to ``timeout`` seconds."""
        self._observed = True
        return self._future.exception(timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the save finished; raises its error if it failed."""
        self.result(timeout)

    @property
    def observed(self) -> bool:
        """Whether someone asked for the outcome (so an error is not raised again)."""
        return self._observed


class AsyncSaver:
    """A manager's asynchronous saves: at most ``max_in_flight`` unfinished at once,
    finished on one background thread in the order they were started.

    Example::

        >>> from ckptstore import LocalSession, Task
        >>> saver = AsyncSaver()
        >>> stage = lambda: Task(lambda ws: "ticket")  # the snapshot, run in the session
        >>> finish = lambda tickets: []  # the write, on the background thread
        >>> future = saver.submit(3, LocalSession(), stage, finish, 1)
        >>> saver.settle()  # waits for every save in flight
        >>> future.result()
        []
    """

    def __init__(self) -> None:
        self._pending: list[SaveFuture] = []
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    def submit(
        self,
        epoch: int,
        session: Session,
        stage: Callable[[], Runnable],
        finish: Callable[[list[Any]], list[NodeStats]],
        max_in_flight: int,
    ) -> SaveFuture:
        """Wait until fewer than ``max_in_flight`` saves are unfinished (raising an
        unobserved failure of an earlier one), run ``stage()`` in ``session`` (the
        snapshot: blocking), then ``finish(tickets)`` on the background thread."""
        self.settle(max_in_flight - 1)
        tickets = session.run(stage())
        future = SaveFuture(epoch)
        inner = future._future
        with self._lock:
            if self._worker is None:
                self._worker = _Worker("ckptstore-commit")
                weakref.finalize(self, self._worker.close)  # no thread outlives its saver
            worker = self._worker
            self._pending.append(future)

        def job() -> None:
            try:
                inner.set_result(finish(tickets))
            except BaseException as error:
                error.add_note(f"raised by the background save of epoch {epoch}")
                inner.set_exception(error)

        worker.submit(job)
        return future

    def pending(self) -> list[SaveFuture]:
        """The saves unfinished, or failed with nobody having observed it, oldest first."""
        with self._lock:
            self._pending = [f for f in self._pending if not (f.done() and f.observed)]
            return list(self._pending)

    def settle(self, keep: int = 0, timeout: float | None = None) -> None:
        """Collect finished saves and wait for the oldest until at most ``keep`` are
        unfinished; raises the first failure nobody observed (after collecting it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                done = [future for future in self._pending if future.done()]
            for future in done:  # one at a time: a later failure stays for the next call
                with self._lock:
                    self._pending.remove(future)
                if not future.observed:
                    error = future.exception()
                    if error is not None:
                        raise error
            with self._lock:
                waiting = self._pending[0] if len(self._pending) > keep else None
            if waiting is None:
                return
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            waiting._future.exception(remaining)  # waits; raises TimeoutError when due
