"""The upload-builder contract: what a job does with its final checkpoint.

Example (a builder that only logs; :class:`~ckptstore.builtin.CopyUpload` really copies)::

    >>> from ckptstore.execution import Node, Task, WorkspaceType
    >>> class LogUpload(UploadTaskGroupBuilder):
    ...     name = "log"
    ...     def build(self, epoch, checkpoint_manager):
    ...         group = TaskGroup(WorkspaceType.GLOBAL)
    ...         for node in checkpoint_manager.node_names():
    ...             with Node(node), group:
    ...                 Task(lambda ws, node=node: print("upload", node, epoch))
    ...         return group
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> LocalSession().run(LogUpload().build(3, manager))
    upload trainer_0 3
    [None]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

from ckptstore.execution import TaskGroup
from ckptstore.io import IOSettings
from ckptstore.plugin._db_type import DBType
from ckptstore.plugin._path_type import PathType

__all__ = ["CheckpointRoot", "UploadSource", "UploadTaskGroupBuilder"]


class CheckpointRoot(Protocol):
    """Where the checkpoints to upload are: their storage, format and I/O settings.

    :class:`ckptstore.protocol.CheckpointLocation` is one."""

    @property
    def storage(self) -> PathType: ...

    @property
    def db_type(self) -> DBType: ...

    @property
    def io_settings(self) -> IOSettings: ...


class UploadSource(Protocol):
    """What an upload builder may ask of the checkpoint manager that calls it.

    The nodes whose checkpoints to upload, and where they are (every
    :class:`ckptstore.CheckpointManager` is one)."""

    def node_names(self) -> list[str]: ...

    @property
    def location(self) -> CheckpointRoot: ...


class UploadTaskGroupBuilder(ABC):
    """Builds the task group that uploads an epoch's checkpoints after training.

    :class:`~ckptstore.JobRunner` calls :meth:`build` with the last committed epoch and
    its checkpoint manager, and runs the group it returns.

    Example::

        >>> from ckptstore import CheckpointManager, Job, JobRunner
        >>> from ckptstore.builtin import CopyUpload
        >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
        >>> runner = JobRunner(Job(), manager, upload_task_group_builder=CopyUpload("archive"))
    """

    name: ClassVar[str]

    @abstractmethod
    def build(self, epoch: int, checkpoint_manager: UploadSource) -> TaskGroup:
        """A task group that uploads ``epoch``'s checkpoints."""
