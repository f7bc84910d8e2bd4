"""The worker side of a DaskSession: node workspaces kept in worker memory, and the
function that runs a node's tasks against its workspace.

Each session registers one :class:`WorkspaceStore` worker plugin (named after the
session), so a worker holds the workspaces of the nodes placed on it until the session
closes (unregistering the plugin frees them). A worker that restarted comes back with
an empty store: asking it for a node that should exist raises
:class:`~ckptstore.errors.NodeLostError` instead of handing out a fresh workspace.

Task functions travel pre-pickled (:func:`encode`, Dask's own pickling) and are
unpickled inside :func:`run_node_calls`: a worker that cannot import a task's code
then reports an error for that node, instead of Dask dropping the worker's connection.

Example::

    >>> from distributed import Client, LocalCluster
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> address, = client.nthreads()
    >>> _ = client.register_plugin(WorkspaceStore(), name="session-1")
    >>> calls = [NodeCall.of(Task(lambda ws: ws.update(w=41), name="init", node="trainer_0")),
    ...          NodeCall.of(Task(lambda ws: int(ws["w"]) + 1, name="step", node="trainer_0"))]
    >>> future = client.submit(run_node_calls, "session-1", "trainer_0", encode(calls),
    ...                        WorkspaceType.GLOBAL, False, workers=[address],
    ...                        allow_other_workers=False, pure=False)
    >>> report = decode(future.result())  # a NodeReport
    >>> [outcome.result for outcome in report.outcomes], report.node_error
    ([None, 42], None)
    >>> client.close(); cluster.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distributed import Worker, WorkerPlugin, get_worker
from distributed.protocol import pickle as dask_pickle

from ckptstore.checkpoint import PEER_COPIES
from ckptstore.dask_session._peers import WorkerPeerCopies
from ckptstore.dask_session._shipping import ShippedError
from ckptstore.errors import NodeLostError
from ckptstore.execution import Task, TaskFn, Workspace, WorkspaceType

__all__ = [
    "NodeCall",
    "NodeReport",
    "RemoteOutcome",
    "WorkspaceStore",
    "decode",
    "encode",
    "run_node_calls",
]


def encode(value: Any) -> bytes:
    """``value`` pickled the way Dask pickles tasks (pickle, else cloudpickle)."""
    data: bytes = dask_pickle.dumps(value)  # type: ignore[no-untyped-call]
    return data


def decode(data: bytes) -> Any:
    """The value :func:`encode` pickled."""
    return dask_pickle.loads(data)  # type: ignore[no-untyped-call]


class WorkspaceStore(WorkerPlugin):
    """One session's node workspaces in one worker's memory.

    Example::

        >>> from distributed import Client, LocalCluster
        >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
        >>> client = Client(cluster)
        >>> address, = client.nthreads()
        >>> _ = client.register_plugin(WorkspaceStore(), name="session-1")
        >>> def on_the_worker():
        ...     store = get_worker().plugins["session-1"]
        ...     store.workspace("trainer_0", expect_existing=False)["w"] = np.ones(2)
        ...     try:  # a node this worker should hold but does not (it restarted)
        ...         store.workspace("trainer_1", expect_existing=True)
        ...     except NodeLostError as error:
        ...         return store.nodes(), error.node
        >>> client.submit(on_the_worker, workers=[address], pure=False).result()
        (['trainer_0'], 'trainer_1')
        >>> client.close(); cluster.close()
    """

    def __init__(self, peer_copies: bool = False) -> None:
        self._workspaces: dict[str, Workspace] = {}
        self.address = ""
        self.peer_copies = peer_copies
        self.peers: WorkerPeerCopies | None = None
        """This worker's side of the session's peer replicas (``peer_copies``)."""

    def setup(self, worker: Worker) -> None:
        self._workspaces = {}
        self.address = worker.address
        self.peers = WorkerPeerCopies() if self.peer_copies else None

    def teardown(self, worker: Worker) -> None:
        self._workspaces.clear()
        if self.peers is not None:
            self.peers.clear()

    def nodes(self) -> list[str]:
        """The nodes whose workspace this worker holds."""
        return list(self._workspaces)

    def workspace(self, node: str, *, expect_existing: bool) -> Workspace:
        """``node``'s workspace; created empty on first use, never re-created."""
        workspace = self._workspaces.get(node)
        if workspace is not None:
            return workspace
        if expect_existing:
            raise NodeLostError(
                node, self.address, "this worker no longer holds it (the worker restarted)"
            )
        workspace = self._workspaces[node] = Workspace()
        return workspace


