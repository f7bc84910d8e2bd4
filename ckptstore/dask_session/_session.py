"""DaskSession: a session whose nodes are Dask workers.

Example::

    >>> from distributed import Client, LocalCluster
    >>> from ckptstore import Job, JobRunner, MultiNodeCheckpointManager, Node, Task, epoch_limiter
    >>> from ckptstore.dask_session import DaskSession
    >>> with Job() as job:
    ...     for name in ("trainer_0", "trainer_1"):
    ...         with Node(name), job.init_group:
    ...             _ = Task(lambda ws, n=name: ws.update({f"{n}/total": np.array([100])}))
    ...     with Node("trainer_0"):
    ...         done = epoch_limiter(job, 2)
    >>> manager = MultiNodeCheckpointManager("ckpt", metadata_handler="json")  # or "s3://bucket/run"
    >>> cluster = LocalCluster(n_workers=2, processes=False, dashboard_address=":0")
    >>> with Client(cluster) as client, DaskSession(client) as session:
    ...     JobRunner(job, manager).train(session)
    2
    >>> cluster.close()
"""

from __future__ import annotations

import itertools
import logging
import operator
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from distributed import Client

from ckptstore.checkpoint import list_blob_names
from ckptstore.dask_session._peers import PeerReplicas, ShippedReplica
from ckptstore.dask_session._placement import NodePlacement
from ckptstore.dask_session._remote import (
    NodeCall,
    NodeReport,
    WorkspaceStore,
    decode,
    encode,
    run_node_calls,
)
from ckptstore.dask_session._watch import await_nodes
from ckptstore.errors import JobConfigurationError, NodeLostError
from ckptstore.execution import Runnable, Session, TaskGroup, TaskOutcome, WorkspaceType

__all__ = ["DaskSession"]

log = logging.getLogger(__name__)


