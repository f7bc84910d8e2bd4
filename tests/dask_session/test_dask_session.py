"""DaskSession on a real LocalCluster: where workspaces live, how groups run, what
comes back to the client, and what happens when a node's workspace is gone."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import uuid
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from dask_session.jobs import clear_store, has_store, meet, worker_address
from distributed import Client, LocalCluster

from ckptstore import Node, SaveFailedError, Task, TaskGroup, Workspace
from ckptstore.dask_session import DaskSession
from ckptstore.errors import BlobNotFoundError, JobConfigurationError, NodeLostError
from ckptstore.execution import WorkspaceType
from ckptstore.execution._task import TaskFn

NODES = ["trainer_0", "trainer_1", "trainer_2"]


def group_on(nodes: list[str], fn: TaskFn) -> TaskGroup:
    """A GLOBAL group running ``fn`` once on each of ``nodes``."""
    group = TaskGroup(WorkspaceType.GLOBAL)
    for node in nodes:
        with Node(node), group:
            Task(fn, name=f"{node}/task")
    return group


def test_nodes_spread_over_workers_and_tasks_run_there(
    session: DaskSession, workers: list[str]
) -> None:
    results = session.run(group_on(NODES, worker_address))
    assert sorted(results) == workers  # three nodes, three workers: one each
    assert results == [session.worker_of(node) for node in NODES]
    assert session.node_to_worker() == dict(zip(NODES, results, strict=True))


def test_a_workspace_lives_on_its_worker_between_runs(session: DaskSession) -> None:
    for node in NODES:
        with Node(node):
            session.run(Task(lambda ws, node=node: ws.update(w=np.array([len(node)]))))
    increment = group_on(NODES, lambda ws: ws["w"].__iadd__(10))
    session.run(increment)
    assert [session.fetch_blob(node, "w").tolist() for node in NODES] == [[19], [19], [19]]
    assert session.blob_names("trainer_0") == ["w"]
    assert sorted(session.nodes()) == NODES


def test_outputs_and_results_come_back_to_the_client(session: DaskSession) -> None:
    with Node("trainer_1"):
        task = Task(lambda ws: ws.update(x=np.arange(4)) or "done", outputs=["x"], name="produce")
    assert session.run(task) == ["done"]
    assert task.outputs()[0].fetch().tolist() == [0, 1, 2, 3]
    assert task.result().fetch() == "done"
    session.run(Task(lambda ws: ws["x"].__imul__(2), node="trainer_1"))
    assert task.outputs()[0].fetch().tolist() == [0, 2, 4, 6]  # read live, not a snapshot


def test_private_groups_drop_temporaries_and_keep_outputs(session: DaskSession) -> None:
    with Node("trainer_0"):
        session.run(Task(lambda ws: ws.update(kept=np.zeros(1))))
    group = TaskGroup(WorkspaceType.PRIVATE)
    with Node("trainer_0"), group:
        Task(lambda ws: ws.update(tmp=np.ones(1), out=np.ones(2), kept=np.ones(1)), outputs=["out"])
    session.run(group)
    assert session.blob_names("trainer_0") == ["kept", "out"]
    assert session.fetch_blob("trainer_0", "kept").tolist() == [1.0]


def test_a_nodes_tasks_run_in_order_and_nodes_run_concurrently(session: DaskSession) -> None:
    events = {node: f"ckptstore-test-{uuid.uuid4().hex}-{node}" for node in NODES}
    group = TaskGroup(WorkspaceType.GLOBAL)
    for node in NODES:
        others = [name for other, name in events.items() if other != node]
        with Node(node), group:
            Task(lambda ws: ws.update(step=np.array([1])), name=f"{node}/first")
            Task(lambda ws: ws["step"].__iadd__(1), name=f"{node}/second")
            Task(partial(meet, mine=events[node], others=others), name=f"{node}/meet")
    results = session.run(group)
    assert results[2::3] == [True, True, True]  # every node met the others mid-group
    assert [session.fetch_blob(node, "step").tolist() for node in NODES] == [[2], [2], [2]]


def test_a_failing_task_fails_the_run_and_the_others_still_run(session: DaskSession) -> None:
    def boom(ws: Workspace) -> None:
        raise ValueError("bad batch")

    group = TaskGroup(WorkspaceType.GLOBAL)
    with group:
        with Node("trainer_0"):
            Task(lambda ws: ws.update(ran=np.array(True)), name="fine")
        with Node("trainer_1"):
            Task(boom, name="boom")
    with pytest.raises(ValueError, match="bad batch") as failure:
        session.run(group)
    notes = "\n".join(failure.value.__notes__)
    assert "task 'boom' on node 'trainer_1'" in notes
    assert f"Dask worker {session.worker_of('trainer_1')}" in notes
    assert bool(session.fetch_blob("trainer_0", "ran"))


def test_errors_keep_their_class_and_attributes(session: DaskSession) -> None:
    def fail(ws: Workspace) -> None:
        raise SaveFailedError(3, "/ckpt", {"trainer_2": "disk full"})

    with Node("trainer_2"), pytest.raises(SaveFailedError) as failure:
        session.run(Task(fail))
    assert failure.value.epoch == 3
    assert failure.value.failed_nodes == ("trainer_2",)
    assert "disk full" in str(failure.value)
    with pytest.raises(BlobNotFoundError, match="'absent'"):
        session.fetch_blob("trainer_2", "absent")


def test_nodes_are_placed_from_the_schedulers_answer_not_the_clients_cache(
    client: Client, workers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``client.scheduler_info()`` returns a cache that the client's periodic refresh
    (totals, no workers) can overwrite before it returns; a full-suite run once saw a
    cluster of three live workers as empty. Placement asks the scheduler itself: with
    that cache showing no workers (what the race leaves), nodes are still placed."""
    monkeypatch.setattr(client, "scheduler_info", lambda *args, **kwargs: {"workers": {}})
    with DaskSession(client) as session:
        placed = session.run(group_on(["trainer_0", "trainer_1"], worker_address))
    assert set(placed) <= set(workers)
    assert len(placed) == 2


