"""Tasks, task groups and task outputs: the units a session runs on nodes.

Example::

    >>> from ckptstore.execution import LocalSession
    >>> group = TaskGroup(WorkspaceType.GLOBAL)
    >>> with group, Node("trainer_0"):
    ...     init = Task(lambda ws: ws.update(total=np.array([100])), outputs=["total"])
    >>> session = LocalSession()
    >>> session.run(group)
    [None]
    >>> init.outputs()[0].fetch()
    array([100])
"""

from __future__ import annotations

import enum
import itertools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ckptstore.errors import FrozenGroupError, NotRunError
from ckptstore.execution._context import Current
from ckptstore.execution._node import Node
from ckptstore.execution._workspace import PrivateWorkspace, Workspace
from ckptstore.records import validate_blob_name, validate_node_name

if TYPE_CHECKING:
    from ckptstore.execution._session import Session

__all__ = ["Task", "TaskFn", "TaskGroup", "TaskOutput", "WorkspaceType"]

TaskFn = Callable[[Workspace], object]
"""A task's body: called with its node's workspace; its return value is the task's result."""

_task_ids = itertools.count()


class WorkspaceType(enum.Enum):
    """How a group's tasks see their node's workspace.

    ``GLOBAL``: tasks work in the node's workspace directly; every blob they create
    persists. ``PRIVATE``: see :class:`~ckptstore.execution._workspace.PrivateWorkspace`.
    """

    GLOBAL = "global"
    PRIVATE = "private"


class TaskOutput:
    """A handle on something a task produces, fetched after a session ran the task.

    A blob output's :meth:`fetch` reads the blob's *current* value on the task's node
    each time it is called (it is not a snapshot); a result output returns what the
    task's function returned on its last run.

    Example::

        >>> from ckptstore.execution import LocalSession
        >>> task = Task(lambda ws: ws.update(x=np.ones(2)), outputs=["x"])
        >>> LocalSession().run(task)
        [None]
        >>> task.outputs()[0].fetch()
        array([1., 1.])
    """

    def __init__(self, task: Task, blob_name: str | None = None) -> None:
        # the task's node and name, not the task: a task holds its outputs, and an output
        # holding its task would make a cycle that keeps the session (and every blob in
        # its workspaces) alive until the garbage collector's next full pass
        self.node = task.node
        self.task_name = task.name
        self.blob_name = blob_name
        self._session: Session | None = None
        self._value: object = None

    def fetch(self) -> object:
        """The output's value; raises :class:`NotRunError` before the task has run."""
        if self._session is None:
            raise NotRunError(
                f"output {self!r} has not been produced yet: run task {self.task_name!r} "
                "(or its group) in a session before fetching it."
            )
        if self.blob_name is None:
            return self._value
        return self._session.fetch_blob(self.node, self.blob_name)

    def fetch_array(self) -> np.ndarray:
        """:meth:`fetch` for an output holding an array (every blob output does); raises
        :class:`TypeError` for a task result that is not an array."""
        value = self.fetch()
        if not isinstance(value, np.ndarray):
            raise TypeError(f"output {self!r} holds a {type(value).__name__}, not an array")
        return value

    def bind(self, session: Session, value: object = None) -> None:
        """Called by a session after running the task: where (and what) to fetch."""
        self._session = session
        self._value = value

    def __repr__(self) -> str:
        what = self.blob_name if self.blob_name is not None else "<result>"
        return f"TaskOutput({self.node}/{what})"


