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
  gone (then it is taken over, said at INFO: after a crash that is the expected
  restart): its own ``renewed_at + ttl`` has passed (hosts are assumed to keep their
  clocks roughly in sync), or it ran on this host and its process no longer exists or is a
  zombie (killed, not yet reaped). A lease broken by an operator
  (:func:`~ckptstore.protocol.break_lease`) is free. An unreadable lease is taken over
  with a warning.
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
  (:func:`~ckptstore.protocol.fenced_out`), which closes the window between the check
  and the create.

Example::

    >>> from ckptstore.builtin import LocalPath
    >>> from ckptstore.protocol import read_lease
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
from dataclasses import replace
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
from ckptstore.plugin import PathType
from ckptstore.protocol._lease_document import (
    ATTEMPTS,
    LIVE_TOKENS,
    RELEASED,
    LeaseFence,
    LeaseHolder,
    lost_reason,
    with_fence,
)
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import LEASE_DIR, lease_key, validate_node_name

__all__ = ["DEFAULT_LEASE_TTL", "WriterLease", "check_lease_ttl"]

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL = 60.0
"""Seconds a lease stays valid after its last renewal (the heartbeat renews it every
third of that)."""


def check_lease_ttl(ttl: float) -> None:
    """Refuse a lease time that is not a positive number of seconds."""
    if not ttl > 0:  # NaN too
        raise JobConfigurationError(
            f"lease ttl must be a positive number of seconds, got {ttl!r}; pass one (a "
            "JobRunner's lease_ttl), or lease_ttl=None to take no lease"
        )


class WriterLease:
    """The writer leases of one job's nodes under one checkpoint root.

    ``ttl``: seconds a lease stays valid after it was taken or last renewed; the
    heartbeat thread (``heartbeat=True``) renews it every ``ttl / 3`` seconds.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> from ckptstore.protocol import read_lease
        >>> storage = LocalPath("two_nodes")
        >>> with WriterLease(storage, ["trainer_0", "trainer_1"], ttl=30):
        ...     read_lease(storage, "trainer_1").pid == os.getpid()
        True
        >>> read_lease(storage, "trainer_1") is None
        True
    """

    def __init__(
        self,
        where: CheckpointLocation | PathType,
        nodes: Iterable[str],
        *,
        ttl: float = DEFAULT_LEASE_TTL,
        heartbeat: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_lease_ttl(ttl)
        self.storage = storage_of(where)
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
        LIVE_TOKENS.add(self.token)
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
        unlinked = False
        for _ in range(ATTEMPTS):
            try:
                current = self.storage.get_versioned_document(key)
            except CorruptCheckpointError as error:
                if unlinked:
                    raise
                # a link (or a file) in place of the lease directory, never followed:
                # it holds no lease this job can read, so it is removed, once
                log.warning("Replacing what stands in place of %s/%s (%s)", url, LEASE_DIR, error)
                self.storage.delete([LEASE_DIR])
                unlinked = True
                continue
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
                log.info(  # after a crash this is the expected restart, not a problem
                    "Taking over the writer lease of node %r under %s from a job that is gone "
                    "(%s): it crashed or was killed; this job writes there now",
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

    @property
    def taken_over(self) -> frozenset[str]:
        """The nodes whose lease this job took over (not fresh, not cleanly released):
        their last holder may still be alive."""
        return frozenset(self._taken_over & set(self.generations))

    def record_resume(self, epoch: int | None, listed: Mapping[str, int] | None = None) -> None:
        """Record in each lease taken over that this generation writes the epochs after
        ``epoch`` (``None``: from scratch) and after ``listed[node]`` (the newest epoch
        with a record of that node a listing found since the takeover), before
        anything is saved: commit records of older generations for later epochs, which
        can only have been created after that listing, are then fenced out
        (:func:`~ckptstore.protocol.fenced_out`). Records listed before stay as they are."""
        listed = listed or {}
        with self._lock:
            for node in sorted(self.taken_over):
                after = max(-1 if epoch is None else epoch, listed.get(node, -1))
                fence = (self.generations[node], after)

                def add(holder: LeaseHolder, fence: tuple[int, int] = fence) -> LeaseHolder:
                    return replace(holder, fences=with_fence(holder.fences, fence))

                self._rewrite(node, add)
                self._resumed_after[node] = after
                self.fences[node] = with_fence(self.fences.get(node, ()), fence)

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
        for _ in range(ATTEMPTS):
            current = self.storage.get_versioned_document(key)
            holder = None
            if current is not None:
                try:
                    holder = LeaseHolder.decode(current[0], url=url, key=key)
                except CorruptCheckpointError as error:
                    self._lose(node, f"its lease is unreadable ({error})")
            reason = lost_reason(holder, self.token, generation, -1.0)
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
        LIVE_TOKENS.discard(self.token)
        with self._lock:
            held, self.generations = self.generations, {}
            for node, generation in sorted(held.items()):
                self.generations = {node: generation}
                try:
                    self._rewrite(node, lambda holder: replace(holder, state=RELEASED))
                except (LeaseLostError, StorageError, CorruptCheckpointError) as error:
                    log.debug("Not releasing the writer lease of %r: %s", node, error)
            self.generations = {}
