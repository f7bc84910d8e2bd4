"""Tiers: several checkpoint roots, fastest first.

A manager given several roots (``["/mnt/nvme/run", "s3://bucket/run"]``) saves and
commits on the first one at its speed; every later root receives a verified copy of
each committed epoch in the background, in order, committed there with its own
create-once commit records. Each root stays an ordinary checkpoint root: a one-root
manager, the CLI and the reading guide read it alone.

Copies are :class:`~ckptstore.plugin.UploadTaskGroupBuilder` groups (a URL becomes the
built-in ``copy`` builder, which verifies every checksum before it commits), run on one
background thread per manager. A copy that fails is retried, then reported
(``checkpoint_copy_failed``, to the metadata handler and every reporter) and handed to
the runner, which counts it; the epoch stays committed on the first root, where a
resume finds it. Retention runs per root, and never lets the first root drop an epoch
a later root has not received yet.

Reading goes the other way: the newest epoch committed on any root, each node read
from the first root that holds it committed and intact (a damaged or missing node on a
fast root is read from a slower one; a copy is visible only once committed, so never
half done).

Example::

    >>> from ckptstore import LocalSession
    >>> from ckptstore.checkpoint import CheckpointManager
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager(["fast", "durable"], "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))  # committed on "fast"; copied in the background
    >>> manager.tiers.wait()
    >>> manager.tiers.holding(1, ["trainer_0"])
    ['fast', 'durable']
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, runtime_checkable

from ckptstore import protocol
from ckptstore.checkpoint._retention import RetentionPolicy, enforce, retain_after_save
from ckptstore.errors import (
    CorruptCheckpointError,
    JobConfigurationError,
    TierConflictError,
    TierCopyFailedError,
    is_permanent,
)
from ckptstore.execution import LocalSession, Workspace
from ckptstore.plugin import PathType, UploadTaskGroupBuilder, get_registry
from ckptstore.protocol import CheckpointLocation, CommitListing
from ckptstore.records import NodeStats

if TYPE_CHECKING:
    from ckptstore.checkpoint._manager import ManagerBase

__all__ = [
    "DEFAULT_COPY_RETRIES",
    "ReadableTier",
    "RootLike",
    "TierCopyFailure",
    "TieredListing",
    "Tiers",
    "first_serving",
    "from_fastest",
    "split_retention",
    "split_roots",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_COPY_RETRIES = 3
"""How many times a failed background copy is retried (backoff doubling from 0.5 s)."""

PAUSE_LIMIT = 30.0
"""The longest a save keeps the copy's child process stopped (``pause_during_saves``):
a save that fails never ends the pause itself."""

RootLike = str | CheckpointLocation | UploadTaskGroupBuilder
"""One root of a manager: a URL, an opened location (with its own storage options), or
(for a later root) an upload builder."""


@runtime_checkable
class ReadableTier(Protocol):
    """An upload builder whose destination is a checkpoint root (``storage``): it can be
    listed, checked and resumed from. A builder without one is a write-only tier."""

    @property
    def storage(self) -> PathType: ...


@dataclass(frozen=True)
class TierCopyFailure:
    """An epoch a later root did not receive (after the retries), and why."""

    root: str
    epoch: int
    error: BaseException


def split_roots(
    roots: Sequence[RootLike], open_first: Callable[[str], CheckpointLocation]
) -> tuple[CheckpointLocation, list[UploadTaskGroupBuilder]]:
    """The first root opened (a URL through ``open_first``) and the later ones as upload
    builders (a URL or a location becomes the registered ``copy`` builder)."""
    if not roots:
        raise JobConfigurationError("a manager needs at least one checkpoint root")
    first = roots[0]
    if isinstance(first, UploadTaskGroupBuilder):
        raise JobConfigurationError(
            "the first root is where saves commit: give a URL or a CheckpointLocation, not "
            f"an upload builder ({first!r})"
        )
    location = first if isinstance(first, CheckpointLocation) else open_first(str(first))
    return location, [_builder(root) for root in roots[1:]]


def _builder(root: RootLike) -> UploadTaskGroupBuilder:
    if isinstance(root, UploadTaskGroupBuilder):
        return root
    copy = cast("Callable[..., UploadTaskGroupBuilder]", get_registry().upload_builders["copy"])
    if isinstance(root, CheckpointLocation):
        return copy(root.prefix, path_type=root.path_type, storage_options=root.storage_options)
    return copy(str(root))


def split_retention(
    retention: RetentionPolicy | Sequence[RetentionPolicy | None] | None, roots: int
) -> tuple[RetentionPolicy | None, list[RetentionPolicy | None]]:
    """The first root's policy and the later roots': one policy applies to every root, a
    list gives one per root (``None``: keep everything there)."""
    if retention is None or isinstance(retention, RetentionPolicy):
        return retention, [retention] * (roots - 1)
    policies = list(retention)
    if len(policies) != roots:
        raise JobConfigurationError(
            f"retention lists {len(policies)} policies for {roots} roots: give one per root "
            "(None keeps everything on that root), or one policy for all"
        )
    return policies[0], policies[1:]


def _url(builder: UploadTaskGroupBuilder) -> str:
    if isinstance(builder, ReadableTier):
        return builder.storage.display_url
    return repr(builder)


@dataclass
class _Tier:
    builder: UploadTaskGroupBuilder
    retention: RetentionPolicy | None
    url: str
    newest: int | None = None  # the newest epoch copied there by this process
    shared: bool = False  # another job's epoch was found there: its retention stays off


@dataclass
class Tiers:
    """The later roots of a manager and the background thread copying to them.

    ``manager`` is the one saving to the first root (its node names and location are
    what the builders copy from). ``retries`` and ``backoff`` govern each copy.
    """

    manager: ManagerBase
    builders: Sequence[UploadTaskGroupBuilder]
    retention: Sequence[RetentionPolicy | None] = ()
    retries: int = DEFAULT_COPY_RETRIES
    backoff: float = 0.5
    _tiers: list[_Tier] = field(init=False)
    copy_every_epoch: bool = False
    """Copy every committed epoch, even when the copies fall behind the saves; by
    default, when several epochs wait, only the newest is copied (the later roots then
    lag by one copy, not by a growing queue)."""
    copy_in_process: bool = False
    """Run the copies in a child process (spawned at the first copy, then reused)
    instead of on a thread of this one: their Python work (HTTP requests, checksums)
    then never holds the GIL of the process that trains and saves. The builder must be
    picklable (the built-in ``copy`` builder is)."""
    copy_niceness: int = 0
    """Added to the nice value of the copying thread (or child process): above 0, the
    training and its saves win the CPU when both want it (Linux sets it per thread; the
    threads a copy starts inherit it)."""
    pause_during_saves: bool = False
    """With ``copy_in_process``: stop the copy's child process (``SIGSTOP``) while a
    synchronous save runs on the first root, and let it go on (``SIGCONT``) once the
    save committed (at the latest after :data:`PAUSE_LIMIT` seconds)."""
    _queue: queue.Queue[tuple[int, tuple[str, ...]]] = field(init=False)
    _pending: dict[int, int] = field(init=False)
    _failures: list[TierCopyFailure] = field(init=False)
    _lock: threading.Condition = field(init=False)
    _thread: threading.Thread | None = field(init=False, default=None)
    _pool: ProcessPoolExecutor | None = field(init=False, default=None)
    _child: int | None = field(init=False, default=None)
    _paused: threading.Timer | None = field(init=False, default=None)
    _newest_committed: int | None = field(init=False, default=None)
    first_retention: RetentionPolicy | None = field(init=False, default=None)
    """The first root's policy, as the runner last applied it: applied again once the
    epochs it kept for the later roots are copied."""

    def __post_init__(self) -> None:
        policies = list(self.retention) or [None] * len(self.builders)
        self._tiers = [
            _Tier(builder, policy, _url(builder))
            for builder, policy in zip(self.builders, policies, strict=True)
        ]
        self._queue = queue.Queue()
        self._pending = {}
        self._failures = []
        self._lock = threading.Condition()

    # -- what the first root's commit calls -----------------------------------------

    @property
    def roots(self) -> list[str]:
        """Every root's URL, fastest (the first) first, without credentials."""
        return [self.manager.location.storage.display_url] + [tier.url for tier in self._tiers]

    def after_commit(self, epoch: int, nodes: Iterable[str]) -> None:
        """Queue the copy of ``epoch`` (just committed on the first root) to every later
        root; returns at once."""
        with self._lock:
            self._pending[epoch] = self._pending.get(epoch, 0) + 1
            self._newest_committed = max(epoch, self._newest_committed or epoch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="ckptstore-tiers", daemon=True
                )
                self._thread.start()
        self._queue.put((epoch, tuple(nodes)))

    def pause(self) -> bool:
        """A save starts: stop the copy's child process (with ``pause_during_saves``
        and ``copy_in_process``; otherwise nothing). Whether this call stopped it."""
        if not (self.pause_during_saves and self.copy_in_process):
            return False
        with self._lock:
            child = self._child
            if child is None or self._paused is not None:
                return False
            self._paused = threading.Timer(PAUSE_LIMIT, self.resume)
            self._paused.daemon = True
            self._paused.start()
        with suppress(ProcessLookupError):
            os.kill(child, signal.SIGSTOP)
        return True

    def resume(self) -> None:
        """A save ended: let a copy :meth:`pause` stopped go on."""
        with self._lock:
            timer, self._paused = self._paused, None
            child = self._child
        if timer is None:
            return
        timer.cancel()
        if child is not None:
            with suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """:meth:`pause` for the ``with`` block (an asynchronous save's snapshot: what
        the training waits for), then :meth:`resume` if this block paused."""
        stopped = self.pause()
        try:
            yield
        finally:
            if stopped:
                self.resume()

    def in_transit(self) -> set[int]:
        """Epochs committed on the first root and not yet copied (or given up on): the
        first root's retention keeps them."""
        with self._lock:
            return set(self._pending)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every queued copy finished (copied or given up on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.resume()
        with self._lock:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"copies of epoch(s) {sorted(self._pending)} unfinished")
                self._lock.wait(remaining)

    def take_failures(self) -> list[TierCopyFailure]:
        """The copies given up on since the last call, oldest first."""
        with self._lock:
            failures, self._failures = self._failures, []
        return failures

    def newest_copied(self) -> dict[str, int | None]:
        """For each later root, the newest epoch this process copied there (``None``:
        none yet)."""
        return {tier.url: tier.newest for tier in self._tiers}

    def lag(self) -> dict[str, int | None]:
        """For each later root, how many epochs it is behind the newest one committed on
        the first root (``None``: nothing copied there yet)."""
        with self._lock:
            newest = self._newest_committed
        return {
            tier.url: None if tier.newest is None or newest is None else newest - tier.newest
            for tier in self._tiers
        }

    # -- the background thread -------------------------------------------------------

    def _work(self) -> None:
        if self.copy_niceness and not self.copy_in_process:
            _lower_priority(self.copy_niceness, threading.get_native_id())
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():  # queued while the previous copy ran
                batch.append(self._queue.get_nowait())
            epochs = [epoch for epoch, _ in batch]
            todo = batch if self.copy_every_epoch else [max(batch, key=lambda item: item[0])]
            skipped = sorted(set(epochs) - {epoch for epoch, _ in todo})
            if skipped:
                log.info(
                    "Not copying epoch(s) %s to the later roots: epoch %d was saved before "
                    "their turn came (the copies are slower than the saves)",
                    skipped,
                    todo[-1][0],
                )
            try:
                for epoch, nodes in todo:
                    for tier in self._tiers:
                        self._copy_retrying(tier, epoch, nodes)
            finally:
                self._done(epochs, todo[-1])

    def _done(self, epochs: list[int], newest: tuple[int, tuple[str, ...]]) -> None:
        """The queued ``epochs`` are copied or given up on; the first root's policy may
        now let them go."""
        with self._lock:
            for epoch in epochs:
                self._pending[epoch] -= 1
                if not self._pending[epoch]:
                    del self._pending[epoch]
            policy = self.first_retention
            last = not self._pending
        if policy is not None and last:  # what the first root kept for the copies
            retain_after_save(self.manager, policy, newest[0])
        with self._lock:
            self._lock.notify_all()

    def _copy_retrying(self, tier: _Tier, epoch: int, nodes: Sequence[str]) -> bool:
        attempts = 1 + self.retries
        for attempt in range(1, attempts + 1):
            try:
                self._copy(tier, epoch, nodes)
                return True
            except Exception as error:
                final = (
                    attempt == attempts
                    or isinstance(error, TierConflictError)
                    or (isinstance(error, OSError) and is_permanent(error))
                )
                log.warning(
                    "Copy of epoch %d to %s failed (attempt %d of %d): %s",
                    epoch,
                    tier.url,
                    attempt,
                    attempts,
                    error,
                )
                if final:
                    self._failed(tier, epoch, nodes, error)
                    return False
                time.sleep(self.backoff * 2 ** (attempt - 1))
        return False  # pragma: no cover (the loop returns)

    def _copy(self, tier: _Tier, epoch: int, nodes: Sequence[str]) -> None:
        builder = tier.builder
        if isinstance(builder, ReadableTier) and self._holds_ours(tier, epoch, nodes):
            tier.newest = max(epoch, tier.newest or epoch)
            return  # copied by an earlier run: committed there, never copied twice
        started = time.perf_counter_ns()
        if self.copy_in_process:
            results = self._run_in_process(builder, epoch, nodes)
        else:
            results = LocalSession().run(builder.build(epoch, self.manager))
        tier.newest = max(epoch, tier.newest or epoch)
        stats = {s.db_path: s for s in results if isinstance(s, NodeStats)}
        log.info(
            "Copied epoch %d to %s in %.2f s",
            epoch,
            tier.url,
            (time.perf_counter_ns() - started) / 1e9,
        )
        self.manager.report("checkpoint_copy", stats)
        if tier.retention is not None and isinstance(builder, ReadableTier):
            self._retain(tier, builder.storage, epoch, nodes)

    def _run_in_process(
        self, builder: UploadTaskGroupBuilder, epoch: int, nodes: Sequence[str]
    ) -> list[object]:
        """The copy's groups run in the child process (a new one if the last died:
        its half-done copy was never committed, and this attempt redoes it)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_copy_child,
                initargs=(self.copy_niceness, os.getpid()),
            )
            self._child = self._pool.submit(os.getpid).result()
        try:
            return self._pool.submit(
                _copy_in_child, builder, epoch, self.manager.location, tuple(nodes)
            ).result()
        except BrokenProcessPool:
            self._pool.shutdown(wait=False)
            self._pool, self._child = None, None
            raise

    def _holds_ours(self, tier: _Tier, epoch: int, nodes: Sequence[str]) -> bool:
        """Whether ``tier`` holds ``epoch`` of ``nodes`` as committed on the first root
        (the same manifests: a copy keeps them byte for byte). Raises
        :class:`~ckptstore.errors.TierConflictError` if a node is committed there with
        another manifest: another job's epoch, never replaced; ``tier`` is then marked
        shared, and its retention stays off for the rest of the job."""
        assert isinstance(tier.builder, ReadableTier)
        there = protocol.read_commit(tier.builder.storage, epoch, nodes)
        if there is None:
            return False
        ours = protocol.read_commit(self.manager.location.storage, epoch, nodes)
        foreign = [
            node
            for node, commit in there.nodes.items()
            if ours is None
            or node not in ours.nodes
            or ours.nodes[node].manifest_crc32c != commit.manifest_crc32c
        ]
        if foreign:
            if not tier.shared:
                log.error(
                    "%s holds another job's epoch %d: two jobs write there; no retention "
                    "runs there from this job any more",
                    tier.url,
                    epoch,
                )
            tier.shared = True
            raise TierConflictError(tier.url, epoch, foreign)
        return set(there.nodes) == set(nodes)

    def _retain(self, tier: _Tier, storage: PathType, epoch: int, nodes: Sequence[str]) -> None:
        if tier.shared:
            return  # another job writes there: its epochs are not this job's to delete
        try:
            assert tier.retention is not None
            enforce(storage, tier.retention, upto=epoch, protect={epoch}, nodes=nodes)
        except (OSError, CorruptCheckpointError) as error:
            log.warning("Retention on %s after epoch %d failed: %s", tier.url, epoch, error)

    def _failed(self, tier: _Tier, epoch: int, nodes: Sequence[str], error: BaseException) -> None:
        message = f"{type(error).__name__}: {error}"
        stats = {
            f"{tier.url.rstrip('/')}/{node}": NodeStats(
                node,
                epoch,
                f"{tier.url.rstrip('/')}/{node}",
                "checkpoint_copy_failed",
                error=message,
            )
            for node in nodes
        }
        self.manager.report("checkpoint_copy_failed", stats)
        with self._lock:
            self._failures.append(TierCopyFailure(tier.url, epoch, error))
        log.error(
            "Gave up copying epoch %d to %s (%s); the newest epoch there is %s, "
            "committed on the first root: %s",
            epoch,
            tier.url,
            message,
            tier.newest,
            self.manager.location.storage.display_url,
        )

    # -- the end of training and the start of the next -------------------------------

    def ensure(self, epoch: int, nodes: Sequence[str]) -> None:
        """Return once every root holds ``epoch`` (waiting for the background copies,
        then copying again where it is missing), or raise
        :class:`~ckptstore.errors.TierCopyFailedError` naming the first root that does
        not."""
        self.wait()
        for tier in self._tiers:
            if tier.newest is not None and tier.newest >= epoch:
                continue
            if not self._copy_retrying(tier, epoch, nodes):
                failure = self.take_failures()[-1]
                raise TierCopyFailedError(
                    epoch, tier.url, dict.fromkeys(nodes, str(failure.error))
                ) from failure.error

    def catch_up(self, nodes: Sequence[str], listing: CommitListing) -> None:
        """At the start of a job: queue the newest epoch complete on the first root
        again if a later root lacks it (an earlier run was stopped mid-copy: the copy
        is redone; a half-done one was never visible)."""
        newest = listing.newest_complete(nodes)
        if newest is None:
            return
        missing = [tier for tier in self._tiers if not self._known_to_hold(tier, newest, nodes)]
        if missing:
            log.info(
                "Epoch %d is not on %s yet: copying it", newest, [tier.url for tier in missing]
            )
            self.after_commit(newest, nodes)

    def _known_to_hold(self, tier: _Tier, epoch: int, nodes: Sequence[str]) -> bool:
        """Whether ``tier`` is known to hold ``epoch`` (unreachable: not known, so the
        copy is queued and its own retries and reports deal with the outage)."""
        if not isinstance(tier.builder, ReadableTier):
            return False
        try:
            return self._holds_ours(tier, epoch, nodes)
        except TierConflictError:
            return False  # the copy, queued, reports it
        except (OSError, CorruptCheckpointError) as error:
            log.warning("Cannot tell whether %s holds epoch %d: %s", tier.url, epoch, error)
            return False

    # -- reading -----------------------------------------------------------------------

    def read_locations(self) -> list[CheckpointLocation]:
        """Every readable root as a location, fastest first (the first root first)."""
        first = self.manager.location
        later = [
            CheckpointLocation(
                tier.builder.storage,
                first.db_type,
                tier.builder.storage.default_io.with_environment(),
                tier.url,
            )
            for tier in self._tiers
            if isinstance(tier.builder, ReadableTier)
        ]
        return [first, *later]

    def holding(self, epoch: int, nodes: Sequence[str]) -> list[str]:
        """The roots where ``epoch`` is committed on every node of ``nodes``."""
        return [
            location.storage.display_url
            for location in self.read_locations()
            if _holds(location, epoch, nodes)
        ]

    def listing(self, first: CommitListing) -> TieredListing:
        """What is committed on every readable root, ``first`` being the first root's. A
        later root that cannot be listed is left out, loudly: the job resumes from the
        others (its copies report the outage)."""
        later = []
        for location in self.read_locations()[1:]:
            try:
                later.append(CommitListing.of(location))
            except OSError as error:
                log.warning(
                    "Cannot list %s (%s): resuming from the other roots",
                    location.storage.display_url,
                    error,
                )
        return TieredListing(first, later)


def _start_copy_child(niceness: int, parent: int) -> None:
    """Start the copy's child process: it dies with the job, at a lower priority.

    Linux sends it SIGKILL when the job's process dies (``PR_SET_PDEATHSIG``), so a
    child left stopped by ``pause_during_saves`` never outlives a killed job. A copy cut
    short this way was never committed: the next run redoes it."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the job died before the request took effect
            os._exit(1)
    _lower_priority(niceness, 0)


_PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when its parent dies."""


def _lower_priority(niceness: int, thread: int) -> None:
    """Add ``niceness`` to the nice value of ``thread`` (0: the calling process)."""
    if niceness:
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + niceness)


def _copy_in_child(
    builder: UploadTaskGroupBuilder, epoch: int, source: CheckpointLocation, nodes: tuple[str, ...]
) -> list[object]:
    """One copy, in the child process: the builder's groups against a manager of the
    first root for ``nodes`` (what a builder reads its source from)."""
    from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager

    manager = MultiNodeCheckpointManager([source], source.db_type)
    manager._create_managers(nodes)
    return LocalSession().run(builder.build(epoch, manager))


def _holds(where: CheckpointLocation | PathType, epoch: int, nodes: Iterable[str]) -> bool:
    wanted = set(nodes)
    return protocol.committed_nodes(where, epoch, wanted) == wanted


@dataclass(frozen=True)
class TieredListing:
    """Committed epochs over several roots: the newest epoch complete on any of them.
    Writer fences are the first root's (the only one a job writes directly)."""

    first: CommitListing
    later: Sequence[CommitListing]

    def newest_complete(self, nodes: Iterable[str], *, before: int | None = None) -> int | None:
        names = list(nodes)
        found = [
            listing.newest_complete(names, before=before) for listing in (self.first, *self.later)
        ]
        known = [epoch for epoch in found if epoch is not None]
        return max(known) if known else None

    def newest_listed(self, node: str) -> int | None:
        return self.first.newest_listed(node)