class DaskSession(Session):
    """Runs each node's tasks on one Dask worker, where the node's workspace lives.

    ``node_to_worker`` pins nodes to workers (by address or worker name); other nodes
    are spread over the live workers in the order they are first used (see
    :mod:`ckptstore.dask_session._placement`). Several nodes may share a worker; each
    keeps its own workspace. A group's tasks run concurrently across nodes and in
    order within a node. Task functions and results travel with Dask's serialization;
    blob outputs are fetched from the worker on :meth:`TaskOutput.fetch`.

    A node whose worker died is never given a fresh workspace: the run fails with
    :class:`~ckptstore.errors.NodeLostError` naming it. Re-run the job in a new session
    and it resumes from the last epoch committed on all nodes. ``close()`` frees the
    workspaces on every worker; the client stays open.

    ``peer_replicas=k`` keeps a copy of each node's newest committed checkpoint in the
    memory of ``k`` other workers (at most ``peer_memory_limit`` bytes of copies per
    worker), so a re-run after a lost worker restores its nodes from a surviving copy,
    checked against the root's commit record, instead of from the root (see
    :mod:`ckptstore.dask_session._peers`).

    Example::

        >>> from distributed import Client, LocalCluster
        >>> from ckptstore import Job, JobRunner, MultiNodeCheckpointManager
        >>> from ckptstore import Node, Task, epoch_limiter
        >>> from ckptstore.dask_session import DaskSession
        >>> with Job() as job:
        ...     for name in ("trainer_0", "trainer_1"):
        ...         with Node(name), job.init_group:
        ...             _ = Task(lambda ws, n=name: ws.update({f"{n}/total": np.array([100])}))
        ...     with Node("trainer_0"):
        ...         done = epoch_limiter(job, 2)
        >>> manager = MultiNodeCheckpointManager("ckpt", metadata_handler="json")  # or "s3://bucket/run"
        >>> cluster = LocalCluster(n_workers=2, processes=False, dashboard_address=":0")
        >>> with Client(cluster) as client, DaskSession(client) as session:
        ...     last = JobRunner(job, manager).train(session)
        ...     session.fetch_blob("trainer_0", "trainer_0/total")
        array([100])
        >>> cluster.close()
    """

    def __init__(
        self,
        client: Client,
        node_to_worker: Mapping[str, str] | None = None,
        *,
        liveness_interval: float = 0.5,
        peer_replicas: int = 0,
        peer_memory_limit: int | None = None,
    ) -> None:
        if client.asynchronous:
            raise JobConfigurationError(
                "DaskSession needs a synchronous distributed.Client (created without "
                "asynchronous=True); JobRunner drives it from ordinary blocking code"
            )
        if liveness_interval <= 0:
            raise JobConfigurationError(
                f"liveness_interval must be > 0 seconds, got {liveness_interval}"
            )
        self.client = client
        self.session_id = uuid.uuid4().hex[:12]
        self.liveness_interval = liveness_interval
        self._store_name = f"ckptstore-workspaces-{self.session_id}"
        self._placement = NodePlacement(node_to_worker)
        self._started: set[str] = set()
        self._lost: dict[str, NodeLostError] = {}
        self._keys = itertools.count()
        self._closed = False
        self._peers = (
            PeerReplicas(client, peer_replicas, peer_memory_limit) if peer_replicas else None
        )
        client.register_plugin(WorkspaceStore(peer_replicas > 0), name=self._store_name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"nodes={self._placement.pinned()}"
        return f"{type(self).__name__}({self.session_id}, {state})"

    # -- placement --------------------------------------------------------------------

    def worker_of(self, node: str) -> str:
        """The address of the worker holding ``node``'s workspace (placing it now if it
        has not been used yet)."""
        self._check_open()
        return self._place(node)

    def node_to_worker(self) -> dict[str, str]:
        """``{node: worker address}`` for every node placed so far."""
        return self._placement.pinned()

    def nodes(self) -> list[str]:
        """Nodes that have a workspace on a live worker in this session."""
        return [
            node
            for node in self._placement.pinned()
            if node in self._started and node not in self._lost
        ]

    def lost_nodes(self) -> list[str]:
        """Nodes whose workspace was lost with their worker."""
        return list(self._lost)

    # -- peer replicas ----------------------------------------------------------------

    def wait_for_peer_replicas(self, timeout: float | None = None) -> dict[str, ShippedReplica]:
        """Wait until the peer replicas of the epochs committed so far are in place;
        ``{node: where its newest replica went}`` (empty without ``peer_replicas``).
        Raises the error of a shipment that failed."""
        return {} if self._peers is None else self._peers.wait(timeout)

    def restored_from_peers(self) -> list[tuple[str, int]]:
        """``(node, epoch)`` of every checkpoint this session restored from a peer
        replica instead of the checkpoint root."""
        if self._peers is None:
            return []
        store = self._store_name

        def restored(dask_worker: Any) -> list[tuple[str, int]]:
            peers = getattr(dask_worker.plugins.get(store), "peers", None)
            return list(peers.restored) if peers is not None else []

        found = self.client.run(restored)
        return sorted(entry for entries in found.values() for entry in entries)

    def drop_peer_replicas(self) -> None:
        """Free every peer replica held on the cluster. They otherwise outlive the
        session (a restart after a lost worker restores from them) until a newer
        epoch of the same node replaces them."""
        PeerReplicas(self.client, 0).drop_all()

    # -- Session ----------------------------------------------------------------------

    def run(self, runnable: Runnable) -> list[object]:
        """:meth:`Session.run`; with ``peer_replicas``, the nodes whose save it
        committed then ship their copies to their peers, in the background."""
        results = super().run(runnable)
        if self._peers is not None:
            saves = self._peers.committed(results)
            if saves:
                writers = {stats.node: self._placement.pinned()[stats.node] for stats in saves}
                self._peers.ship(self._store_name, saves, writers, list(self._live_workers()))
        return results

    def _execute(self, group: TaskGroup) -> list[TaskOutcome]:
        workspace_type = group.workspace_type() or WorkspaceType.GLOBAL
        tasks = group.tasks()
        calls: dict[str, list[NodeCall]] = {}
        for task in tasks:
            calls.setdefault(task.node, []).append(NodeCall.of(task))
        by_node = {
            node: iter(outcomes)
            for node, outcomes in self._run_on_nodes(calls, workspace_type).items()
        }
        return [next(by_node[task.node]) for task in tasks]

    def fetch_blob(self, node: str, name: str) -> np.ndarray:
        """The current value of blob ``name`` in ``node``'s workspace, copied here."""
        blob: np.ndarray = self._call(
            node, NodeCall(operator.itemgetter(name), f"fetch {name}", node, ())
        )
        return blob

    def blob_names(self, node: str) -> list[str]:
        """The names of the blobs in ``node``'s workspace, sorted."""
        names: list[str] = self._call(node, NodeCall(list_blob_names, "blob_names", node, ()))
        return names

    def close(self) -> None:
        """Free every node's workspace on the workers (the client stays open)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.unregister_worker_plugin(self._store_name)  # type: ignore[no-untyped-call]
        except Exception as error:  # a closed client or scheduler: workers hold nothing
            log.warning("could not free the workspaces of %r: %s", self, error)

    # -- internals --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JobConfigurationError(
                "this DaskSession is closed and holds no workspaces; create a new one"
            )

    def _live_workers(self) -> dict[str, str]:
        """The workers the scheduler knows now, by address: asked of the scheduler, not
        read from ``client.scheduler_info()``, whose cache the client's periodic refresh
        (totals only, no workers) can overwrite between that method's fetch and its
        return: a cluster of live workers then looked empty (seen in a test run)."""
        scheduler = self.client.scheduler
        if scheduler is None:
            raise JobConfigurationError(
                "the Dask client is not connected to a scheduler: create it with the "
                "scheduler's address (or a cluster) before the DaskSession"
            )
        info = self.client.sync(scheduler.identity, n_workers=-1)  # type: ignore[no-untyped-call]
        return {address: str(worker["name"]) for address, worker in info["workers"].items()}

    def _place(self, node: str) -> str:
        address = self._placement.worker_of(node)
        if address is not None and node in self._started:
            return address
        live = self._live_workers()
        if address is not None and address not in live:
            self._placement.unpin(node)  # never used: nothing was lost, place it again
        return self._placement.place(node, live)

    def _call(self, node: str, call: NodeCall) -> Any:
        outcome = self._run_on_nodes({node: [call]}, WorkspaceType.GLOBAL)[node][0]
        if outcome.error is not None:
            raise outcome.error
        return outcome.result

    def _run_on_nodes(
        self, calls: Mapping[str, Sequence[NodeCall]], workspace_type: WorkspaceType
    ) -> dict[str, list[TaskOutcome]]:
        """Run each node's calls on its worker, all nodes at once; outcomes per node."""
        self._check_open()
        settled: dict[str, Any] = {}
        payloads: dict[str, bytes] = {}
        for node, node_calls in calls.items():
            lost = self._lost.get(node)
            if lost is not None:
                settled[node] = NodeLostError(lost.node, lost.worker, lost.detail)
                continue
            try:
                payloads[node] = encode(list(node_calls))
            except Exception as error:  # a task function that cannot be pickled
                settled[node] = error
        workers = {node: self._place(node) for node in payloads}  # may raise: before any runs
        futures = {
            node: self.client.submit(
                run_node_calls,
                self._store_name,
                node,
                payload,
                workspace_type,
                node in self._started,
                key=f"ckptstore-{self.session_id}-{next(self._keys)}-{node}",
                workers=[workers[node]],
                allow_other_workers=False,
                pure=False,
            )
            for node, payload in payloads.items()
        }
        settled.update(await_nodes(self.client, futures, workers, self.liveness_interval))
        return {node: self._outcomes(node, settled[node], len(calls[node])) for node in calls}

    def _outcomes(self, node: str, settled: Any, count: int) -> list[TaskOutcome]:
        if isinstance(settled, bytes):
            self._started.add(node)  # the worker ran: the node's workspace exists there
            try:
                settled = decode(settled)
            except Exception as error:
                settled = error
        if isinstance(settled, NodeReport):
            if settled.node_error is None:
                return [
                    TaskOutcome(outcome.result)
                    if outcome.error is None
                    else TaskOutcome(error=outcome.error.unpack())
                    for outcome in settled.outcomes
                ]
            settled = settled.node_error.unpack()
        if not isinstance(settled, BaseException):
            settled = JobConfigurationError(
                f"the worker of node {node!r} returned {type(settled).__name__}, not a "
                "report: every worker must run the same ckptstore version as the client"
            )
        elif isinstance(settled, NodeLostError):
            self._lost[node] = settled
        elif not isinstance(settled, JobConfigurationError):
            settled.add_note(
                f"the tasks of node {node!r} could not travel to or from worker "
                f"{self._placement.worker_of(node)}: every worker needs the code the tasks "
                "call, and the same ckptstore and plugins as the client"
            )
        return [TaskOutcome(error=settled)] * count
