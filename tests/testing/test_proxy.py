"""The fault proxy forwards real HTTP to a server, injects each kind of fault on the
requests it is told to, and records what it saw (including listings)."""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Iterator

import pytest

from ckptstore.testing import FaultProxy, MotoServer, RecordedRequest, wait_for

AUTH = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=k/20240101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0"
}


def call(
    proxy: FaultProxy, method: str, target: str, body: bytes | None = None, timeout: float = 30
) -> tuple[int, bytes]:
    parsed = urllib.parse.urlsplit(proxy.endpoint_url)
    connection = http.client.HTTPConnection(
        parsed.hostname or "127.0.0.1", parsed.port, timeout=timeout
    )
    try:
        connection.request(method, target, body=body, headers=AUTH)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def proxy(s3_server: MotoServer) -> Iterator[FaultProxy]:
    s3_server.create_bucket("proxied")
    with FaultProxy(s3_server.endpoint_url) as running:
        yield running
    s3_server.delete_bucket("proxied")


def test_requests_are_forwarded_and_recorded(proxy: FaultProxy) -> None:
    assert call(proxy, "PUT", "/proxied/a/b", b"hello")[0] == 200
    assert call(proxy, "GET", "/proxied/a/b") == (200, b"hello")
    assert call(proxy, "HEAD", "/proxied/a/b")[0] == 200
    assert [(r.method, r.path, r.status, r.outcome) for r in proxy.requests] == [
        ("PUT", "/proxied/a/b", 200, "forwarded"),
        ("GET", "/proxied/a/b", 200, "forwarded"),
        ("HEAD", "/proxied/a/b", 200, "forwarded"),
    ]
    assert proxy.methods() == {"PUT": 1, "GET": 1, "HEAD": 1}
    assert proxy.uploads() == ["/proxied/a/b"]
    proxy.clear()
    assert proxy.requests == []


def test_fail_next_answers_with_an_s3_error_for_matching_requests_only(proxy: FaultProxy) -> None:
    proxy.fail_next(2, status=503, methods={"PUT"}, after=1)
    assert call(proxy, "PUT", "/proxied/k", b"1")[0] == 200  # let through by after=1
    assert call(proxy, "GET", "/proxied/k")[0] == 200  # not a PUT
    status, body = call(proxy, "PUT", "/proxied/k", b"2")
    assert status == 503
    assert b"<Code>SlowDown</Code>" in body
    assert call(proxy, "PUT", "/proxied/k", b"3")[0] == 503
    assert call(proxy, "PUT", "/proxied/k", b"4")[0] == 200  # the two faults are used up
    assert proxy.count("PUT", outcome="failed") == 2
    assert call(proxy, "GET", "/proxied/k") == (200, b"4")


def test_faults_can_target_a_path(proxy: FaultProxy) -> None:
    proxy.fail_next(5, status=500, path="commit.json")
    assert call(proxy, "PUT", "/proxied/data", b"d")[0] == 200
    status, body = call(proxy, "PUT", "/proxied/_c/epoch-1.commit.json", b"c")
    assert status == 500
    assert b"InternalError" in body


def test_a_star_in_a_faults_path_stands_for_any_run_of_characters(proxy: FaultProxy) -> None:
    proxy.fail_next(1, status=500, path="node.3/*/manifest")
    assert call(proxy, "PUT", "/proxied/node.3/manifest-x", b"m")[0] == 200  # no part between
    assert call(proxy, "PUT", "/proxied/node.4/attempt-1/manifest", b"m")[0] == 200
    assert call(proxy, "PUT", "/proxied/node.3/attempt-1/manifest", b"m")[0] == 500


def test_reset_next_drops_the_connection(proxy: FaultProxy) -> None:
    proxy.reset_next(1)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        call(proxy, "GET", "/proxied")
    assert call(proxy, "GET", "/proxied")[0] == 200
    assert [r.outcome for r in proxy.requests] == ["reset", "forwarded"]


def test_stalled_requests_are_held_until_released(proxy: FaultProxy) -> None:
    proxy.stall_next(1, seconds=60)
    results: list[int] = []
    thread = threading.Thread(target=lambda: results.append(call(proxy, "GET", "/proxied")[0]))
    thread.start()
    wait_for(lambda: proxy.holding == 1, timeout=30, what="the request to be held")
    assert results == []
    proxy.release()
    thread.join(timeout=30)
    assert results == [200]
    assert proxy.holding == 0
    assert proxy.requests[-1].outcome == "stalled"


