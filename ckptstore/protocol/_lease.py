"""Writer leases: at most one job writes a node's checkpoints under a root at a time,
and a job that lost its lease can no longer commit.

A job (``JobRunner.train``) takes a lease per node it saves before doing anything else:
``_ckptstore/lease/<node>.json``, holding a random owner token, the host, the pid, the
start time, the last renewal, the expiry and a **generation** that grows by one at
every change of holder. Every write of the document is a conditional replace
(:meth:`PathType.replace_document`: a lock on local disk, ``If-Match`` on S3,
``ifGenerationMatch`` on GCS), so of two jobs acting on the same version of it, one
wins and the other reads again. The document is never deleted: a release marks it
free, so generations only grow.

* **Taking it.** A free lease is taken at once. A held one stops the job with
  :class:`~ckptstore.errors.LeaseHeldError` naming the holder, unless the holder is
  gone: its own ``renewed_at + ttl`` has passed (hosts are assumed to keep their clocks
  roughly in sync), or it ran on this host and its process no longer exists or is a
  zombie (killed, not yet reaped). A lease broken by an operator
  (:func:`break_lease`) is free. An unreadable lease is taken over with a warning.
* **Keeping it.** A heartbeat thread renews every lease every ``ttl / 3`` seconds,
  whatever the saves do, so epochs longer than the ttl keep it. A renewal that finds
  the lease changed hands marks it lost: :meth:`WriterLease.check` (before each save)
  and :meth:`WriterLease.verify` (before each commit) then raise
  :class:`~ckptstore.errors.LeaseLostError`. So does a lease not renewed for a whole
  ttl (storage unreachable): another job may take it over by then.
* **Fencing.** :meth:`WriterLease.fence` gives the commit step a :class:`LeaseFence`:
  it reads each node's lease right before the commit records are created and refuses
  to commit unless this job still holds it at its generation; every commit record
  carries that generation (``lease_generation``). A job that took a lease over records
  the epoch it resumes from in the lease (:meth:`WriterLease.record_resume`): commit
  records of an older generation for later epochs are not committed
  (:func:`fenced_out`), which closes the window between the check and the create.

Example::

    >>> from ckptstore import LocalPath
    >>> storage = LocalPath("ckpt")
    >>> lease = WriterLease(storage, ["trainer_0"], ttl=30)
    >>> lease.acquire()  # LeaseHeldError if another live job holds it
    >>> try:
    ...     lease.check()  # before each save: LeaseLostError once lost
    ... finally:
    ...     lease.release()
    >>> read_lease(storage, "trainer_0") is None  # released: the next job may write
    True
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import NoReturn

from ckptstore.errors import (
    CorruptCheckpointError,
    DocumentChangedError,
    JobConfigurationError,
    LeaseHeldError,
    LeaseLostError,
    StorageError,
)
from ckptstore.plugin._path_type import PathType
from ckptstore.records._documents import (
    decode_document,
    encode_document,
    json_int,
    json_list,
    json_number,
)
from ckptstore.records._layout import lease_key
from ckptstore.records._names import validate_node_name

__all__ = [
    "DEFAULT_LEASE_TTL",
    "LeaseFence",
    "LeaseHolder",
    "WriterLease",
    "break_lease",
    "check_lease_ttl",
    "fenced_out",
    "read_lease",
    "read_lease_document",
]

log = logging.getLogger(__name__)

LEASE_KIND = "ckptstore.lease"
DEFAULT_LEASE_TTL = 60.0
"""Seconds a lease stays valid after its last renewal (the heartbeat renews it every
third of that)."""
HELD, RELEASED, BROKEN = "held", "released", "broken"
_ATTEMPTS = 8
"""Conditional writes of one lease in a row that may find it changed before giving up."""
MAX_FENCES = 64
"""Resume points kept in a lease document (the newest ones)."""
_LIVE_TOKENS: set[str] = set()
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
            return self.token not in _LIVE_TOKENS
        return not _process_alive(self.pid)


def _fence(pair: object) -> tuple[int, int]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError("a fence is not a [generation, epoch] pair")
    generation, epoch = pair
    for value in (generation, epoch):
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value < 1 << 63:
            raise ValueError("a fence holds a value that is not an integer in range")
    return generation, epoch


def _with_fence(
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


def read_lease_document(storage: PathType, node: str) -> LeaseHolder | None:
    """``node``'s lease document under ``storage`` whatever its state, or ``None`` if
    there is none. Raises :class:`CorruptCheckpointError` for an unreadable one."""
    key = lease_key(validate_node_name(node))
    data = storage.get_document(key)
    if data is None:
        return None
    return LeaseHolder.decode(data, url=storage.display_url, key=key)


def read_lease(storage: PathType, node: str) -> LeaseHolder | None:
    """The holder of ``node``'s writer lease under ``storage``, or ``None`` if nobody
    holds it. Raises :class:`CorruptCheckpointError` for an unreadable lease."""
    holder = read_lease_document(storage, node)
    return holder if holder is not None and holder.held else None


def break_lease(storage: PathType, node: str) -> LeaseHolder | None:
    """Break ``node``'s writer lease (an operator's ``ckptstore lease break``): the
    lease becomes free with a new generation, so a new job may take it at once and its
    last holder, if alive, can no longer commit (its next check raises
    :class:`~ckptstore.errors.LeaseLostError`). Returns the holder it broke, or ``None``
    if nobody held it.

    Example::

        >>> from ckptstore import LocalPath
        >>> storage = LocalPath("to_break")
        >>> lease = WriterLease(storage, ["trainer_0"], heartbeat=False)
        >>> lease.acquire()
        >>> break_lease(storage, "trainer_0").pid == os.getpid()
        True
        >>> read_lease(storage, "trainer_0") is None
        True
    """
    key = lease_key(validate_node_name(node))
    for _ in range(_ATTEMPTS):
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


def check_lease_ttl(ttl: float) -> None:
    """Refuse a lease time that is not a positive number of seconds."""
    if not ttl > 0:  # NaN too
        raise JobConfigurationError(
            f"lease ttl must be a positive number of seconds, got {ttl!r}; pass one (a "
            "JobRunner's lease_ttl), or lease_ttl=None to take no lease"
        )


@dataclass(frozen=True)
class LeaseFence:
    """What the commit step checks right before it creates commit records: this job's
    token and, per node, the lease generation it holds and the epoch it resumed from
    after a takeover. Plain data, so it travels with a save to wherever the commit
    runs.

    Example::

        >>> from ckptstore import LocalPath
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
            reason = _lost_reason(holder, self.token, generation, now)
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


