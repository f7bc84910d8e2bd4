"""What is committed under a checkpoint root, from ONE listing of its control directory.

A :class:`CommitListing` lists ``_ckptstore/`` once and remembers which nodes have a
commit record for which epoch. Questions about committed epochs are then answered with
no further listing: :meth:`CommitListing.newest_complete` ("the newest epoch complete
on these nodes": resume, the runner's refusal to start over, a catalog's
``last_epoch``) reads only the candidates' records, newest first, until one is intact;
:meth:`CommitListing.record` reads one epoch's listed records (a catalog's rebuild).
A listing is a snapshot: take a new one after saving.

Commit records a writer made after it lost its lease are not committed: a record that
carries a lease generation (see :mod:`ckptstore.protocol._lease`) is checked against
the fences in its node's lease document, read once per listing and node (one GET, and
only when a candidate record carries a generation).

Example::

    >>> from ckptstore.builtin import LocalPath, NpzDB
    >>> from ckptstore.io import ParallelIO
    >>> from ckptstore.protocol import commit_epoch, write_node
    >>> storage, blobs = LocalPath("ckpt"), {"w": np.ones(2)}
    >>> for epoch in (1, 2):
    ...     commit = write_node(storage, "trainer_0", epoch, blobs, NpzDB(), ParallelIO())
    ...     _ = commit_epoch(storage, epoch, [commit])
    >>> listing = CommitListing.of(storage)
    >>> listing.epochs, listing.newest_complete(["trainer_0"]), listing.newest_complete(["x"])
    ([1, 2], 2, None)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ckptstore.errors import CorruptCheckpointError
from ckptstore.plugin import PathType
from ckptstore.protocol._commit import EpochCommit, read_commit, read_listed_commit
from ckptstore.protocol._control import control_keys
from ckptstore.protocol._lease_document import fenced_out, read_lease_document
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import LEASE_DIR, parse_commit_record_key, parse_node_commit_key

__all__ = ["CommitListing", "newest_complete"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitListing:
    """The commit records under ``storage`` as one listing found them: ``nodes[epoch]``
    names the nodes with a per-node record, ``legacy`` the epochs with an earlier
    version's one-document record, ``unreadable`` the epochs whose records were found
    damaged when read.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> CommitListing.of(LocalPath("empty")).epochs
        []
    """

    storage: PathType
    nodes: Mapping[int, frozenset[str]]
    legacy: frozenset[int]
    unreadable: set[int] = field(default_factory=set, compare=False)
    """Epochs whose records a read through this listing found unreadable (so far)."""
    leases: frozenset[str] = frozenset()
    """The nodes with a writer lease document."""
    _fences: dict[str, tuple[tuple[int, int], ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, where: CheckpointLocation | PathType) -> CommitListing:
        """List ``where``'s control directory (one LIST request, nothing read; not
        its chunk store)."""
        return cls.from_keys(where, control_keys(where))

    @classmethod
    def from_keys(cls, where: CheckpointLocation | PathType, keys: Iterable[str]) -> CommitListing:
        """The commit records among ``keys``, a listing of ``where``'s control
        directory taken for several purposes (retention also finds its tombstones)."""
        storage = storage_of(where)
        nodes: dict[int, set[str]] = {}
        legacy = set()
        leases = set()
        for key in keys:
            per_node = parse_node_commit_key(key)
            if per_node is not None:
                nodes.setdefault(per_node[0], set()).add(per_node[1])
            elif (epoch := parse_commit_record_key(key)) is not None:
                legacy.add(epoch)
            elif key.startswith(f"{LEASE_DIR}/") and key.endswith(".json"):
                leases.add(key[len(LEASE_DIR) + 1 : -len(".json")])
        frozen = {epoch: frozenset(names) for epoch, names in nodes.items()}
        return cls(storage, frozen, frozenset(legacy), leases=frozenset(leases))

    @property
    def epochs(self) -> list[int]:
        """The epochs with a commit record, ascending."""
        return sorted(set(self.nodes) | self.legacy)

    def record(self, epoch: int) -> EpochCommit | None:
        """The commit record of ``epoch`` from its listed records (one GET each, no
        listing); ``None`` if none was listed or they are gone. Raises
        :class:`~ckptstore.errors.CorruptCheckpointError` if one is unreadable."""
        if epoch not in self.nodes and epoch not in self.legacy:
            return None
        return read_listed_commit(
            self.storage, epoch, self.nodes.get(epoch, ()), legacy=epoch in self.legacy
        )

    def newest_listed(self, node: str) -> int | None:
        """The newest epoch with a per-node record of ``node`` in this listing (read
        or not), or ``None``."""
        return max((epoch for epoch, names in self.nodes.items() if node in names), default=None)

    def complete_on(self, nodes: Iterable[str], *, before: int | None = None) -> list[int]:
        """The epochs (before ``before``, if given) whose listing names every one of
        ``nodes``, ascending: the candidates, their records not read yet."""
        wanted = set(nodes)
        return [
            epoch
            for epoch in self.epochs
            if (before is None or epoch < before) and self._lists(epoch, wanted)
        ]

    def is_complete(self, epoch: int, nodes: Iterable[str]) -> bool:
        """Whether ``epoch`` is committed on every one of ``nodes``: their records are
        read (one GET each; none if the listing lacks one). Raises
        :class:`~ckptstore.errors.CorruptCheckpointError` if one is unreadable."""
        wanted = set(nodes)
        if not self._lists(epoch, wanted):
            return False
        record = read_commit(self.storage, epoch, wanted)
        if record is None or not wanted <= set(record.nodes):
            return False
        fenced = [
            node
            for node in sorted(wanted)
            if record.nodes[node].lease_generation is not None
            and fenced_out(self.fences(node), record.nodes[node].lease_generation, epoch)
        ]
        if fenced:
            log.warning(
                "Epoch %d of %s under %s is not committed: a job that had lost the writer "
                "lease wrote its record (fenced out)",
                epoch,
                fenced,
                self.storage.display_url,
            )
        return not fenced

    def know_fences(self, fences: Mapping[str, tuple[tuple[int, int], ...]]) -> None:
        """Use these nodes' lease fences instead of reading their lease documents (a
        job that has just read them to take its leases: no extra request)."""
        self._fences.update(fences)

    def fences(self, node: str) -> tuple[tuple[int, int], ...]:
        """The fences of ``node``'s writer lease (read once per listing; none if it has
        no lease document or it is unreadable)."""
        if node not in self.leases:
            return ()
        if node not in self._fences:
            try:
                holder = read_lease_document(self.storage, node)
            except CorruptCheckpointError as error:
                log.warning("Ignoring the unreadable writer lease of %r: %s", node, error)
                holder = None
            self._fences[node] = holder.fences if holder is not None else ()
        return self._fences[node]

    def _lists(self, epoch: int, nodes: set[str]) -> bool:
        return epoch in self.legacy or nodes <= self.nodes.get(epoch, frozenset())

    def newest_complete(self, nodes: Iterable[str], *, before: int | None = None) -> int | None:
        """The newest epoch (before ``before``, if given) committed on every one of
        ``nodes``, or ``None``: the candidates' records are read newest first until one
        is intact; an unreadable one is skipped with a warning (it cannot be trusted)."""
        wanted = set(nodes)
        candidates = reversed(self.complete_on(wanted, before=before))
        return next((epoch for epoch in candidates if self._intact(epoch, wanted)), None)

    def complete(self, nodes: Iterable[str]) -> list[int]:
        """Every epoch committed on every one of ``nodes``, ascending (reads every
        candidate's records: for messages and repairs, not for resume)."""
        wanted = set(nodes)
        return [epoch for epoch in self.complete_on(wanted) if self._intact(epoch, wanted)]

    def _intact(self, epoch: int, nodes: set[str]) -> bool:
        try:
            return self.is_complete(epoch, nodes)
        except CorruptCheckpointError as error:
            log.warning("Skipping epoch %d while looking for an intact one: %s", epoch, error)
            self.unreadable.add(epoch)
            return False


def newest_complete(where: CheckpointLocation | PathType, nodes: Iterable[str]) -> int | None:
    """The newest epoch committed on every one of ``nodes`` under ``where`` (one
    listing of the control directory, then the candidates' records, newest first)."""
    storage = storage_of(where)
    return CommitListing.of(storage).newest_complete(nodes)
