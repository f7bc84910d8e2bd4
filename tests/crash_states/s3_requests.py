"""Record the S3 requests of a save and commit, and replay a prefix of them.

The S3 plugin sends every request through one method, ``S3Client.call(method, ...)``.
:func:`recording_requests` wraps it and keeps each request that changes the bucket
(``put_object``, conditional ones included, ``delete_objects`` and the four requests of
a multipart upload), with its body's bytes, in the order the store answered them.
Requests the store refused (a conditional PUT that lost) changed nothing and are left
out. A crash after request ``k`` leaves the bucket as it was plus the first ``k``
requests: :func:`replay` sends exactly those to a fresh bucket holding the objects from
before the save. A multipart upload started but not completed is left in progress (its
parts stored, no object), as a crash leaves it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

MUTATING = frozenset(
    {
        "put_object",
        "delete_objects",
        "create_multipart_upload",
        "upload_part",
        "complete_multipart_upload",
        "abort_multipart_upload",
    }
)


@dataclass(frozen=True)
class Request:
    """One request that changed the bucket: the client method, its parameters (a body
    as bytes) and, for ``create_multipart_upload``, the upload id it returned."""

    method: str
    params: dict[str, Any]
    upload_id: str = ""

    def describe(self) -> str:
        key = self.params.get("Key", "")
        if self.method == "delete_objects":
            key = ", ".join(o["Key"] for o in self.params["Delete"]["Objects"])
        conditions = [f"{h}" for h in ("IfNoneMatch", "IfMatch") if h in self.params]
        extra = f" ({', '.join(conditions)})" if conditions else ""
        part = f" part {self.params['PartNumber']}" if "PartNumber" in self.params else ""
        return f"{self.method}{part} {key}{extra}"


def _body_bytes(body: Any) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    body.seek(0)
    data = body.read()
    body.seek(0)
    return bytes(data)


@contextmanager
def recording_requests() -> Iterator[list[Request]]:
    """Record the bucket-changing requests of the S3 plugin (module docstring)."""
    from ckptstore_s3.client import S3Client

    original = S3Client.call
    requests: list[Request] = []
    lock = threading.Lock()

    async def call(self: Any, method: str, describe: str, **params: Any) -> dict[str, Any]:
        recorded = dict(params)
        if "Body" in recorded:
            recorded["Body"] = _body_bytes(recorded["Body"])
        response: dict[str, Any] = await original(self, method, describe, **params)
        if method in MUTATING:
            with lock:
                requests.append(Request(method, recorded, str(response.get("UploadId", ""))))
        return response

    with mock.patch.object(S3Client, "call", call):
        yield requests


def copy_objects(client: Any, objects: dict[str, bytes], bucket: str) -> None:
    """Create ``bucket`` holding ``objects``."""
    client.create_bucket(Bucket=bucket)
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def read_objects(client: Any, bucket: str) -> dict[str, bytes]:
    """Every object of ``bucket``, key to bytes."""
    objects: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            key = item["Key"]
            objects[key] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return objects


def replay(client: Any, requests: list[Request], bucket: str) -> None:
    """Send ``requests`` to ``bucket`` in order (multipart upload ids mapped to the new
    uploads')."""
    uploads: dict[str, str] = {}
    etags: dict[tuple[str, int], str] = {}
    for request in requests:
        params = dict(request.params)
        if "UploadId" in params:
            params["UploadId"] = uploads[params["UploadId"]]
        if request.method == "complete_multipart_upload":
            parts = [
                {
                    "PartNumber": p["PartNumber"],
                    "ETag": etags[(params["UploadId"], p["PartNumber"])],
                }
                for p in params["MultipartUpload"]["Parts"]
            ]
            params["MultipartUpload"] = {"Parts": parts}
        response = getattr(client, request.method)(Bucket=bucket, **params)
        if request.method == "create_multipart_upload":
            uploads[request.upload_id] = response["UploadId"]
        elif request.method == "upload_part":
            etags[(params["UploadId"], params["PartNumber"])] = response["ETag"]


def empty_bucket(client: Any, bucket: str) -> None:
    """Delete every object and upload of ``bucket``, then the bucket."""
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    keys = [{"Key": key} for key in read_keys(client, bucket)]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000]})
    client.delete_bucket(Bucket=bucket)


def read_keys(client: Any, bucket: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys
