"""The execution model: nodes, per-node workspaces, tasks, task groups, jobs and the
sessions that run them (Caffe2's ``Job``/``Task``/``Session``, without Caffe2).

Owns what runs where; knows nothing of checkpoints or storage. May import only
:mod:`ckptstore.records` (name rules), :mod:`ckptstore.errors` and the standard library.

Example::

    >>> from ckptstore.execution import Job, Node, Task
    >>> with Job() as job, Node("trainer_0"):
    ...     _ = Task(lambda ws: ws.update(step=1), name="train")
    >>> [task.name for task in job.epoch_group.tasks()]
    ['train']
"""

from ckptstore.execution._job import Job, epoch_limiter
from ckptstore.execution._node import DEFAULT_NODE, Node
from ckptstore.execution._session import LocalSession, Runnable, Session, TaskOutcome
from ckptstore.execution._task import Task, TaskFn, TaskGroup, TaskOutput, WorkspaceType
from ckptstore.execution._workspace import PrivateWorkspace, Workspace, as_blob

__all__ = [
    "DEFAULT_NODE",
    "Job",
    "LocalSession",
    "Node",
    "PrivateWorkspace",
    "Runnable",
    "Session",
    "Task",
    "TaskFn",
    "TaskGroup",
    "TaskOutcome",
    "TaskOutput",
    "Workspace",
    "WorkspaceType",
    "as_blob",
    "epoch_limiter",
]
