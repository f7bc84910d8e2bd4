"""MultiNodeCheckpointManager: checkpoints every node of a job, committing an epoch only
when all of them saved it.

Example::

    >>> from ckptstore import Job, Node, Task, epoch_limiter
    >>> with Job() as job:
    ...     for name in ("trainer_0", "trainer_1"):
    ...         with Node(name):
    ...             with job.init_group:
    ...                 _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...             _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     with Node("trainer_0"):
    ...         done = epoch_limiter(job, 3)
    >>> from ckptstore import JobRunner, LocalSession
    >>> manager = MultiNodeCheckpointManager("ckpt", "zarr", metadata_handler="json")
    >>> JobRunner(job, manager).train(LocalSession())  # "s3://bucket/run" works alike
    3
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial

from ckptstore import protocol
from ckptstore.checkpoint._manager import (
    DEFAULT_DB_TYPE,
    CheckpointManager,
    ManagerBase,
)
from ckptstore.checkpoint._node_tasks import NO_HOOKS, Hooks, NodeWork, partial_load
from ckptstore.checkpoint._retention import RetentionPolicy
from ckptstore.checkpoint._roots import open_roots
from ckptstore.checkpoint._tiers import RootLike
from ckptstore.errors import JobConfigurationError
from ckptstore.execution import Node, Session, Task, TaskGroup, WorkspaceType
from ckptstore.io import IOSettings
from ckptstore.plugin import DBType, MetadataHandler, MetadataHandlerLike
from ckptstore.records import db_name, validate_epoch, validate_node_name

__all__ = ["MultiNodeCheckpointManager"]

log = logging.getLogger(__name__)


class MultiNodeCheckpointManager(ManagerBase):
    """One :class:`CheckpointManager` per node, driven together.

    Saves run on every node at once (each node writes its own data); the epoch's commit
    record is written only once every node succeeded. Per-node managers have no
    metadata handler: this object alone talks to it, as in Caffe2. Committed epochs are
    write-once: saving one again raises :class:`~ckptstore.errors.AlreadyCommittedError`
    unless ``overwrite=True``, which uncommits the job's nodes first. ``db_prefix`` may
    list several roots, fastest first, as for :class:`CheckpointManager`
    (``["/mnt/nvme/run", "s3://bucket/run"]``). ``incremental`` and ``frozen`` too:
    a node that does not hold a blob ``frozen`` names ignores that name.

    Example::

        >>> from ckptstore import LocalSession
        >>> session = LocalSession()
        >>> for node in ("trainer_0", "trainer_1"):
        ...     session.workspace(node)["w"] = np.ones(2)
        >>> manager = MultiNodeCheckpointManager("npz_ckpt", "npz")
        >>> _ = session.run(manager.init(["trainer_0", "trainer_1"]))
        >>> _ = session.run(manager.save(1))  # commits epoch 1 once both nodes saved
        >>> manager.get_ckpt_db_name("trainer_1", 1)
        'npz_ckpt/trainer_1.1'
    """

    def __init__(
        self,
        db_prefix: str | Sequence[RootLike],
        db_type: str | DBType = DEFAULT_DB_TYPE,
        metadata_handler: str | MetadataHandler | MetadataHandlerLike | None = None,
        *,
        io: IOSettings | None = None,
        path_type: str | None = None,
        storage_options: Mapping[str, object] | None = None,
        retention: RetentionPolicy | Sequence[RetentionPolicy | None] | None = None,
        overwrite: bool = False,
        incremental: bool = False,
        frozen: Collection[str] = (),
    ) -> None:
        location, later = open_roots(
            db_prefix,
            db_type=db_type,
            io=io,
            path_type=path_type,
            storage_options=storage_options,
            incremental=incremental,
            frozen=frozen,
        )
        super().__init__(location, metadata_handler, None, overwrite=overwrite)
        self._set_tiers(later, retention)
        self._node_managers: list[tuple[str, CheckpointManager]] | None = None
        self._node_names: list[str] = []

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.location.storage.display_url!r}, "
            f"{self._db_type.name!r}, nodes={self._node_names})"
        )

    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``(node name, per-node manager)`` pairs, in the job's node order."""
        return list(self._require_managers())

    def node_names(self) -> list[str]:
        """The nodes this manager checkpoints (after :meth:`init`)."""
        return [node for node, _ in self._require_managers()]

    def _require_managers(self) -> list[tuple[str, CheckpointManager]]:
        if self._node_managers is None:
            raise JobConfigurationError("call manager.init(nodes) first")
        return self._node_managers

    def _create_managers(self, nodes: Sequence[str]) -> bool:
        """Create per-node managers; False if they exist (for the same nodes)."""
        names = [validate_node_name(str(node)) for node in nodes]
        if self._node_managers is not None:
            existing = [node for node, _ in self._node_managers]
            if existing != names:
                raise JobConfigurationError(
                    f"this manager was initialised for nodes {existing}, not {names}; use one "
                    "manager per set of nodes"
                )
            return False
        self._node_managers = [
            (node, CheckpointManager(self._db_prefix, node, location=self._location))
            for node in names
        ]
        for _, manager in self._node_managers:
            manager.tiers = self.tiers  # loads read from the fastest root holding the node
        return True

    def _task_group(
        self, build: Callable[[CheckpointManager], Task], hooks: Hooks = NO_HOOKS
    ) -> TaskGroup:
        after = hooks.after
        group = TaskGroup(
            WorkspaceType.GLOBAL,
            before_run=hooks.before,
            # on the driver: the commit's stats (the record just written) are kept
            after_run=None
            if after is None
            else lambda results: self._keep_committed(list(after(results))),
        )
        for node, manager in self._require_managers():
            with Node(node), group:
                build(manager)
        return group

    # -- Caffe2 API -------------------------------------------------------------------

    def init(
        self,
        nodes: Sequence[str] | None = None,
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> TaskGroup:
        """A group recording each node's blob list. Called again on the same nodes it
        returns an empty group and keeps the lists, unless ``retrieve_from_epoch`` asks
        to re-read them from that epoch's manifests."""
        if not nodes:
            raise JobConfigurationError("MultiNodeCheckpointManager.init needs the list of nodes")
        if retrieve_from_epoch is not None:
            retrieve_from_epoch = validate_epoch(retrieve_from_epoch, "retrieve_from_epoch")
        created = self._create_managers(nodes)
        if not created and retrieve_from_epoch is None:
            return TaskGroup(WorkspaceType.GLOBAL)
        return self._task_group(
            lambda manager: manager.init(
                [manager.node_name], retrieve_from_epoch, path_prefix, path_type
            )
        )

    def save(self, epoch: int) -> TaskGroup:
        """A group saving every node; the epoch is committed after all succeeded, and
        :class:`~ckptstore.errors.SaveFailedError` names the nodes that did not."""
        group = super().save(epoch)
        assert isinstance(group, TaskGroup)
        return group

    def _on_every_node(
        self, build: Callable[[CheckpointManager], NodeWork], name: str, hooks: Hooks = NO_HOOKS
    ) -> TaskGroup:
        return self._task_group(lambda manager: manager._on_every_node(build, name), hooks)

    def load(
        self, epoch: int, path_prefix: str | None = None, path_type: str | None = None
    ) -> TaskGroup:
        """A group loading every node's blobs from epoch ``epoch``."""
        epoch = validate_epoch(epoch)
        group = self._task_group(lambda manager: manager.load(epoch, path_prefix, path_type))
        self._stats_outputs = [task.outputs()[0] for task in group.tasks()]
        return group

    def restore(self, nodes: Sequence[str], epoch: int) -> TaskGroup:
        """A group loading every node's blobs from epoch ``epoch`` and recording them as
        the blobs to checkpoint (see :meth:`ManagerBase.restore`)."""
        epoch = validate_epoch(epoch)
        self._create_managers(nodes)
        group = self._task_group(lambda manager: manager.restore([manager.node_name], epoch))
        self._stats_outputs = [task.outputs()[0] for task in group.tasks()]
        return group

    def _blob_lists(self) -> list[tuple[str, list[str]]]:
        return [(node, manager.blob_list()) for node, manager in self._require_managers()]

    def load_blobs_locally(
        self, nodes: Sequence[str], blob_names: Sequence[str], epoch: int, session: Session
    ) -> bool:
        """Gather ``blob_names`` from the nodes' checkpoints of ``epoch`` into the current
        node's workspace. Returns False, loading nothing, if any node's checkpoint of
        that epoch is not committed; raises if a requested blob is found nowhere."""
        epoch = validate_epoch(epoch)
        self._create_managers(nodes)
        names = self.node_names()
        location = self._read_location(None, None)
        committed = protocol.committed_nodes(location, epoch, names)
        self._stats_outputs = []
        absent = [node for node in names if node not in committed]
        if absent:
            for node in absent:
                log.info("DB %s does not exist!", location.db_path(node, epoch))
            return False
        task = Task(
            partial(
                partial_load, location=location, nodes=names, epoch=epoch, names=list(blob_names)
            ),
            name="checkpoint_partial_load",
            result_is_output=True,
        )
        session.run(task)
        self._stats_outputs = [task.outputs()[0]]
        return True

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str | None:
        """Where ``node_name``'s checkpoint of ``epoch`` lives (None for an unknown node)."""
        for node, _ in self._require_managers():
            if node == str(node_name):
                return db_name(validate_epoch(epoch), node, self._db_prefix)
        return None

    def set_params(
        self, nodes: Sequence[str], path_prefix: str | None = None, path_type: str | None = None
    ) -> None:
        self._node_names = [str(node) for node in nodes]
        self._set_params(self._node_names, path_prefix, path_type)
