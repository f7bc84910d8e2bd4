"""The metadata-handler contract: the catalog of a job's checkpoints.

One contract, :class:`MetadataHandler`. The runner calls, in this order:
``set_params`` at the start of ``train``; ``last_epoch`` to choose the epoch to resume
from; ``cp_accessible`` before each save; ``write_committed`` (by default ``write``)
after an epoch's save is committed; ``report`` after each save, load, partial load or
failure; ``forget`` after retention deleted epochs. A Caffe2-style handler (any object
with Caffe2's methods, :class:`MetadataHandlerLike`) is wrapped in a
:class:`Caffe2Handler`, so managers see only a :class:`MetadataHandler`.

The contract (``docs/metadata.md``): the commit records are the truth and a catalog is
an index of them. ``last_epoch`` is derived from storage when in doubt (a missing,
unreadable or stale catalog never makes a job start over committed epochs), and
``write(epoch)`` may be called concurrently by several jobs, losing nothing.
:class:`ckptstore.builtin.IndexCatalog` implements it once for catalogs.

Example::

    >>> class PrintingHandler(MetadataHandler):
    ...     name = "printing"
    ...     def last_epoch(self, user_epoch=None):
    ...         return user_epoch
    ...     def write(self, epoch):
    ...         print("epoch", epoch, "is committed")
    >>> PrintingHandler().write(3)
    epoch 3 is committed
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from ckptstore.errors import InvalidPluginError, JobConfigurationError

if TYPE_CHECKING:
    from ckptstore.plugin._path_type import PathType
    from ckptstore.records import NodeStats

__all__ = ["Caffe2Handler", "MetadataHandler", "MetadataHandlerLike", "as_metadata_handler"]


@runtime_checkable
class MetadataHandlerLike(Protocol):
    """A Caffe2-style handler: any object with these methods.

    ``report`` and ``forget`` are optional. Managers accept such an object and wrap it
    in a :class:`Caffe2Handler`."""

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None: ...

    def last_epoch(self, user_epoch: int | None = None) -> int | None: ...

    def write(self, epoch: int) -> None: ...

    def cp_accessible(self, epoch: int | None = None) -> bool: ...


class MetadataHandler(ABC):
    """Keeps track of which epochs are complete, and hears about every operation.

    Subclasses set ``name`` and implement :meth:`last_epoch` and :meth:`write`;
    :meth:`set_params` stores the job's parameters (``self.db_prefix``,
    ``self.node_names``, ``self.storage``...), the rest are optional.

    Example::

        >>> from ckptstore import CheckpointManager
        >>> manager = CheckpointManager("ckpt", "trainer_0", "zarr", metadata_handler="json")
        >>> manager.metadata_handler.name
        'json'
    """

    name: ClassVar[str]
    answers_from_storage: ClassVar[bool] = False
    """Whether :meth:`last_epoch` answers from the commit records themselves (the newest
    epoch complete on every node, as :class:`ckptstore.builtin.IndexCatalog` does): the
    runner then does not ask storage the same question again."""

    def __init__(self) -> None:
        self.db_prefix: str | None = None
        self.db_type: str | None = None
        self.node_names: list[str] = []
        self.path_prefix: str | None = None
        self.path_type: str | None = None
        self.storage: PathType | None = None

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
        storage: PathType | None = None,
    ) -> None:
        """Receive the job's checkpoint location, format and nodes."""
        self.db_prefix = db_prefix
        self.db_type = db_type
        self.node_names = list(node_names)
        self.path_prefix = path_prefix
        self.path_type = path_type
        self.storage = storage

    def require_storage(self) -> PathType:
        """The checkpoint root given to :meth:`set_params`, or a clear error."""
        if self.storage is None:
            raise JobConfigurationError(
                f"metadata handler {self.name!r} has no checkpoint location yet: call "
                "manager.set_params(nodes) first (JobRunner.train does this)"
            )
        return self.storage

    @abstractmethod
    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from: ``user_epoch`` if given (and valid), else the newest
        epoch complete on every node, else ``None`` (start from scratch)."""

    @abstractmethod
    def write(self, epoch: int) -> None:
        """Record that ``epoch`` is committed on every node."""

    def write_committed(self, epoch: int, stats: Sequence[NodeStats]) -> None:
        """Record that ``epoch`` is committed, told by the save that committed it:
        ``stats`` are its nodes', each with the commit just written (``commit``), so a
        catalog need not read it back. The default calls :meth:`write`."""
        self.write(epoch)

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Whether checkpoints can be written now (the runner skips the save if not)."""
        storage = self.require_storage()
        return storage.accessible()

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        """Hear about a finished operation: ``stats`` maps each node checkpoint's path
        to its :class:`~ckptstore.records._stats.NodeStats`."""

    def forget(self, epochs: Sequence[int]) -> None:
        """Drop ``epochs`` from the catalog: retention deleted this job's nodes of them
        (an epoch where other jobs' nodes remain is still committed). The default
        keeps no catalog to change."""


class Caffe2Handler(MetadataHandler):
    """A Caffe2-style duck-typed handler behind the one handler contract.

    Each call goes to ``handler`` with Caffe2's arguments (``set_params`` without
    ``storage``). ``report`` and ``forget`` go to it only if it has them.

    Example::

        >>> class Caffe2Style:  # no base class, as written for Caffe2
        ...     def set_params(self, **params): self.params = params
        ...     def last_epoch(self, user_epoch=None): return 7
        ...     def write(self, epoch): print("epoch", epoch)
        ...     def cp_accessible(self, epoch=None): return True
        >>> handler = as_metadata_handler(Caffe2Style())
        >>> type(handler).__name__, handler.last_epoch()
        ('Caffe2Handler', 7)
        >>> handler.write(3)
        epoch 3
    """

    name = "caffe2"

    def __init__(self, handler: MetadataHandlerLike) -> None:
        super().__init__()
        self.handler = handler
        """The wrapped Caffe2-style handler."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.handler!r})"

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
        storage: PathType | None = None,
    ) -> None:
        super().set_params(db_prefix, db_type, node_names, path_prefix, path_type, storage)
        self.handler.set_params(
            db_prefix=db_prefix,
            db_type=db_type,
            node_names=list(node_names),
            path_prefix=path_prefix,
            path_type=path_type,
        )

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        return self.handler.last_epoch(user_epoch=user_epoch)

    def write(self, epoch: int) -> None:
        self.handler.write(epoch=epoch)

    def cp_accessible(self, epoch: int | None = None) -> bool:
        return bool(self.handler.cp_accessible(epoch))

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        report = getattr(self.handler, "report", None)
        if report is not None:
            report(action_name, stats)

    def forget(self, epochs: Sequence[int]) -> None:
        forget = getattr(self.handler, "forget", None)
        if forget is not None:
            forget(epochs)


def as_metadata_handler(handler: MetadataHandler | MetadataHandlerLike) -> MetadataHandler:
    """``handler`` as a :class:`MetadataHandler`: itself, or a Caffe2-style one
    wrapped in a :class:`Caffe2Handler`; raises
    :class:`~ckptstore.errors.InvalidPluginError` for an object that is neither."""
    if isinstance(handler, MetadataHandler):
        return handler
    if isinstance(handler, MetadataHandlerLike):
        return Caffe2Handler(handler)
    raise InvalidPluginError(
        f"a metadata handler must subclass ckptstore.plugin.MetadataHandler or have "
        f"Caffe2's methods (set_params, last_epoch, write, cp_accessible); got "
        f"{type(handler).__name__}"
    )
