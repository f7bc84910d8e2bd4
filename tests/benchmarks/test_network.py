"""The benchmark's network helpers: a namespace joined by a veth pair (created and
removed again) and the user-space relay that adds round-trip latency."""

from __future__ import annotations

import http.client
import os
import subprocess
import time

from benchmarks.network import LatencyRelay, NetworkNamespace
from ckptstore.testing import MotoServer

AUTH = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=k/20240101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0"
}


def timed_request(
    port: int, method: str, target: str, body: bytes | None = None
) -> tuple[float, int, bytes]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, target, body=body, headers=AUTH)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return time.perf_counter() - started, response.status, data


def test_the_relay_adds_two_round_trips_per_new_connection_and_keeps_data(
    s3_server: MotoServer,
) -> None:
    s3_server.create_bucket("relayed")
    direct = min(timed_request(s3_server.port or 0, "HEAD", "/relayed")[0] for _ in range(3))
    payload = os.urandom(3 << 20)
    with LatencyRelay("127.0.0.1", s3_server.port or 0, delay_ms=50) as relay:
        relayed = min(timed_request(relay.port, "HEAD", "/relayed")[0] for _ in range(3))
        assert relayed >= 0.1 > direct  # 50 ms to connect + 50 ms request round trip
        assert timed_request(relay.port, "PUT", "/relayed/blob", payload)[1] == 200
        _, status, data = timed_request(relay.port, "GET", "/relayed/blob")
        assert (status, data == payload) == (200, True)
    s3_server.delete_bucket("relayed")


def test_a_namespace_is_reachable_over_its_veth_and_removed_after() -> None:
    with NetworkNamespace("cktest") as network:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert network.name in names
        server = MotoServer(
            host=network.inner_address, port=9400, command_prefix=network.exec_prefix
        )
        with server:
            assert server.endpoint_url == f"http://{network.inner_address}:9400"
            assert server.answers()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert network.name not in names
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert network._outer not in links


def test_the_relay_caps_the_bandwidth_and_keeps_data(s3_server: MotoServer) -> None:
    s3_server.create_bucket("capped")
    payload = os.urandom(8 << 20)
    with LatencyRelay("127.0.0.1", s3_server.port or 0, delay_ms=0, rate_mibps=16) as relay:
        assert timed_request(relay.port, "PUT", "/capped/blob", payload)[1] == 200
        seconds, status, data = timed_request(relay.port, "GET", "/capped/blob")
        assert (status, data == payload) == (200, True)
        assert seconds >= 0.45  # 8 MiB at 16 MiB/s, each way
    s3_server.delete_bucket("capped")
