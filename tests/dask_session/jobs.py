"""Jobs, fault injectors and a path type for the DaskSession tests.

Everything here runs on Dask workers, so it lives in a module the workers can import
(``tests/`` is on ``sys.path``, which spawned worker processes inherit), not in the
test files themselves.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

import numpy as np
from caffe2_pipeline import build_pipeline
from distributed import Event, Worker, get_worker

from ckptstore import Job, Node, Session, Task, Workspace, epoch_limiter
from ckptstore._types import Buffer
from ckptstore.errors import StorageError
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin import hookimpl
from ckptstore.plugin._path_type import PathType

NODES = ("trainer_0", "trainer_1", "trainer_2")


def caffe2_job(kill_at: KillAt | None = None) -> Job:
    """The Caffe2 test job on trainer_0..2; ``kill_at`` adds a task that kills one
    node's worker process at the start of an epoch (once)."""
    with Job() as job:
        for node_id, node in enumerate(NODES):
            if kill_at is not None and kill_at.node == node:
                with Node(node):
                    Task(partial(kill_at_cursor, kill_at=kill_at), name=f"{node}/kill")
            build_pipeline(node_id)
    return job


@dataclass(frozen=True)
class KillAt:
    """Kill ``node``'s worker once, before it reads record ``cursor``. ``marker`` is a
    file created when the kill happens, so a re-run does not kill again."""

    node: str
    cursor: int
    marker: str
    test_pid: int = field(default_factory=os.getpid)  # the process never to kill


def kill_at_cursor(ws: Workspace, *, kill_at: KillAt) -> None:
    if int(ws[f"{kill_at.node}/cursor"]) == kill_at.cursor:
        kill_this_worker_once(kill_at.marker, kill_at.test_pid)


def kill_this_worker_once(marker: str, test_pid: int) -> None:
    """SIGKILL the worker process this runs in, the first time only."""
    if this_worker_address(test_pid) is None:
        raise RuntimeError("refusing to kill a process that is not a Dask worker")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def this_worker_address(test_pid: int) -> str | None:
    """The address of the Dask worker this process runs, or None in the test process
    (works from any thread, including I/O threads a task started)."""
    if os.getpid() == test_pid:
        return None
    try:
        return str(get_worker().address)
    except ValueError:
        running = list(Worker._instances)
        return str(running[0].address) if len(running) == 1 else None


def worker_address(ws: Workspace) -> str:
    return str(get_worker().address)


def meet(ws: Workspace, *, mine: str, others: Sequence[str]) -> bool:
    """Set this task's event, then wait for the others' (True if all arrived): only
    tasks that run at the same time can all meet."""
    Event(mine).set()
    return all(Event(name).wait(timeout=30) for name in others)


def clear_store(dask_worker: Any, store_name: str) -> list[str]:
    """Empty a session's workspace store on one worker (as a restart would)."""
    store = dask_worker.plugins[store_name]
    nodes: list[str] = store.nodes()
    store.teardown(dask_worker)
    return nodes


def has_store(dask_worker: Any, store_name: str) -> bool:
    return store_name in dask_worker.plugins


class FaultyLocalPath(LocalPath):
    """Local disk that misbehaves on chosen Dask workers.

    ``unreachable_from``: worker addresses whose writes fail with a StorageError (only
    for keys containing ``only_keys_containing`` when set). ``kill_on_key`` and
    ``kill_marker``: the worker writing a key containing ``kill_on_key`` dies (once).
    """

    name = "faulty_local"
    protocols = ()

    def __init__(
        self,
        url: str,
        *,
        unreachable_from: Collection[str] = (),
        only_keys_containing: str | None = None,
        kill_on_key: str | None = None,
        kill_marker: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.unreachable_from = frozenset(unreachable_from)
        self.only_keys_containing = only_keys_containing
        self.kill_on_key = kill_on_key
        self.kill_marker = kill_marker
        self.test_pid = os.getpid()  # opened by the test process, then shipped to workers

    def _before_write(self, key: str) -> None:
        worker = this_worker_address(self.test_pid)
        if worker is None:
            return  # the test process (the driver's commit records): always reachable
        if self.kill_on_key is not None and self.kill_on_key in key:
            assert self.kill_marker is not None
            kill_this_worker_once(self.kill_marker, self.test_pid)
        if worker not in self.unreachable_from:
            return
        if self.only_keys_containing is None or self.only_keys_containing in key:
            raise StorageError(
                self.display_url, key, "write", PermissionError("storage unreachable")
            )

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        self._before_write(key)
        super().write_parts(key, parts)

    def open_write(self, key: str) -> IO[bytes]:
        self._before_write(key)
        return super().open_write(key)


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [FaultyLocalPath]


def totals(session: Session) -> list[int]:
    """Each node's running total in ``session``."""
    return [int(session.fetch_blob(node, f"{node}/total")[0]) for node in NODES]


def state_job(values: int, epochs: int) -> Job:
    """Each node of :data:`NODES` holds ``{node}/w``: ``values`` float64s, equal to
    :func:`expected_state` after each epoch; the job stops after ``epochs``."""
    with Job() as job:
        for node_id, node in enumerate(NODES):
            with Node(node):
                with job.init_group:
                    Task(partial(fill_state, node=node, values=values, node_id=node_id))
                Task(partial(step_state, node=node))
        with Node(NODES[0]):
            epoch_limiter(job, epochs)
    return job


def expected_state(node: str, values: int, epoch: int) -> np.ndarray:
    return np.arange(values, dtype=np.float64) + 1000 * NODES.index(node) + epoch


def fill_state(ws: Workspace, *, node: str, values: int, node_id: int) -> None:
    ws[f"{node}/w"] = expected_state(node, values, 0)


def step_state(ws: Workspace, *, node: str) -> None:
    ws[f"{node}/w"] += 1


def kept_in_place(ws: Workspace, *, name: str) -> bool:
    """Whether blob ``name`` is a view of memory no array of its own owns (the received
    bytes of a peer replica), not an array a load allocated and filled."""
    array = ws[name]
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base is not None
