"""A small HTTP proxy in front of a local object store that injects faults and records
every request.

Point a client at :attr:`FaultProxy.endpoint_url` instead of the server's. Then:

* :meth:`FaultProxy.fail_next` answers the next N matching requests with an error
  status (503 ``SlowDown`` by default) without passing them on;
* :meth:`FaultProxy.reset_next` drops the connection (TCP reset) instead of answering;
* :meth:`FaultProxy.stall_next` holds requests for a while before passing them on;
* :meth:`FaultProxy.outage` / :meth:`FaultProxy.restore` make the server unreachable
  (every request is reset) and reachable again; ``outage_after`` starts an outage when
  the N-th matching request arrives.

A fault applies to requests of the given ``methods`` whose target (path and query,
URL-decoded) contains ``path`` (all, by default; a ``*`` in it stands for any run of
characters, e.g. ``node.3/*/manifest`` for any save attempt); ``after=K`` lets K matching requests
through first. Every request is recorded (:attr:`FaultProxy.requests`), so a test can
count them by method or check that no listing happened (:meth:`FaultProxy.listings`).

Example::

    >>> import boto3
    >>> from contextlib import ExitStack
    >>> from ckptstore.testing import in_process_moto
    >>> from ckptstore_s3 import S3Path
    >>> stack = ExitStack()
    >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
    >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
    >>> _ = s3.create_bucket(Bucket="proxied")
    >>> proxy = stack.enter_context(FaultProxy(moto.endpoint_url, flavour="s3"))
    >>> storage = S3Path("s3://proxied/run", endpoint_url=proxy.endpoint_url)
    >>> proxy.fail_next(3, status=503, methods={"PUT"})
    >>> storage.write_bytes("a", b"x")  # the next three PUTs get "503 SlowDown": retried
    >>> proxy.count("PUT"), proxy.count("PUT", outcome="failed"), proxy.listings()
    (4, 3, [])
    >>> stack.close()
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import struct
import threading
import urllib.parse
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal, Self

from ckptstore.testing.servers import LOOPBACK, Service, wait_for

__all__ = ["FaultProxy", "RecordedRequest"]

Flavour = Literal["s3", "gcs"]
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "content-length",
    }
)
_S3_LIST_PARAMS = frozenset(
    {
        "list-type",
        "prefix",
        "delimiter",
        "max-keys",
        "continuation-token",
        "start-after",
        "encoding-type",
        "marker",
        "fetch-owner",
        "uploads",
        "versions",
        "key-marker",
        "upload-id-marker",
        "version-id-marker",
    }
)
_GCS_REASONS = {  # the first error's reason, as GCS's JSON API gives it
    401: "required",
    403: "forbidden",
    404: "notFound",
    429: "rateLimitExceeded",
}
_GCS_LISTING = re.compile(r"^(/storage/v1)?/b/[^/]+/o/?$")
_GCS_UPLOAD = re.compile(r"^/upload/storage/v1/b/([^/]+)/o/?$")
_S3_CODES = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "AccessDenied",
    404: "NoSuchKey",
    429: "TooManyRequests",
    500: "InternalError",
    502: "BadGateway",
    503: "SlowDown",
    504: "GatewayTimeout",
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request that reached the proxy, and what the proxy did with it.

    ``outcome`` is ``"forwarded"``, ``"failed"`` (an injected status), ``"reset"``,
    ``"stalled"`` (then forwarded) or ``"unreachable"`` (outage or server down).
    """

    method: str
    path: str
    query: str
    status: int | None
    outcome: str

    @property
    def params(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.query, keep_blank_values=True)


def _contains(target: str, pattern: str) -> bool:
    """Whether ``target`` contains ``pattern``, each ``*`` in it any run of characters."""
    return re.search(".*".join(map(re.escape, pattern.split("*"))), target) is not None


@dataclass
class _Rule:
    kind: str
    remaining: int
    skip: int
    methods: frozenset[str] | None
    status: int = 503
    seconds: float = 0.0
    path: str | None = None
    matched: int = field(default=0)

    def take(self, method: str, path: str) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        if self.path is not None and not _contains(path, self.path):
            return False
        if self.skip:
            self.skip -= 1
            return False
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        self.matched += 1
        return True


