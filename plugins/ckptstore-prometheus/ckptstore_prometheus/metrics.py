"""Checkpoint statistics as Prometheus metrics.

Every ``ckptstore_report`` updates, per action (``checkpoint_save``, ``checkpoint_load``,
``checkpoint_partial_load``, ``checkpoint_save_failed``, ``checkpoint_upload``) and node:

=============================================== ========= ===============================
metric                                          type      what
=============================================== ========= ===============================
``ckptstore_operations_total``                  counter   operations reported
``ckptstore_failures_total``                    counter   failed operations
``ckptstore_operation_duration_seconds``        histogram how long each took
``ckptstore_bytes_total``                       counter   blob bytes moved
``ckptstore_stored_bytes``                      gauge     bytes on storage, last operation
``ckptstore_throughput_bytes_per_second``       gauge     blob bytes/s, last operation
``ckptstore_last_epoch``                        gauge     epoch of the last operation
``ckptstore_slowest_node_duration_seconds``     gauge     the slowest node of the last
                                                          operation (labels: action, node)
=============================================== ========= ===============================

Example::

    >>> from ckptstore.plugin import get_registry
    >>> metrics = CheckpointMetrics(CollectorRegistry())
    >>> get_registry().register(metrics)  # or rely on the installed entry point
    >>> get_registry().unregister(metrics)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ckptstore.plugin import hookimpl
from ckptstore.records import NodeStats

__all__ = ["DURATION_BUCKETS", "CheckpointMetrics"]

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
"""Checkpoint durations span milliseconds (small states) to many minutes."""

LABELS = ("action", "node")


class CheckpointMetrics:
    """The metrics, registered in ``registry``; a ``ckptstore_report`` plugin.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> from ckptstore.plugin import get_registry
        >>> registry = CollectorRegistry()
        >>> metrics = CheckpointMetrics(registry)
        >>> get_registry().register(metrics, name="my-metrics")
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("saved", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(1))
        >>> manager.report_checkpoint_stats("checkpoint_save")  # what JobRunner does
        >>> labels = {"action": "checkpoint_save", "node": "trainer_0"}
        >>> registry.get_sample_value("ckptstore_operations_total", labels)
        1.0
        >>> get_registry().unregister(metrics)
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._slowest: dict[str, str] = {}
        self.operations = Counter(
            "ckptstore_operations", "Checkpoint operations reported", LABELS, registry=registry
        )
        self.failures = Counter(
            "ckptstore_failures", "Checkpoint operations that failed", LABELS, registry=registry
        )
        self.duration = Histogram(
            "ckptstore_operation_duration_seconds",
            "Duration of checkpoint operations per node",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.bytes = Counter(
            "ckptstore_bytes", "Blob bytes saved, loaded or uploaded", LABELS, registry=registry
        )
        self.stored_bytes = Gauge(
            "ckptstore_stored_bytes",
            "Bytes on storage of the node's last checkpoint operation",
            LABELS,
            registry=registry,
        )
        self.throughput = Gauge(
            "ckptstore_throughput_bytes_per_second",
            "Blob bytes per second of the node's last checkpoint operation",
            LABELS,
            registry=registry,
        )
        self.last_epoch = Gauge(
            "ckptstore_last_epoch",
            "Epoch of the node's last checkpoint operation",
            LABELS,
            registry=registry,
        )
        self.slowest = Gauge(
            "ckptstore_slowest_node_duration_seconds",
            "Duration of the slowest node in the last operation of each action",
            LABELS,
            registry=registry,
        )

    def observe(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        """Record one report."""
        if not stats:
            return
        with self._lock:
            for node in stats.values():
                labels = (action_name, node.node)
                self.operations.labels(*labels).inc()
                self.last_epoch.labels(*labels).set(node.epoch)
                if node.error is not None or action_name == "checkpoint_save_failed":
                    self.failures.labels(*labels).inc()
                    continue
                self.duration.labels(*labels).observe(node.duration_ns / 1e9)
                self.bytes.labels(*labels).inc(node.nbytes)
                self.stored_bytes.labels(*labels).set(node.stored_bytes)
                self.throughput.labels(*labels).set(node.throughput)
            timed = [node for node in stats.values() if node.error is None]
            if timed:
                slowest = max(timed, key=lambda node: node.duration_ns)
                previous = self._slowest.get(action_name)
                if previous is not None and previous != slowest.node:
                    self.slowest.remove(action_name, previous)
                self.slowest.labels(action_name, slowest.node).set(slowest.duration_ns / 1e9)
                self._slowest[action_name] = slowest.node

    @hookimpl
    def ckptstore_report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        self.observe(action_name, stats)
