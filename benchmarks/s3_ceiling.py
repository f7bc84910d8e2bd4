"""The S3 server's own ceiling: one large object up and down with a bare HTTP client,
with the best parallelism.

Upload: one PUT of the whole object, and multipart uploads of 2, 4 and 8 parts sent in
parallel (initiate and complete included). Download: one GET, and 2, 4 and 8 ranged
GETs in parallel into one preallocated buffer. The ceiling is the fastest of each; no
client library can beat it on the same server. Requests carry a fixed unsigned
authorization header (moto does not check signatures).
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

KEY = "bench"
MIN_PART = 5 << 20  # S3's smallest part (but the last)
PARALLELISM = (1, 2, 4, 8)
FAKE_AUTH = {
    "Authorization": f"AWS4-HMAC-SHA256 Credential={KEY}/20240101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0",
    "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
}


@dataclass(frozen=True)
class Ceiling:
    """The best upload and download of one object, and how each was done."""

    nbytes: int
    put_seconds: float
    put_method: str
    get_seconds: float
    get_method: str


class _Client:
    """Bare HTTP requests to one bucket on one endpoint (a new connection per request)."""

    def __init__(self, endpoint: str, bucket: str) -> None:
        parsed = urllib.parse.urlsplit(endpoint)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port
        self.bucket = bucket

    def request(
        self,
        method: str,
        key: str,
        query: str = "",
        body: bytes | memoryview | None = None,
        headers: dict[str, str] | None = None,
        into: memoryview | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=600)
        try:
            path = f"/{self.bucket}/{key}" + (f"?{query}" if query else "")
            connection.request(method, path, body=body, headers={**FAKE_AUTH, **(headers or {})})
            response = connection.getresponse()
            if into is not None and response.status in (200, 206):
                view = into
                while view:
                    count = response.readinto(view)
                    if not count:
                        raise RuntimeError(f"{method} {path}: response ended early")
                    view = view[count:]
                payload = b""
            else:
                payload = response.read()
            if response.status not in (200, 204, 206):
                raise RuntimeError(f"{method} {path}: HTTP {response.status} {payload[:200]!r}")
            return response.status, dict(response.getheaders()), payload
        finally:
            connection.close()


def _parts(nbytes: int, parallel: int) -> list[tuple[int, int]]:
    size = -(-nbytes // parallel)
    return [(start, min(size, nbytes - start)) for start in range(0, nbytes, size)]


def _multipart_put(client: _Client, key: str, data: memoryview, parallel: int) -> None:
    _, _, payload = client.request("POST", key, "uploads")
    upload_id = next(
        element.text
        for element in ElementTree.fromstring(payload).iter()
        if element.tag.endswith("UploadId")
    )
    parts = _parts(len(data), parallel)

    def send(number: int, start: int, length: int) -> str:
        query = f"partNumber={number}&uploadId={upload_id}"
        _, headers, _ = client.request("PUT", key, query, data[start : start + length])
        return next(value for name, value in headers.items() if name.lower() == "etag")

    with ThreadPoolExecutor(parallel) as pool:
        etags = list(pool.map(lambda part: send(part[0] + 1, *part[1]), enumerate(parts)))
    body = "".join(
        f"<Part><PartNumber>{number}</PartNumber><ETag>{etag}</ETag></Part>"
        for number, etag in enumerate(etags, 1)
    )
    client.request(
        "POST",
        key,
        f"uploadId={upload_id}",
        f"<CompleteMultipartUpload>{body}</CompleteMultipartUpload>".encode(),
    )


def _parallel_get(client: _Client, key: str, target: memoryview, parallel: int) -> None:
    def fetch(start: int, length: int) -> None:
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        client.request("GET", key, headers=headers, into=target[start : start + length])

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda part: fetch(*part), _parts(len(target), parallel)))


def measure_ceiling(endpoint: str, bucket: str, nbytes: int, repeat: int = 1) -> Ceiling:
    """Upload and download one ``nbytes`` object every way, ``repeat`` times; the best."""
    client = _Client(endpoint, bucket)
    data = memoryview(np.random.default_rng(1).bytes(nbytes))
    target = np.ones(nbytes, dtype=np.uint8)
    puts: dict[str, float] = {}
    gets: dict[str, float] = {}
    for _ in range(repeat):
        for parallel in PARALLELISM:
            if parallel > 1 and nbytes // parallel < MIN_PART:
                continue
            key = f"ceiling-{parallel}"
            method = "one PUT" if parallel == 1 else f"multipart, {parallel} parts in parallel"
            started = time.perf_counter()
            if parallel == 1:
                client.request("PUT", key, body=data)
            else:
                _multipart_put(client, key, data, parallel)
            seconds = time.perf_counter() - started
            puts[method] = min(puts.get(method, seconds), seconds)

            method = "one GET" if parallel == 1 else f"{parallel} ranged GETs in parallel"
            started = time.perf_counter()
            if parallel == 1:
                client.request("GET", key, into=target.data)
            else:
                _parallel_get(client, key, target.data, parallel)
            seconds = time.perf_counter() - started
            gets[method] = min(gets.get(method, seconds), seconds)
            if target[:4096].tobytes() != bytes(data[:4096]) or target[-1] != data[-1]:
                raise RuntimeError(f"the ceiling object {key} came back different")
            client.request("DELETE", key)
    put_method, put_seconds = min(puts.items(), key=lambda item: item[1])
    get_method, get_seconds = min(gets.items(), key=lambda item: item[1])
    return Ceiling(nbytes, put_seconds, put_method, get_seconds, get_method)
