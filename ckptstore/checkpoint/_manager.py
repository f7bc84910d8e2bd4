"""CheckpointManager: checkpoints one node's state, with Caffe2's methods and call shapes.

Example::

    >>> from ckptstore import Job, Node, Task, epoch_limiter
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     done = epoch_limiter(job, 3)
    >>> from ckptstore import JobRunner, LocalSession
    >>> manager = CheckpointManager("ckpt", "trainer_0", "zarr", metadata_handler="json")
    >>> JobRunner(job, manager).train(LocalSession())
    3
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from ckptstore.checkpoint._async_save import AsyncSaver, SaveFuture, await_node_save, stage_node
from ckptstore.checkpoint._node_tasks import (
    NO_HOOKS,
    Hooks,
    NodeWork,
    check_not_committed,
    commit_saves,
    list_blob_names,
    load_node,
    node_exists,
    partial_load,
    read_blob_names,
    run_alone,
    save_node,
)
from ckptstore.checkpoint._retention import RetentionPolicy, retain_after_save
from ckptstore.checkpoint._roots import open_roots
from ckptstore.checkpoint._tiers import (
    RootLike,
    Tiers,
    from_fastest,
    split_retention,
)
from ckptstore.errors import (
    CorruptCheckpointError,
    JobConfigurationError,
    NotRunError,
    SaveFailedError,
)
from ckptstore.execution import Node, Session, Task, TaskGroup, TaskOutput, Workspace
from ckptstore.io import IOSettings
from ckptstore.plugin import (
    DBType,
    MetadataHandler,
    MetadataHandlerLike,
    UploadTaskGroupBuilder,
    get_registry,
)
from ckptstore.protocol import (
    CheckpointLocation,
    CommitListing,
    LeaseFence,
    WriterLease,
    check_can_hold,
    verify_node,
)
from ckptstore.records import ATTEMPT_MARK, NodeStats, db_name, validate_epoch, validate_node_name

__all__ = [
    "BACKGROUND_NICE",
    "DEFAULT_DB_TYPE",
    "CheckpointManager",
    "ManagerBase",
    "StageOptions",
]

log = logging.getLogger(__name__)

# the longest names a save derives from a node's: its attempt directory for a 10-digit
# epoch, and a blob's deepest key in any built-in format (zarr's chunk keys)
_ATTEMPT_SAMPLE = "{node}.9999999999/" + ATTEMPT_MARK + "0123456789ab"
_CHUNK_SAMPLE = "c/0/0/0/0"
_KEPT_COMMITS = 8

DEFAULT_DB_TYPE = "zarr"
BACKGROUND_NICE = 0
"""How many nice levels below the training thread an asynchronous save writes by
default: none (measured: a lower priority only moved the wait from the compute to the
next save; see docs/design.md)."""


@dataclass(frozen=True)
class StageOptions:
    """How an asynchronous save stages and writes on each node: staging slots (saves
    that may be in flight), retries of the background write with their backoff, and how
    many nice levels below the training thread the write runs."""

    slots: int = 1
    retries: int = 0
    backoff: float = 0.5
    nice: int = 0


class ManagerBase(ABC):
    """What single- and multi-node managers share: settings, the metadata handler, and
    reporting of the last operation's stats.

    Example::

        >>> from ckptstore import LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(3)
        >>> manager = CheckpointManager("stats_ckpt", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(1))
        >>> manager.report_checkpoint_stats("checkpoint_save")  # to the handler and plugins
    """

    def __init__(
        self,
        location: CheckpointLocation,
        metadata_handler: str | MetadataHandler | MetadataHandlerLike | None,
        retention: RetentionPolicy | None = None,
        *,
        overwrite: bool = False,
    ) -> None:
        self._location = location
        self.retention = retention
        self.overwrite = overwrite
        """Whether a save may replace an epoch already committed for its nodes (it is
        uncommitted first); otherwise such a save raises ``AlreadyCommittedError``."""
        self._db_prefix = location.prefix
        self._db_type = location.db_type
        self._metadata_handler = get_registry().metadata_handler(metadata_handler)
        self._stats_outputs: list[TaskOutput] = []
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._saver = AsyncSaver()
        self.writer_fence: LeaseFence | None = None
        """The writer lease a runner holds for this manager's saves (set by
        ``JobRunner.train``): each commit checks it and records its generation."""
        self._replace_upto = -1  # saves of epochs up to this one replace damaged ones
        self._legacy_epochs: frozenset[int] | None = None  # from the last listing
        self._committed: dict[int, list[NodeStats]] = {}  # kept by a group's commit
        self.tiers: Tiers | None = None
        """The later roots (given several roots): each committed epoch is copied there
        in the background (see :mod:`ckptstore.checkpoint._tiers`)."""

    @property
    def db_prefix(self) -> str:
        return self._db_prefix

    @property
    def db_type(self) -> DBType:
        return self._db_type

    @property
    def metadata_handler(self) -> MetadataHandler | None:
        """The handler, or ``None``; a Caffe2-style one is wrapped in a
        :class:`~ckptstore.plugin.Caffe2Handler` (the object passed in is its
        ``handler``)."""
        return self._metadata_handler

    @property
    def location(self) -> CheckpointLocation:
        """The opened checkpoint root, format and I/O settings."""
        return self._location

    @property
    def display_url(self) -> str:
        """The checkpoint root, as messages name it (credentials removed)."""
        return self._location.storage.display_url

    # -- what a runner asks before and around saves ------------------------------------

    def saved_nodes(self, job_nodes: Sequence[str]) -> list[str]:
        """The node names a job with ``job_nodes`` files its checkpoints under."""
        return [str(node) for node in job_nodes]

    def check_writable(self) -> None:
        """Raise, typed, if the checkpoint root cannot be written at all."""
        self._location.storage.check_writable()

    def check_can_hold(self) -> None:
        """Raise :class:`~ckptstore.errors.JobConfigurationError` if this manager's
        format cannot be written on its storage (before anything is saved)."""
        check_can_hold(self._location)

    def check_accessible(self, epoch: int) -> None:
        """Before a save of ``epoch``: raise if the handler (else the storage) says
        checkpoints cannot be written now, typed when the cause is permanent, else a
        retryable :class:`~ckptstore.errors.SaveFailedError`."""
        if not self.cp_accessible(epoch=None):
            self.check_writable()  # a permanent cause: typed
            raise SaveFailedError(
                epoch,
                self.display_url,
                dict.fromkeys(self.node_names(), "Checkpoint files cannot be accessed"),
            )

    def check_name_limits(self) -> None:
        """Raise :class:`~ckptstore.errors.InvalidNameError` at init if a node or blob
        name makes a key longer than the storage allows (255-byte local path
        components, 1024-byte S3/GCS object names), instead of failing at every save."""
        storage = self._location.storage
        for node, blobs in self._blob_lists():
            directory = _ATTEMPT_SAMPLE.format(node=node)
            storage.check_key_limits(directory, "node name", node)
            for blob in blobs:
                storage.check_key_limits(f"{directory}/{blob}/{_CHUNK_SAMPLE}", "blob name", blob)

    def _blob_lists(self) -> list[tuple[str, list[str]]]:
        """Each node's name and the blobs its saves write (after :meth:`init`)."""
        return []

    def writer_lease(self, nodes: Sequence[str], ttl: float) -> WriterLease:
        """A writer lease on ``nodes`` under this manager's root (not taken yet)."""
        return WriterLease(self._location, nodes, ttl=ttl)

    def commit_listing(self) -> CommitListing:
        """The commit records under the root, from one listing of its control directory
        (a snapshot: resume asks it). Saves learn from it which epochs have a
        one-document record of earlier versions, so they look for one only there."""
        listing = CommitListing.of(self._location)
        self._legacy_epochs = listing.legacy
        return listing

    def replace_committed(self, upto: int | None = None) -> None:
        """Let later saves replace committed epochs: every epoch (``upto=None``, what
        ``overwrite=True`` does), or those up to ``upto`` (epochs a runner could not
        restore: they hold nothing usable; each replacement is logged)."""
        if upto is None:
            self.overwrite = True
        else:
            self._replace_upto = max(self._replace_upto, upto)

    def _read_location(self, path_prefix: str | None, path_type: str | None) -> CheckpointLocation:
        return self._location.at(path_prefix or self._path_prefix, path_type or self._path_type)

    @abstractmethod
    def node_names(self) -> list[str]:
        """The node names checkpoints are filed under."""

    @abstractmethod
    def init(
        self,
        nodes: Sequence[str] | None = None,
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> Task | TaskGroup:
        """What records the blobs to checkpoint (run it before save or load)."""

    def save(self, epoch: int) -> Task | TaskGroup:
        """What saves every node's blobs as ``epoch`` and commits it once all of them
        succeeded: the one commit path (:meth:`_commit_steps` around each node's
        :func:`save_node`), for one node or many."""
        epoch = validate_epoch(epoch)
        runnable = self._on_every_node(
            lambda manager: manager._save_work(epoch), "checkpoint_save", self._commit_hooks(epoch)
        )
        tasks = [runnable] if isinstance(runnable, Task) else runnable.tasks()
        self._stats_outputs = [task.outputs()[0] for task in tasks]
        return runnable

    def _commit_hooks(self, epoch: int) -> Hooks:
        """What runs before every node's part of the save of ``epoch`` (committed
        checkpoints are write-once) and after all of them (commit, or
        :class:`~ckptstore.errors.SaveFailedError` naming the failed nodes)."""
        check = self._check_hook(epoch)
        tiers = self.tiers
        if tiers is None or not tiers.pause_during_saves:
            return Hooks(check, self._commit_hook(epoch))

        def pause_then_check() -> None:  # the copy waits while the save runs
            tiers.pause()
            check()

        return Hooks(pause_then_check, self._commit_hook(epoch))

    def _check_hook(self, epoch: int) -> Callable[[], None]:
        """The check before the save of ``epoch``; it reads the epoch's one-document
        record of earlier versions only if a listing showed one (the first save of a
        manager that was never listed lists the control directory once)."""
        replacing = epoch <= self._replace_upto and not self.overwrite
        if replacing:
            log.warning("Replacing epoch %d, which could not be restored", epoch)
        if self._legacy_epochs is None:
            self.commit_listing()
        assert self._legacy_epochs is not None
        return partial(
            check_not_committed,
            location=self.location,
            epoch=epoch,
            nodes=self.node_names(),
            overwrite=self.overwrite or replacing,
            fence=self.writer_fence,
            legacy=epoch in self._legacy_epochs,
        )

    def _commit_hook(
        self, epoch: int, *, ends_pause: bool = True
    ) -> Callable[[list[object]], list[NodeStats]]:
        """The commit after every node's part of the save of ``epoch``; with several
        roots, it then queues the epoch's copy to the later ones. ``ends_pause``: it
        lets a copy the save paused go on (an asynchronous save's commit does not: its
        pause ended with the snapshot, and another save's may be running)."""
        commit = partial(commit_saves, storage=self.location, epoch=epoch, fence=self.writer_fence)
        tiers = self.tiers
        if tiers is None:
            return commit
        nodes = self.node_names()

        def commit_then_copy(results: list[object]) -> list[NodeStats]:
            try:
                committed = commit(results)
            finally:
                if ends_pause:
                    tiers.resume()
            tiers.after_commit(epoch, nodes)
            return committed

        return commit_then_copy

    def _set_tiers(
        self,
        later: Sequence[UploadTaskGroupBuilder],
        retention: RetentionPolicy | Sequence[RetentionPolicy | None] | None,
    ) -> None:
        """Keep the first root's retention on the manager and give the later roots (upload
        builders) and their policies to a :class:`Tiers`."""
        first, others = split_retention(retention, 1 + len(later))
        self.retention = first
        if later:
            self.tiers = Tiers(self, list(later), others)

    def epochs_in_transit(self) -> set[int]:
        """Epochs committed here and not yet copied to the later roots (retention on the
        first root keeps them)."""
        return self.tiers.in_transit() if self.tiers is not None else set()

    def _keep_committed(self, results: list[object]) -> list[object]:
        """Keep the stats a group's commit hook returned (with the commit just
        written) for :meth:`finish_commit`: a group's tasks' outputs lack it."""
        committed = [stats for stats in results if isinstance(stats, NodeStats)]
        if committed:
            self._committed[committed[0].epoch] = committed
            while len(self._committed) > _KEPT_COMMITS:  # saves nobody finished
                del self._committed[next(iter(self._committed))]
        return results

    def finish_commit(
        self,
        epoch: int,
        stats: Sequence[NodeStats] | None = None,
        *,
        retention: RetentionPolicy | None = None,
    ) -> None:
        """What follows the commit of ``epoch``, the one path for synchronous and
        asynchronous saves: the catalog entry (from the commit just written, nothing
        read back), the stats reports, then ``retention``.

        ``stats``: the save's (default: those of the last operation). A failing
        catalog write raises before anything else ran, so the caller may call this
        again; a failing report or retention is logged: the save succeeded."""
        if stats is None:
            collected: dict[str, NodeStats] = {}
            self.collect_checkpoint_stats(collected)
            stats = list(collected.values())
        stats = self._committed.pop(epoch, None) or list(stats)
        try:
            self.write_checkpoint_metadata(epoch, stats)
        except BaseException:
            self._committed[epoch] = stats  # for the caller's next attempt
            raise
        self.report("checkpoint_save", {node_stats.db_path: node_stats for node_stats in stats})
        if retention is not None:
            retain_after_save(self, retention, epoch)

    @abstractmethod
    def _on_every_node(
        self, build: Callable[[CheckpointManager], NodeWork], name: str, hooks: Hooks = NO_HOOKS
    ) -> Task | TaskGroup:
        """``build(node's manager)`` run on every node, with ``hooks`` around all of
        them (a group's hooks; for one node, inside its one task)."""

    @abstractmethod
    def load(
        self, epoch: int, path_prefix: str | None = None, path_type: str | None = None
    ) -> Task | TaskGroup:
        """What loads ``epoch`` back into the workspaces."""

    @abstractmethod
    def restore(self, nodes: Sequence[str], epoch: int) -> Task | TaskGroup:
        """What a resume runs: ``init(nodes, retrieve_from_epoch=epoch)`` then
        ``load(epoch)`` in one, each node's checkpoint opened once (its manifest read
        once): every stored blob is loaded and becomes a blob to checkpoint."""

    def save_async(
        self,
        epoch: int,
        session: Session,
        *,
        max_in_flight: int = 1,
        retries: int = 0,
        backoff: float = 0.5,
        after_commit: Callable[[int, list[NodeStats]], None] | None = None,
        background_nice: int = BACKGROUND_NICE,
        retention: RetentionPolicy | None = None,
    ) -> SaveFuture:
        """Save ``epoch`` in the background; returns once every node's blobs are copied
        into staging buffers (training may then change them).

        Writing, checksums, fsync, the commit (once every node succeeded), then
        :meth:`finish_commit` (the catalog update, stats reports, ``retention``) and
        ``after_commit(epoch, stats)`` run on background threads; the returned
        :class:`SaveFuture` completes after them. At most ``max_in_flight`` saves are
        unfinished: this call first waits for the oldest, and raises (typed) the error
        of an earlier save nobody observed. A node's background write is retried
        ``retries`` times from its staged copy.

        The background write runs ``background_nice`` nice levels below the calling
        thread (Linux; its I/O threads too; default 0: at the training thread's
        priority), for a host whose other work (data loaders) must keep the CPU first.

        Example::

            >>> from ckptstore import LocalSession
            >>> session = LocalSession()
            >>> session.workspace("trainer_0")["w"] = np.ones(3)
            >>> manager = CheckpointManager("async_ckpt", "trainer_0", "npz")
            >>> _ = session.run(manager.init(["trainer_0"]))
            >>> future = manager.save_async(1, session)
            >>> session.workspace("trainer_0")["w"] += 1   # the next epoch trains meanwhile
            >>> future.wait()
        """
        epoch = validate_epoch(epoch)
        if max_in_flight < 1:
            raise JobConfigurationError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if background_nice < 0:
            raise JobConfigurationError(f"background_nice must be >= 0, got {background_nice}")
        options = StageOptions(max_in_flight, retries, backoff, background_nice)

        def finish(tickets: list[Any]) -> list[NodeStats]:
            results = cast("list[NodeStats]", session.run(self._finish_group(epoch, tickets)))
            self.finish_commit(epoch, results, retention=retention)
            if after_commit is not None:
                try:
                    after_commit(epoch, results)
                except Exception:  # the epoch is committed: the save itself succeeded
                    log.error("after-commit work of epoch %d failed", epoch, exc_info=True)
            return results

        # with pause_during_saves, a copy's process waits while the training does
        with self.tiers.paused() if self.tiers is not None else contextlib.nullcontext():
            return self._saver.submit(
                epoch, session, lambda: self._stage_group(epoch, options), finish, max_in_flight
            )

    def wait_for_saves(self, timeout: float | None = None) -> None:
        """Wait for every asynchronous save to finish; raises the first failure nobody
        observed through its :class:`SaveFuture` (or :class:`TimeoutError`)."""
        self._saver.settle(0, timeout)

    def saves_in_flight(self) -> list[SaveFuture]:
        """The asynchronous saves started and not yet collected, oldest first."""
        return self._saver.pending()

    def _stage_group(self, epoch: int, options: StageOptions) -> Task | TaskGroup:
        """What copies every node's blobs into staging and queues their writes (after
        the same check as a synchronous save)."""
        check = Hooks(before=self._check_hook(epoch))
        return self._on_every_node(
            lambda manager: manager._stage_work(epoch, options), "checkpoint_stage", check
        )

    def _finish_group(self, epoch: int, tickets: list[Any]) -> Task | TaskGroup:
        """What waits for the staged writes, then commits as a synchronous save does."""
        by_node = dict(zip(self.node_names(), tickets, strict=True))
        commit = Hooks(after=self._commit_hook(epoch, ends_pause=False))
        return self._on_every_node(
            lambda manager: manager._await_work(epoch, by_node[manager.node_name]),
            "checkpoint_await_save",
            commit,
        )

    @abstractmethod
    def set_params(
        self, nodes: Sequence[str], path_prefix: str | None = None, path_type: str | None = None
    ) -> None:
        """Record the job's nodes (and a read prefix) and pass them to the handler."""

    def collect_checkpoint_stats(self, stats: dict[str, NodeStats]) -> None:
        """Add the last operation's per-node stats to ``stats`` (``{db_path: stats}``)."""
        for output in self._stats_outputs:
            try:
                value = output.fetch()
            except NotRunError:
                log.warning("Failed to collect checkpoint stats: the operation did not run")
                continue
            for node_stats in value if isinstance(value, list) else [value]:
                if isinstance(node_stats, NodeStats):
                    stats[node_stats.db_path] = node_stats

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Send the last operation's stats to the metadata handler and every reporter."""
        stats: dict[str, NodeStats] = {}
        self.collect_checkpoint_stats(stats)
        self.report(action_name, stats)

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        """Send ``stats`` to the metadata handler (if any) and to every
        ``ckptstore_report`` plugin. A failing report is logged, never raised: it comes
        after the operation it describes, which succeeded or failed on its own."""
        handler = self._metadata_handler
        if handler is not None:
            try:
                handler.report(action_name, stats)
            except Exception:
                log.warning(
                    "metadata handler %r failed to report %s", handler, action_name, exc_info=True
                )
        get_registry().report(action_name, stats)

    def failure_stats(
        self,
        epoch: int,
        node_errors: Mapping[str, str],
        action: str = "checkpoint_save_failed",
    ) -> dict[str, NodeStats]:
        """Stats describing a failed operation on ``epoch`` (by default a save)."""
        stats = {}
        for node, error in node_errors.items():
            path = self._location.db_path(node, epoch)
            stats[path] = NodeStats(node, epoch, path, action, error=error)
        return stats

    def write_checkpoint_metadata(
        self, epoch: int, stats: Sequence[NodeStats] | None = None
    ) -> None:
        """Tell the metadata handler that ``epoch`` is committed; ``stats``, the save's,
        carry the commit just written (:meth:`MetadataHandler.write_committed`)."""
        handler = self._metadata_handler
        if handler is not None and stats:
            handler.write_committed(epoch, stats)
        elif handler is not None:
            handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from: the handler's answer if there is a handler, else
        ``user_epoch``."""
        if self._metadata_handler is not None:
            result: int | None = self._metadata_handler.last_epoch(user_epoch=user_epoch)
            return result
        return user_epoch

    def _set_params(
        self, node_names: list[str], path_prefix: str | None, path_type: str | None
    ) -> None:
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        handler = self._metadata_handler
        if handler is None:
            return
        handler.set_params(
            db_prefix=self._db_prefix,
            db_type=self._db_type.name,
            node_names=node_names,
            path_prefix=path_prefix,
            path_type=path_type,
            storage=self.location.storage,
        )

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Whether checkpoints can be written now (the handler's answer, else the
        storage's)."""
        if self._metadata_handler is not None:
            return bool(self._metadata_handler.cp_accessible(epoch))
        return self.location.storage.accessible()

    def verify(self, epoch: int) -> list[CorruptCheckpointError]:
        """Check every stored byte of ``epoch``'s checkpoints, on every node, against
        the checksums recorded when they were written, without loading anything into a
        workspace. Returns one error per damaged chunk or file (empty: intact); raises
        :class:`~ckptstore.errors.CheckpointNotFoundError` if the epoch is not committed.
        """
        epoch = validate_epoch(epoch)
        location = self.location
        problems: list[CorruptCheckpointError] = []
        for node in self.node_names():
            problems.extend(verify_node(location, node, epoch))
        return problems


class CheckpointManager(ManagerBase):
    """Saves and loads one node's checkpoints under ``db_prefix``.

    ``db_type`` and ``metadata_handler`` are registered names (``"zarr"``, ``"npz"``,
    ``"json"``) or instances. Checkpoint files are named after ``node_name``
    (``<db_prefix>/<node_name>.<epoch>``); the workspace saved is the one of the node
    passed to :meth:`init` (``JobRunner`` passes the job's node), else the current node.

    ``retention`` (e.g. ``KeepLast(3)``) is applied by the runner after each committed
    save. Committed epochs are write-once: saving one again raises
    :class:`~ckptstore.errors.AlreadyCommittedError` unless ``overwrite=True``, which
    uncommits it first. ``incremental=True`` stores each chunk of the large blobs once
    per content under the root; ``frozen`` then names blobs the job promises do not
    change between saves (a fine-tuning's frozen base): they are not read again
    (docs/design.md, "Incremental checkpoints"). ``io`` tunes the chunked I/O engine;
    ``path_type`` forces a path type instead of choosing it from the URL;
    ``storage_options`` go to the path type (endpoint, credentials...).

    ``db_prefix`` may list several roots, fastest first (URLs, locations or upload
    builders): saves commit on the first and are copied to the others in the
    background, loads read the fastest root holding the node intact, and ``retention``
    may give one policy per root (see :mod:`ckptstore.checkpoint._tiers`).

    Example::

        >>> from ckptstore import LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(3)
        >>> manager = CheckpointManager("npz_ckpt", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(1))
        >>> session.workspace("trainer_0")["w"][:] = 0
        >>> _ = session.run(manager.load(1))
        >>> session.workspace("trainer_0")["w"]
        array([1., 1., 1.])
    """

    BLOB_NAMES = "blob_names"

    def __init__(
        self,
        db_prefix: str | Sequence[RootLike],
        node_name: str,
        db_type: str | DBType = DEFAULT_DB_TYPE,
        metadata_handler: str | MetadataHandler | MetadataHandlerLike | None = None,
        *,
        io: IOSettings | None = None,
        path_type: str | None = None,
        storage_options: Mapping[str, object] | None = None,
        location: CheckpointLocation | None = None,
        retention: RetentionPolicy | Sequence[RetentionPolicy | None] | None = None,
        overwrite: bool = False,
        incremental: bool = False,
        frozen: Collection[str] = (),
    ) -> None:
        first, later = open_roots(
            db_prefix,
            db_type=db_type,
            io=io,
            path_type=path_type,
            storage_options=storage_options,
            incremental=incremental,
            frozen=frozen,
            location=location,
        )
        super().__init__(first, metadata_handler, None, overwrite=overwrite)
        self._set_tiers(later, retention)
        self._node_name = validate_node_name(str(node_name))
        self._workspace_node: str | None = None
        self._names_output: TaskOutput | None = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._location.storage.display_url!r}, "
            f"{self._node_name!r}, {self._db_type.name!r})"
        )

    # -- accessors --------------------------------------------------------------------

    @property
    def node_name(self) -> str:
        """The node name checkpoints are filed under."""
        return self._node_name

    def _task_node(self) -> str:
        return self._workspace_node or Node.current()

    # -- Caffe2 API -------------------------------------------------------------------

    def init(
        self,
        nodes: Sequence[str] | None = None,
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> Task:
        """A task that records which blobs to checkpoint: every blob in the node's
        workspace now, or (``retrieve_from_epoch``) the blobs stored in that epoch."""
        if nodes is not None and len(nodes) != 1:
            raise JobConfigurationError(
                f"CheckpointManager checkpoints one node, got {list(nodes)}; use "
                "MultiNodeCheckpointManager for several"
            )
        self._workspace_node = validate_node_name(str(nodes[0])) if nodes else Node.current()
        if retrieve_from_epoch is not None:
            retrieve_from_epoch = validate_epoch(retrieve_from_epoch, "retrieve_from_epoch")
        if retrieve_from_epoch is None:
            fn: Any = list_blob_names
        else:
            fn = self._reading(
                read_blob_names,
                path_prefix,
                path_type,
                node=self._node_name,
                epoch=retrieve_from_epoch,
            )
        task = Task(fn, name="checkpoint_init", node=self._workspace_node, result_is_output=True)
        self._names_output = task.outputs()[0]
        return task

    def blob_list(self) -> list[str]:
        """The blob names recorded by the task :meth:`init` returned (run it first)."""
        if self._names_output is None:
            raise JobConfigurationError("call manager.init(...) and run its task before save/load")
        try:
            names = self._names_output.fetch()
            if isinstance(names, NodeStats):  # recorded by restore: what it loaded
                return sorted(names.blobs)
            return list(cast("list[str]", names))
        except NotRunError:
            raise NotRunError(
                "the task returned by manager.init(...) has not run yet: run it in the session "
                "before building save or load tasks"
            ) from None

    def save(self, epoch: int) -> Task:
        """A task that saves the node's blobs as epoch ``epoch`` and commits it: a group
        of one, with a multi-node save's check and commit run inside the task."""
        task = super().save(epoch)
        assert isinstance(task, Task)
        return task

    def _on_every_node(
        self, build: Callable[[CheckpointManager], NodeWork], name: str, hooks: Hooks = NO_HOOKS
    ) -> Task:
        return Task(
            partial(run_alone, work=build(self), hooks=hooks),
            name=name,
            node=self._task_node(),
            result_is_output=True,
        )

    def _save_work(self, epoch: int) -> Callable[[Workspace], NodeStats]:
        """This node's part of a save: write its blobs, uncommitted."""
        return partial(
            save_node,
            location=self.location,
            node=self._node_name,
            epoch=epoch,
            names=self.blob_list(),
        )

    def _stage_work(self, epoch: int, options: StageOptions) -> Callable[[Workspace], int]:
        """This node's part of an asynchronous save's snapshot (its result: a ticket)."""
        return partial(
            stage_node,
            location=self.location,
            node=self._node_name,
            epoch=epoch,
            names=self.blob_list(),
            slots=options.slots,
            retries=options.retries,
            backoff=options.backoff,
            nice=options.nice,
        )

    def _await_work(self, epoch: int, ticket: int) -> Callable[[Workspace], NodeStats]:
        """This node's wait for the background write of ``ticket`` (its stats)."""
        return partial(
            await_node_save,
            ticket=ticket,
            node=self._node_name,
            epoch=epoch,
            url=self.location.storage.display_url,
        )

    def load(
        self, epoch: int, path_prefix: str | None = None, path_type: str | None = None
    ) -> Task:
        """A task that loads every listed blob from epoch ``epoch`` (all or nothing).

        ``path_prefix`` reads from another checkpoint root, such as an upload tier.
        """
        task = self._load_task(validate_epoch(epoch), path_prefix, path_type, self.blob_list())
        self._stats_outputs = [task.outputs()[0]]
        return task

    def restore(self, nodes: Sequence[str], epoch: int) -> Task:
        """A task that loads every blob of this node's checkpoint of ``epoch`` and
        records them as the blobs to checkpoint (see :meth:`ManagerBase.restore`)."""
        epoch = validate_epoch(epoch)
        self.init(nodes)  # the workspace's node; the blob list comes from the load
        task = self._load_task(epoch, None, None, None, "checkpoint_restore")
        self._names_output = task.outputs()[0]
        self._stats_outputs = [self._names_output]
        return task

    def _load_task(
        self,
        epoch: int,
        path_prefix: str | None,
        path_type: str | None,
        names: list[str] | None,
        name: str = "checkpoint_load",
    ) -> Task:
        """A task loading ``names`` (``None``: every stored blob) of ``epoch`` from where
        :meth:`_reading` says."""
        return Task(
            self._reading(
                load_node, path_prefix, path_type, node=self._node_name, epoch=epoch, names=names
            ),
            name=name,
            node=self._task_node(),
            result_is_output=True,
        )

    def _reading(
        self,
        work: Callable[..., Any],
        path_prefix: str | None,
        path_type: str | None,
        **arguments: Any,
    ) -> Callable[[Workspace], Any]:
        """``work`` bound to where it reads: the given prefix, else (several roots) the
        fastest root holding the node intact, else this manager's root."""
        if self.tiers is not None and not path_prefix and not self._path_prefix:
            return partial(
                from_fastest, work=work, locations=self.tiers.read_locations(), **arguments
            )
        return partial(work, location=self._read_location(path_prefix, path_type), **arguments)

    def load_blobs_from_checkpoint(self, blob_names: Sequence[str], epoch: int) -> Task:
        """A task that loads ``blob_names`` from this node's checkpoint of ``epoch`` into
        the workspace of the current node."""
        epoch = validate_epoch(epoch)
        task = Task(
            partial(
                partial_load,
                location=self._read_location(None, None),
                nodes=[self._node_name],
                epoch=epoch,
                names=list(blob_names),
            ),
            name="checkpoint_partial_load",
            result_is_output=True,
        )
        self._stats_outputs = [task.outputs()[0]]
        return task

    def check_db_exists(self, epoch: int) -> Task:
        """A task whose output is whether this node's checkpoint of ``epoch`` is committed."""
        epoch = validate_epoch(epoch)
        return Task(
            partial(
                node_exists,
                location=self._read_location(None, None),
                node=self._node_name,
                epoch=epoch,
            ),
            name="check_db_exists",
            result_is_output=True,
        )

    def set_params(
        self, nodes: Sequence[str], path_prefix: str | None = None, path_type: str | None = None
    ) -> None:
        """Remember a read prefix/type and pass the job's parameters to the handler."""
        self._set_params([self._node_name], path_prefix, path_type)

    def node_names(self) -> list[str]:
        return [self._node_name]

    def saved_nodes(self, job_nodes: Sequence[str]) -> list[str]:
        return [self._node_name]

    def _blob_lists(self) -> list[tuple[str, list[str]]]:
        return [(self._node_name, self.blob_list())]

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str | None:
        """Where ``node_name``'s checkpoint of ``epoch`` lives, if it is this manager's."""
        if str(node_name) != self._node_name:
            return None
        return db_name(validate_epoch(epoch), self._node_name, self._db_prefix)
