"""One LocalCluster of worker processes for every DaskSession test, and helpers.

The cluster has three worker processes (two threads each) (one per node of the Caffe2 job);
tests that kill a worker leave the nanny to restart it, and :func:`client` waits
until all three are back before the next test uses the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster

from ckptstore.dask_session import DaskSession
from ckptstore.testing.dask_workers import wait_for_workers

WORKERS = 3


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    # silencing the cluster's logs raises the level of the root logger's handlers,
    # pytest's capture among them, until the session ends: later tests' caplog would
    # miss every warning (tests/checkpoint/test_tiers.py run after this directory)
    handlers = [(handler, handler.level) for handler in logging.getLogger().handlers]
    with LocalCluster(
        n_workers=WORKERS,
        threads_per_worker=2,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    ) as local_cluster:
        for handler, level in handlers:
            handler.setLevel(level)
        yield local_cluster


@pytest.fixture(scope="session")
def session_client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster) as client:
        yield client


@pytest.fixture
def client(session_client: Client) -> Client:
    """The shared client, once every worker (restarted ones included) is up."""
    wait_for_workers(session_client, WORKERS)
    return session_client


@pytest.fixture
def workers(client: Client) -> list[str]:
    """The live workers' addresses, sorted."""
    return sorted(client.nthreads())


@pytest.fixture
def session(client: Client) -> Iterator[DaskSession]:
    with DaskSession(client) as dask_session:
        yield dask_session
