"""Tasks, task groups and task outputs."""

from __future__ import annotations

import numpy as np
import pytest

from ckptstore import LocalSession, Node, Task, TaskGroup, Workspace
from ckptstore.errors import FrozenGroupError, NotRunError
from ckptstore.execution import WorkspaceType


def test_a_task_binds_to_the_current_node_and_group() -> None:
    group = TaskGroup()
    with Node("trainer_0"), group:
        task = Task(lambda ws: None, name="t")
    assert task.node == "trainer_0"
    assert task.group is group
    assert group.tasks() == [task]
    outside = Task(lambda ws: None)
    assert outside.node == "local"
    assert outside.group is None


def test_explicit_node_and_group_win() -> None:
    group, other = TaskGroup(), TaskGroup()
    with Node("trainer_0"), other:
        task = Task(lambda ws: None, group=group, node="trainer_1")
    assert task.node == "trainer_1"
    assert group.tasks() == [task]
    assert other.tasks() == []


def test_task_names_default_to_the_function_name() -> None:
    def init_model(ws: Workspace) -> None:
        pass

    assert Task(init_model).name == "init_model"
    assert Task(outputs=["x"]).name.startswith("task_")
    assert Task(init_model, name="explicit").name == "explicit"


def test_outputs_are_named_blobs_and_a_string_means_one() -> None:
    task = Task(lambda ws: None, outputs="total")
    assert task.output_names() == ("total",)
    assert [o.blob_name for o in task.outputs()] == ["total"]
    assert task.outputs() is not task.outputs()  # a copy each time


def test_fetch_before_run_raises_not_run_error() -> None:
    task = Task(lambda ws: ws.update(x=np.ones(2)), outputs=["x"], name="producer")
    with pytest.raises(NotRunError, match="producer"):
        task.outputs()[0].fetch()
    with pytest.raises(NotRunError):
        task.result().fetch()


def test_fetch_reads_the_blob_live_not_a_snapshot() -> None:
    session = LocalSession()
    with Node("trainer_0"):
        task = Task(lambda ws: ws.update(x=np.array([1])), outputs=["x"])
    session.run(task)
    output = task.outputs()[0]
    assert output.fetch().tolist() == [1]
    session.workspace("trainer_0")["x"] = np.array([7])
    assert output.fetch().tolist() == [7]


def test_result_outputs_hold_the_return_value_of_the_last_run() -> None:
    session = LocalSession()
    counter = iter(range(10))
    task = Task(lambda ws: next(counter), result_is_output=True, outputs=["unused"])
    session.workspace()["unused"] = 0
    session.run(task)
    assert task.outputs()[0].fetch() == 0
    assert task.outputs()[0] is task.result()
    assert [o.blob_name for o in task.outputs()] == [None, "unused"]
    session.run(TaskGroup.wrapping(task))
    assert task.result().fetch() == 1


def test_an_untyped_group_becomes_private_when_its_first_task_is_added() -> None:
    group = TaskGroup()
    assert group.workspace_type() is None
    group.add(Task(lambda ws: None))
    assert group.workspace_type() is WorkspaceType.PRIVATE
    assert TaskGroup(WorkspaceType.GLOBAL).workspace_type() is WorkspaceType.GLOBAL


def test_used_nodes_are_distinct_in_first_use_order() -> None:
    group = TaskGroup()
    for node in ["b", "a", "b", "c", "a"]:
        Task(lambda ws: None, node=node, group=group)
    assert group.used_nodes() == ["b", "a", "c"]


def test_groups_freeze_on_first_run() -> None:
    group = TaskGroup(WorkspaceType.GLOBAL)
    group.extend([Task(lambda ws: None), Task(lambda ws: None)])
    assert len(group.tasks()) == 2
    LocalSession().run(group)
    assert group.frozen
    with pytest.raises(FrozenGroupError), group:
        Task(lambda ws: None)
    assert len(group.tasks()) == 2


def test_current_group_is_the_innermost() -> None:
    outer, inner = TaskGroup(), TaskGroup()
    assert TaskGroup.current() is None
    with outer:
        with inner:
            assert TaskGroup.current() is inner
        assert TaskGroup.current() is outer
    assert TaskGroup.current() is None


def test_contexts_exited_out_of_order_are_an_error() -> None:
    first, second = TaskGroup(), TaskGroup()
    first.__enter__()
    second.__enter__()
    with pytest.raises(RuntimeError, match="out of order"):
        first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    first.__exit__(None, None, None)
    assert TaskGroup.current() is None


def _group_of(kind: WorkspaceType | None) -> tuple[TaskGroup, Task]:
    group = TaskGroup(kind)

    def body(ws: Workspace) -> None:
        ws["existing"] += 1
        ws["new_name"] = np.zeros(1)
        ws["declared"] = np.ones(1)

    with group:
        task = Task(body, outputs=["declared"])
    return group, task


def test_private_groups_keep_existing_and_declared_names_only() -> None:
    session = LocalSession()
    session.workspace()["existing"] = np.array([1])
    group, task = _group_of(None)
    session.run(group)
    ws = session.workspace()
    assert sorted(ws) == ["declared", "existing"]
    assert ws["existing"].tolist() == [2]
    assert task.outputs()[0].fetch().tolist() == [1.0]


def test_global_groups_keep_every_name() -> None:
    session = LocalSession()
    session.workspace()["existing"] = np.array([1])
    group, _ = _group_of(WorkspaceType.GLOBAL)
    session.run(group)
    assert sorted(session.workspace()) == ["declared", "existing", "new_name"]


def test_a_task_without_a_function_only_exposes_outputs() -> None:
    session = LocalSession()
    session.workspace("n")["x"] = np.array(5)
    reader = Task(outputs=["x"], node="n")
    assert session.run(reader) == [None]
    assert reader.outputs()[0].fetch().item() == 5