class Task:
    """One unit of work on one node: a Python function of the node's workspace.

    A task joins the group it is created in (``with group:``, ``with job.init_group:``)
    or ``group=``, and runs on the current ``Node`` or ``node=``. ``outputs`` names the
    blobs it produces; in a PRIVATE group those persist even if the task creates them.
    With ``result_is_output`` the function's return value is ``outputs()[0]`` (how the
    checkpoint managers hand back blob lists, existence checks and stats).

    Example::

        >>> from ckptstore.execution import Job
        >>> job = Job()
        >>> with Node("trainer_0"), job.init_group:
        ...     Task(lambda ws: ws.update(total=np.array([100])), outputs=["total"], name="init")
        Task('init', node='trainer_0')
    """

    def __init__(
        self,
        fn: TaskFn | None = None,
        outputs: Sequence[str] = (),
        name: str | None = None,
        group: TaskGroup | None = None,
        node: str | None = None,
        *,
        result_is_output: bool = False,
    ) -> None:
        self.fn = fn
        self.id = next(_task_ids)
        self.name = name or getattr(fn, "__name__", None) or f"task_{self.id}"
        self.node = validate_node_name(node) if node is not None else Node.current()
        if isinstance(outputs, str):
            outputs = [outputs]
        self._outputs = [TaskOutput(self, validate_blob_name(blob)) for blob in outputs]
        self._result = TaskOutput(self)
        if result_is_output:
            self._outputs.insert(0, self._result)
        self._group: weakref.ref[TaskGroup] | None = None
        target = group if group is not None else TaskGroup._innermost()
        if target is not None:
            target.add(self)

    @property
    def group(self) -> TaskGroup | None:
        """The group this task joined (None if none, or once that group is gone).

        A weak reference: the group holds its tasks, and a task holding its group would
        make a cycle that outlives both, keeping the session their outputs point at (and
        every blob in its workspaces) until the garbage collector's next full pass.
        """
        return None if self._group is None else self._group()

    def outputs(self) -> list[TaskOutput]:
        """One :class:`TaskOutput` per declared output blob, in declaration order."""
        return list(self._outputs)

    def output_names(self) -> tuple[str, ...]:
        """The declared output blob names."""
        return tuple(output.blob_name for output in self._outputs if output.blob_name)

    def result(self) -> TaskOutput:
        """A :class:`TaskOutput` holding the function's return value from its last run."""
        return self._result

    def execute(self, workspace: Workspace, workspace_type: WorkspaceType) -> object:
        """Run the task's function against ``workspace``; what sessions call on a node."""
        if self.fn is None:
            return None
        if workspace_type is WorkspaceType.PRIVATE:
            return self.fn(PrivateWorkspace(workspace, keep=self.output_names()))
        return self.fn(workspace)

    def bind_outputs(self, session: Session, result: object) -> None:
        """Point this task's outputs at ``session`` after it ran there."""
        for output in self._outputs:
            output.bind(session)
        self._result.bind(session, result)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, node={self.node!r})"


class TaskGroup(Current, context="ckptstore_task_group"):
    """Tasks that start together; the group is done when its last task is.

    ``workspace_type`` is ``None`` until the first task is added, which makes an untyped
    group PRIVATE. A group is frozen once compiled or run. ``before_run`` runs on the
    driver before the tasks; ``after_run`` runs on the driver with the tasks' results,
    only if every task succeeded (the checkpoint managers commit epochs this way).

    Example::

        >>> group = TaskGroup(WorkspaceType.GLOBAL)
        >>> with group:
        ...     _ = Task(lambda ws: ws.update(x=np.zeros(3)))
        >>> group.used_nodes()
        ['local']
    """

    def __init__(
        self,
        workspace_type: WorkspaceType | None = None,
        *,
        before_run: Callable[[], None] | None = None,
        after_run: Callable[[list[object]], object] | None = None,
    ) -> None:
        self._workspace_type = workspace_type
        self._tasks: list[Task] = []
        self._frozen = False
        self.before_run = before_run
        self.after_run = after_run

    @classmethod
    def wrapping(cls, task: Task) -> TaskGroup:
        """A GLOBAL group that runs ``task`` alone (how sessions run a bare task)."""
        group = cls(WorkspaceType.GLOBAL)
        group._tasks.append(task)
        return group

    @staticmethod
    def current() -> TaskGroup | None:
        """The group new tasks join right now, if any."""
        return TaskGroup._innermost()

    def add(self, task: Task) -> None:
        """Add ``task``; raises :class:`FrozenGroupError` once the group ran or compiled."""
        if self._frozen:
            raise FrozenGroupError(
                f"cannot add {task!r}: this task group has already been compiled or run. "
                "Create all tasks before compiling the job or running the group."
            )
        if self._workspace_type is None:
            self._workspace_type = WorkspaceType.PRIVATE
        self._tasks.append(task)
        task._group = weakref.ref(self)

    def extend(self, tasks: Iterable[Task]) -> None:
        """Add several tasks."""
        for task in tasks:
            self.add(task)

    def tasks(self) -> list[Task]:
        """The group's tasks, in the order they were added."""
        return list(self._tasks)

    def used_nodes(self) -> list[str]:
        """Distinct node names of the group's tasks, in first-use order."""
        return list(dict.fromkeys(task.node for task in self._tasks))

    def workspace_type(self) -> WorkspaceType | None:
        """GLOBAL, PRIVATE, or None for an untyped group without tasks."""
        return self._workspace_type

    def freeze(self) -> None:
        """Forbid adding tasks from now on (called on compile and on first run)."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        """Whether tasks can still be added."""
        return self._frozen

    def __repr__(self) -> str:
        kind = self._workspace_type.value if self._workspace_type else "untyped"
        return f"TaskGroup({kind}, {len(self._tasks)} tasks)"