class FaultProxy(Service):
    """An HTTP proxy on 127.0.0.1 that forwards to ``upstream`` and injects faults.

    ``flavour`` (``"s3"`` or ``"gcs"``) shapes injected error bodies and what counts as
    a listing.

    Example::

        >>> import boto3
        >>> from contextlib import ExitStack
        >>> from ckptstore.testing import in_process_moto
        >>> from ckptstore_s3 import S3Path
        >>> stack = ExitStack()
        >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
        >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
        >>> _ = s3.create_bucket(Bucket="proxied-resets")
        >>> proxy = FaultProxy(moto.endpoint_url).start()
        >>> storage = S3Path("s3://proxied-resets/run", endpoint_url=proxy.endpoint_url)
        >>> storage.write_bytes("a", b"x")
        >>> proxy.reset_next(2)  # drop the next two connections
        >>> storage.read_bytes("a")  # retried through the resets
        b'x'
        >>> proxy.stop()
        >>> stack.close()
    """

    def __init__(self, upstream: str, *, flavour: Flavour = "s3", host: str = LOOPBACK) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = upstream
        self.upstream_host: str = parsed.hostname
        self.upstream_port: int = parsed.port
        self.flavour: Flavour = flavour
        self.host = host
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._records: list[RecordedRequest] = []
        self._down = False
        self._stopping = threading.Event()
        self._held: list[threading.Event] = []
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Start listening on a free port of ``host``."""
        if self._server is None:
            self._stopping.clear()
            self._server = _ProxyServer((self.host, 0), self)
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="ckptstore-fault-proxy",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection."""
        self._stopping.set()
        self.release()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.close_all()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``: give this to the client instead of the server's."""
        if self._server is None:
            raise RuntimeError("the fault proxy is not running; call start()")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def __repr__(self) -> str:
        where = self.endpoint_url if self._server is not None else "stopped"
        return f"FaultProxy({where} -> {self.upstream}, {len(self._records)} requests)"

    # -- faults -----------------------------------------------------------------------

    def _add(self, rule: _Rule) -> None:
        if rule.remaining < 0 or rule.skip < 0:
            raise ValueError("count and after must not be negative")
        with self._lock:
            self._rules.append(rule)

    @staticmethod
    def _methods(methods: Collection[str] | None) -> frozenset[str] | None:
        return None if methods is None else frozenset(m.upper() for m in methods)

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 503,
        methods: Collection[str] | None = None,
        path: str | None = None,
        after: int = 0,
    ) -> None:
        """Answer the next ``count`` matching requests with ``status`` (503: S3's
        ``SlowDown``, GCS's ``backendError``) instead of passing them on."""
        self._add(_Rule("fail", count, after, self._methods(methods), status=status, path=path))

    def reset_next(
        self,
        count: int = 1,
        *,
        methods: Collection[str] | None = None,
        path: str | None = None,
        after: int = 0,
    ) -> None:
        """Drop the connection (TCP reset, no answer) on the next ``count`` requests."""
        self._add(_Rule("reset", count, after, self._methods(methods), path=path))

    def stall_next(
        self,
        count: int = 1,
        *,
        seconds: float,
        methods: Collection[str] | None = None,
        path: str | None = None,
        after: int = 0,
    ) -> None:
        """Hold the next ``count`` requests for ``seconds`` (or until :meth:`release`)
        before passing them on; a client with a shorter read timeout gives up and
        retries."""
        self._add(_Rule("stall", count, after, self._methods(methods), seconds=seconds, path=path))

    def outage_after(
        self, count: int, *, methods: Collection[str] | None = None, path: str | None = None
    ) -> None:
        """Start an :meth:`outage` when the ``count``-th matching request arrives (that
        request is already refused)."""
        self._add(_Rule("outage", 1, max(0, count - 1), self._methods(methods), path=path))

    def outage(self) -> None:
        """Make the server unreachable: every request is reset until :meth:`restore`."""
        with self._lock:
            self._down = True

    def restore(self) -> None:
        """End an outage; also clears pending faults."""
        with self._lock:
            self._down = False
            self._rules.clear()

    def clear_faults(self) -> None:
        """Forget pending faults (requests already held by a stall are released)."""
        with self._lock:
            self._rules.clear()

    def release(self) -> None:
        """Let every request held by a stall go on now."""
        with self._lock:
            held, self._held = self._held, []
        for event in held:
            event.set()

    @property
    def holding(self) -> int:
        """How many requests a stall is holding right now."""
        with self._lock:
            return len(self._held)

    def _hold(self, seconds: float) -> None:
        event = threading.Event()
        with self._lock:
            self._held.append(event)
        if not self._stopping.is_set():
            event.wait(seconds)
        with self._lock:
            if event in self._held:
                self._held.remove(event)

    @property
    def down(self) -> bool:
        """Whether an outage is in progress."""
        return self._down

    # -- records ----------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request so far, in arrival order."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        """Forget the requests recorded so far."""
        with self._lock:
            self._records.clear()

    def count(self, method: str | None = None, *, outcome: str | None = None) -> int:
        """How many requests (of ``method``, with ``outcome``) arrived."""
        return sum(
            1
            for r in self.requests
            if (method is None or r.method == method.upper())
            and (outcome is None or r.outcome == outcome)
        )

    def methods(self) -> Counter[str]:
        """Requests per HTTP method."""
        return Counter(r.method for r in self.requests)

    def listings(self) -> list[RecordedRequest]:
        """The requests that listed a bucket's objects."""
        return [r for r in self.requests if self.is_listing(r)]

    def is_listing(self, request: RecordedRequest) -> bool:
        """Whether ``request`` lists objects (S3 ListObjects/ListMultipartUploads, GCS
        objects.list)."""
        if request.method != "GET":
            return False
        if self.flavour == "gcs":
            return bool(_GCS_LISTING.match(request.path))
        bucket_only = "/" not in request.path.strip("/")
        return bucket_only and set(request.params) <= _S3_LIST_PARAMS

    def uploads(self) -> list[str]:
        """Where each upload request (parts included) wrote, in arrival order, as
        ``/bucket/key``: S3 PUTs, GCS media uploads."""
        return [target for r in self.requests if (target := self.upload_target(r)) is not None]

    def upload_target(self, request: RecordedRequest) -> str | None:
        """``/bucket/key`` if ``request`` uploads an object (or a part of one)."""
        if self.flavour == "gcs":
            match = _GCS_UPLOAD.match(request.path)
            if request.method != "POST" or match is None:
                return None
            return f"/{match.group(1)}/{request.params.get('name', [''])[0]}"
        return request.path if request.method == "PUT" else None

    def wait_for_requests(
        self, count: int, *, method: str | None = None, timeout: float = 30.0
    ) -> None:
        """Block until ``count`` requests (of ``method``) have arrived."""
        wait_for(
            lambda: self.count(method) >= count,
            timeout=timeout,
            what=f"{count} {method or ''} requests through the fault proxy",
        )

    # -- used by the handler ----------------------------------------------------------

    def _decide(self, method: str, target: str) -> _Rule | None:
        path = urllib.parse.unquote(target)  # the query too: GCS uploads name objects there
        with self._lock:
            if self._down:
                return _Rule("unreachable", 0, 0, None)
            for rule in self._rules:
                if rule.take(method, path):
                    if rule.kind == "outage":
                        self._down = True
                        return _Rule("unreachable", 0, 0, None)
                    return rule
            self._rules = [rule for rule in self._rules if rule.remaining > 0]
        return None

    def _record(self, method: str, target: str, status: int | None, outcome: str) -> None:
        path, _, query = target.partition("?")
        with self._lock:
            self._records.append(RecordedRequest(method, path, query, status, outcome))

    def _error_body(self, status: int) -> tuple[bytes, str]:
        if self.flavour == "gcs":
            document = {
                "error": {
                    "code": status,
                    "message": "injected by ckptstore's fault proxy",
                    "errors": [
                        {
                            "reason": _GCS_REASONS.get(status, "backendError"),
                            "message": "injected fault",
                        }
                    ],
                }
            }
            return json.dumps(document).encode(), "application/json"
        code = _S3_CODES.get(status, "InternalError" if status >= 500 else "BadRequest")
        slow_down = "Please reduce your request rate " if status in (429, 503) else ""
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{code}</Code><Message>{slow_down}"
            "(injected by ckptstore's fault proxy).</Message>"
            "<RequestId>ckptstore-fault-proxy</RequestId></Error>"
        )
        return xml.encode(), "application/xml"


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet: a client that gave up on a stalled request is expected."""

    def close_all(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for connection in connections:
            _reset(connection)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        if self._upstream is not None:
            self._upstream.close()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: requests are recorded, not printed."""

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            pieces: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(pieces)
                pieces.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        proxy = self.server.proxy
        method = self.command
        body = self._read_body()
        rule = proxy._decide(method, self.path)
        if rule is not None and rule.kind == "stall":
            proxy._hold(rule.seconds)
        if rule is not None and rule.kind in ("reset", "unreachable"):
            proxy._record(
                method, self.path, None, "reset" if rule.kind == "reset" else "unreachable"
            )
            self._drop()
            return
        if rule is not None and rule.kind == "fail":
            proxy._record(method, self.path, rule.status, "failed")
            payload, content_type = proxy._error_body(rule.status)
            self.send_response(rule.status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(payload)
            return
        outcome = "stalled" if rule is not None else "forwarded"
        try:
            status, reason, headers, data = self._forward(method, body)
        except (OSError, http.client.HTTPException):
            proxy._record(method, self.path, None, "unreachable")
            self._drop()
            return
        proxy._record(method, self.path, status, outcome)
        self.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if method == "HEAD":
            upstream_length = next(
                (v for n, v in headers if n.lower() == "content-length"), str(len(data))
            )
            self.send_header("Content-Length", upstream_length)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD" and data:
            self.wfile.write(data)

    def _forward(self, method: str, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        proxy = self.server.proxy
        headers = {
            name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP
        }
        if body or method in ("PUT", "POST", "PATCH"):
            headers["Content-Length"] = str(len(body))
        for attempt in range(2):
            upstream = self._upstream or http.client.HTTPConnection(
                proxy.upstream_host, proxy.upstream_port, timeout=300
            )
            self._upstream = upstream
            try:
                upstream.request(method, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                if response.will_close:
                    upstream.close()
                    self._upstream = None
                return response.status, response.reason, response.getheaders(), data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                # a kept-alive upstream connection went stale: retry once on a new one
                upstream.close()
                self._upstream = None
                if attempt == 1:
                    raise
            except OSError:
                upstream.close()
                self._upstream = None
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop(self) -> None:
        self.close_connection = True
        _reset(self.connection)


def _reset(connection: socket.socket) -> None:
    """Close ``connection`` with a TCP reset (what a crashed server looks like)."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        connection.close()
