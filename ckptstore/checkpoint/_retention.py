"""Retention: which committed epochs to keep, and deleting the others safely.

A policy picks the epochs to keep among the committed ones (:class:`KeepLast`: the
newest ``last`` and every ``every``-th). Deletion touches only what commit records own:
for each epoch let go, a tombstone naming its nodes is written, the commit record is
deleted (the epoch is invisible from then on), then exactly the node checkpoints the
record listed, then the tombstone. An interrupted deletion is finished by the next one.
Uncommitted epochs, staging directories and anything else under the root are never
touched, nor are epochs newer than ``upto`` (the runner passes the epoch it just saved,
so a job resumed from an older epoch never deletes the epochs it is about to redo).

Example::

    >>> from ckptstore import Job, Node, Task, epoch_limiter
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     done = epoch_limiter(job, 3)
    >>> from ckptstore import CheckpointManager, JobRunner, LocalPath, LocalSession
    >>> _ = JobRunner(job, CheckpointManager("ckpt", "trainer_0", "npz")).train(LocalSession())
    >>> plan = enforce(LocalPath("ckpt"), KeepLast(2), dry_run=True)
    >>> [removal.epoch for removal in plan.delete]
    [0, 1]
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> runner = JobRunner(job, manager, retention=KeepLast(3))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ckptstore import protocol
from ckptstore.errors import CorruptCheckpointError, JobConfigurationError
from ckptstore.plugin._path_type import PathType
from ckptstore.protocol._inventory import committed_epochs
from ckptstore.records._documents import decode_document, encode_document, json_list
from ckptstore.records._layout import CONTROL_DIR, commit_record_key
from ckptstore.records._names import get_ckpt_filename

if TYPE_CHECKING:
    from ckptstore.checkpoint._manager import ManagerBase

__all__ = [
    "EpochRemoval",
    "ForgetsEpochs",
    "KeepLast",
    "RetentionPlan",
    "RetentionPolicy",
    "enforce",
    "plan_retention",
    "remove_epochs",
    "retain_after_save",
]

log = logging.getLogger(__name__)

TOMBSTONE_KIND = "ckptstore.deleting"


def tombstone_key(epoch: int) -> str:
    """Where the deletion of ``epoch`` is recorded until it is complete."""
    return f"{CONTROL_DIR}/epoch-{epoch}.deleting.json"


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


@runtime_checkable
class ForgetsEpochs(Protocol):
    """A metadata handler that drops deleted epochs from its catalog.

    Example::

        >>> from ckptstore import JsonCatalog
        >>> isinstance(JsonCatalog(), ForgetsEpochs)  # retention calls handler.forget([3, 4])
        True
    """

    def forget(self, epochs: Sequence[int]) -> None:
        """Remove ``epochs`` from the catalog."""
        ...


@dataclass(frozen=True)
class KeepLast:
    """Keep the newest ``last`` epochs, and every ``every``-th epoch (``epoch % every
    == 0``, so epoch 0 too) when ``every`` is set.

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
    finishing a deletion an earlier run left half done).

    Example::

        >>> EpochRemoval(3, ("trainer_0", "trainer_1"), stored_bytes=1 << 20).stored_bytes
        1048576
    """

    epoch: int
    nodes: tuple[str, ...]
    stored_bytes: int
    resumed: bool = False

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
        >>> from ckptstore import CheckpointManager, JobRunner, LocalPath, LocalSession
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
) -> RetentionPlan:
    """What ``policy`` keeps and deletes among the committed epochs ``<= upto``, plus
    any deletion an earlier run left unfinished."""
    protected = set(protect)
    committed = committed_epochs(storage)
    considered = [epoch for epoch in committed if upto is None or epoch <= upto]
    kept = policy.keep(considered) | protected
    removals = [_unfinished(storage, epoch) for epoch in _tombstoned(storage)]
    pending = {removal.epoch for removal in removals}
    for epoch in considered:
        if epoch in kept or epoch in pending:
            continue
        record = protocol.read_commit(storage, epoch)
        if record is not None:
            removals.append(
                EpochRemoval(
                    epoch,
                    tuple(sorted(record.nodes)),
                    sum(node.stored_bytes for node in record.nodes.values()),
                )
            )
    deleted = {removal.epoch for removal in removals}
    keep = tuple(epoch for epoch in committed if epoch not in deleted)
    return RetentionPlan(storage.display_url, keep, tuple(sorted(removals, key=_by_epoch)))


def _by_epoch(removal: EpochRemoval) -> int:
    return removal.epoch


def _tombstoned(storage: PathType) -> list[int]:
    epochs = []
    for key in storage.list_keys(CONTROL_DIR):
        name = key.rsplit("/", 1)[-1]
        if name.startswith("epoch-") and name.endswith(".deleting.json"):
            number = name[len("epoch-") : -len(".deleting.json")]
            if number.isdigit():
                epochs.append(int(number))
    return sorted(epochs)


def _unfinished(storage: PathType, epoch: int) -> EpochRemoval:
    key = tombstone_key(epoch)
    data = storage.get_document(key) or b""
    try:
        nodes = json_list(
            decode_document(data, TOMBSTONE_KIND, url=storage.display_url, key=key), "nodes"
        )
    except (CorruptCheckpointError, KeyError, ValueError):
        nodes = []
    return EpochRemoval(epoch, tuple(str(node) for node in nodes), 0, resumed=True)


def remove_epochs(
    storage: PathType,
    removals: Iterable[EpochRemoval],
    *,
    on_removed: Callable[[EpochRemoval], None] | None = None,
) -> None:
    """Delete each epoch: tombstone, commit record, owned node checkpoints, tombstone.

    Resuming an unfinished deletion leaves alone the nodes a new commit record of the
    epoch lists (saved again since)."""
    for removal in removals:
        key = tombstone_key(removal.epoch)
        storage.put_document(key, encode_document(TOMBSTONE_KIND, {"nodes": list(removal.nodes)}))
        if not removal.resumed:
            storage.delete([commit_record_key(removal.epoch)])
        live = protocol.committed_nodes(storage, removal.epoch)
        for node in removal.nodes:
            if node not in live:
                storage.delete_tree(get_ckpt_filename(node, removal.epoch))
        storage.delete([key])
        if on_removed is not None:
            on_removed(removal)


def enforce(
    storage: PathType,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    upto: int | None = None,
    protect: Iterable[int] = (),
    handler: Any = None,
    on_removed: Callable[[EpochRemoval], None] | None = None,
) -> RetentionPlan:
    """Plan and (unless ``dry_run``) carry out ``policy``; the handler forgets the
    deleted epochs if it can (:class:`ForgetsEpochs`)."""
    plan = plan_retention(storage, policy, upto=upto, protect=protect)
    if dry_run or not plan.delete:
        return plan
    remove_epochs(storage, plan.delete, on_removed=on_removed)
    if isinstance(handler, ForgetsEpochs):
        handler.forget([removal.epoch for removal in plan.delete])
    return plan


def retain_after_save(manager: ManagerBase, policy: RetentionPolicy, epoch: int) -> None:
    """Apply ``policy`` after ``epoch`` was committed (what :class:`JobRunner` calls).
    A failure is logged, never raised: the save itself succeeded."""
    try:
        plan = enforce(
            manager.location.storage,
            policy,
            upto=epoch,
            protect={epoch},
            handler=manager.metadata_handler,
        )
    except (OSError, CorruptCheckpointError) as error:
        log.warning(
            "Retention after epoch %d failed (will retry after the next save): %s", epoch, error
        )
        return
    if plan.delete:
        log.info("Retention deleted epochs %s", [removal.epoch for removal in plan.delete])
