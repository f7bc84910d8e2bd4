"""Retention: which committed epochs to keep, and deleting the others safely.

A policy picks the epochs to keep among the committed ones (:class:`KeepLast`: the
newest ``last`` and every ``every``-th). Retention deletes only what it owns: given the
job's ``nodes``, it considers the epochs where those nodes are committed, and deletes
only those nodes' checkpoints; another job sharing the prefix keeps its nodes, and the
epoch's shared control files (its commit record, its catalog entry) go only when no
node remains in it. ``nodes=None`` (``ckptstore gc`` without ``--node``) owns every node.

For each epoch let go: a tombstone naming the nodes is written, the nodes are retracted
from the commit record (uncommitted first, so a crash never leaves an epoch that looks
committed but is not loadable), then exactly those node checkpoints are deleted, then
the tombstone. An interrupted deletion is finished by the next one. Uncommitted epochs,
staging directories and anything else under the root are never touched, nor are epochs
newer than ``upto`` (the runner passes the epoch it just saved, so a job resumed from
an older epoch never deletes the epochs it is about to redo). A pass lists the control
directory once, then reads the commit records of the epochs it considers.

Example::

    >>> from ckptstore import Job, Node, Task, epoch_limiter
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     done = epoch_limiter(job, 3)
    >>> from ckptstore import CheckpointManager, JobRunner, LocalSession
    >>> from ckptstore.builtin import LocalPath
    >>> _ = JobRunner(job, CheckpointManager("ckpt", "trainer_0", "npz")).train(LocalSession())
    >>> plan = enforce(LocalPath("ckpt"), KeepLast(2), dry_run=True)
    >>> [removal.epoch for removal in plan.delete]
    [0, 1]
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> runner = JobRunner(job, manager, retention=KeepLast(3))
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ckptstore import protocol
from ckptstore.errors import CorruptCheckpointError, InvalidNameError, JobConfigurationError
from ckptstore.io import ByteProgress, NodeProgress
from ckptstore.plugin import MetadataHandler, PathType
from ckptstore.records import (
    CONTROL_DIR,
    decode_document,
    encode_document,
    get_ckpt_filename,
    json_list,
    validate_node_name,
)

if TYPE_CHECKING:
    from ckptstore.checkpoint._manager import ManagerBase

__all__ = [
    "EpochRemoval",
    "KeepLast",
    "RetentionPlan",
    "RetentionPolicy",
    "carry_out",
    "enforce",
    "plan_retention",
    "remove_epochs",
    "retain_after_save",
]

log = logging.getLogger(__name__)

TOMBSTONE_KIND = "ckptstore.deleting"


_TOMBSTONE = re.compile(r"epoch-(\d+)\.deleting(?:-[0-9a-f]{12})?\.json")


def tombstone_key(epoch: int, nodes: Iterable[str] | None = None) -> str:
    """Where the deletion of ``nodes`` of ``epoch`` is recorded until it is complete
    (one key per set of nodes, so two jobs deleting their nodes of one epoch never
    overwrite each other's tombstone; without ``nodes``, the old single-key form)."""
    if nodes is None:
        return f"{CONTROL_DIR}/epoch-{epoch}.deleting.json"
    digest = hashlib.sha256("\n".join(sorted(nodes)).encode()).hexdigest()[:12]
    return f"{CONTROL_DIR}/epoch-{epoch}.deleting-{digest}.json"


@runtime_checkable
class RetentionPolicy(Protocol):
    """Chooses the committed epochs to keep.

    Example::

        >>> class KeepEven:
        ...     def keep(self, epochs): return {e for e in epochs if e % 2 == 0}
        >>> isinstance(KeepEven(), RetentionPolicy)
        True
    """

    def keep(self, epochs: Sequence[int]) -> set[int]:
        """The subset of ``epochs`` (committed, ascending) to keep."""
        ...


@dataclass(frozen=True)
class KeepLast:
    """Keep the newest ``last`` epochs, and every ``every``-th epoch if set.

    Every ``every``-th epoch means ``epoch % every == 0``, so epoch 0 too.

    Example::

        >>> sorted(KeepLast(2, every=5).keep([0, 1, 2, 3, 4, 5, 6, 7]))
        [0, 5, 6, 7]
    """

    last: int
    every: int | None = None

    def __post_init__(self) -> None:
        if self.last < 1:
            raise JobConfigurationError(
                f"keep-last must be at least 1 (the newest epoch is always kept), got {self.last}"
            )
        if self.every is not None and self.every < 1:
            raise JobConfigurationError(f"keep-every must be at least 1, got {self.every}")

    def keep(self, epochs: Sequence[int]) -> set[int]:
        kept = set(sorted(epochs)[-self.last :])
        if self.every is not None:
            kept.update(epoch for epoch in epochs if epoch % self.every == 0)
        return kept


@dataclass(frozen=True)
class EpochRemoval:
    """One epoch to delete: the node checkpoints its commit record owns (``resumed``:
    finishing a deletion an earlier run left half done), and (``node_bytes``, in the
    order of ``nodes``; empty when resumed) how much each one stores.

    Example::

        >>> EpochRemoval(3, ("trainer_0", "trainer_1"), stored_bytes=1 << 20).stored_bytes
        1048576
    """

    epoch: int
    nodes: tuple[str, ...]
    stored_bytes: int
    resumed: bool = False
    tombstone: str | None = None
    node_bytes: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """The tombstone recording this removal."""
        return self.tombstone or tombstone_key(self.epoch, self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "nodes": list(self.nodes),
            "stored_bytes": self.stored_bytes,
            "resumed": self.resumed,
        }


@dataclass(frozen=True)
class RetentionPlan:
    """The committed epochs kept and the removals that make the policy hold.

    Example::

        >>> from ckptstore import Job, Node, Task, epoch_limiter
        >>> with Job() as job, Node("trainer_0"):
        ...     with job.init_group:
        ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
        ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
        ...     done = epoch_limiter(job, 3)
        >>> from ckptstore import CheckpointManager, JobRunner, LocalSession
        >>> from ckptstore.builtin import LocalPath
        >>> _ = JobRunner(job, CheckpointManager("ckpt", "trainer_0", "npz")).train(LocalSession())
        >>> plan = plan_retention(LocalPath("ckpt"), KeepLast(2))
        >>> plan.keep, [removal.epoch for removal in plan.delete], plan.freed_bytes > 0
        ((2, 3), [0, 1], True)
    """

    url: str
    keep: tuple[int, ...]
    delete: tuple[EpochRemoval, ...]

    @property
    def freed_bytes(self) -> int:
        return sum(removal.stored_bytes for removal in self.delete)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "keep": list(self.keep),
            "delete": [removal.to_json() for removal in self.delete],
            "freed_bytes": self.freed_bytes,
        }


