"""Where a node's reads may come from besides its checkpoint root: copies of its newest
committed checkpoint that a session keeps on other machines (peer replicas).

A session that keeps such copies sets :data:`PEER_COPIES` while it runs a node's tasks
(the Dask session does, with ``peer_replicas=k``). The node tasks then tell it which
root each save wrote to (:func:`note_saved`), and read a committed checkpoint through
:func:`read_committed`: from a copy if the session has one for that root, node and
epoch, else from the root. A copy is untrusted: it is read through the commit protocol
against the root's commit record (its manifest's CRC-32C, then every chunk's
checksum), so a copy of an epoch that is not committed in the root, or one whose bytes
differ, is never used; the read then goes to the root, as without copies.

Example::

    >>> from ckptstore.protocol import CheckpointLocation
    >>> location = CheckpointLocation.open("ckpt", "npz")
    >>> where = read_committed(location, "trainer_0", 3, lambda storage: storage.display_url)
    >>> where.endswith("ckpt")  # no session keeps copies here: the root
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol, TypeVar

from ckptstore.errors import CheckpointNotFoundError, CorruptCheckpointError, ObjectNotFoundError
from ckptstore.plugin import PathType
from ckptstore.protocol import CheckpointLocation

__all__ = ["PEER_COPIES", "PeerCopies", "note_saved", "read_committed"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class PeerCopies(Protocol):
    """What a session keeping copies of checkpoints on its peers offers node tasks."""

    def saved(self, location: CheckpointLocation, node: str, epoch: int) -> None:
        """``node`` wrote its checkpoint of ``epoch`` under ``location`` (not committed
        yet: the session copies it only once the epoch is committed)."""

    def storage_for(self, location: CheckpointLocation, node: str, epoch: int) -> PathType | None:
        """A read-only storage serving a copy of ``node``'s checkpoint of ``epoch``
        (and the root's commit records), or ``None`` without a usable copy."""

    def done(self, location: CheckpointLocation, node: str, epoch: int, *, used: bool) -> None:
        """The copy served for ``node``'s ``epoch`` is no longer needed (``used``: it was
        read whole and verified; otherwise it was refused)."""


PEER_COPIES: ContextVar[PeerCopies | None] = ContextVar("ckptstore_peer_copies", default=None)
"""The peer copies of the session running the current node task (``None``: none)."""


def note_saved(location: CheckpointLocation, node: str, epoch: int) -> None:
    """Tell the running session's peer copies (if any) where ``node`` saved ``epoch``."""
    copies = PEER_COPIES.get()
    if copies is not None:
        copies.saved(location, node, epoch)


def read_committed(
    location: CheckpointLocation,
    node: str,
    epoch: int,
    read: Callable[[PathType], _T],
    *,
    last: bool = True,
) -> _T:
    """``read(storage)`` of ``node``'s committed checkpoint of ``epoch``: from a peer
    copy if the session holds one that passes the commit protocol's checks, else from
    ``location``'s root. ``last``: nothing reads this copy after (it may be freed)."""
    copies = PEER_COPIES.get()
    storage = copies.storage_for(location, node, epoch) if copies is not None else None
    if copies is None or storage is None:
        return read(location.storage)
    try:
        result = read(storage)
    except (CorruptCheckpointError, ObjectNotFoundError, CheckpointNotFoundError) as error:
        log.warning(
            "The peer copy of node %r's checkpoint of epoch %d was refused (%s: %s); "
            "reading it from %s",
            node,
            epoch,
            type(error).__name__,
            error,
            location.storage.display_url,
        )
        copies.done(location, node, epoch, used=False)
        return read(location.storage)
    if last:
        copies.done(location, node, epoch, used=True)
    return result
