"""Peer replicas: after each commit, a copy of every node's newest committed checkpoint
in the memory of ``k`` other workers, for a restart after a lost worker to restore
from instead of the checkpoint root.

After the client committed an epoch, each node's worker reads its just-committed
checkpoint back through the commit protocol (:func:`capture_replica`, after dropping
the node's older replicas); Dask moves that copy to each of the ``k`` peers, where
:func:`keep_replica` scatters it from the peer itself (held there only, with no task
Dask could recompute it from), in pieces, one key each (each large blob's bytes in a
piece of its own, the rest in pieces no larger than a frame of Dask's comm), and
publishes them as a Dask dataset named after the root, the node and the
copy's number, so it outlives the session and the client that made it. Keys of each
peer's own, not keys replicated ``k`` times: Dask's active memory manager drops extra
replicas of a key, never a key a dataset holds.

A restore on any worker (:class:`WorkerPeerCopies`, used by the node tasks through
:mod:`ckptstore.checkpoint._peer_copies`) starts receiving the pieces of a surviving
peer's copy, two at a time, each in one frame (:mod:`._piece_transfer`), while it
reads the root's commit record of the node and epoch (one small GET): no record, no
replica. It reads the copy through the commit protocol's checks, each piece as soon
as it arrives (a read waits only for the pieces it needs), so checking and placing the
bytes overlaps their transfer. A missing or refused copy means a read from the root,
as without replicas.

Example::

    >>> peer_order(["tcp://a:1", "tcp://b:1", "tcp://c:1"], "tcp://b:1")
    ['tcp://c:1', 'tcp://a:1']
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, Future, get_client, get_worker, wait

from ckptstore import protocol
from ckptstore.dask_session._piece_transfer import PieceArrivals, frame_limit, serve_pieces
from ckptstore.dask_session._replica_pieces import ReplicaLayout, replica_pieces
from ckptstore.dask_session._replica_storage import (
    ArrivingPiece,
    NodeReplica,
    Piece,
    ReplicaPath,
    capture_node,
)
from ckptstore.errors import JobConfigurationError
from ckptstore.plugin import PathType
from ckptstore.protocol import CheckpointLocation
from ckptstore.records import NodeStats

__all__ = [
    "DATASET_PREFIX",
    "PeerReplicas",
    "ShippedReplica",
    "WorkerPeerCopies",
    "capture_replica",
    "keep_replica",
    "peer_order",
    "replica_dataset",
]

log = logging.getLogger(__name__)

DATASET_PREFIX = "ckptstore-peer-replica/"
FETCH_TIMEOUT = 600.0
"""Seconds a restore waits for a piece of a replica from a peer before reading the root."""


def replica_dataset(root: str, node: str) -> str:
    """The prefix of the Dask datasets holding the newest replicas of ``node`` under
    ``root`` (one per peer: the prefix and the copy's number)."""
    digest = hashlib.sha256(root.encode()).hexdigest()[:16]
    return f"{DATASET_PREFIX}{digest}/{node}/"  # node names hold no "/"


def peer_order(workers: Sequence[str], writer: str) -> list[str]:
    """The workers other than ``writer``, starting after it in sorted order (so the
    nodes' replicas spread evenly: with N nodes on N workers, each holds k copies)."""
    ring = sorted(workers)
    if writer not in ring:
        return ring
    start = ring.index(writer)
    return ring[start + 1 :] + ring[:start]


@dataclass(frozen=True)
class ShippedReplica:
    """Where a node's replica of ``epoch`` went, and its size in bytes."""

    node: str
    epoch: int
    peers: tuple[str, ...]
    nbytes: int


class WorkerPeerCopies:
    """One worker's side of a session's peer replicas: where its nodes saved (to ship
    their copy after the commit), and the replicas fetched for a restore."""

    def __init__(self) -> None:
        self._saved: dict[str, CheckpointLocation] = {}
        self._fetched: dict[tuple[str, str, int], ReplicaPath] = {}
        self.restored: list[tuple[str, int]] = []
        """``(node, epoch)`` of every checkpoint restored from a peer replica here."""

    def saved(self, location: CheckpointLocation, node: str, epoch: int) -> None:
        self._saved[node] = location

    def location_of(self, node: str) -> CheckpointLocation | None:
        return self._saved.get(node)

    def storage_for(self, location: CheckpointLocation, node: str, epoch: int) -> PathType | None:
        root = location.storage.display_url
        cached = self._fetched.get((root, node, epoch))
        if cached is not None:
            return cached
        try:
            names = _published(get_client(), replica_dataset(root, node))
        except Exception as error:  # the scheduler cannot be asked: read the root
            log.warning("Could not look up a peer replica of node %r: %s", node, error)
            return None
        if not names:
            return None  # no replica: the load reads the root, with no request more
        storage = ReplicaPath(NodeReplica(root, node, epoch, {}), location.storage)
        with ThreadPoolExecutor(1, thread_name_prefix="ckptstore-commit-record") as pool:
            # the root's commit record is read while the replica travels
            committed = pool.submit(protocol.committed_nodes, storage, epoch, [node])
            try:
                fetched = _fetch(names, node, epoch)
            except Exception as error:  # the scheduler cannot be asked: read the root
                log.warning("Could not fetch a peer replica of node %r: %s", node, error)
                fetched = None
            if node not in committed.result():
                if fetched is not None:
                    fetched[0].cancel()
                return None  # a replica never counts as committed on its own
        if fetched is None:
            return None
        _, files, received = fetched
        storage.files = files
        storage.lends = received  # a copy of its own: the load keeps it as the blobs
        self._fetched[(root, node, epoch)] = storage
        return storage

    def done(self, location: CheckpointLocation, node: str, epoch: int, *, used: bool) -> None:
        self._fetched.pop((location.storage.display_url, node, epoch), None)
        if used:
            self.restored.append((node, epoch))
            log.info("Restored node %r's checkpoint of epoch %d from a peer replica", node, epoch)

    def clear(self) -> None:
        self._saved.clear()
        self._fetched.clear()


def _arriving(
    url: str, key: str, nbytes: int, arrival: ConcurrentFuture[Any], future: Future[Any]
) -> ArrivingPiece:
    """A piece on its way, given up on as soon as Dask says its key is gone (its peer
    left: Dask cannot recompute scattered data, and a fetch of it would wait)."""

    def lost() -> bool:
        return future.status in ("lost", "cancelled", "error")

    return ArrivingPiece(url, key, nbytes, arrival, FETCH_TIMEOUT, lost)


def _fetch(
    names: Sequence[str], node: str, epoch: int
) -> tuple[PieceArrivals, dict[str, tuple[Piece, ...]], bool] | None:
    """Start receiving a replica of ``node``'s ``epoch`` among the datasets ``names``
    that a surviving peer still holds: the pieces on their way, the objects made of
    them, and whether they come from another worker (a copy of this restore's own, not
    the one this worker keeps); ``None`` if there is none (the caller reads the root)."""
    client = get_client()
    for name in names:
        held = client.get_dataset(name, default=None)
        if not isinstance(held, tuple) or len(held) != 3 or held[0] != epoch:
            continue
        layout, futures = held[1], list(held[2])
        if (
            not isinstance(layout, ReplicaLayout)
            or (layout.node, layout.epoch) != (node, epoch)
            or len(futures) != layout.count
            or not layout.valid()
        ):
            continue
        holders = client.who_has(futures)  # type: ignore[no-untyped-call]
        if not all(holders.get(future.key) for future in futures):
            continue  # its peer left: the scheduler lost it (a fetch would wait forever)
        worker = get_worker()
        here = worker.address
        sources = [
            (here if here in holders[future.key] else holders[future.key][0], future.key)
            for future in futures
        ]
        arrivals = PieceArrivals(worker, sources)
        url = f"peer replica of {node}.{epoch}"
        owners = layout.owners()
        pieces = [
            _arriving(url, owners.get(index, ""), nbytes, arrival, future)
            for index, (nbytes, arrival, future) in enumerate(
                zip(layout.pieces, arrivals.pieces, futures, strict=True)
            )
        ]
        files: dict[str, tuple[Piece, ...]] = dict(layout.objects(pieces))
        received = all(here not in holders[future.key] for future in futures)
        return arrivals, files, received
    return None


def capture_replica(store_name: str, node: str, epoch: int, *earlier: object) -> NodeReplica:
    """On the worker that saved ``node``: its committed checkpoint of ``epoch``, read
    back through the commit protocol, as this task's result (which Dask then moves to
    the peers). The node's older replicas are dropped first, so no worker holds two
    epochs of one node. ``earlier``: the node's earlier shipment, which runs first."""
    store = get_worker().plugins.get(store_name)
    copies = getattr(store, "peers", None)
    location = copies.location_of(node) if isinstance(copies, WorkerPeerCopies) else None
    if location is None:
        raise JobConfigurationError(
            f"worker {get_worker().address} has no record of node {node!r}'s save of epoch "
            f"{epoch}; its peer replica cannot be made"
        )
    client = get_client()
    for name in _published(client, replica_dataset(location.storage.display_url, node)):
        with contextlib.suppress(KeyError):
            client.unpublish_dataset(name)
    return capture_node(location, node, epoch)


def keep_replica(replica: NodeReplica, index: int) -> int:
    """On a peer: keep ``replica`` in this worker's memory (scattered from here, so it
    is held on this worker only, and has no task Dask could recompute from the root)
    and publish it as copy ``index`` of its node; returns its size. Each piece of it is
    a key of its own (a large blob's bytes, or other bytes up to this worker's comm
    frame), so a restore receives them one message at a time, each in one frame, and
    checks each one while the next travels."""
    client = get_client()
    serve_pieces(get_worker())
    layout, pieces = replica_pieces(replica, frame_limit())
    held = client.scatter(pieces, hash=False)  # type: ignore[no-untyped-call]
    name = f"{replica_dataset(replica.root, replica.node)}{index}"
    client.publish_dataset((replica.epoch, layout, held), name=name, override=True)
    return replica.nbytes


def _published(client: Client, prefix: str) -> list[str]:
    """The names of the datasets published under ``prefix``, sorted."""
    names = client.list_datasets()  # type: ignore[no-untyped-call]
    return sorted(str(name) for name in names if str(name).startswith(prefix))


@dataclass
class _Shipment:
    """One node's replica on its way: the tasks still running (released as each one
    ends, so no finished task is kept that Dask could recompute, from the root, after a
    worker it ran on left), the sizes they reported, the first error."""

    node: str
    epoch: int
    workers: frozenset[str]
    peers: tuple[str, ...]
    running: list[Future[Any]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def settle(self, future: Future[Any]) -> None:
        """Record ``future``'s outcome and let go of it (a Dask done-callback)."""
        with self.lock:
            if future not in self.running:
                return
            self.running.remove(future)
            if future.status == "finished":
                self.sizes.append(int(future.result()))
            elif self.error is None:
                try:
                    self.error = future.exception() or RuntimeError(future.status)  # type: ignore[no-untyped-call]
                except Exception as error:  # cancelled
                    self.error = error

    def result(self) -> ShippedReplica:
        if self.error is not None:
            raise self.error
        return ShippedReplica(self.node, self.epoch, self.peers, max(self.sizes, default=0))


@dataclass
class PeerReplicas:
    """The client's side: which workers receive each node's replica after a commit,
    within ``memory_limit`` bytes of replicas per worker (``None``: no limit)."""

    client: Client
    copies: int
    memory_limit: int | None = None
    _held: dict[str, dict[str, int]] = field(default_factory=dict)
    _shipments: dict[str, _Shipment] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.copies < 0:
            raise JobConfigurationError(f"peer_replicas must be >= 0, got {self.copies}")
        if self.memory_limit is not None and self.memory_limit < 0:
            raise JobConfigurationError(
                f"peer_memory_limit must be >= 0 bytes, got {self.memory_limit}"
            )

    @staticmethod
    def committed(results: Iterable[object]) -> list[NodeStats]:
        """The node saves among a group's results (their epoch is committed: the group
        ran its commit before returning them)."""
        return [
            stats
            for stats in results
            if isinstance(stats, NodeStats)
            and stats.action == "checkpoint_save"
            and stats.commit is not None
        ]

    def ship(
        self,
        store_name: str,
        saves: Sequence[NodeStats],
        writers: Mapping[str, str],
        live: Sequence[str],
    ) -> None:
        """Start shipping each saved node's replica from its writer to its peers (in
        the background: training goes on)."""
        alive = set(live)
        for worker in [worker for worker in self._held if worker not in alive]:
            del self._held[worker]
        for stats in saves:
            for held in self._held.values():
                held.pop(stats.node, None)
            writer = writers[stats.node]
            peers = self._choose(stats, writer, live)
            if peers:
                self._start(store_name, stats, writer, peers, alive)

    def _choose(self, stats: NodeStats, writer: str, live: Sequence[str]) -> list[str]:
        """The first ``copies`` workers after ``writer`` with room for the replica."""
        size = stats.stored_bytes
        peers = [
            worker
            for worker in peer_order(live, writer)
            if self.memory_limit is None
            or sum(self._held.get(worker, {}).values()) + size <= self.memory_limit
        ][: self.copies]
        if len(peers) < self.copies:
            log.warning(
                "Node %r's epoch %d has %d peer replica(s), not %d: too few other workers%s",
                stats.node,
                stats.epoch,
                len(peers),
                self.copies,
                "" if self.memory_limit is None else " with room under peer_memory_limit",
            )
        for worker in peers:
            self._held.setdefault(worker, {})[stats.node] = size
        return peers

    def _start(
        self,
        store_name: str,
        stats: NodeStats,
        writer: str,
        peers: Sequence[str],
        alive: set[str],
    ) -> None:
        """Submit the capture on ``writer`` and a keep on each peer; the capture waits
        for the node's previous shipment unless a worker of it left (its tasks then
        never run: they are cancelled)."""
        earlier = self._shipments.get(stats.node)
        after: list[Future[Any]] = []
        if earlier is not None:
            with earlier.lock:
                running = list(earlier.running)
            if earlier.workers <= alive:
                after = running
            elif running:
                self.client.cancel(running)  # type: ignore[no-untyped-call]
        captured = self.client.submit(
            capture_replica,
            store_name,
            stats.node,
            stats.epoch,
            *after,
            workers=[writer],
            allow_other_workers=False,
            pure=False,
        )
        shipment = _Shipment(stats.node, stats.epoch, frozenset([writer, *peers]), tuple(peers))
        for index, peer in enumerate(peers):
            keep = self.client.submit(
                keep_replica,
                captured,
                index,
                workers=[peer],
                allow_other_workers=False,
                pure=False,
            )
            shipment.running.append(keep)
        self._shipments[stats.node] = shipment
        for keep in list(shipment.running):
            keep.add_done_callback(shipment.settle)  # type: ignore[no-untyped-call]

    def wait(self, timeout: float | None = None) -> dict[str, ShippedReplica]:
        """Wait for the shipments started so far; the newest one of each node. Raises
        the error of a shipment that failed."""
        shipments = dict(self._shipments)
        running = []
        for shipment in shipments.values():
            with shipment.lock:
                running.extend(shipment.running)
        wait(running, timeout=timeout)  # type: ignore[no-untyped-call]
        for future in running:  # before their callbacks, which may not have run yet
            for shipment in shipments.values():
                shipment.settle(future)
        return {node: shipment.result() for node, shipment in shipments.items()}

    def drop_all(self) -> None:
        """Unpublish every peer replica on the cluster (their memory is freed)."""
        for name in _published(self.client, DATASET_PREFIX):
            with contextlib.suppress(KeyError):
                self.client.unpublish_dataset(name)
        self._held.clear()
