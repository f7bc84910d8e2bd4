"""``ckptstore.testing.dask_workers``: a killed worker is replaced, and the waits never
break the ``LocalCluster`` they run against (closing it raises nothing)."""

from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster

from ckptstore.testing.dask_workers import kill_worker, wait_for_workers


def test_killed_workers_are_replaced_and_the_cluster_closes_cleanly() -> None:
    # distributed's Client.wait_for_workers after a kill broke the cluster manager's
    # watch (a KeyError raised again when the cluster closed): 1 run in 20 kills here
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        for _ in range(4):
            before = wait_for_workers(client, 2)
            lost = min(before)
            fresh = kill_worker(client, lost)
            after = wait_for_workers(client, 2)
            assert lost not in after
            assert fresh in after
            assert fresh not in before
            assert client.submit(sum, [1, 2], workers=[fresh]).result() == 3
        assert not cluster._watch_worker_status_task.done()  # the manager still watches


def test_a_worker_in_this_process_is_refused() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        [address] = client.nthreads()
        with pytest.raises(ValueError, match="processes=True"):
            kill_worker(client, address)
        assert list(client.nthreads()) == [address]  # nothing killed


def test_too_few_workers_time_out_naming_how_many_run() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
        pytest.raises(TimeoutError, match="1 of 2 Dask workers running"),
    ):
        wait_for_workers(client, 2, timeout=0.2)