def from_fastest(
    ws: Workspace,
    *,
    work: Callable[..., object],
    locations: Sequence[CheckpointLocation],
    node: str,
    epoch: int,
    **arguments: object,
) -> object:
    """``work(ws, location=..., node=..., epoch=..., **arguments)`` on the first of
    ``locations`` serving ``node``'s checkpoint of ``epoch`` (:func:`first_serving`)."""
    return first_serving(
        locations,
        lambda location: work(ws, location=location, node=node, epoch=epoch, **arguments),
        f"node {node} of epoch {epoch}",
    )


def first_serving(
    locations: Sequence[CheckpointLocation], read: Callable[[CheckpointLocation], T], what: str
) -> T:
    """``read(location)`` on the first of ``locations`` where it succeeds: a root where
    ``what`` is damaged or missing is passed over (logged), never a partial copy (a copy
    is read only once committed). Raises the first root's error if no root serves it."""
    errors: list[BaseException] = []
    for location in locations:
        try:
            return read(location)
        except (CorruptCheckpointError, FileNotFoundError) as error:
            if len(locations) > 1:
                log.warning(
                    "%s cannot be read from %s (%s)%s",
                    what[:1].upper() + what[1:],
                    location.storage.display_url,
                    error,
                    "; trying the next root" if location is not locations[-1] else "",
                )
            errors.append(error)
    raise errors[0]
