"""The one location object: where a job's checkpoints live and how they are written.

A :class:`CheckpointLocation` is an opened checkpoint root (its path type), the DB type
new checkpoints are written in, and the I/O engine's settings. Managers, the runner,
node tasks, retention, transfers and the CLI all pass this one object around. The
protocol's functions take it whole (or a bare path type, for callers without one).
A DB type plugin receives the :class:`~ckptstore.plugin.DBLocation` of one node
checkpoint instead.

Example::

    >>> location = CheckpointLocation.open("ckpt", "npz")
    >>> location.db_path("trainer_0", 3)
    'ckpt/trainer_0.3'
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ckptstore.io import IOSettings, ParallelIO
from ckptstore.plugin import DBType, PathType, get_registry
from ckptstore.protocol._incremental import check_frozen, check_incremental
from ckptstore.records import NodeManifest, db_name

__all__ = ["CheckpointLocation", "storage_of"]


@dataclass(frozen=True)
class CheckpointLocation:
    """A checkpoint root with its format and I/O settings: all a node needs.

    ``prefix`` is the root as the user gave it (it may carry credentials: show
    ``storage.display_url`` instead); ``storage_options`` are reused when the same kind
    of storage is opened at another prefix (:meth:`at`).

    Example::

        >>> from ckptstore import IOSettings
        >>> from ckptstore.builtin import LocalPath, NpzDB
        >>> location = CheckpointLocation(LocalPath("ckpt"), NpzDB(), IOSettings())
        >>> location.db_path("trainer_0", 3)
        'ckpt/trainer_0.3'
    """

    storage: PathType
    db_type: DBType
    io_settings: IOSettings
    prefix: str = ""
    path_type: str | None = None
    storage_options: Mapping[str, object] = field(default_factory=dict, repr=False)
    incremental: bool = False
    """Saves store large blobs' chunks once per content in the root's chunk store
    (docs/design.md, "Incremental checkpoints")."""
    frozen: frozenset[str] = frozenset()
    """Names of blobs that incremental saves take as unchanged since this process's
    previous save of the node, unread (``frozen`` of :func:`~ckptstore.protocol.write_node`;
    a node that does not hold one ignores it)."""
    _others: dict[tuple[str, str | None], CheckpointLocation] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def open(
        cls,
        prefix: str,
        db_type: str | DBType,
        *,
        io: IOSettings | None = None,
        path_type: str | None = None,
        storage_options: Mapping[str, object] | None = None,
        incremental: bool = False,
        frozen: Collection[str] = (),
    ) -> CheckpointLocation:
        """Open the checkpoint root ``prefix`` through the registered path types
        (``incremental`` and ``frozen``: see :func:`~ckptstore.protocol.write_node`;
        the DB type must support it; ``frozen`` needs ``incremental``)."""
        registry = get_registry()
        options = dict(storage_options or {})
        storage = registry.open_path(str(prefix), path_type, **options)
        settings = (io or storage.default_io).with_environment()
        chosen = registry.db_type(db_type)
        if incremental:
            check_incremental(chosen)
        check_frozen(frozen, incremental=incremental)
        names = frozenset(frozen)
        return cls(storage, chosen, settings, str(prefix), path_type, options, incremental, names)

    def at(self, prefix: str | None, path_type: str | None = None) -> CheckpointLocation:
        """The same format and I/O at another root (e.g. an upload tier), opened once;
        ``prefix=None`` is this location."""
        if not prefix or (prefix == self.prefix and path_type in (None, self.path_type)):
            return self
        key = (prefix, path_type)
        other = self._others.get(key)
        if other is None:
            same_kind = _protocol(prefix) == _protocol(self.prefix)
            other = self._others[key] = CheckpointLocation.open(
                prefix,
                self.db_type,
                path_type=path_type,
                storage_options=self.storage_options if same_kind else None,
            )
        return other

    def engine(self) -> ParallelIO:
        """A parallel I/O engine with this location's settings."""
        return ParallelIO(self.io_settings)

    def db_path(self, node: str, epoch: int) -> str:
        """Where a node's checkpoint of ``epoch`` lives, without credentials."""
        return db_name(epoch, node, self.storage.display_url)

    def reader_for(self, manifest: NodeManifest) -> DBType:
        """The DB type that wrote ``manifest`` (checkpoints stay readable after a job
        changes its ``db_type``)."""
        if manifest.db_type == self.db_type.name:
            return self.db_type
        return get_registry().db_type(manifest.db_type)


def _protocol(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else ""


def storage_of(where: CheckpointLocation | PathType) -> PathType:
    """The path type under ``where``: a location's storage, or ``where`` itself."""
    return where.storage if isinstance(where, CheckpointLocation) else where
