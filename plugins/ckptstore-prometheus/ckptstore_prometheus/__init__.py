"""ckptstore-prometheus: checkpoint statistics as Prometheus metrics.

Installing the distribution registers a ``ckptstore_report`` plugin: every save, load,
partial load, failure and upload updates durations, bytes, throughput, failures per
node and action, and the slowest node of each operation.

Example::

    from ckptstore_prometheus import serve
    serve(9108)                       # scrape http://127.0.0.1:9108/metrics
    JobRunner(job, manager).train(session)
"""

from ckptstore_prometheus.metrics import DURATION_BUCKETS, CheckpointMetrics
from ckptstore_prometheus.plugin import default_metrics, serve

__all__ = ["DURATION_BUCKETS", "CheckpointMetrics", "default_metrics", "serve"]
