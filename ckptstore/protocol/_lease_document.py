"""Writer lease documents: ``_ckptstore/lease/<node>.json``, what they hold, how they
are read, broken and checked (see :mod:`ckptstore.protocol._lease` for how a job takes,
keeps and gives up its leases).

A lease document holds its holder (token, host, pid), its start, last renewal and
expiry, its state (held, released, broken), its generation, which grows by one at every
change of holder, and the fences of the jobs that took it over: ``(generation,
epoch)``, that generation wrote the epochs after that one (:func:`fenced_out`).

Example::

    >>> from ckptstore.builtin import LocalPath
    >>> storage = LocalPath("documents")
    >>> read_lease_document(storage, "trainer_0") is None  # never leased
    True
    >>> fenced_out([(2, 5)], 1, 6)  # generation 2 took over and resumed from epoch 5
    True
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ckptstore.errors import CorruptCheckpointError, DocumentChangedError, LeaseLostError
from ckptstore.plugin import PathType
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import (
    decode_document,
    encode_document,
    json_int,
    json_list,
    json_number,
    lease_key,
    validate_node_name,
)

__all__ = [
    "BROKEN",
    "HELD",
    "LIVE_TOKENS",
    "MAX_FENCES",
    "RELEASED",
    "LeaseFence",
    "LeaseHolder",
    "break_lease",
    "fenced_out",
    "lost_reason",
    "read_lease",
    "read_lease_document",
    "with_fence",
]

LEASE_KIND = "ckptstore.lease"
HELD, RELEASED, BROKEN = "held", "released", "broken"
ATTEMPTS = 8
"""Conditional writes of one lease in a row that may find it changed before giving up."""
MAX_FENCES = 64
"""Resume points kept in a lease document (the newest ones)."""
LIVE_TOKENS: set[str] = set()
"""Tokens of the leases this process holds now: a lease of this host and pid with any
other token belongs to a job of this process that has ended (its release failed)."""


@dataclass(frozen=True)
class LeaseHolder:
    """A node's writer lease, as stored in the lease document.

    ``state`` is ``"held"``, ``"released"`` (free) or ``"broken"`` (by an operator:
    free, and its last holder can no longer commit). ``fences`` are the
    ``(generation, epoch)`` resume points of jobs that took the lease over: that
    generation wrote the epochs after that one.

    Example::

        >>> holder = LeaseHolder("trainer_0", "5f1c", "gpu-7", 4242, 1767323045.0, 1767323105.0)
        >>> holder.describe()
        'host gpu-7, pid 4242, started 2026-01-02T03:04:05+00:00, lease valid until ...'
    """

    node: str
    token: str
    host: str
    pid: int
    started_at: float
    expires_at: float
    generation: int = 0
    renewed_at: float | None = None
    state: str = HELD
    fences: tuple[tuple[int, int], ...] = field(default=())

    @property
    def held(self) -> bool:
        return self.state == HELD

    def encode(self) -> bytes:
        return encode_document(
            LEASE_KIND,
            {
                "node": self.node,
                "token": self.token,
                "host": self.host,
                "pid": self.pid,
                "started_at": self.started_at,
                "renewed_at": self.started_at if self.renewed_at is None else self.renewed_at,
                "expires_at": self.expires_at,
                "generation": self.generation,
                "state": self.state,
                "fences": [list(pair) for pair in self.fences],
            },
        )

    @classmethod
    def decode(cls, data: bytes, *, url: str, key: str) -> LeaseHolder:
        document = decode_document(data, LEASE_KIND, url=url, key=key)
        try:
            state = str(document.get("state", HELD))
            if state not in (HELD, RELEASED, BROKEN):
                raise ValueError(f"state {state[:20]!r} is not one of held, released, broken")
            fences = json_list(document, "fences") if "fences" in document else []
            if len(fences) > MAX_FENCES:
                raise ValueError(f"more than {MAX_FENCES} fences")
            return cls(
                node=str(document["node"]),
                token=str(document["token"]),
                host=str(document["host"]),
                pid=json_int(document, "pid"),
                started_at=json_number(document, "started_at"),
                expires_at=json_number(document, "expires_at"),
                generation=json_int(document, "generation") if "generation" in document else 0,
                renewed_at=(
                    json_number(document, "renewed_at") if "renewed_at" in document else None
                ),
                state=state,
                fences=tuple(_fence(pair) for pair in fences),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptCheckpointError(
                f"writer lease is malformed: {error}", url=url, file=key
            ) from None

    def describe(self) -> str:
        """Host, pid, start time and expiry, for messages."""
        return (
            f"host {self.host}, pid {self.pid}, started {_iso(self.started_at)}, "
            f"lease valid until {_iso(self.expires_at)}"
        )

    def gone(self, now: float) -> bool:
        """Whether the holder is certainly not writing any more: the lease is free, its
        own expiry (``renewed_at + ttl``) passed, or it ran on this host and its process
        no longer exists or is a zombie."""
        if not self.held or now >= self.expires_at:
            return True
        if self.host != socket.gethostname():
            return False
        if self.pid == os.getpid():
            return self.token not in LIVE_TOKENS
        return not _process_alive(self.pid)


def _fence(pair: object) -> tuple[int, int]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError("a fence is not a [generation, epoch] pair")
    generation, epoch = pair
    for value in (generation, epoch):
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value < 1 << 63:
            raise ValueError("a fence holds a value that is not an integer in range")
    return generation, epoch


def with_fence(
    fences: tuple[tuple[int, int], ...], fence: tuple[int, int]
) -> tuple[tuple[int, int], ...]:
    """``fences`` with ``fence`` replacing any of its generation, newest last, at most
    :data:`MAX_FENCES` of them."""
    kept = [pair for pair in fences if pair[0] != fence[0]]
    return (*kept, fence)[-MAX_FENCES:]


def fenced_out(fences: Iterable[tuple[int, int]], generation: int | None, epoch: int) -> bool:
    """Whether a commit record of ``epoch`` written under lease ``generation`` is fenced
    out: a later generation of the lease resumed from an earlier epoch, so the record's
    writer had lost the lease when it wrote it. Records without a generation (saves
    without a lease, older versions) are never fenced out.

    Example::

        >>> fenced_out([(2, 5)], 1, 6), fenced_out([(2, 5)], 1, 5), fenced_out([(2, 5)], 2, 6)
        (True, False, False)
    """
    if generation is None:
        return False
    return any(later > generation and epoch > after for later, after in fences)


def read_lease_document(where: CheckpointLocation | PathType, node: str) -> LeaseHolder | None:
    """``node``'s lease document under ``where`` whatever its state, or ``None`` if
    there is none. Raises :class:`CorruptCheckpointError` for an unreadable one."""
    storage = storage_of(where)
    key = lease_key(validate_node_name(node))
    data = storage.get_document(key)
    if data is None:
        return None
    return LeaseHolder.decode(data, url=storage.display_url, key=key)


def read_lease(where: CheckpointLocation | PathType, node: str) -> LeaseHolder | None:
    """The holder of ``node``'s writer lease under ``where``, or ``None`` if nobody
    holds it. Raises :class:`CorruptCheckpointError` for an unreadable lease."""
    storage = storage_of(where)
    holder = read_lease_document(storage, node)
    return holder if holder is not None and holder.held else None


def break_lease(where: CheckpointLocation | PathType, node: str) -> LeaseHolder | None:
    """Break ``node``'s writer lease (an operator's ``ckptstore lease break``): the
    lease becomes free with a new generation, so a new job may take it at once and its
    last holder, if alive, can no longer commit (its next check raises
    :class:`~ckptstore.errors.LeaseLostError`). Returns the holder it broke, or ``None``
    if nobody held it.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> from ckptstore.protocol import WriterLease
        >>> storage = LocalPath("to_break")
        >>> lease = WriterLease(storage, ["trainer_0"], heartbeat=False)
        >>> lease.acquire()
        >>> break_lease(storage, "trainer_0").pid == os.getpid()
        True
        >>> read_lease(storage, "trainer_0") is None
        True
    """
    storage = storage_of(where)
    key = lease_key(validate_node_name(node))
    for _ in range(ATTEMPTS):
        current = storage.get_versioned_document(key)
        if current is None:
            return None
        data, version = current
        try:
            old: LeaseHolder | None = LeaseHolder.decode(data, url=storage.display_url, key=key)
        except CorruptCheckpointError:
            old = None
        generation = old.generation if old is not None else 0
        now = time.time()
        broken = LeaseHolder(
            node=node,
            token="",
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=now,
            expires_at=now,
            generation=generation + 1,
            state=BROKEN,
            fences=old.fences if old is not None else (),
        )
        try:
            storage.replace_document(key, broken.encode(), version)
        except DocumentChangedError:
            continue
        return old if old is not None and old.held else None
    raise DocumentChangedError(storage.display_url, key)


@dataclass(frozen=True)
class LeaseFence:
    """What the commit step checks right before it creates commit records: this job's
    token and, per node, the lease generation it holds and the epoch it resumed from
    after a takeover. Plain data, so it travels with a save to wherever the commit
    runs.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> from ckptstore.protocol import WriterLease
        >>> storage = LocalPath("fenced")
        >>> with WriterLease(storage, ["trainer_0"], heartbeat=False) as lease:
        ...     fence = lease.fence()
        ...     fence.verify(storage, ["trainer_0"])  # still held: no error
        ...     fence.generations
        {'trainer_0': 1}
    """

    token: str
    generations: Mapping[str, int]
    resumed_after: Mapping[str, int] = field(default_factory=dict)

    def verify(self, storage: PathType, nodes: Iterable[str]) -> None:
        """Read each node's lease (one GET each); raise
        :class:`~ckptstore.errors.LeaseLostError` unless this job still holds it, at its
        generation, unexpired by the lease's own clock."""
        now = time.time()
        for node in sorted(set(nodes)):
            generation = self.generations.get(node)
            if generation is None:
                continue  # a node this job holds no lease on (lease-less saves)
            try:
                holder = read_lease_document(storage, node)
            except CorruptCheckpointError as error:
                raise LeaseLostError(
                    storage.display_url, node, generation, f"its lease is unreadable ({error})"
                ) from None
            reason = lost_reason(holder, self.token, generation, now)
            if reason is not None:
                raise LeaseLostError(storage.display_url, node, generation, reason)

    def fenced_out(self, node: str, generation: int | None, epoch: int) -> bool:
        """Whether a commit record of ``node``'s ``epoch`` written under ``generation``
        belongs to a writer this job took the lease over from, after the epoch this job
        resumed from (:func:`fenced_out`): not committed, so saved over."""
        mine = self.generations.get(node)
        after = self.resumed_after.get(node)
        if mine is None or after is None:
            return False
        return fenced_out([(mine, after)], generation, epoch)


def lost_reason(holder: LeaseHolder | None, token: str, generation: int, now: float) -> str | None:
    """Why a job with ``token`` no longer holds the lease at ``generation``, or ``None``
    if it does."""
    if holder is None:
        return "its lease document was deleted"
    if holder.state == BROKEN:
        return f"an operator broke it (ckptstore lease break, from host {holder.host})"
    if holder.token != token or holder.generation != generation:
        if holder.held:
            return f"another job took it over ({holder.describe()}, generation {holder.generation})"
        return "it was released"
    if not holder.held:
        return "it was released"
    if now >= holder.expires_at:
        return f"it expired at {_iso(holder.expires_at)} without being renewed"
    return None


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host: a zombie (killed, not yet reaped by
    its parent) counts as dead; it can no longer write."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[:1]
    except FileNotFoundError:
        return False
    except OSError:
        return _signal_reaches(pid)
    return state not in ([b"Z"], [b"X"])


def _signal_reaches(pid: int) -> bool:
    """Where ``/proc`` cannot tell: whether signal 0 reaches ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
