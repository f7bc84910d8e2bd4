"""ckptstore-prometheus: checkpoint statistics as Prometheus metrics.

Installing the distribution registers a ``ckptstore_report`` plugin: every save, load,
partial load, failure and upload updates durations, bytes, throughput, failures per
node and action, and the slowest node of each operation.

Example::

    >>> import urllib.request
    >>> from ckptstore import CheckpointManager, Job, JobRunner, LocalSession, Node, Task
    >>> from ckptstore import epoch_limiter
    >>> server, port = serve(0)  # serve(9108): scrape http://127.0.0.1:9108/metrics
    >>> with Job() as job, Node("trainer_0"):
    ...     _ = Task(lambda ws: ws.update(w=np.ones(2)), name="train")
    ...     done = epoch_limiter(job, 2)
    >>> JobRunner(job, CheckpointManager("ckpt", "trainer_0", "npz")).train(LocalSession())
    2
    >>> page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    >>> 'ckptstore_last_epoch{action="checkpoint_save",node="trainer_0"} 2.0' in page
    True
    >>> server.shutdown()
"""

from ckptstore_prometheus.metrics import DURATION_BUCKETS, CheckpointMetrics
from ckptstore_prometheus.plugin import default_metrics, serve

__all__ = ["DURATION_BUCKETS", "CheckpointMetrics", "default_metrics", "serve"]
