"""Run ckptstore jobs on Dask distributed: one workspace per node, held by a worker.

Needs the ``dask`` extra (from a checkout: ``pip install '.[dask]'``; into an installed
ckptstore: ``pip install 'distributed>=2024.8'``); the rest of ckptstore never imports
Dask. See ``docs/distributed.md``.

Example::

    from distributed import Client
    from ckptstore.dask_session import DaskSession

    with Client("tcp://scheduler:8786") as client, DaskSession(client) as session:
        JobRunner(job, manager).train(session)
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
