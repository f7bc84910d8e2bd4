"""Kill a Dask worker process and wait for the nanny's new one: for tests of how a job
survives a lost node (needs the ``dask`` extra; the rest of ``ckptstore.testing`` never
imports Dask).

The waits ask the scheduler, never the cluster manager. ``Client.wait_for_workers`` on
a ``LocalCluster``'s client replaces the manager's copy of the worker list; when the
scheduler's note that a killed worker left arrives after that, the manager's watch
raises ``KeyError`` and closing the cluster raises it again (distributed 2026.8; the
same lookup as dask/distributed#5407).

Example::

    >>> import logging
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(
    ...     n_workers=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    ... ) as cluster, Client(cluster) as client:
    ...     [lost] = client.nthreads()
    ...     fresh = kill_worker(client, lost)
    ...     sorted(client.nthreads()) == [fresh] and fresh != lost
    True
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from distributed import Client, Worker

__all__ = ["kill_worker", "wait_for_workers"]

_POLL_SECONDS = 0.05
"""How often the waits ask the scheduler again (polling a condition, not a sleep that
hopes something happened)."""


def _running_workers(client: Client) -> set[str]:
    """The addresses of the workers the scheduler lists as running, asked now."""
    workers = client.scheduler_info()["workers"]
    return {address for address, info in workers.items() if info.get("status") == "running"}


def wait_for_workers(client: Client, n_workers: int, *, timeout: float = 60.0) -> set[str]:
    """Wait until the scheduler lists ``n_workers`` running workers; return their
    addresses. Raises :class:`TimeoutError` naming how many are running after
    ``timeout`` seconds. Use it instead of ``client.wait_for_workers`` after killing
    a worker of a ``LocalCluster`` (see the module's docstring)."""
    deadline = time.monotonic() + timeout
    while len(running := _running_workers(client)) < n_workers:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(running)} of {n_workers} Dask workers running after {timeout:g} s: "
                "is every worker run by a nanny that restarts it?"
            )
        time.sleep(_POLL_SECONDS)
    return running


def _pid_and_directory(dask_worker: Worker) -> tuple[int, str]:
    return os.getpid(), str(dask_worker.local_directory)


def kill_worker(client: Client, address: str, *, timeout: float = 60.0) -> str:
    """SIGKILL the worker process at ``address`` (on this machine), remove its local
    directory, wait until the scheduler dropped it and the nanny's new worker joined,
    and return the new worker's address.

    Raises :class:`ValueError` if the worker runs in this process (a ``LocalCluster``
    with ``processes=False``: nothing could be killed alone), and
    :class:`TimeoutError` if no new worker joined within ``timeout`` seconds."""
    before = _running_workers(client)
    pid, directory = client.run(_pid_and_directory, workers=[address])[address]
    if pid == os.getpid():
        raise ValueError(
            f"the Dask worker {address} runs in this process: start the cluster with "
            "LocalCluster(processes=True) to kill one worker"
        )
    os.kill(pid, signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)
    deadline = time.monotonic() + timeout
    while True:
        running = _running_workers(client)
        fresh = running - before
        if address not in running and fresh and len(running) >= len(before):
            return min(fresh)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no new Dask worker replaced {address} within {timeout:g} s "
                f"(running: {sorted(running)}): is it run by a nanny?"
            )
        time.sleep(_POLL_SECONDS)
