"""Writer leases: at most one job writes a node's checkpoints under a root at a time.

A job (``JobRunner.train``) takes a lease per node it saves before doing anything else:
``_ckptstore/lease/<node>.json``, created with the create-only write
(:meth:`PathType.create_document`), holding a random owner token, the host, the pid,
the start time and an expiry. A second job on the same root and node finds the lease
and stops at once with :class:`~ckptstore.errors.LeaseHeldError` naming the holder,
instead of interleaving its checkpoints with the first job's. The lease is renewed at
every save and deleted when the job ends.

A lease whose holder is gone is taken over with a warning, so a crash never blocks a
restart for long: at once when the holder ran on this host and its process no longer
exists (kill -9, OOM) or is this process but no longer holds it (a job whose storage
failed before it could release it), otherwise when the lease has expired (``ttl`` seconds after
the last renewal; hosts are assumed to keep their clocks roughly in sync). A corrupt
lease counts as expired.

Example::

    >>> from ckptstore import LocalPath
    >>> storage = LocalPath("ckpt")
    >>> lease = WriterLease(storage, ["trainer_0"])
    >>> lease.acquire()  # LeaseHeldError if another live job holds it
    >>> try:
    ...     lease.renew()  # before each save
    ... finally:
    ...     lease.release()
    >>> read_lease(storage, "trainer_0") is None  # released: the next job may write
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from ckptstore.errors import (
    CorruptCheckpointError,
    JobConfigurationError,
    KeyExistsError,
    LeaseHeldError,
    StorageError,
)
from ckptstore.plugin._path_type import PathType
from ckptstore.records._documents import decode_document, encode_document, json_int, json_number
from ckptstore.records._layout import LEASE_DIR, lease_key
from ckptstore.records._names import validate_node_name

__all__ = ["DEFAULT_LEASE_TTL", "LeaseHolder", "WriterLease", "check_lease_ttl", "read_lease"]

log = logging.getLogger(__name__)

LEASE_KIND = "ckptstore.lease"
DEFAULT_LEASE_TTL = 600.0
"""Seconds a lease stays valid after its last renewal (every save renews it)."""
_ACQUIRE_ATTEMPTS = 4
_LIVE_TOKENS: set[str] = set()
"""Tokens of the leases this process holds now: a lease of this host and pid with any
other token belongs to a job of this process that has ended (its release failed)."""


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a node's writer lease, as stored in the lease document.

    Example::

        >>> holder = LeaseHolder("trainer_0", "5f1c", "gpu-7", 4242, 1767323045.0, 1767323645.0)
        >>> holder.describe()
        'host gpu-7, pid 4242, started 2026-01-02T03:04:05+00:00, lease valid until ...'
    """

    node: str
    token: str
    host: str
    pid: int
    started_at: float
    expires_at: float

    def encode(self) -> bytes:
        return encode_document(
            LEASE_KIND,
            {
                "node": self.node,
                "token": self.token,
                "host": self.host,
                "pid": self.pid,
                "started_at": self.started_at,
                "expires_at": self.expires_at,
            },
        )

    @classmethod
    def decode(cls, data: bytes, *, url: str, key: str) -> LeaseHolder:
        document = decode_document(data, LEASE_KIND, url=url, key=key)
        try:
            return cls(
                node=str(document["node"]),
                token=str(document["token"]),
                host=str(document["host"]),
                pid=json_int(document, "pid"),
                started_at=json_number(document, "started_at"),
                expires_at=json_number(document, "expires_at"),
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
        """Whether the holder is certainly not writing any more: its lease expired, or
        it ran on this host and its process no longer exists."""
        if now >= self.expires_at:
            return True
        if self.host != socket.gethostname():
            return False
        if self.pid == os.getpid():
            return self.token not in _LIVE_TOKENS
        return not _process_alive(self.pid)


def read_lease(storage: PathType, node: str) -> LeaseHolder | None:
    """The holder of ``node``'s writer lease under ``storage``, or ``None`` if nobody
    holds it. Raises :class:`CorruptCheckpointError` for an unreadable lease."""
    key = lease_key(validate_node_name(node))
    data = storage.get_document(key)
    if data is None:
        return None
    return LeaseHolder.decode(data, url=storage.display_url, key=key)


def check_lease_ttl(ttl: float) -> None:
    """Refuse a lease time that is not a positive number of seconds."""
    if not ttl > 0:  # NaN too
        raise JobConfigurationError(
            f"lease ttl must be a positive number of seconds, got {ttl!r}; pass one (a "
            "JobRunner's lease_ttl), or lease_ttl=None to take no lease"
        )


class WriterLease:
    """The writer leases of one job's nodes under one checkpoint root.

    ``ttl``: seconds a lease stays valid after it was taken or last renewed.

    Example::

        >>> from ckptstore import LocalPath
        >>> storage = LocalPath("two_nodes")
        >>> with WriterLease(storage, ["trainer_0", "trainer_1"], ttl=300):
        ...     read_lease(storage, "trainer_1").pid == os.getpid()
        True
        >>> read_lease(storage, "trainer_1") is None
        True
    """

    def __init__(
        self,
        storage: PathType,
        nodes: Iterable[str],
        *,
        ttl: float = DEFAULT_LEASE_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_lease_ttl(ttl)
        self.storage = storage
        self.nodes = sorted({validate_node_name(node) for node in nodes})
        self.ttl = ttl
        self.token = secrets.token_hex(16)
        self._clock = clock
        self._started = clock()
        self._renewed_at = self._started
        self._held: list[str] = []

    def __enter__(self) -> WriterLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _mine(self, node: str) -> LeaseHolder:
        return LeaseHolder(
            node=node,
            token=self.token,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started,
            expires_at=self._clock() + self.ttl,
        )

    def acquire(self) -> None:
        """Take every node's lease, or none: raises :class:`LeaseHeldError` naming the
        other writer if a live job holds one."""
        try:
            for node in self.nodes:
                self._acquire(node)
                self._held.append(node)
                _LIVE_TOKENS.add(self.token)
        except BaseException:
            self.release()
            raise

    def _acquire(self, node: str) -> None:
        key = lease_key(node)
        url = self.storage.display_url
        holder: LeaseHolder | None = None
        unlinked = False
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                self.storage.create_document(key, self._mine(node).encode())
                return
            except KeyExistsError:
                pass
            except CorruptCheckpointError as error:
                if unlinked:
                    raise
                # a link (or a file) in place of the lease directory, never followed:
                # it holds no lease this job can read, so it is removed, once
                log.warning("Replacing what stands in place of %s/%s (%s)", url, LEASE_DIR, error)
                self.storage.delete([LEASE_DIR])
                unlinked = True
                continue
            try:
                holder = read_lease(self.storage, node)
            except CorruptCheckpointError as error:
                log.warning("Taking over the unreadable writer lease %s/%s (%s)", url, key, error)
                self.storage.delete([key])
                continue
            if holder is None:
                continue  # released meanwhile: try again
            now = self._clock()
            if holder.token == self.token:
                self.storage.put_document(key, self._mine(node).encode())
                return
            if not holder.gone(now):
                raise LeaseHeldError(url, node, holder.describe(), holder.expires_at - now)
            log.warning(
                "Taking over the writer lease of node %r under %s from a job that is gone "
                "(%s): it crashed or was killed",
                node,
                url,
                holder.describe(),
            )
            self.storage.delete([key])
        describe = holder.describe() if holder is not None else "several jobs starting at once"
        raise LeaseHeldError(url, node, describe, self.ttl)

    def renew(self) -> None:
        """Extend every lease held by ``ttl`` from now (before each save). Raises
        :class:`LeaseHeldError` if another job took one over meanwhile (this job was
        silent for longer than ``ttl``).

        Within a quarter of ``ttl`` of the last renewal nothing is read or written: no
        other job can have taken a lease over that soon, and a save then costs no
        request (nor, on a full disk, a page) for its lease.
        """
        now = self._clock()
        if now - self._renewed_at < self.ttl / 4:
            return
        self._renewed_at = now
        for node in self._held:
            key = lease_key(node)
            try:
                holder = read_lease(self.storage, node)
            except CorruptCheckpointError:
                holder = None
            if holder is not None and holder.token != self.token:
                raise LeaseHeldError(
                    self.storage.display_url,
                    node,
                    f"{holder.describe()}; it took the lease over after this job's expired",
                    holder.expires_at - self._clock(),
                )
            self.storage.put_document(key, self._mine(node).encode())

    def release(self) -> None:
        """Give up every lease this object holds (leases taken over by others stay)."""
        held, self._held = self._held, []
        _LIVE_TOKENS.discard(self.token)
        for node in held:
            with contextlib.suppress(StorageError, CorruptCheckpointError):
                holder = read_lease(self.storage, node)
                if holder is None or holder.token == self.token:
                    self.storage.delete([lease_key(node)])


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return True
    return True


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
