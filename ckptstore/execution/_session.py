"""Sessions run tasks and task groups on nodes, and hold each node's workspace.

Example::

    >>> from ckptstore.execution import Node
    >>> session = LocalSession()
    >>> with Node("trainer_0"):
    ...     task = Task(lambda ws: ws.update(total=np.array([100])), outputs=["total"])
    >>> session.run(task)
    [None]
    >>> session.workspace("trainer_0")["total"]
    array([100])
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ckptstore._closing import Closing
from ckptstore.execution._node import DEFAULT_NODE
from ckptstore.execution._task import Task, TaskGroup, WorkspaceType
from ckptstore.execution._workspace import Workspace

__all__ = ["LocalSession", "Runnable", "Session", "TaskOutcome"]

Runnable = Task | TaskGroup
"""What :meth:`Session.run` accepts: a task, a task group, or what a manager returns."""


@dataclass(frozen=True)
class TaskOutcome:
    """What running one task produced: its return value, or the exception it raised."""

    result: object = None
    error: BaseException | None = None


class Session(Closing):
    """Runs runnables on nodes. Subclasses decide where a node's workspace lives.

    ``run`` freezes the group, calls its ``before_run`` hook, runs every task (a failing
    task does not stop the others), binds outputs, re-raises the first failure with the
    others attached as notes, and calls ``after_run`` only when all tasks succeeded.

    Example::

        >>> class MySession(Session):
        ...     def _execute(self, group): ...
        ...     def fetch_blob(self, node, name): ...
        >>> session = MySession()
    """

    @classmethod
    def compile(cls, runnable: Runnable) -> TaskGroup:
        """Freeze ``runnable`` for running; a bare task becomes a GLOBAL group of one."""
        group = TaskGroup.wrapping(runnable) if isinstance(runnable, Task) else runnable
        group.freeze()
        return group

    def run(self, runnable: Runnable) -> list[object]:
        """Run a task or task group to completion; returns the tasks' results in order."""
        group = self.compile(runnable)
        if group.before_run is not None:
            group.before_run()
        tasks = group.tasks()
        outcomes = self._execute(group) if tasks else []
        failures: list[tuple[Task, BaseException]] = []
        for task, outcome in zip(tasks, outcomes, strict=True):
            if outcome.error is None:
                task.bind_outputs(self, outcome.result)
            else:
                failures.append((task, outcome.error))
        if failures:
            _raise_failures(failures)
        results = [outcome.result for outcome in outcomes]
        if group.after_run is not None:
            group.after_run(results)
        return results

    @abstractmethod
    def _execute(self, group: TaskGroup) -> Sequence[TaskOutcome]:
        """Run every task of ``group`` (possibly concurrently); one outcome per task."""

    @abstractmethod
    def fetch_blob(self, node: str, name: str) -> np.ndarray:
        """The current value of blob ``name`` in ``node``'s workspace."""

    def close(self) -> None:
        """Release the session's resources; a closed session keeps no workspaces."""


def _raise_failures(failures: list[tuple[Task, BaseException]]) -> None:
    task, first = failures[0]
    first.add_note(f"raised by task {task.name!r} on node {task.node!r}")
    for other_task, other in failures[1:]:
        first.add_note(
            f"task {other_task.name!r} on node {other_task.node!r} also failed: "
            f"{type(other).__name__}: {other}"
        )
    raise first


class LocalSession(Session):
    """Runs everything in this process; every node gets its own workspace.

    Tasks of a group run one after another in the order they were added. Pass
    ``workspaces`` to start from existing workspaces (for instance to share one).

    Example::

        >>> from ckptstore import CheckpointManager, Job, JobRunner, Node, epoch_limiter
        >>> with Job() as job, Node("trainer_0"):
        ...     with job.init_group:
        ...         _ = Task(lambda ws: ws.update(total=np.array([100])))
        ...     _ = Task(lambda ws: ws["total"].__iadd__(1))
        ...     done = epoch_limiter(job, 2)
        >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
        >>> session = LocalSession()
        >>> JobRunner(job, manager).train(session)
        2
        >>> session.workspace("trainer_0")["total"]
        array([102])
    """

    def __init__(self, workspaces: Mapping[str, Workspace] | None = None) -> None:
        self._workspaces: dict[str, Workspace] = dict(workspaces or {})

    def workspace(self, node: str = DEFAULT_NODE) -> Workspace:
        """The workspace of ``node``, created empty on first use."""
        workspace = self._workspaces.get(node)
        if workspace is None:
            workspace = self._workspaces[node] = Workspace()
        return workspace

    def nodes(self) -> list[str]:
        """Names of the nodes that have a workspace in this session."""
        return list(self._workspaces)

    def _execute(self, group: TaskGroup) -> list[TaskOutcome]:
        workspace_type = group.workspace_type() or WorkspaceType.GLOBAL
        outcomes = []
        for task in group.tasks():
            try:
                outcomes.append(
                    TaskOutcome(task.execute(self.workspace(task.node), workspace_type))
                )
            except Exception as error:
                outcomes.append(TaskOutcome(error=error))
        return outcomes

    def fetch_blob(self, node: str, name: str) -> np.ndarray:
        return self.workspace(node)[name]

    def close(self) -> None:
        self._workspaces.clear()