def _lost_reason(holder: LeaseHolder | None, token: str, generation: int, now: float) -> str | None:
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


class WriterLease:
    """The writer leases of one job's nodes under one checkpoint root.

    ``ttl``: seconds a lease stays valid after it was taken or last renewed; the
    heartbeat thread (``heartbeat=True``) renews it every ``ttl / 3`` seconds.

    Example::

        >>> from ckptstore import LocalPath
        >>> storage = LocalPath("two_nodes")
        >>> with WriterLease(storage, ["trainer_0", "trainer_1"], ttl=30):
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
        heartbeat: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_lease_ttl(ttl)
        self.storage = storage
        self.nodes = sorted({validate_node_name(node) for node in nodes})
        self.ttl = ttl
        self.token = secrets.token_hex(16)
        self.generations: dict[str, int] = {}
        """The generation of each lease held."""
        self._heartbeat = heartbeat
        self._clock = clock
        self._started = clock()
        self._expires = self._started + ttl
        self.fences: dict[str, tuple[tuple[int, int], ...]] = {}
        """The fences each lease held when it was taken (and those this job added)."""
        self._taken_over: set[str] = set()
        self._resumed_after: dict[str, int] = {}
        self._lost: LeaseLostError | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WriterLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _mine(
        self, node: str, generation: int, now: float, fences: tuple[tuple[int, int], ...]
    ) -> LeaseHolder:
        return LeaseHolder(
            node=node,
            token=self.token,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started,
            expires_at=now + self.ttl,
            generation=generation,
            renewed_at=now,
            fences=fences,
        )

    # -- taking -------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take every node's lease, or none: raises :class:`LeaseHeldError` naming the
        other writer if a live job holds one. Starts the heartbeat."""
        _LIVE_TOKENS.add(self.token)
        try:
            self._expires = self._clock() + self.ttl
            for node in self.nodes:
                self.generations[node] = self._acquire(node)
        except BaseException:
            self.release()
            raise
        if self._heartbeat:
            self._thread = threading.Thread(
                target=self._beat, name=f"ckptstore-lease-{self.token[:8]}", daemon=True
            )
            self._thread.start()

    def _acquire(self, node: str) -> int:
        key = lease_key(node)
        url = self.storage.display_url
        prior: LeaseHolder | None = None
        for _ in range(_ATTEMPTS):
            current = self.storage.get_versioned_document(key)
            version = None if current is None else current[1]
            now = self._clock()
            floor = 0  # the generation the new one must exceed
            try:
                prior = (
                    None if current is None else LeaseHolder.decode(current[0], url=url, key=key)
                )
            except CorruptCheckpointError as error:
                log.warning("Taking over the unreadable writer lease %s/%s (%s)", url, key, error)
                prior = None
                # its generation is lost: milliseconds since 1970 exceed any counted one
                floor = int(now * 1000)
            if prior is not None and prior.held and prior.token != self.token:
                if not prior.gone(now):
                    raise LeaseHeldError(url, node, prior.describe(), prior.expires_at - now)
                log.warning(
                    "Taking over the writer lease of node %r under %s from a job that is gone "
                    "(%s): it crashed or was killed",
                    node,
                    url,
                    prior.describe(),
                )
            if prior is not None and prior.held and prior.token == self.token:
                generation = prior.generation  # this object's own lease, taken again
            else:
                generation = max(prior.generation if prior is not None else 0, floor) + 1
            fences = prior.fences if prior is not None else ()
            try:
                self.storage.replace_document(
                    key, self._mine(node, generation, now, fences).encode(), version
                )
            except DocumentChangedError:
                continue  # another job acted on the same version: look again
            self.fences[node] = fences
            if current is not None and (prior is None or prior.state != RELEASED):
                # the last holder may still be alive: its commits after this job's resume
                # point are fenced out (a fresh lease or a clean release needs no fence)
                self._taken_over.add(node)
            return generation
        describe = prior.describe() if prior is not None else "several jobs starting at once"
        raise LeaseHeldError(url, node, describe, self.ttl)

    def record_resume(self, epoch: int | None) -> None:
        """Record in each lease taken over (not fresh, not cleanly released) that this
        generation writes the epochs after ``epoch`` (``None``: from scratch), before
        anything is saved: commit records of older generations for later epochs are
        then fenced out (:func:`fenced_out`)."""
        after = -1 if epoch is None else epoch
        with self._lock:
            for node in sorted(self._taken_over & set(self.generations)):
                fence = (self.generations[node], after)

                def add(holder: LeaseHolder, fence: tuple[int, int] = fence) -> LeaseHolder:
                    return replace(holder, fences=_with_fence(holder.fences, fence))

                self._rewrite(node, add)
                self._resumed_after[node] = after
                self.fences[node] = _with_fence(self.fences.get(node, ()), fence)

    # -- keeping ------------------------------------------------------------------------

    def _beat(self) -> None:
        """The heartbeat: renew every ``ttl / 3`` seconds until released or lost."""
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except LeaseLostError as error:
                log.error("%s", error)
                return
            except (OSError, CorruptCheckpointError) as error:
                log.warning("Could not renew the writer lease (will retry): %s", error)

    def renew(self) -> None:
        """Extend every lease held by ``ttl`` from now (the heartbeat calls it). Raises
        :class:`~ckptstore.errors.LeaseLostError` (and marks the lease lost) if another
        job took one over or an operator broke it."""
        self.check()
        with self._lock:
            now = self._clock()
            renewed = partial(replace, renewed_at=now, expires_at=now + self.ttl)
            for node in sorted(self.generations):
                self._rewrite(node, renewed)
            self._expires = now + self.ttl

    def _rewrite(self, node: str, change: Callable[[LeaseHolder], LeaseHolder]) -> None:
        """Replace ``node``'s lease with ``change(lease)`` if this job still holds it,
        conditionally; marks the lease lost (and raises) if it does not."""
        key = lease_key(node)
        url = self.storage.display_url
        generation = self.generations[node]
        for _ in range(_ATTEMPTS):
            current = self.storage.get_versioned_document(key)
            holder = None
            if current is not None:
                try:
                    holder = LeaseHolder.decode(current[0], url=url, key=key)
                except CorruptCheckpointError as error:
                    self._lose(node, f"its lease is unreadable ({error})")
            reason = _lost_reason(holder, self.token, generation, -1.0)
            if reason is not None or holder is None or current is None:
                self._lose(node, reason or "its lease document was deleted")
            try:
                self.storage.replace_document(key, change(holder).encode(), current[1])
            except DocumentChangedError:
                continue  # changed under us (an operator?): read it again
            return
        raise DocumentChangedError(url, key)

    def _lose(self, node: str, reason: str) -> NoReturn:
        error = LeaseLostError(
            self.storage.display_url, node, self.generations.get(node, 0), reason
        )
        if self._lost is None:
            self._lost = error
        raise error

    @property
    def lost(self) -> LeaseLostError | None:
        """Why this job lost its lease (the heartbeat found it taken over or broken),
        or ``None`` while it holds it as far as it knows."""
        return self._lost

    def check(self) -> None:
        """Raise :class:`~ckptstore.errors.LeaseLostError` if the lease is lost, or was
        not renewed for a whole ``ttl`` (nothing read: before each save)."""
        if self._lost is not None:
            raise self._lost
        if self.generations and self._clock() >= self._expires:
            node = self.nodes[0]
            self._lost = LeaseLostError(
                self.storage.display_url,
                node,
                self.generations.get(node, 0),
                f"it was not renewed for {self.ttl:g} s; another job may have taken it over",
            )
            raise self._lost

    def fence(self) -> LeaseFence:
        """What the commit step checks (:class:`LeaseFence`); raises
        :class:`~ckptstore.errors.LeaseLostError` if the lease is already lost."""
        self.check()
        return LeaseFence(self.token, dict(self.generations), dict(self._resumed_after))

    def verify(self) -> None:
        """:meth:`check`, then read every lease (one GET each): raises
        :class:`~ckptstore.errors.LeaseLostError` unless this job still holds them."""
        try:
            self.fence().verify(self.storage, self.generations)
        except LeaseLostError as error:
            if self._lost is None:
                self._lost = error
            raise

    # -- giving up ----------------------------------------------------------------------

    def release(self) -> None:
        """Stop the heartbeat and free every lease this object holds (leases taken over
        or broken by others stay as they are). Never raises a storage error."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        _LIVE_TOKENS.discard(self.token)
        with self._lock:
            held, self.generations = self.generations, {}
            for node, generation in sorted(held.items()):
                self.generations = {node: generation}
                try:
                    self._rewrite(node, lambda holder: replace(holder, state=RELEASED))
                except (LeaseLostError, StorageError, CorruptCheckpointError) as error:
                    log.debug("Not releasing the writer lease of %r: %s", node, error)
            self.generations = {}


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
