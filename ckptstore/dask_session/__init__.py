"""Run ckptstore jobs on Dask distributed: one workspace per node, held by a worker.

Needs the ``dask`` extra (from a checkout: ``pip install '.[dask]'``; into an installed
ckptstore: ``pip install 'distributed>=2024.8'``); the rest of ckptstore never imports
Dask. See ``docs/distributed.md``.

Example::

    >>> from distributed import Client, LocalCluster  # or Client("tcp://scheduler:8786")
    >>> from ckptstore import Job, JobRunner, MultiNodeCheckpointManager, Node, Task, epoch_limiter
    >>> from ckptstore.dask_session import DaskSession
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     done = epoch_limiter(job, 2)
    >>> manager = MultiNodeCheckpointManager("ckpt", metadata_handler="json")
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
    ...     with Client(cluster) as client, DaskSession(client) as session:
    ...         last = JobRunner(job, manager).train(session)
    >>> last
    2
"""

try:
    import distributed as _distributed  # noqa: F401
except ImportError as error:
    raise ImportError(
        "ckptstore.dask_session needs Dask distributed: `pip install 'distributed>=2024.8'` "
        "(on the client, the scheduler and every worker)"
    ) from error

from ckptstore.dask_session._session import DaskSession

__all__ = ["DaskSession"]
