"""The upload-builder contract: what a job does with its final checkpoint.

Example::

    class UploadToLocalDir(UploadTaskGroupBuilder):
        name = "to_dir"
        def __init__(self, dest):
            self.dest = dest
        def build(self, epoch, checkpoint_manager):
            group = TaskGroup(WorkspaceType.GLOBAL)
            for node, manager in checkpoint_manager.node_managers():
                with Node(node), group:
                    Task(partial(copy_node_checkpoint, manager, epoch, self.dest))
            return group
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from ckptstore.execution._task import TaskGroup

if TYPE_CHECKING:
    pass

__all__ = ["UploadTaskGroupBuilder"]


class UploadTaskGroupBuilder(ABC):
    """Builds the task group that uploads an epoch's checkpoints after training.

    :class:`~ckptstore.JobRunner` calls :meth:`build` with the last committed epoch and
    its checkpoint manager, and runs the group it returns.

    Example::

        JobRunner(job, manager, upload_task_group_builder=CopyUpload("s3://bucket/run"))
    """

    name: ClassVar[str]

    @abstractmethod
    def build(self, epoch: int, checkpoint_manager: Any) -> TaskGroup:
        """A task group that uploads ``epoch``'s checkpoints."""
