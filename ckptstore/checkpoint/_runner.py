"""JobRunner: runs a job epoch by epoch, checkpointing after each epoch and resuming
from the last complete one.

Order, as in Caffe2: init → init-checkpoint → (save 0 | load k) →
[epoch → stop-check → save]* → upload → download → exit.

Example::

    >>> from ckptstore import Job, Node, Task, epoch_limiter
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     done = epoch_limiter(job, 3)
    >>> from ckptstore import LocalSession, MultiNodeCheckpointManager
    >>> runner = JobRunner(job, MultiNodeCheckpointManager("ckpt", "zarr", "json"))
    >>> runner.train(LocalSession())
    3
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ckptstore.checkpoint._async_save import SaveFuture
from ckptstore.checkpoint._manager import BACKGROUND_NICE, ManagerBase
from ckptstore.checkpoint._retention import RetentionPolicy
from ckptstore.checkpoint._tiers import TieredListing
from ckptstore.errors import (
    AlreadyCommittedError,
    CorruptCheckpointError,
    JobConfigurationError,
    ObjectNotFoundError,
    SaveFailedError,
    TierCopyFailedError,
    TooManySaveFailuresError,
    is_disk_full,
    is_permanent,
)
from ckptstore.execution import Job, Session
from ckptstore.plugin import UploadTaskGroupBuilder, get_registry
from ckptstore.protocol import DEFAULT_LEASE_TTL, CommitListing, WriterLease, check_lease_ttl
from ckptstore.records import validate_epoch

__all__ = ["JobRunner", "SaveFailure"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveFailure:
    """An epoch whose checkpoint could not be committed (or restored), and why."""

    epoch: int
    error: BaseException


def _refuse_to_start_over(url: str, complete: int | None) -> None:
    """Raise if an epoch is committed on every node of the job (``complete``, the newest
    such): starting from scratch would overwrite it."""
    if complete is not None:
        raise JobConfigurationError(
            f"refusing to start from scratch over committed checkpoints: epoch {complete} "
            f"is committed on every node of this job under {url}. "
            f"Resume with JobRunner(..., resume_from_epoch={complete}) or a metadata "
            "handler (metadata_handler='json' resumes by itself), or pass "
            "JobRunner(..., overwrite=True) to start over and overwrite them."
        )


class JobRunner:
    """Runs a :class:`~ckptstore.Job` with checkpoints.

    Unlike Caffe2, failures stop the job by default. Errors that retrying cannot fix
    (permission denied, a read-only filesystem, a name too long, bad names, unsupported
    blobs, bugs) propagate at once; :meth:`train` first checks that the checkpoint
    location can be written at all. A transient failure is retried (``save_retries``
    times, with exponential backoff from ``retry_backoff`` seconds); a full disk
    (:class:`~ckptstore.errors.StorageFullError`) is not retried at once. A save that
    still fails is counted in :attr:`save_failures`, reported as
    ``checkpoint_save_failed`` and never committed, and after
    ``max_consecutive_save_failures`` (default 3) failed epochs in a row :meth:`train`
    raises :class:`~ckptstore.errors.TooManySaveFailuresError`. Pass
    ``max_consecutive_save_failures=None`` to keep training whatever the saves do.
    ``retention`` (e.g. :class:`~ckptstore.checkpoint._retention.KeepLast`) deletes older committed
    epochs after each committed save (see :mod:`ckptstore.checkpoint._retention`); without it, the
    manager's own ``retention`` applies. Committed epochs are write-once: a save of one
    raises :class:`~ckptstore.errors.AlreadyCommittedError` at once unless
    ``overwrite=True`` (set on the manager by :meth:`train`), which uncommits it first.

    :meth:`train` takes a writer lease on each node it saves (see
    :mod:`ckptstore.protocol._lease`): a second job on the same prefix and node stops
    at startup with :class:`~ckptstore.errors.LeaseHeldError` naming this one. A
    heartbeat thread renews the lease every ``lease_ttl / 3`` seconds (default 60 s
    ttl), whatever the saves do; it is released at the end, and taken over (logged at
    INFO: after a crash that is the expected restart) once its holder is gone
    (``lease_ttl`` seconds after its last renewal, or at once when its process on this
    host died or is a zombie). A storage error while taking it raises. A job that lost
    its lease (taken over, or broken with ``ckptstore lease break``) commits nothing
    more: :meth:`train` raises :class:`~ckptstore.errors.LeaseLostError`.
    ``lease_ttl=None`` takes no lease.

    With ``async_save`` each save returns once the blobs are copied into staging
    buffers and is written, committed, catalogued and retained in the background while
    the next epoch trains (see :meth:`ManagerBase.save_async`); at most
    ``max_saves_in_flight`` are unfinished; they write ``background_nice`` nice levels
    below the training thread (Linux; default 0). A background failure is collected at the
    next save or at the end of :meth:`train` and counts exactly like a synchronous one;
    ``train`` returns only after the last save finished. On Ctrl-C, ``train`` waits for
    the saves in flight (a second Ctrl-C abandons them: they are never committed).

    After :meth:`train`, :attr:`resumed_from_epoch` is the epoch it restored and went on
    from (``None``: it started from scratch). The resume is logged at INFO, or as a
    warning when something was wrong: the chosen epoch could not be restored (it fell
    back to an older one), or the catalog was behind the commit records.

    A job never starts from scratch over an epoch committed on every one of its nodes
    (it would overwrite it): without a metadata handler or ``resume_from_epoch`` to
    resume from, ``train`` raises :class:`~ckptstore.errors.JobConfigurationError`
    unless ``overwrite=True``.

    Example::

        >>> from ckptstore import Job, Node, Task, epoch_limiter
        >>> with Job() as job, Node("trainer_0"):
        ...     with job.init_group:
        ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
        ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
        ...     done = epoch_limiter(job, 3)
        >>> from ckptstore import CheckpointManager, LocalSession
        >>> manager = CheckpointManager("npz_ckpt", "trainer_0", "npz")
        >>> runner = JobRunner(job, manager, max_consecutive_save_failures=3)
        >>> runner.train(LocalSession())
        3
        >>> runner.committed_epochs
        [0, 1, 2, 3]
    """

    def __init__(
        self,
        job: Job,
        checkpoint_manager: ManagerBase | None = None,
        resume_from_epoch: int | None = None,
        upload_task_group_builder: str | UploadTaskGroupBuilder | None = None,
        *,
        save_retries: int = 2,
        retry_backoff: float = 0.5,
        max_consecutive_save_failures: int | None = 3,
        retention: RetentionPolicy | None = None,
        async_save: bool = False,
        max_saves_in_flight: int = 1,
        background_nice: int = BACKGROUND_NICE,
        overwrite: bool = False,
        lease_ttl: float | None = DEFAULT_LEASE_TTL,
    ) -> None:
        if max_saves_in_flight < 1:
            raise JobConfigurationError(
                f"max_saves_in_flight must be >= 1, got {max_saves_in_flight}"
            )
        if save_retries < 0:
            raise JobConfigurationError(f"save_retries must be >= 0, got {save_retries}")
        if background_nice < 0:
            raise JobConfigurationError(f"background_nice must be >= 0, got {background_nice}")
        if max_consecutive_save_failures is not None and max_consecutive_save_failures < 1:
            raise JobConfigurationError("max_consecutive_save_failures must be >= 1 or None")
        if lease_ttl is not None:
            check_lease_ttl(lease_ttl)
        self.job = job
        self.checkpoint_manager = checkpoint_manager
        self.resume_from_epoch = (
            None
            if resume_from_epoch is None
            else validate_epoch(resume_from_epoch, "resume_from_epoch")
        )
        self.upload_task_group_builder = get_registry().upload_builder(upload_task_group_builder)
        self.save_retries = save_retries
        self.retry_backoff = retry_backoff
        self.max_consecutive_save_failures = max_consecutive_save_failures
        self.retention = retention
        self.overwrite = overwrite
        self.lease_ttl = lease_ttl
        self._lease: WriterLease | None = None
        self._commits: CommitListing | None = None
        self._tiered: TieredListing | None = None
        self.save_failures: list[SaveFailure] = []
        self.restore_failures: list[SaveFailure] = []
        self.committed_epochs: list[int] = []
        self._consecutive_failures = 0
        self.async_save = async_save
        self.max_saves_in_flight = max_saves_in_flight
        self.background_nice = background_nice
        self._in_flight: list[SaveFuture] = []
        self.already_finished = False
        self.resumed_from_epoch: int | None = None
        """The epoch the last :meth:`train` restored and continued from; ``None`` when
        it started from scratch (or has not run)."""
        self._catalog_behind: int | None = None  # the epoch only the commit records knew

    def __call__(self, session: Session) -> int:
        return self.train(session)

    def train(self, session: Session) -> int:
        """Run the job to its end; returns the number of the last epoch run.

        A job resumed at or past its :func:`~ckptstore.epoch_limiter` limit is finished:
        its last epoch is restored (and so verified; a damaged one falls back as usual),
        then no epoch, save, upload, download or exit group runs; :attr:`already_finished`
        is set, a warning says so and the restored epoch is returned.
        """
        self.resumed_from_epoch = self._catalog_behind = None
        lease = self._take_lease()
        try:
            return self._train(session)
        finally:
            self._lease = None
            self._commits = self._tiered = None
            if self.checkpoint_manager is not None:
                self.checkpoint_manager.writer_fence = None
            if lease is not None:
                lease.release()

    def _take_lease(self) -> WriterLease | None:
        """The writer lease of the nodes this job saves, taken (``None`` without a
        manager or ``lease_ttl``). A storage error while taking it raises: a job
        writes without a lease only when told to (``lease_ttl=None``)."""
        manager = self.checkpoint_manager
        if manager is None or self.lease_ttl is None:
            return None
        nodes = self._saved_nodes(manager)
        manager.check_writable()  # an unusable root says so, not the lease's first write
        lease = manager.writer_lease(nodes, self.lease_ttl)
        lease.acquire()
        self._lease = lease
        return lease

    def _fence_writes(self, manager: ManagerBase, resume: int | None) -> None:
        """Before anything is saved: record where this job resumes in the leases it took
        over (past every record listed since the takeover, which the fence must never
        hide: only one listing, shared with resume, and only after a takeover), and hand
        the manager's commits the fence to check."""
        lease = self._lease
        if lease is None:
            return
        if lease.taken_over:
            listing = self._listing(manager)
            listed = {node: listing.newest_listed(node) for node in lease.taken_over}
            lease.record_resume(
                resume, {node: epoch for node, epoch in listed.items() if epoch is not None}
            )
        manager.writer_fence = lease.fence()

    def _saved_nodes(self, manager: ManagerBase) -> list[str]:
        """The node names this job's checkpoints are filed under."""
        return manager.saved_nodes(self.job.nodes_to_checkpoint())

    def _resume_epoch(self, manager: ManagerBase) -> int | None:
        """The epoch to resume from: the handler's (or the user's) answer, caught up with
        storage, which is the truth. Without ``resume_from_epoch`` or ``overwrite``, when
        a newer epoch is committed on every node (a crash between a commit and the
        catalog's update), it resumes from that one instead of saving over it; and a job
        never starts from scratch over a complete epoch unless ``overwrite``. Storage
        is asked once (:meth:`_listing`), not at all when the handler's own answer comes
        from the commit records."""
        resume = manager.get_resume_from_epoch_id(self.resume_from_epoch)
        handler = manager.metadata_handler
        if (
            handler is not None
            and handler.answers_from_storage
            and manager.tiers is None  # it answers for the first root alone
        ):
            return resume  # the same question, already answered from the commit records
        nodes = self._saved_nodes(manager)
        if self.resume_from_epoch is None and not manager.overwrite:
            try:
                newest = self._listing(manager).newest_complete(nodes)
            except OSError as error:
                log.warning("Could not check the commit records under storage: %s", error)
                newest = None  # unreadable storage: the saves will say so
            if newest is not None and (resume is None or newest > resume):
                if handler is not None:  # without one, the commit records are the record
                    log.warning(
                        "The catalog is behind storage: epoch %d is committed on every "
                        "node under %s; resuming from it",
                        newest,
                        " or ".join(manager.tiers.roots) if manager.tiers else manager.display_url,
                    )
                    self._catalog_behind = newest
                resume = newest
        if resume is None and not self.overwrite:
            _refuse_to_start_over(
                manager.display_url, self._listing(manager).newest_complete(nodes)
            )
        return resume

    def _listing(self, manager: ManagerBase) -> CommitListing | TieredListing:
        """The commit records as one listing found them, taken once per :meth:`train`
        before anything is saved (resume and its fallback ask it; saves never do); with
        several roots, the newest epoch committed on any of them."""
        if self._commits is None:
            self._commits = manager.commit_listing()
            if self._lease is not None:  # just read to take the lease: no request more
                self._commits.know_fences(self._lease.fences)
            if manager.tiers is not None:
                self._tiered = manager.tiers.listing(self._commits)
        return self._tiered if manager.tiers is not None and self._tiered else self._commits

    def _train(self, session: Session) -> int:
        job, manager = self.job, self.checkpoint_manager
        if not job.stop_conditions:
            raise JobConfigurationError(
                "the job has no stop condition and would run forever: add "
                "epoch_limiter(job, n) or job.add_stop_condition(output)"
            )
        resume = self.resume_from_epoch
        if manager is not None:
            if self.overwrite:
                manager.replace_committed()
            manager.check_writable()
            nodes = job.nodes_to_checkpoint()
            manager.set_params(nodes=nodes)
            resume = self._resume_epoch(manager)
            self._fence_writes(manager, resume)
            if manager.tiers is not None and self._commits is not None:
                manager.tiers.catch_up(self._saved_nodes(manager), self._commits)
        elif resume is not None:
            raise JobConfigurationError(
                f"resume_from_epoch={resume} needs a checkpoint manager to load that epoch "
                "from: pass checkpoint_manager=..."
            )
        from_scratch = resume is None
        if from_scratch:
            if manager is not None:  # before anything runs: this job will save
                manager.check_can_hold()
            session.run(job.init_group)
        if manager is not None:
            if resume is None:
                session.run(manager.init(job.nodes_to_checkpoint()))
                manager.check_name_limits()
                with self._finishing_saves():
                    self.save_checkpoints(0, session)
            else:
                failed_before = len(self.restore_failures)
                resume = self._restore(session, manager, resume)
                self.resumed_from_epoch = resume
                self._log_resume(resume, self.restore_failures[failed_before:])
                if self._finished(resume):
                    tier_error = self._finish_copies(manager, resume)  # a stopped copy
                    if tier_error is not None:
                        raise tier_error
                    return resume  # a finished job only reads: any format may be read
                manager.check_can_hold()
        epoch = 1 if resume is None else resume + 1
        with self._finishing_saves():
            while True:
                session.run(job.epoch_group)
                stop = any(np.asarray(out.fetch()).any() for out in job.stop_conditions)
                if manager is not None:
                    self.save_checkpoints(epoch, session)
                if stop:
                    break
                epoch += 1
            self.collect_saves(0)
        tier_error = self._finish_copies(manager, resume)
        upload_error = self._upload(session, epoch, resume)
        session.run(job.download_group)
        session.run(job.exit_group)
        if upload_error is not None:
            raise upload_error
        if tier_error is not None:
            raise tier_error
        return epoch

    def _finish_copies(
        self, manager: ManagerBase | None, resumed_from: int | None
    ) -> TierCopyFailedError | None:
        """With several roots: wait until every root holds the last committed epoch;
        the error naming the root that does not (raised once download and exit ran)."""
        if manager is None or manager.tiers is None:
            return None
        committed = self.committed_epochs[-1] if self.committed_epochs else resumed_from
        try:
            if committed is not None:
                manager.tiers.ensure(committed, self._saved_nodes(manager))
        except TierCopyFailedError as error:
            log.error("%s", error)
            return error
        finally:
            self._count_copy_failures(manager)
        return None

    def _count_copy_failures(self, manager: ManagerBase) -> None:
        """Count the background copies given up on as failed saves (reported already);
        they do not stop the job: the epoch is committed on the first root."""
        if manager.tiers is None:
            return
        for failure in manager.tiers.take_failures():
            error = TierCopyFailedError(
                failure.epoch,
                failure.root,
                dict.fromkeys(
                    manager.node_names(), f"{type(failure.error).__name__}: {failure.error}"
                ),
            )
            self.save_failures.append(SaveFailure(failure.epoch, error))

    def _log_resume(self, restored: int, failures: list[SaveFailure]) -> None:
        """Say where training resumed: at INFO, as a warning when something was wrong."""
        problems = []
        if failures:
            damaged = ", ".join(str(failure.epoch) for failure in failures)
            problems.append(f"epoch(s) {damaged} could not be restored")
        if self._catalog_behind is not None:
            problems.append(f"the catalog did not know epoch {self._catalog_behind}")
        if problems:
            log.warning("Resumed from epoch %d (%s; see above)", restored, "; ".join(problems))
        else:
            log.info("Resumed from epoch %d", restored)

    def _finished(self, restored: int) -> bool:
        """Whether the restored epoch already reached the job's epoch limit (then nothing
        more runs: a rerun of a finished job only restores its last epoch)."""
        limit = self.job.epoch_limit()
        if limit is None or restored < limit:
            return False
        log.warning(
            "Nothing to do: epoch %d is committed and epoch_limiter stops this job after "
            "epoch %d; its state is restored, no epoch runs. Raise the limit to train further",
            restored,
            limit,
        )
        self.already_finished = True
        return True

    def _restore(self, session: Session, manager: ManagerBase, epoch: int) -> int:
        """Load ``epoch`` on every node. If the epoch was chosen by the catalog (not by
        the user) and its data turns out to be damaged or missing, fall back to the
        newest older epoch committed on every node, loudly; returns the epoch loaded."""
        nodes = self.job.nodes_to_checkpoint()
        while True:
            try:
                session.run(manager.restore(nodes, epoch))
            except (CorruptCheckpointError, ObjectNotFoundError) as error:
                older = (
                    None
                    if self.resume_from_epoch is not None
                    else self._listing(manager).newest_complete(
                        self._saved_nodes(manager), before=epoch
                    )
                )
                manager.report(
                    "checkpoint_load_failed",
                    manager.failure_stats(
                        epoch,
                        {node: f"{type(error).__name__}: {error}" for node in manager.node_names()},
                        action="checkpoint_load_failed",
                    ),
                )
                if older is None:
                    raise
                log.error(
                    "Epoch %d cannot be restored (%s); resuming from epoch %d, the newest "
                    "older epoch committed on every node",
                    epoch,
                    error,
                    older,
                )
                self.restore_failures.append(SaveFailure(epoch, error))
                manager.replace_committed(upto=epoch)
                epoch = older
                continue
            manager.report_checkpoint_stats("checkpoint_load")
            return epoch

    def save_checkpoints(self, epoch: int, session: Session) -> bool:
        """Save and commit ``epoch`` on every node; True if it was committed (with
        ``async_save``: True if its background save started)."""
        epoch = validate_epoch(epoch)
        manager = self.checkpoint_manager
        if manager is None:
            raise JobConfigurationError("save_checkpoints needs a checkpoint manager")
        self._count_copy_failures(manager)
        if self.async_save:
            return self._start_async_save(manager, epoch, session)
        attempts = 1 + self.save_retries
        committed = False  # once it is, a retry retries only the catalog write
        for attempt in range(1, attempts + 1):
            try:
                if not committed:
                    manager.check_accessible(epoch)
                    self._run_save(session, manager, epoch)
                    committed = True
                manager.finish_commit(epoch, retention=self._retention(manager))
                break
            except AlreadyCommittedError:
                raise  # write-once: retrying cannot help, and it is not a storage fault
            except (OSError, CorruptCheckpointError) as error:
                if is_permanent(error):
                    raise
                log.warning(
                    "Unable to write %s for epoch %d (attempt %d of %d): %s",
                    "the catalog entry" if committed else "checkpoint",
                    epoch,
                    attempt,
                    attempts,
                    error,
                )
                if attempt == attempts or is_disk_full(error):
                    self._save_failed(epoch, error)
                    return False
                time.sleep(self.retry_backoff * 2 ** (attempt - 1))
        self._consecutive_failures = 0
        self.committed_epochs.append(epoch)
        return True

    def _retention(self, manager: ManagerBase) -> RetentionPolicy | None:
        """The runner's retention policy, else the manager's."""
        return self.retention if self.retention is not None else manager.retention

    def _start_async_save(self, manager: ManagerBase, epoch: int, session: Session) -> bool:
        self.collect_saves(self.max_saves_in_flight - 1)
        try:
            if self._lease is not None:
                self._lease.check()
            manager.check_accessible(epoch)
            future = manager.save_async(
                epoch,
                session,
                max_in_flight=self.max_saves_in_flight,
                retries=self.save_retries,
                backoff=self.retry_backoff,
                background_nice=self.background_nice,
                retention=self._retention(manager),
            )
        except AlreadyCommittedError:
            raise
        except (OSError, CorruptCheckpointError) as error:
            if is_permanent(error):
                raise
            log.warning("Unable to start the save of epoch %d: %s", epoch, error)
            self._save_failed(epoch, error)
            return False
        self._in_flight.append(future)
        return True

    def collect_saves(self, keep: int = 0) -> None:
        """Collect finished background saves, waiting for the oldest until at most
        ``keep`` are unfinished; a failed one counts as a failed save (and may raise
        :class:`~ckptstore.errors.TooManySaveFailuresError`)."""
        while self._in_flight:
            future = self._in_flight[0]
            if len(self._in_flight) <= keep and not future.done():
                return
            error = future.exception()
            self._in_flight.pop(0)
            if error is None:
                self._consecutive_failures = 0
                self.committed_epochs.append(future.epoch)
            elif isinstance(error, AlreadyCommittedError):
                raise error  # write-once: not a storage failure to count
            elif isinstance(error, (OSError, CorruptCheckpointError)) and not is_permanent(error):
                log.warning("The background save of epoch %d failed: %s", future.epoch, error)
                self._save_failed(future.epoch, error)
            else:
                raise error

    @contextmanager
    def _finishing_saves(self) -> Iterator[None]:
        """On any error (Ctrl-C included) leave no background save unaccounted for:
        wait for the saves in flight, logging which; a second Ctrl-C abandons them."""
        try:
            yield
        except BaseException:
            pending = [future.epoch for future in self._in_flight if not future.done()]
            if pending:
                log.warning(
                    "Interrupted: waiting for the background save of epoch(s) %s to "
                    "finish (interrupt again to abandon it)",
                    pending,
                )
            try:
                self.collect_saves(0)
            except KeyboardInterrupt:
                log.warning(
                    "Abandoned the background save of epoch(s) %s: not committed unless its "
                    "commit record was already written; a resume starts from the last "
                    "committed epoch",
                    [future.epoch for future in self._in_flight if not future.done()] or pending,
                )
            except Exception:
                log.error("A background save failed while stopping", exc_info=True)
            else:
                if pending:
                    log.warning("The background save of epoch(s) %s finished", pending)
            raise

    def _run_save(self, session: Session, manager: ManagerBase, epoch: int) -> None:
        """Run the manager's save of ``epoch``. An epoch the runner fell back past
        (committed, but it could not be restored) is replaced: it holds nothing usable."""
        if self._lease is not None:
            self._lease.check()
        session.run(manager.save(epoch))

    def _save_failed(self, epoch: int, error: BaseException) -> None:
        manager = self.checkpoint_manager
        assert manager is not None
        self.save_failures.append(SaveFailure(epoch, error))
        node_errors = (
            error.node_errors
            if isinstance(error, SaveFailedError)
            else {node: f"{type(error).__name__}: {error}" for node in manager.node_names()}
        )
        manager.report("checkpoint_save_failed", manager.failure_stats(epoch, node_errors))
        self._consecutive_failures += 1
        limit = self.max_consecutive_save_failures
        if limit is not None and self._consecutive_failures >= limit:
            raise TooManySaveFailuresError(self._consecutive_failures, error) from error

    def load_blobs_from_checkpoints(
        self, blob_names: list[str], epoch: int, session: Session
    ) -> bool:
        """Gather ``blob_names`` from every checkpointed node's epoch ``epoch`` into the
        current node; False (nothing loaded) if that epoch is not committed everywhere."""
        epoch = validate_epoch(epoch)
        manager = self.checkpoint_manager
        if manager is None:
            raise JobConfigurationError("load_blobs_from_checkpoints needs a checkpoint manager")
        load = getattr(manager, "load_blobs_locally", None)
        if load is None:
            raise JobConfigurationError(
                "load_blobs_from_checkpoints needs a MultiNodeCheckpointManager"
            )
        result = bool(load(self.job.nodes_to_checkpoint(), blob_names, epoch, session))
        manager.report_checkpoint_stats("checkpoint_partial_load")
        return result

    def _upload(
        self, session: Session, epoch: int, resumed_from: int | None
    ) -> OSError | CorruptCheckpointError | None:
        builder = self.upload_task_group_builder
        if builder is None:
            return None
        manager = self.checkpoint_manager
        if manager is None:
            raise JobConfigurationError("an upload builder needs a checkpoint manager")
        committed = self.committed_epochs[-1] if self.committed_epochs else resumed_from
        if committed is None:
            log.warning("Nothing to upload: no epoch was committed in this run")
            return None
        if committed != epoch:
            log.warning(
                "The save of the last epoch (%d) failed; uploading epoch %d, the last committed",
                epoch,
                committed,
            )
        try:
            session.run(builder.build(committed, manager))
        except (OSError, CorruptCheckpointError) as error:
            # raised once download and exit ran; a corrupt source is an upload failure too
            log.error("Upload of epoch %d failed: %s", committed, error)
            return error
        return None
