"""The plugin registered under the ``ckptstore`` entry-point group as ``prometheus``.

Reports go to metrics in ``prometheus_client``'s default registry (exported with the
application's other metrics). Setting ``CKPTSTORE_PROMETHEUS_PORT`` serves them over
HTTP from the first report on (``CKPTSTORE_PROMETHEUS_ADDR`` picks the address,
default ``127.0.0.1``); :func:`serve` does the same from code.

Example::

    >>> from ckptstore_prometheus import serve
    >>> server, port = serve(0)   # http://127.0.0.1:<port>/metrics (9108 in production)
    >>> port > 0
    True
    >>> server.shutdown()
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from ckptstore.plugin import hookimpl
from ckptstore.records import NodeStats
from ckptstore_prometheus.metrics import CheckpointMetrics

__all__ = ["ADDR_ENV", "PORT_ENV", "ckptstore_report", "default_metrics", "serve"]

PORT_ENV = "CKPTSTORE_PROMETHEUS_PORT"
ADDR_ENV = "CKPTSTORE_PROMETHEUS_ADDR"

_lock = threading.Lock()
_metrics: CheckpointMetrics | None = None
_server: WSGIServer | None = None


def default_metrics() -> CheckpointMetrics:
    """The metrics in the default registry, created on first use."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = CheckpointMetrics(REGISTRY)
        return _metrics


def serve(
    port: int = 0, addr: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY
) -> tuple[WSGIServer, int]:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread; returns
    the server and the port it listens on (``port=0`` picks a free one)."""
    server, _ = start_http_server(port, addr, registry)
    return server, int(server.server_port)


def _serve_from_environment() -> None:
    global _server
    port = os.environ.get(PORT_ENV)
    with _lock:
        if not port or _server is not None:
            return
        _server, _ = serve(int(port), os.environ.get(ADDR_ENV, "127.0.0.1"))


@hookimpl
def ckptstore_report(action_name: str, stats: Mapping[str, NodeStats]) -> None:
    """Update the default metrics (and start serving them if the environment asks)."""
    _serve_from_environment()
    default_metrics().observe(action_name, stats)
