"""The ``copy`` upload builder: copy an epoch's committed checkpoints to another URL.

Every node copies its own checkpoint in parallel (on its own worker under a
distributed session), verifying checksums on the way; the destination's commit record
is written last, once every node's copy is complete. Restores can then come from
either tier (``manager.load(epoch, path_prefix=dest)``).

Example::

    >>> from ckptstore import Job, JobRunner, LocalSession, Node, Task, epoch_limiter
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     done = epoch_limiter(job, 2)
    >>> from ckptstore import CheckpointManager
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> upload = CopyUpload("archive")  # "s3://bucket/run" works alike
    >>> JobRunner(job, manager, upload_task_group_builder=upload).train(LocalSession())
    2
    >>> from ckptstore.protocol import read_commit
    >>> sorted(read_commit(upload.storage, 2).nodes)
    ['trainer_0']
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from ckptstore.checkpoint import commit_saves
from ckptstore.execution import Node, Task, TaskGroup, WorkspaceType
from ckptstore.plugin import PathType, UploadSource, UploadTaskGroupBuilder, get_registry, hookimpl
from ckptstore.protocol import CheckpointLocation, copy_node_task

__all__ = ["CopyUpload"]


class CopyUpload(UploadTaskGroupBuilder):
    """Copies the final committed epoch to ``dest`` (any path type's URL).

    ``storage_options`` go to the destination's path type; ``verify`` reads the copy
    back and checks every checksum before committing it.

    Example::

        >>> CopyUpload("gs://bucket/run", storage_options={"token": "anon"}).dest
        'gs://bucket/run'
    """

    name = "copy"

    def __init__(
        self,
        dest: str,
        *,
        path_type: str | None = None,
        storage_options: Mapping[str, object] | None = None,
        verify: bool = True,
    ) -> None:
        self.dest = dest
        self.path_type = path_type
        self.storage_options = dict(storage_options or {})
        self.verify = verify
        self._storage: PathType | None = None

    @property
    def storage(self) -> PathType:
        """The destination root, opened on first use."""
        if self._storage is None:
            self._storage = get_registry().open_path(
                self.dest, self.path_type, **self.storage_options
            )
        return self._storage

    def __repr__(self) -> str:
        return f"CopyUpload({self.storage.display_url!r})"

    def build(self, epoch: int, checkpoint_manager: UploadSource) -> TaskGroup:
        dest = self.storage
        nodes = checkpoint_manager.node_names()
        source = checkpoint_manager.location
        if not isinstance(source, CheckpointLocation):  # another manager's own root type
            source = CheckpointLocation(source.storage, source.db_type, source.io_settings)
        # Nothing at ``dest`` is retracted: a node already committed there stays as it
        # is (the same checkpoint: skipped; another job's: the copy fails).
        group = TaskGroup(
            WorkspaceType.GLOBAL,
            after_run=partial(commit_saves, storage=dest, epoch=epoch),
        )
        for node in nodes:
            with Node(node), group:
                Task(
                    partial(
                        copy_node_task,
                        source=source,
                        dest=dest,
                        node=node,
                        epoch=epoch,
                        verify=self.verify,
                    ),
                    name="checkpoint_upload",
                )
        return group


@hookimpl
def ckptstore_upload_builders() -> list[type[UploadTaskGroupBuilder]]:
    return [CopyUpload]
