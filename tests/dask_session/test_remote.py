"""The worker side on its own: run_node_calls against a WorkspaceStore on a worker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from distributed import Client

from ckptstore.dask_session._remote import (
    NodeCall,
    NodeReport,
    WorkspaceStore,
    decode,
    encode,
    run_node_calls,
)
from ckptstore.errors import BlobNotFoundError, NodeLostError
from ckptstore.execution._task import WorkspaceType


@pytest.fixture
def store(client: Client) -> Iterator[str]:
    name = f"ckptstore-test-store-{uuid.uuid4().hex}"
    client.register_plugin(WorkspaceStore(), name=name)
    yield name
    client.unregister_worker_plugin(name)


def run(
    client: Client,
    worker: str,
    store: str,
    calls: list[NodeCall],
    *,
    expect_existing: bool,
    kind: WorkspaceType = WorkspaceType.GLOBAL,
) -> NodeReport:
    future = client.submit(
        run_node_calls,
        store,
        "trainer_0",
        encode(calls),
        kind,
        expect_existing,
        workers=[worker],
        allow_other_workers=False,
        pure=False,
    )
    report = decode(future.result())
    assert isinstance(report, NodeReport)
    return report


def call(fn: object, outputs: tuple[str, ...] = ()) -> NodeCall:
    return NodeCall(fn, "task", "trainer_0", outputs)  # type: ignore[arg-type]


def test_calls_run_in_order_and_failures_do_not_stop_the_next(
    client: Client, workers: list[str], store: str
) -> None:
    report = run(
        client,
        workers[0],
        store,
        [
            call(lambda ws: ws.update(w=np.arange(3))),
            call(lambda ws: ws["missing"]),
            call(lambda ws: int(ws["w"].sum())),
        ],
        expect_existing=False,
    )
    assert report.node_error is None
    first, failed, last = report.outcomes
    assert first.error is None
    assert failed.error is not None
    assert isinstance(failed.error.unpack(), BlobNotFoundError)
    assert last.result == 3


def test_private_calls_keep_only_their_outputs(
    client: Client, workers: list[str], store: str
) -> None:
    calls = [call(lambda ws: ws.update(tmp=1, out=2), outputs=("out",))]
    run(client, workers[0], store, calls, expect_existing=False, kind=WorkspaceType.PRIVATE)
    report = run(client, workers[0], store, [call(sorted)], expect_existing=True)
    assert report.outcomes[0].result == ["out"]


def test_a_node_expected_on_a_worker_that_lacks_it_is_lost(
    client: Client, workers: list[str], store: str
) -> None:
    run(client, workers[0], store, [call(lambda ws: None)], expect_existing=False)
    report = run(client, workers[1], store, [call(lambda ws: None)], expect_existing=True)
    assert report.outcomes == ()
    assert report.node_error is not None
    error = report.node_error.unpack()
    assert isinstance(error, NodeLostError)
    assert (error.node, error.worker) == ("trainer_0", workers[1])


def test_a_worker_without_the_sessions_store_reports_it(client: Client, workers: list[str]) -> None:
    report = run(client, workers[0], "no-such-store", [call(len)], expect_existing=False)
    assert report.node_error is not None
    assert "holds no workspaces for the session" in str(report.node_error.unpack())