@dataclass(frozen=True)
class NodeCall:
    """What a worker needs to run one task: its function, name, node and outputs.

    Tasks themselves do not travel (they reference their group and session); the
    worker rebuilds a detached :class:`~ckptstore.execution._task.Task` from this and runs it.

    Example::

        >>> workspace = Workspace()
        >>> task = Task(lambda ws: ws.update(w=np.ones(2)), name="init", node="trainer_0")
        >>> NodeCall.of(task).run(workspace, WorkspaceType.GLOBAL)  # as a worker runs it
        >>> workspace["w"]
        array([1., 1.])
    """

    fn: TaskFn | None
    name: str
    node: str
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, task: Task) -> NodeCall:
        return cls(task.fn, task.name, task.node, task.output_names())

    def run(self, workspace: Workspace, workspace_type: WorkspaceType) -> Any:
        task = Task(self.fn, outputs=self.outputs, name=self.name, node=self.node)
        return task.execute(workspace, workspace_type)


@dataclass(frozen=True)
class RemoteOutcome:
    """One task's result, or its packed exception."""

    result: Any = None
    error: ShippedError | None = None


@dataclass(frozen=True)
class NodeReport:
    """What running a node's tasks produced: one outcome per task, or a packed error
    that prevented running any of them (such as a lost workspace)."""

    outcomes: tuple[RemoteOutcome, ...] = ()
    node_error: ShippedError | None = None


def run_node_calls(
    store_name: str,
    node: str,
    calls: bytes,
    workspace_type: WorkspaceType,
    expect_existing: bool,
) -> bytes:
    """Run the encoded list of :class:`NodeCall` one after another against ``node``'s
    workspace on this worker; returns an encoded :class:`NodeReport`.

    Nothing raises out of here: tasks' exceptions come back packed (a failing task
    does not stop the next ones, as in a local session), and so do a lost workspace or
    task code this worker cannot unpickle (which, left to Dask, would break the
    worker's connection to the scheduler).
    """
    worker = get_worker()
    where = f"ran on Dask worker {worker.address} for node {node!r}"
    try:
        store = worker.plugins.get(store_name)
        if not isinstance(store, WorkspaceStore):
            raise NodeLostError(
                node, worker.address, "this worker holds no workspaces for the session"
            )
        workspace = store.workspace(node, expect_existing=expect_existing)
        node_calls: list[NodeCall] = decode(calls)
    except Exception as error:
        return encode(NodeReport(node_error=ShippedError.pack(error, where)))
    outcomes = []
    peers = PEER_COPIES.set(store.peers)
    try:
        for call in node_calls:
            try:
                outcomes.append(RemoteOutcome(call.run(workspace, workspace_type)))
            except Exception as error:
                outcomes.append(RemoteOutcome(error=ShippedError.pack(error, where)))
    finally:
        PEER_COPIES.reset(peers)
    try:
        return encode(NodeReport(tuple(outcomes)))
    except Exception:
        pairs = zip(outcomes, node_calls, strict=True)
        return encode(NodeReport(tuple(_sendable(outcome, call, where) for outcome, call in pairs)))


def _sendable(outcome: RemoteOutcome, call: NodeCall, where: str) -> RemoteOutcome:
    """``outcome``, or an error outcome if its result cannot be pickled."""
    try:
        encode(outcome.result)
    except Exception as error:
        problem = TypeError(
            f"the result of task {call.name!r} cannot be sent back to the client "
            f"({type(error).__name__}: {error}); return picklable values, or keep "
            "the data in the workspace and fetch it as an output"
        )
        return RemoteOutcome(error=ShippedError.pack(problem, where))
    return outcome