def test_a_stalled_request_times_the_client_out(proxy: FaultProxy) -> None:
    proxy.stall_next(1, seconds=60)
    with pytest.raises(TimeoutError):
        call(proxy, "GET", "/proxied", timeout=0.3)
    proxy.release()


def test_outages_make_the_server_unreachable_until_restored(proxy: FaultProxy) -> None:
    proxy.outage_after(2, methods={"GET"})
    assert call(proxy, "GET", "/proxied")[0] == 200
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        call(proxy, "GET", "/proxied")
    assert proxy.down
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        call(proxy, "PUT", "/proxied/x", b"1")
    proxy.restore()
    assert [proxy.down] == [False]  # (a list: mypy keeps the narrowing above)
    assert call(proxy, "PUT", "/proxied/x", b"1")[0] == 200
    assert proxy.count(outcome="unreachable") == 2


def test_a_stopped_server_shows_as_unreachable(s3_server: MotoServer) -> None:
    with MotoServer() as doomed, FaultProxy(doomed.endpoint_url) as proxy:
        doomed.stop()
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            call(proxy, "GET", "/")
        assert proxy.requests[-1].outcome == "unreachable"


def test_gcs_flavour_errors_are_json() -> None:
    with MotoServer() as server, FaultProxy(server.endpoint_url, flavour="gcs") as proxy:
        proxy.fail_next(1, status=503)
        status, body = call(proxy, "GET", "/storage/v1/b/x/o/y")
        assert status == 503
        assert b'"reason": "backendError"' in body


@pytest.mark.parametrize(
    ("flavour", "method", "target", "listing"),
    [
        ("s3", "GET", "/bucket?list-type=2&prefix=run%2F", True),
        ("s3", "GET", "/bucket/", True),
        ("s3", "GET", "/bucket?uploads", True),
        ("s3", "GET", "/bucket?location", False),
        ("s3", "GET", "/bucket/run/key", False),
        ("s3", "HEAD", "/bucket", False),
        ("gcs", "GET", "/storage/v1/b/bucket/o?prefix=run", True),
        ("gcs", "GET", "/b/bucket/o", True),
        ("gcs", "GET", "/storage/v1/b/bucket/o/run%2Fkey", False),
        ("gcs", "GET", "/storage/v1/b/bucket", False),
    ],
)
def test_listings_are_recognised(
    s3_server: MotoServer, flavour: str, method: str, target: str, listing: bool
) -> None:
    with FaultProxy(s3_server.endpoint_url, flavour=flavour) as proxy:  # type: ignore[arg-type]
        call(proxy, method, target)
        assert proxy.is_listing(proxy.requests[0]) is listing
        assert len(proxy.listings()) == int(listing)


@pytest.mark.parametrize(
    ("flavour", "method", "path", "query", "target"),
    [
        ("s3", "PUT", "/bucket/run/a", "", "/bucket/run/a"),
        ("s3", "PUT", "/bucket/run/a", "partNumber=2&uploadId=u", "/bucket/run/a"),
        ("s3", "POST", "/bucket/run/a", "uploads", None),
        ("s3", "GET", "/bucket/run/a", "", None),
        (
            "gcs",
            "POST",
            "/upload/storage/v1/b/bucket/o",
            "uploadType=media&name=run%2Fa",
            "/bucket/run/a",
        ),
        ("gcs", "POST", "/storage/v1/b/bucket/o/run%2Fa/compose", "", None),
        ("gcs", "GET", "/download/storage/v1/b/bucket/o/run%2Fa", "alt=media", None),
    ],
)
def test_uploads_are_recognised(
    flavour: str, method: str, path: str, query: str, target: str | None
) -> None:
    proxy = FaultProxy("http://127.0.0.1:9", flavour=flavour)  # type: ignore[arg-type]
    assert proxy.upload_target(RecordedRequest(method, path, query, 200, "forwarded")) == target


def test_bad_upstreams_and_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        FaultProxy("s3://bucket")
    proxy = FaultProxy("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="must not be negative"):
        proxy.fail_next(-1)
    with pytest.raises(RuntimeError, match="not running"):
        _ = proxy.endpoint_url
