"""What every catalog shares: the commit records in storage are the truth, the catalog
is an index of them.

:class:`IndexCatalog` implements the metadata-handler contract once (``last_epoch``
with the user's epoch checked, damaged commit records skipped, ``write`` only for
epochs committed on every node, ``forget``, and :meth:`IndexCatalog.rebuild`); a
catalog subclass supplies only its storage: read every entry, put one entry, drop
entries, and discard an unreadable catalog.

``last_epoch()`` lists the control directory once (the epochs with a commit record)
and reads the newest commit records until one lists every node of the job: a missing,
empty, unreadable or stale catalog can never make a job start over committed epochs.
When the catalog disagrees with storage, it is rebuilt and a warning says what changed.

Example::

    >>> class MemoryCatalog(IndexCatalog):
    ...     name = "memory"
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.entries = {}
    ...     def _read_entries(self):
    ...         return dict(self.entries)
    ...     def _put_entry(self, record):
    ...         self.entries[record.epoch] = CatalogEntry.from_commit(record)
    ...     def _drop_entries(self, epochs):
    ...         for epoch in epochs:
    ...             self.entries.pop(epoch, None)
    ...     def _reset(self):
    ...         self.entries = {}
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz", metadata_handler=MemoryCatalog())
    >>> manager.set_params(["trainer_0"])  # JobRunner.train does this
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> manager.write_checkpoint_metadata(1)
    >>> manager.metadata_handler.last_epoch(), list(manager.metadata_handler.entries)
    (1, [1])
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ckptstore._types import JSONObject
from ckptstore.errors import CatalogCorruptError, CheckpointNotFoundError, CorruptCheckpointError
from ckptstore.plugin import MetadataHandler
from ckptstore.protocol import (
    CommitListing,
    EpochCommit,
    committed_nodes,
    read_commit,
    require_commit,
)
from ckptstore.records import NodeStats, json_int, json_list

__all__ = ["CatalogEntry", "IndexCatalog", "RebuildReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogEntry:
    """One committed epoch as a catalog lists it (a copy of its commit records).

    Example::

        >>> entry = CatalogEntry(3, ("trainer_0",), nbytes=4096, stored_bytes=4400,
        ...                      committed_at="2026-01-01T00:00:00+00:00", db_types=("npz",))
        >>> CatalogEntry.from_json(3, entry.to_json()) == entry
        True
    """

    epoch: int
    nodes: tuple[str, ...]
    nbytes: int
    stored_bytes: int
    committed_at: str
    db_types: tuple[str, ...]

    @classmethod
    def from_commit(cls, record: EpochCommit) -> CatalogEntry:
        """The entry describing ``record``."""
        return cls(
            epoch=record.epoch,
            nodes=tuple(sorted(record.nodes)),
            nbytes=record.nbytes,
            stored_bytes=sum(node.stored_bytes for node in record.nodes.values()),
            committed_at=record.committed_at,
            db_types=tuple(sorted({node.db_type for node in record.nodes.values()})),
        )

    def to_json(self) -> JSONObject:
        return {
            "nodes": list(self.nodes),
            "nbytes": self.nbytes,
            "stored_bytes": self.stored_bytes,
            "committed_at": self.committed_at,
            "db_types": list(self.db_types),
        }

    @classmethod
    def from_json(cls, epoch: int, raw: Mapping[str, object]) -> CatalogEntry:
        """Parse :meth:`to_json`'s output (untrusted: raises ``KeyError`` for a missing
        field and ``ValueError`` for one of the wrong type)."""
        committed_at = raw["committed_at"]
        if not isinstance(committed_at, str):
            raise ValueError(f"committed_at {committed_at!r} is not text")
        return cls(
            epoch=epoch,
            nodes=_strings(raw, "nodes"),
            nbytes=json_int(raw, "nbytes"),
            stored_bytes=json_int(raw, "stored_bytes"),
            committed_at=committed_at,
            db_types=_strings(raw, "db_types"),
        )


def _strings(raw: Mapping[str, object], key: str) -> tuple[str, ...]:
    """``raw[key]`` as a tuple of strings (``KeyError``/``ValueError`` otherwise)."""
    values = json_list(raw, key)
    if not all(isinstance(value, str) for value in values):
        raise ValueError(f"{key} {values!r} is not a list of text")
    return tuple(str(value) for value in values)


@dataclass(frozen=True)
class RebuildReport:
    """What a rebuild changed: epochs ``added`` (or corrected) and ``dropped`` (no
    longer committed); ``reset``: the old catalog was unreadable and was discarded.

    Example::

        >>> report = RebuildReport("/ckpt", epochs=(1, 2), added=(2,))
        >>> report.changed, report.describe()
        (True, 'catalog of /ckpt: added or corrected epochs [2]; it now lists 2 epoch(s)')
    """

    url: str
    epochs: tuple[int, ...]
    added: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    reset: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.dropped or self.reset)

    def describe(self) -> str:
        """One line saying what was rebuilt."""
        parts = []
        if self.reset:
            parts.append("discarded the unreadable catalog")
        if self.added:
            parts.append(f"added or corrected epochs {list(self.added)}")
        if self.dropped:
            parts.append(f"dropped epochs {list(self.dropped)} (no longer committed)")
        done = "; ".join(parts) if parts else "nothing to change"
        return f"catalog of {self.url}: {done}; it now lists {len(self.epochs)} epoch(s)"

    def to_json(self) -> JSONObject:
        return {
            "url": self.url,
            "epochs": list(self.epochs),
            "added": list(self.added),
            "dropped": list(self.dropped),
            "reset": self.reset,
            "changed": self.changed,
        }


class IndexCatalog(MetadataHandler):
    """A metadata handler whose catalog is an index of the commit records.

    Subclasses implement the four storage methods; the storage methods raise
    :class:`~ckptstore.errors.CatalogCorruptError` when the catalog cannot be read, and
    this class then rebuilds it from the commit records.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("indexed", "trainer_0", "npz", metadata_handler="json")
        >>> manager.set_params(["trainer_0"])
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(1))  # committed, not yet in the catalog
        >>> handler = manager.metadata_handler
        >>> handler.rebuild().describe()  # the catalog, recreated from the commit records
        'catalog of indexed: added or corrected epochs [1]; it now lists 1 epoch(s)'
        >>> handler.last_epoch(), list(handler.epochs())  # newest on every node: from storage
        (1, [1])
    """

    answers_from_storage = True

    # -- storage (what a catalog implements) ------------------------------------------

    @abstractmethod
    def _read_entries(self) -> dict[int, CatalogEntry]:
        """Every entry in the catalog; raises CatalogCorruptError if unreadable."""

    @abstractmethod
    def _put_entry(self, record: EpochCommit) -> None:
        """Add or replace the entry of ``record``'s epoch (its summary is
        ``CatalogEntry.from_commit(record)``); safe against concurrent writers."""

    @abstractmethod
    def _drop_entries(self, epochs: Sequence[int]) -> None:
        """Remove the entries of ``epochs`` (absent ones are ignored)."""

    @abstractmethod
    def _reset(self) -> None:
        """Discard an unreadable catalog, so that it can be written again from scratch."""

    # -- the handler contract ---------------------------------------------------------

    def epochs(self) -> dict[int, CatalogEntry]:
        """Every epoch in the catalog (rebuilt from storage first if it is unreadable)."""
        try:
            return self._read_entries()
        except CatalogCorruptError as error:
            log.warning("%s; rebuilding it from the commit records", error)
            self.rebuild()
            return self._read_entries()

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        storage = self.require_storage()
        nodes = set(self.node_names)
        if user_epoch is not None:
            committed = committed_nodes(storage, user_epoch)
            if not nodes <= committed:
                complete = self._complete(nodes)
                raise CheckpointNotFoundError(
                    storage.display_url,
                    None,
                    user_epoch,
                    f"cannot resume from epoch {user_epoch}: it is not committed for nodes "
                    f"{sorted(nodes - committed)} under {storage.display_url}. Complete "
                    f"epochs: {complete or 'none'}.",
                )
            return user_epoch
        listing = CommitListing.of(storage)
        chosen = listing.newest_complete(nodes)
        if not self._agrees(listing.epochs, listing.unreadable, chosen, nodes):
            try:
                report = self.rebuild()
            # the answer stands regardless; CorruptCheckpointError: the catalog's own files
            # cannot be written (a link in their place, which is never followed)
            except (OSError, CatalogCorruptError, CorruptCheckpointError) as error:
                log.warning("could not repair the catalog (resuming anyway): %s", error)
                return chosen
            if report.changed:
                resume = "nothing" if chosen is None else f"epoch {chosen}"
                log.warning(
                    "the catalog disagreed with the commit records, which decide: rebuilt "
                    "it (%s); resuming from %s",
                    report.describe(),
                    resume,
                )
        return chosen

    def _catalogued_epochs(self) -> set[int]:
        """The epochs the catalog lists (a catalog may answer without reading every
        entry; the default reads them all)."""
        return set(self._read_entries())

    def _read_entry(self, epoch: int) -> CatalogEntry | None:
        """One epoch's entry, or ``None`` (the default reads every entry)."""
        return self._read_entries().get(epoch)

    def _agrees(
        self, listed: list[int], unreadable: set[int], chosen: int | None, nodes: set[str]
    ) -> bool:
        """Whether the catalog lists the committed epochs, and the chosen one in full."""
        try:
            catalogued = self._catalogued_epochs()
            if catalogued - set(listed) or set(listed) - unreadable - catalogued:
                return False
            if chosen is None:
                return True
            entry = self._read_entry(chosen)
        except CatalogCorruptError as error:
            log.warning("%s", error)
            return False
        return entry is not None and nodes <= set(entry.nodes)

    def _complete(self, nodes: set[str]) -> list[int]:
        """Epochs committed on every one of ``nodes`` (reads every commit record: only
        for error messages)."""
        return CommitListing.of(self.require_storage()).complete(nodes)

    def write(self, epoch: int) -> None:
        self._file(require_commit(self.require_storage(), epoch, self.node_names, action="catalog"))

    def write_committed(self, epoch: int, stats: Sequence[NodeStats]) -> None:
        """File the commit the save just wrote (no read), when it covers every node of
        the job; else, as :meth:`write`, from the commit records."""
        commits = {
            node_stats.node: node_stats.commit
            for node_stats in stats
            if node_stats.epoch == epoch
            and node_stats.commit is not None
            and node_stats.commit.committed_at is not None
        }
        nodes = set(self.node_names)
        if not nodes or not nodes <= set(commits):
            self.write(epoch)
            return
        mine = {node: commits[node] for node in sorted(nodes)}
        stamps = [commit.committed_at for commit in mine.values() if commit.committed_at]
        self._file(EpochCommit(epoch, mine, max(stamps)))

    def _file(self, record: EpochCommit) -> None:
        try:
            self._put_entry(record)
        except CatalogCorruptError as error:
            log.warning("%s; rebuilding it from the commit records", error)
            self.rebuild()

    def forget(self, epochs: Sequence[int]) -> None:
        """Bring the entries of ``epochs`` in line with storage after retention: an epoch
        another job still has nodes in keeps its entry, with those nodes."""
        storage = self.require_storage()
        gone = []
        try:
            for epoch in epochs:
                try:
                    record = read_commit(storage, epoch)
                except CorruptCheckpointError:
                    record = None
                if record is None or not record.nodes:
                    gone.append(epoch)
                else:
                    self._put_entry(record)
            if gone:
                self._drop_entries(gone)
        except CatalogCorruptError as error:
            log.warning("%s; rebuilding it from the commit records", error)
            self.rebuild()

    def rebuild(self) -> RebuildReport:
        """Make the catalog list exactly the epochs committed in storage (lists the
        control directory once and reads every commit record it found: a repair, not a
        hot path)."""
        storage = self.require_storage()
        listing = CommitListing.of(storage)
        truth: dict[int, EpochCommit] = {}
        for epoch in listing.epochs:
            try:
                record = listing.record(epoch)
            except CorruptCheckpointError as error:
                log.warning("not cataloguing epoch %d: %s", epoch, error)
                continue
            if record is not None and record.nodes:
                truth[epoch] = record
        reset = False
        try:
            current = self._read_entries()
        except CatalogCorruptError as error:
            log.warning("%s; discarding it", error)
            self._reset()
            current, reset = {}, True
        try:
            added, dropped = self._align(truth, current)
        except CatalogCorruptError as error:  # cannot be written as it is: start it afresh
            if reset:
                raise
            log.warning("%s; discarding it", error)
            self._reset()
            reset = True
            added, dropped = self._align(truth, {})
        return RebuildReport(storage.display_url, _sorted(truth), added, dropped, reset)

    def _align(
        self, truth: Mapping[int, EpochCommit], current: Mapping[int, CatalogEntry]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Write the entries of ``truth`` that ``current`` lacks or has otherwise, drop
        those it should not have; the epochs ``(added, dropped)``."""
        added = _sorted(
            epoch
            for epoch, record in truth.items()
            if current.get(epoch) != CatalogEntry.from_commit(record)
        )
        dropped = _sorted(epoch for epoch in current if epoch not in truth)
        for epoch in added:
            self._put_entry(truth[epoch])
        if dropped:
            self._drop_entries(dropped)
        return added, dropped


def _sorted(epochs: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(epochs))