def test_nodes_map_onto_workers_by_address_or_name(client: Client, workers: list[str]) -> None:
    identity = client.sync(client.scheduler.identity, n_workers=-1)
    names = {address: info["name"] for address, info in identity["workers"].items()}
    mapping = {"trainer_0": workers[2], "trainer_1": str(names[workers[2]])}
    with DaskSession(client, mapping) as session:
        assert session.run(group_on(["trainer_0", "trainer_1"], worker_address)) == [
            workers[2],
            workers[2],
        ]
        session.run(group_on(["trainer_0", "trainer_1"], lambda ws: ws.update(n=np.zeros(1))))
        assert session.blob_names("trainer_0") == ["n"]  # two nodes, one worker, two workspaces


def test_a_mapping_to_an_unknown_worker_says_which(client: Client) -> None:
    session = DaskSession(client, {"trainer_0": "no-such-worker"})
    with session, pytest.raises(JobConfigurationError, match="is mapped to worker 'no-such"):
        session.worker_of("trainer_0")


def test_close_frees_every_workers_state(client: Client) -> None:
    session = DaskSession(client)
    session.run(group_on(NODES, lambda ws: ws.update(big=np.zeros(1000))))
    store = f"ckptstore-workspaces-{session.session_id}"
    assert all(client.run(has_store, store_name=store).values())
    session.close()
    assert not any(client.run(has_store, store_name=store).values())
    with pytest.raises(JobConfigurationError, match="closed"):
        session.fetch_blob("trainer_0", "big")


def test_a_node_whose_worker_lost_its_state_is_never_recreated_empty(
    session: DaskSession, client: Client
) -> None:
    session.run(group_on(NODES, lambda ws: ws.update(w=np.ones(1))))
    store = f"ckptstore-workspaces-{session.session_id}"
    lost_worker = session.worker_of("trainer_1")
    cleared = client.run(clear_store, store_name=store, workers=[lost_worker])
    assert cleared == {lost_worker: ["trainer_1"]}
    with pytest.raises(NodeLostError) as failure:
        session.run(group_on(NODES, lambda ws: ws["w"].__iadd__(1)))
    assert failure.value.node == "trainer_1"
    assert failure.value.worker == lost_worker
    assert "re-run the job" in str(failure.value)
    assert session.lost_nodes() == ["trainer_1"]
    with pytest.raises(NodeLostError, match="'trainer_1'"):
        session.fetch_blob("trainer_1", "w")
    assert session.fetch_blob("trainer_0", "w").tolist() == [2.0]  # the others ran on


def test_task_code_missing_on_the_workers_is_explained(
    session: DaskSession, tmp_path: Path
) -> None:
    module = f"client_only_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            def touch(ws):
                ws["touched"] = 1
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        touch = __import__(module).touch
        with Node("trainer_0"), pytest.raises(Exception, match=module) as failure:
            session.run(Task(touch))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)
    assert "every worker needs the code the tasks call" in "\n".join(failure.value.__notes__)


def test_results_that_cannot_travel_fail_their_task_only(session: DaskSession) -> None:
    group = TaskGroup(WorkspaceType.GLOBAL)
    with group, Node("trainer_0"):
        Task(lambda ws: threading.Lock(), name="returns_a_lock")
        Task(lambda ws: ws.update(after=np.ones(1)) or 7, name="then_this")
    with pytest.raises(TypeError, match="'returns_a_lock' cannot be sent back"):
        session.run(group)
    assert session.blob_names("trainer_0") == ["after"]
    lock = threading.Lock()
    with Node("trainer_0"), pytest.raises(TypeError, match="lock"):
        session.run(Task(lambda ws: lock.locked()))


def test_an_asynchronous_client_is_refused(cluster: LocalCluster) -> None:
    async def attempt() -> None:
        async with Client(cluster.scheduler_address, asynchronous=True) as async_client:
            with pytest.raises(JobConfigurationError, match="synchronous"):
                DaskSession(async_client)

    asyncio.run(attempt())
