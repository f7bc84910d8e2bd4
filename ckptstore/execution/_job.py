"""Jobs: the init, epoch, download and exit groups a :class:`~ckptstore.JobRunner` runs.

Example::

    >>> from ckptstore.execution import Node
    >>> def init_model(ws): ws["w"] = np.zeros(3)
    >>> def train_one_epoch(ws): ws["w"] += 1
    >>> with Job() as job:                  # tasks created here join job.epoch_group
    ...     with Node("trainer_0"):
    ...         with job.init_group:
    ...             _ = Task(init_model, name="init")
    ...         _ = Task(train_one_epoch, name="epoch")
    >>> done = epoch_limiter(job, 4)
    >>> [task.name for task in job.init_group.tasks()]
    ['init', 'epoch_limiter/0/init']
"""

from __future__ import annotations

import itertools
from types import TracebackType
from typing import Self

import numpy as np

from ckptstore.errors import JobConfigurationError
from ckptstore.execution._context import Current
from ckptstore.execution._task import Task, TaskGroup, TaskOutput, WorkspaceType
from ckptstore.execution._workspace import Workspace
from ckptstore.records import validate_epoch

__all__ = ["Job", "epoch_limiter"]


class Job(Current, context="ckptstore_job"):
    """The four task groups of a training job and the conditions that end it.

    * ``init_group`` (GLOBAL) runs once when a job starts from scratch; the blobs it
      creates are the state every checkpoint holds.
    * ``epoch_group`` runs once per epoch (PRIVATE by default: temporaries vanish).
    * ``download_group`` and ``exit_group`` run once at the end.

    ``with Job() as job:`` makes it the current job and enters its epoch group.

    Example::

        >>> from ckptstore.execution import Node
        >>> with Job() as job, Node("trainer_0"):
        ...     with job.init_group:
        ...         _ = Task(lambda ws: ws.update(total=np.array([100])))
        ...     _ = Task(lambda ws: ws["total"].__iadd__(1))
        >>> done = epoch_limiter(job, 3)
        >>> len(job.stop_conditions)
        1
    """

    def __init__(
        self,
        init_group: TaskGroup | None = None,
        epoch_group: TaskGroup | None = None,
        download_group: TaskGroup | None = None,
        exit_group: TaskGroup | None = None,
        stop_conditions: list[TaskOutput] | None = None,
        nodes_to_checkpoint: list[str] | None = None,
    ) -> None:
        self.init_group = init_group or TaskGroup(WorkspaceType.GLOBAL)
        self.epoch_group = epoch_group or TaskGroup()
        self.download_group = download_group or TaskGroup()
        self.exit_group = exit_group or TaskGroup()
        self.stop_conditions: list[TaskOutput] = list(stop_conditions or [])
        self._nodes_to_checkpoint = (
            list(nodes_to_checkpoint) if nodes_to_checkpoint is not None else None
        )
        self._limiter_ids = itertools.count()
        self._epoch_limits: list[int] = []

    @staticmethod
    def current() -> Job:
        """The job of the innermost ``with Job():`` block."""
        job = Job._innermost()
        if job is None:
            raise JobConfigurationError(
                "there is no current job: call this inside a `with Job() as job:` block"
            )
        return job

    def __enter__(self) -> Self:
        super().__enter__()
        self.epoch_group.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.epoch_group.__exit__(exc_type, exc, tb)
        super().__exit__(exc_type, exc, tb)

    def groups(self) -> tuple[TaskGroup, TaskGroup, TaskGroup, TaskGroup]:
        """The init, epoch, download and exit groups."""
        return self.init_group, self.epoch_group, self.download_group, self.exit_group

    def add_stop_condition(self, output: TaskOutput | str) -> TaskOutput:
        """End the job after an epoch in which ``output`` is true.

        ``output`` is a task output, or the name of a blob on the current node (read
        after each epoch by an empty task added to the epoch group).
        """
        if isinstance(output, str):
            reader = Task(outputs=[output], group=self.epoch_group, name=f"stop_if_{output}")
            output = reader.outputs()[0]
        if not isinstance(output, TaskOutput):
            raise JobConfigurationError(
                f"stop condition must be a TaskOutput or a blob name, not {type(output).__name__}"
            )
        self.stop_conditions.append(output)
        return output

    def nodes_to_checkpoint(self) -> list[str]:
        """The nodes whose state is checkpointed: the explicit list, else init's nodes."""
        if self._nodes_to_checkpoint is not None:
            if not self._nodes_to_checkpoint:
                raise JobConfigurationError(
                    "nodes_to_checkpoint is an empty list: name at least one node, or pass "
                    "None to checkpoint every node used by init_group"
                )
            return list(self._nodes_to_checkpoint)
        return self.init_group.used_nodes()

    def compile(self, session_class: type | None = None) -> None:
        """Freeze the job's groups; no task can be added afterwards (as in Caffe2)."""
        if self._nodes_to_checkpoint is None:
            self._nodes_to_checkpoint = self.init_group.used_nodes() or None
        for group in self.groups():
            group.freeze()

    def add_epoch_limit(self, num_epochs: int) -> None:
        """Record that the job ends after epoch ``num_epochs`` (used by :func:`epoch_limiter`;
        the runner runs nothing when resuming at or past it)."""
        self._epoch_limits.append(num_epochs)

    def epoch_limit(self) -> int | None:
        """The last epoch this job may run (the smallest :func:`epoch_limiter` limit), or
        None if no limiter was added. A job resumed at or past it is finished."""
        return min(self._epoch_limits) if self._epoch_limits else None

    def next_limiter_id(self) -> int:
        """A fresh index for blob names of helpers such as :func:`epoch_limiter`."""
        return next(self._limiter_ids)


def epoch_limiter(job: Job, num_epochs: int) -> TaskOutput:
    """Stop ``job`` once its epoch ``num_epochs`` has run.

    The counter of epochs run so far is created by ``job.init_group`` on the current
    node, so it is checkpointed; the limit itself is not (unlike Caffe2's countdown). So
    rerunning a finished job runs nothing (the runner logs it and returns the last
    epoch), and raising the limit continues training from the last committed epoch.

    Example::

        >>> job = Job()
        >>> epoch_limiter(job, 10)  # stops after the tenth epoch; returns the flag
        TaskOutput(local/epoch_limiter/0/done)
    """
    num_epochs = validate_epoch(num_epochs, "num_epochs")  # a str or float is refused
    if num_epochs < 1:
        raise JobConfigurationError(f"epoch_limiter needs num_epochs >= 1, got {num_epochs}")
    prefix = f"epoch_limiter/{job.next_limiter_id()}"
    counter, done = f"{prefix}/epochs", f"{prefix}/done"
    job.add_epoch_limit(num_epochs)

    def init_counter(ws: Workspace) -> None:
        ws[counter] = np.array(0, dtype=np.int64)

    def count_epoch(ws: Workspace) -> None:
        epochs = ws[counter]
        epochs += 1
        ws[done] = np.array(bool(epochs >= num_epochs))

    Task(init_counter, group=job.init_group, name=f"{prefix}/init")
    limiter = Task(count_epoch, outputs=[done], group=job.epoch_group, name=f"{prefix}/count")
    return job.add_stop_condition(limiter.outputs()[0])
