"""JobRunner: runs a job epoch by epoch, checkpointing after each epoch and resuming
from the last complete one.

Order, as in Caffe2: init → init-checkpoint → (save 0 | load k) →
[epoch → stop-check → save]* → upload → download → exit.

Example::

    runner = JobRunner(job, MultiNodeCheckpointManager("/ckpt", "zarr", "json"))
    last_epoch = runner.train(LocalSession())
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptstore.checkpoint._manager import ManagerBase
from ckptstore.checkpoint._retention import RetentionPolicy, retain_after_save
from ckptstore.errors import (
    CorruptCheckpointError,
    JobConfigurationError,
    ObjectNotFoundError,
    SaveFailedError,
    TooManySaveFailuresError,
)
from ckptstore.execution._job import Job
from ckptstore.execution._session import Session
from ckptstore.plugin._registry import get_registry
from ckptstore.plugin._upload import UploadTaskGroupBuilder
from ckptstore.protocol._commit import newest_complete_before

__all__ = ["JobRunner", "SaveFailure"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveFailure:
    """An epoch whose checkpoint could not be committed (or restored), and why."""

    epoch: int
    error: BaseException


def _older_complete(manager: ManagerBase, epoch: int) -> int | None:
    """The newest epoch before ``epoch`` committed on every node of ``manager``."""
    return newest_complete_before(manager.location.storage, epoch, manager.node_names())


class JobRunner:
    """Runs a :class:`~ckptstore.Job` with checkpoints.

    Unlike Caffe2, a failed save is retried (``save_retries`` times, with exponential
    backoff from ``retry_backoff`` seconds), counted in :attr:`save_failures`, reported
    as ``checkpoint_save_failed`` and never committed; with
    ``max_consecutive_save_failures`` the job stops after that many failed epochs in a
    row. Errors that retrying cannot fix (bad names, unsupported blobs, bugs) propagate.
    ``retention`` (e.g. :class:`~ckptstore.checkpoint._retention.KeepLast`) deletes older committed
    epochs after each committed save (see :mod:`ckptstore.checkpoint._retention`); without it, the
    manager's own ``retention`` applies.

    Example::

        runner = JobRunner(job, manager, max_consecutive_save_failures=3)
        runner.train(session)
        runner.committed_epochs  # [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        job: Job,
        checkpoint_manager: ManagerBase | None = None,
        resume_from_epoch: int | None = None,
        upload_task_group_builder: str | UploadTaskGroupBuilder | Any | None = None,
        *,
        save_retries: int = 2,
        retry_backoff: float = 0.5,
        max_consecutive_save_failures: int | None = None,
        retention: RetentionPolicy | None = None,
    ) -> None:
        if save_retries < 0:
            raise JobConfigurationError(f"save_retries must be >= 0, got {save_retries}")
        if max_consecutive_save_failures is not None and max_consecutive_save_failures < 1:
            raise JobConfigurationError("max_consecutive_save_failures must be >= 1 or None")
        self.job = job
        self.checkpoint_manager = checkpoint_manager
        self.resume_from_epoch = resume_from_epoch
        self.upload_task_group_builder = get_registry().upload_builder(upload_task_group_builder)
        self.save_retries = save_retries
        self.retry_backoff = retry_backoff
        self.max_consecutive_save_failures = max_consecutive_save_failures
        self.retention = retention
        self.save_failures: list[SaveFailure] = []
        self.restore_failures: list[SaveFailure] = []
        self.committed_epochs: list[int] = []
        self._consecutive_failures = 0
        self.already_finished = False

    def __call__(self, session: Session) -> int:
        return self.train(session)

    def train(self, session: Session) -> int:
        """Run the job to its end; returns the number of the last epoch run.

        A job resumed at or past its :func:`~ckptstore.epoch_limiter` limit is finished:
        its last epoch is restored (and so verified; a damaged one falls back as usual),
        then no epoch, save, upload, download or exit group runs; :attr:`already_finished`
        is set, a warning says so and the restored epoch is returned.
        """
        job, manager = self.job, self.checkpoint_manager
        if not job.stop_conditions:
            raise JobConfigurationError(
                "the job has no stop condition and would run forever: add "
                "epoch_limiter(job, n) or job.add_stop_condition(output)"
            )
        resume = self.resume_from_epoch
        if manager is not None:
            nodes = job.nodes_to_checkpoint()
            manager.set_params(nodes=nodes)
            resume = manager.get_resume_from_epoch_id(resume)
            if resume is not None:
                log.info("Resuming from epoch %d", resume)
        elif resume is not None:
            raise JobConfigurationError(
                f"resume_from_epoch={resume} needs a checkpoint manager to load that epoch "
                "from: pass checkpoint_manager=..."
            )
        from_scratch = resume is None
        if from_scratch:
            session.run(job.init_group)
        if manager is not None:
            if resume is None:
                session.run(manager.init(job.nodes_to_checkpoint()))
                self.save_checkpoints(0, session)
            else:
                resume = self._restore(session, manager, resume)
                if self._finished(resume):
                    return resume
        epoch = 1 if resume is None else resume + 1
        while True:
            session.run(job.epoch_group)
            stop = any(bool(np.any(output.fetch())) for output in job.stop_conditions)
            if manager is not None:
                self.save_checkpoints(epoch, session)
            if stop:
                break
            epoch += 1
        upload_error = self._upload(session, epoch, resume)
        session.run(job.download_group)
        session.run(job.exit_group)
        if upload_error is not None:
            raise upload_error
        return epoch

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
                session.run(manager.init(nodes, retrieve_from_epoch=epoch))
                session.run(manager.load(epoch))
            except (CorruptCheckpointError, ObjectNotFoundError) as error:
                older = (
                    None if self.resume_from_epoch is not None else _older_complete(manager, epoch)
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
                epoch = older
                continue
            manager.report_checkpoint_stats("checkpoint_load")
            return epoch

    def save_checkpoints(self, epoch: int, session: Session) -> bool:
        """Save and commit ``epoch`` on every node; True if it was committed."""
        manager = self.checkpoint_manager
        if manager is None:
            raise JobConfigurationError("save_checkpoints needs a checkpoint manager")
        attempts = 1 + self.save_retries
        for attempt in range(1, attempts + 1):
            try:
                if not manager.cp_accessible(epoch=None):
                    raise SaveFailedError(
                        epoch,
                        manager.location.storage.display_url,
                        dict.fromkeys(manager.node_names(), "Checkpoint files cannot be accessed"),
                    )
                session.run(manager.save(epoch))
                manager.write_checkpoint_metadata(epoch)
                break
            except (OSError, CorruptCheckpointError) as error:
                log.warning(
                    "Unable to write checkpoint for epoch %d (attempt %d of %d): %s",
                    epoch,
                    attempt,
                    attempts,
                    error,
                )
                if attempt == attempts:
                    self._save_failed(epoch, error)
                    return False
                time.sleep(self.retry_backoff * 2 ** (attempt - 1))
        self._consecutive_failures = 0
        self.committed_epochs.append(epoch)
        manager.report_checkpoint_stats("checkpoint_save")
        policy = self.retention if self.retention is not None else manager.retention
        if policy is not None:
            retain_after_save(manager, policy, epoch)
        return True

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
