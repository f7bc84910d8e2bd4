"""Waiting for node futures while watching their workers.

A Dask task restricted to a worker that died does not fail: the scheduler keeps it
waiting for that worker forever. :func:`await_nodes` waits on the futures and, every
``interval`` seconds while some are pending, asks the scheduler which workers are
alive; a pending node whose worker left is cancelled and reported as a
:class:`~ckptstore.errors.NodeLostError`.

Example::

    >>> from distributed import Client, LocalCluster
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> address, = client.nthreads()
    >>> future = client.submit(sum, [1, 2], workers=[address], pure=False)
    >>> await_nodes(client, {"trainer_0": future}, {"trainer_0": address}, 0.5)
    {'trainer_0': 3}
    >>> gone = "tcp://127.0.0.1:9"  # a worker that left: its task would wait forever
    >>> stuck = client.submit(sum, [1], workers=[gone], pure=False)
    >>> lost = await_nodes(client, {"trainer_1": stuck}, {"trainer_1": gone}, 0.2)["trainer_1"]
    >>> type(lost).__name__, lost.node
    ('NodeLostError', 'trainer_1')
    >>> client.close(); cluster.close()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from distributed import Client, Future, wait

from ckptstore.errors import NodeLostError

__all__ = ["await_nodes"]


def await_nodes(
    client: Client,
    futures: Mapping[str, Future[Any]],
    workers: Mapping[str, str],
    interval: float,
) -> dict[str, Any]:
    """Each node's future result, or the exception that stands for it: the error the
    future raised, or :class:`NodeLostError` when its worker (``workers[node]``) left."""
    pending = dict(futures)
    settled: dict[str, Any] = {}
    with client.as_current():
        while pending:
            with contextlib.suppress(TimeoutError):
                wait(list(pending.values()), timeout=interval)  # type: ignore[no-untyped-call]
            for node, future in list(pending.items()):
                if future.done():  # type: ignore[no-untyped-call]
                    try:
                        settled[node] = future.result(timeout=interval)
                    except TimeoutError:
                        continue  # its result vanished with its worker: checked below
                    except (Exception, asyncio.CancelledError) as error:
                        settled[node] = error
                    del pending[node]
            if pending:
                live = set(client.nthreads())  # type: ignore[no-untyped-call]
                for node in [node for node in pending if workers[node] not in live]:
                    pending.pop(node).cancel()  # type: ignore[no-untyped-call]
                    settled[node] = NodeLostError(
                        node,
                        workers[node],
                        "its Dask worker left the cluster (the process died or was stopped)",
                    )
    return settled