def plan_retention(
    storage: PathType,
    policy: RetentionPolicy,
    *,
    upto: int | None = None,
    protect: Iterable[int] = (),
    nodes: Iterable[str] | None = None,
) -> RetentionPlan:
    """What ``policy`` keeps and deletes among the epochs ``<= upto`` where ``nodes``
    (``None``: any node) are committed, plus any deletion of those nodes an earlier run
    left unfinished. Lists the control directory once."""
    owned = None if nodes is None else set(nodes)
    protected = set(protect)
    keys = protocol.control_keys(storage)
    removals = [
        removal
        for removal in (_unfinished(storage, key, epoch) for key, epoch in _tombstones(keys))
        if owned is None or not owned.isdisjoint(removal.nodes)
    ]
    mine: dict[int, tuple[str, ...]] = {}
    sizes: dict[int, tuple[int, ...]] = {}
    listing = protocol.CommitListing.from_keys(storage, keys)
    for epoch in listing.epochs:
        if upto is not None and epoch > upto:
            continue
        try:
            # the listing above named each epoch's records: read those, no listing
            record = listing.record(epoch)
        except CorruptCheckpointError as error:
            log.warning("retention leaves epoch %d alone: %s", epoch, error)
            continue
        if record is None:
            continue
        names = tuple(sorted(n for n in record.nodes if owned is None or n in owned))
        if names:
            mine[epoch] = names
            sizes[epoch] = tuple(record.nodes[n].stored_bytes for n in names)
    kept = policy.keep(sorted(mine)) | protected
    fresh = [
        EpochRemoval(epoch, names, sum(sizes[epoch]), node_bytes=sizes[epoch])
        for epoch, names in mine.items()
        if epoch not in kept
    ]
    # a fresh removal rewrites (then drops) the tombstone of the same nodes itself
    replaced = {removal.key for removal in fresh}
    removals = [removal for removal in removals if removal.key not in replaced] + fresh
    deleted = {removal.epoch for removal in fresh}
    keep = tuple(epoch for epoch in sorted(mine) if epoch not in deleted)
    return RetentionPlan(storage.display_url, keep, tuple(sorted(removals, key=_by_epoch)))


def _by_epoch(removal: EpochRemoval) -> tuple[int, bool]:
    return removal.epoch, not removal.resumed  # an unfinished deletion first


def _tombstones(keys: Iterable[str]) -> list[tuple[str, int]]:
    found = []
    for key in keys:
        directory, _, name = key.rpartition("/")
        match = _TOMBSTONE.fullmatch(name)
        if directory == CONTROL_DIR and match is not None:
            found.append((key, int(match.group(1))))
    return sorted(found, key=lambda item: item[1])


def _unfinished(storage: PathType, key: str, epoch: int) -> EpochRemoval:
    data = storage.get_document(key) or b""
    try:
        document = decode_document(data, TOMBSTONE_KIND, url=storage.display_url, key=key)
        nodes = json_list(document, "nodes")
        # stored names become keys to delete: each must be a valid node name
        names = tuple(validate_node_name(str(node)) for node in nodes)
    except (CorruptCheckpointError, KeyError, TypeError, ValueError, InvalidNameError):
        names = ()
    return EpochRemoval(epoch, names, 0, resumed=True, tombstone=key)


