"""The Prometheus reporter: checkpoint stats become metrics, scraped over HTTP."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ckptstore_prometheus import CheckpointMetrics, serve
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ckptstore import (
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
)
from ckptstore.plugin._registry import get_registry, reset_registry
from ckptstore.records import NodeStats

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    reset_registry()
    yield
    reset_registry()


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def job(nodes: tuple[str, ...], epochs: int) -> Job:
    with Job() as built:
        for size, node in enumerate(nodes, start=1):
            with Node(node):
                with built.init_group:
                    Task(lambda ws, n=size * 1000: ws.update(w=np.zeros(n)), name=f"{node}/init")
                Task(lambda ws: ws["w"].__iadd__(1), name=f"{node}/epoch")
        with Node(nodes[0]):
            epoch_limiter(built, epochs)
    return built


def test_the_installed_plugin_exports_a_training_run(tmp_path: Path) -> None:
    assert "prometheus" in {info.name for info in get_registry().plugins()}
    server, port = serve(0)
    try:
        nodes = ("prom_a", "prom_b")  # node names no other test reports
        manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
        assert JobRunner(job(nodes, 3), manager).train(LocalSession()) == 3
        samples = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    save = {"action": "checkpoint_save"}
    assert value(samples, "ckptstore_operations_total", node="prom_a", **save) == 4
    assert value(samples, "ckptstore_operations_total", node="prom_b", **save) == 4
    assert value(samples, "ckptstore_bytes_total", node="prom_b", **save) == 4 * 2000 * 8
    assert value(samples, "ckptstore_last_epoch", node="prom_a", **save) == 3
    assert value(samples, "ckptstore_operation_duration_seconds_count", node="prom_a", **save) == 4
    assert value(samples, "ckptstore_operation_duration_seconds_sum", node="prom_a", **save) > 0
    assert value(samples, "ckptstore_stored_bytes", node="prom_b", **save) > 2000 * 8
    assert value(samples, "ckptstore_throughput_bytes_per_second", node="prom_b", **save) > 0
    slowest = [
        labels
        for (name, labels), _ in samples.items()
        if name == "ckptstore_slowest_node_duration_seconds"
        and ("action", "checkpoint_save") in labels
    ]
    assert len(slowest) == 1


def stats(action: str, durations: dict[str, int], error: str | None = None) -> dict[str, NodeStats]:
    return {
        f"/ckpt/{node}.5": NodeStats(
            node,
            5,
            f"/ckpt/{node}.5",
            action,
            duration_ns,
            nbytes=1 << 20,
            stored_bytes=2 << 20,
            error=error,
        )
        for node, duration_ns in durations.items()
    }


def test_failures_throughput_and_the_slowest_node() -> None:
    registry = CollectorRegistry()
    metrics = CheckpointMetrics(registry)
    get_registry().register(metrics, name="test-metrics")
    server, port = serve(0, registry=registry)
    try:
        get_registry().report(
            "checkpoint_save", stats("checkpoint_save", {"n0": 2 * 10**9, "n1": 5 * 10**8})
        )
        get_registry().report(
            "checkpoint_save", stats("checkpoint_save", {"n0": 10**8, "n1": 4 * 10**9})
        )
        get_registry().report(
            "checkpoint_save_failed", stats("checkpoint_save_failed", {"n1": 0}, "disk full")
        )
        get_registry().report("checkpoint_load", stats("checkpoint_load", {"n0": 10**9}))
        samples = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    assert (
        value(samples, "ckptstore_failures_total", action="checkpoint_save_failed", node="n1") == 1
    )
    assert (
        "ckptstore_failures_total",
        (("action", "checkpoint_save"), ("node", "n1")),
    ) not in samples
    slowest = {
        labels: sample
        for (name, labels), sample in samples.items()
        if name == "ckptstore_slowest_node_duration_seconds"
    }
    assert slowest == {
        (("action", "checkpoint_save"), ("node", "n1")): 4.0,
        (("action", "checkpoint_load"), ("node", "n0")): 1.0,
    }
    assert (
        value(samples, "ckptstore_throughput_bytes_per_second", action="checkpoint_load", node="n0")
        == 1 << 20
    )
    assert value(samples, "ckptstore_bytes_total", action="checkpoint_save", node="n0") == 2 << 20
    assert (
        value(
            samples,
            "ckptstore_operation_duration_seconds_bucket",
            action="checkpoint_save",
            node="n1",
            le="5.0",
        )
        == 2
    )


def test_serving_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptstore_prometheus import plugin

    probe_server, port = serve(0)
    probe_server.shutdown()
    probe_server.server_close()  # free the port again; the plugin binds it next
    monkeypatch.setenv(plugin.PORT_ENV, str(port))
    monkeypatch.setattr(plugin, "_server", None)
    get_registry().report("checkpoint_upload", stats("checkpoint_upload", {"env_node": 10**6}))
    try:
        samples = scrape(port)
    finally:
        assert plugin._server is not None
        plugin._server.shutdown()
        plugin._server.server_close()
    assert (
        value(samples, "ckptstore_operations_total", action="checkpoint_upload", node="env_node")
        == 1
    )
