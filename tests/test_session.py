"""Sessions: running tasks and groups on per-node workspaces."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import build_counter_job

from ckptstore import (
    CheckpointManager,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    TaskGroup,
    Workspace,
)
from ckptstore.execution import WorkspaceType
from ckptstore.io import paused_gc


def test_a_bare_task_runs_in_a_global_group() -> None:
    session = LocalSession()

    def create(ws: Workspace) -> str:
        ws["created"] = np.ones(1)
        return "done"

    task = Task(create, result_is_output=True)
    assert session.run(task) == ["done"]
    assert "created" in session.workspace()
    assert task.group is None  # running it did not add it to a group


def _create_w(ws: Workspace, *, node: str) -> None:
    ws[f"{node}/w"] = np.zeros(1)


def test_every_node_has_its_own_workspace() -> None:
    session = LocalSession()
    group = TaskGroup(WorkspaceType.GLOBAL)
    with group:
        for node in ("trainer_0", "trainer_1"):
            with Node(node):
                Task(partial(_create_w, node=node))
    session.run(group)
    assert list(session.workspace("trainer_0")) == ["trainer_0/w"]
    assert list(session.workspace("trainer_1")) == ["trainer_1/w"]
    assert session.nodes() == ["trainer_0", "trainer_1"]


def _return(ws: Workspace, *, value: int) -> int:
    return value


def test_results_come_back_in_task_order() -> None:
    group = TaskGroup(WorkspaceType.GLOBAL)
    for value in (3, 1, 2):
        Task(partial(_return, value=value), group=group)
    assert LocalSession().run(group) == [3, 1, 2]


def test_a_failing_task_does_not_stop_the_others_and_the_first_error_carries_the_rest() -> None:
    session = LocalSession()
    group = TaskGroup(WorkspaceType.GLOBAL)

    def fail(message: str) -> None:
        raise RuntimeError(message)

    with group:
        Task(lambda ws: fail("first"), name="one", node="n0")
        ok = Task(lambda ws: ws.update(ran=np.ones(1)), outputs=["ran"], name="two", node="n1")
        Task(lambda ws: fail("second"), name="three", node="n2")
    with pytest.raises(RuntimeError, match="first") as info:
        session.run(group)
    notes = info.value.__notes__
    assert "raised by task 'one' on node 'n0'" in notes[0]
    assert "task 'three' on node 'n2' also failed: RuntimeError: second" in notes[1]
    assert "ran" in session.workspace("n1")
    assert ok.outputs()[0].fetch().tolist() == [1.0]  # successful tasks are bound


def test_before_run_and_after_run_hooks() -> None:
    events: list[object] = []
    group = TaskGroup(
        WorkspaceType.GLOBAL,
        before_run=lambda: events.append("before"),
        after_run=lambda results: events.append(("after", results)),
    )

    def task(ws: Workspace) -> int:
        events.append("task")
        return 1

    Task(task, group=group)
    Task(lambda ws: 2, group=group)
    LocalSession().run(group)
    assert events == ["before", "task", ("after", [1, 2])]


def test_after_run_is_skipped_when_a_task_fails() -> None:
    called: list[object] = []
    group = TaskGroup(WorkspaceType.GLOBAL, after_run=called.append)
    Task(lambda ws: 1, group=group)
    Task(lambda ws: 1 / 0, group=group)
    with pytest.raises(ZeroDivisionError):
        LocalSession().run(group)
    assert called == []


def test_an_empty_group_runs_its_hooks_only() -> None:
    called: list[object] = []
    group = TaskGroup(after_run=called.append)
    assert LocalSession().run(group) == []
    assert called == [[]]


def test_sessions_can_share_workspaces_and_close_releases_them() -> None:
    shared = Workspace({"x": [1]})
    session = LocalSession({"local": shared})
    with session:
        session.run(Task(lambda ws: ws["x"].__iadd__(1)))
        assert session.workspace() is shared
    assert shared["x"].tolist() == [2]
    assert session.nodes() == []


def test_run_is_synchronous_in_task_order_on_one_node() -> None:
    session = LocalSession()
    group = TaskGroup(WorkspaceType.GLOBAL)
    with group:
        Task(lambda ws: ws.update(log=np.array([1])))
        Task(lambda ws: ws.update(log=np.append(ws["log"], 2)))
    session.run(group)
    assert session.workspace()["log"].tolist() == [1, 2]


# -- a dropped session is freed at once ------------------------------------------------------


def _run_tasks(session: LocalSession, root: Path) -> np.ndarray:
    group = TaskGroup(WorkspaceType.GLOBAL)
    with group:
        task = Task(lambda ws: ws.update(w=np.ones(4)), outputs=["w"], result_is_output=True)
    session.run(group)
    assert task.group is group
    return task.outputs()[1].fetch_array()


def _save_and_load(session: LocalSession, root: Path) -> np.ndarray:
    session.workspace().update(w=np.ones(4))
    manager = CheckpointManager(str(root), "local", "zarr")
    with Node("local"):
        session.run(manager.init(["local"]))
    session.run(manager.save(1))
    session.run(manager.load(1))
    return session.workspace()["w"]  # the restored array


def _train(session: LocalSession, root: Path, *, async_save: bool) -> np.ndarray:
    job, outputs = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager(str(root), "npz")
    assert JobRunner(job, manager, async_save=async_save).train(session) == 2
    return outputs[0].fetch_array()


@pytest.mark.parametrize(
    "use",
    [
        _run_tasks,
        _save_and_load,
        partial(_train, async_save=False),
        partial(_train, async_save=True),
    ],
    ids=["tasks", "manager save and load", "job runner", "job runner, async saves"],
)
def test_a_dropped_session_frees_its_blobs_without_the_garbage_collector(
    tmp_path: Path, use: Callable[[LocalSession, Path], np.ndarray]
) -> None:
    # a task held its outputs and each output its task (and a task its group, and the
    # group its tasks): cycles through the outputs kept a session, and every blob in its
    # workspaces (a whole restored state), until Python's next full collection
    with paused_gc():  # only reference counts free objects: what a cycle holds stays
        assert not gc.isenabled()
        session = LocalSession()
        blob = use(session, tmp_path)  # an array the session's workspace holds
        freed = weakref.ref(session), weakref.ref(blob)
        del session, blob
        assert [ref() for ref in freed] == [None, None]