def remove_epochs(
    storage: PathType,
    removals: Iterable[EpochRemoval],
    *,
    on_removed: Callable[[EpochRemoval], None] | None = None,
    on_bytes: ByteProgress | None = None,
) -> None:
    """Delete each removal's nodes of its epoch: tombstone, retract those nodes from
    the commit record (uncommit first), delete their checkpoints, drop the tombstone.
    ``on_bytes`` hears each node's stored bytes as its files are deleted.

    Resuming an unfinished deletion retracts nothing and leaves alone the nodes the
    epoch's commit record lists (never retracted, or saved again since)."""
    for removal in removals:
        key = removal.key
        storage.put_document(key, encode_document(TOMBSTONE_KIND, {"nodes": list(removal.nodes)}))
        if not removal.resumed:
            protocol.retract_epoch(storage, removal.epoch, removal.nodes)
        live = protocol.committed_nodes(storage, removal.epoch, removal.nodes)
        sizes = dict(zip(removal.nodes, removal.node_bytes, strict=False))
        for node in removal.nodes:
            progress = NodeProgress(on_bytes, sizes.get(node, 0))
            if node not in live:
                prefix = get_ckpt_filename(node, removal.epoch)
                if on_bytes is not None:
                    _delete_files(storage, prefix, progress)
                storage.delete_tree(prefix)
            progress.finish()
        storage.delete([key])
        if on_removed is not None:
            on_removed(removal)


GC_STEPS = 20
"""How many steps a node's deletion moves a progress bar in, at most."""


def _delete_files(storage: PathType, prefix: str, progress: NodeProgress) -> None:
    """Delete the files of the node checkpoint ``prefix`` in up to :data:`GC_STEPS`
    groups, moving ``progress`` by each group's share of the node's bytes (a share of
    the files, not their sizes: sizing each would cost a request per object)."""
    inside = prefix + "/"  # never a neighbour's files (trainer_0.10 beside trainer_0.1)
    keys = [key for key in storage.list_keys(prefix) if key.startswith(inside)]
    group = max(1, -(-len(keys) // GC_STEPS))
    for start in range(0, len(keys), group):
        storage.delete(keys[start : start + group])
        done = progress.total * min(len(keys), start + group) // len(keys)
        progress(done - progress.reported)


def enforce(
    where: protocol.CheckpointLocation | PathType,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    upto: int | None = None,
    protect: Iterable[int] = (),
    nodes: Iterable[str] | None = None,
    handler: MetadataHandler | None = None,
    on_removed: Callable[[EpochRemoval], None] | None = None,
    on_bytes: ByteProgress | None = None,
) -> RetentionPlan:
    """Plan and (unless ``dry_run``) carry out ``policy`` for ``nodes`` (``None``: every
    node); the handler brings the touched epochs' entries in line with storage
    (:meth:`~ckptstore.plugin.MetadataHandler.forget`)."""
    storage = protocol.storage_of(where)
    plan = plan_retention(storage, policy, upto=upto, protect=protect, nodes=nodes)
    if not dry_run:
        carry_out(storage, plan, handler=handler, on_removed=on_removed, on_bytes=on_bytes)
    return plan


def carry_out(
    storage: PathType,
    plan: RetentionPlan,
    *,
    handler: MetadataHandler | None = None,
    on_removed: Callable[[EpochRemoval], None] | None = None,
    on_bytes: ByteProgress | None = None,
) -> None:
    """Delete what ``plan`` lets go, then tell the handler (``handler.forget``)."""
    if not plan.delete:
        return
    remove_epochs(storage, plan.delete, on_removed=on_removed, on_bytes=on_bytes)
    if handler is not None:
        handler.forget(sorted({removal.epoch for removal in plan.delete}))


def retain_after_save(manager: ManagerBase, policy: RetentionPolicy, epoch: int) -> None:
    """Apply ``policy`` to the manager's own nodes after ``epoch`` was committed (what
    :class:`JobRunner` calls). A failure is logged, never raised: the save itself
    succeeded. With several roots, it runs again on the first root once the epochs it
    kept for the later roots were copied there."""
    if manager.tiers is not None:
        manager.tiers.first_retention = policy
    try:
        plan = enforce(
            manager.location,
            policy,
            upto=epoch,
            protect={epoch, *manager.epochs_in_transit()},
            nodes=manager.node_names(),
            handler=manager.metadata_handler,
        )
    except (OSError, CorruptCheckpointError) as error:
        log.warning(
            "Retention after epoch %d failed (will retry after the next save): %s", epoch, error
        )
        return
    if plan.delete:
        log.info("Retention deleted epochs %s", [removal.epoch for removal in plan.delete])
    if plan.delete and manager.location.incremental:
        try:  # the chunks only the deleted epochs referred to
            protocol.collect_chunks(manager.location)
        except (OSError, CorruptCheckpointError) as error:
            log.warning("Collecting chunks after epoch %d failed: %s", epoch, error)
