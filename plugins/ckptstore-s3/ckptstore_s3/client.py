"""The S3 requests a checkpoint needs, each retried on its own, on s3fs's event loop.

Only object-level calls are made on the save and resume paths (PUT, GET with a range,
HEAD, DELETE, multipart); listing is confined to :meth:`S3Client.list_keys`, which only
operator tools reach.

Example::

    client = S3Client(fs, options, "bucket", "s3://bucket/run")
    client.run(lambda: client.put("run/a", b"data"))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import fsspec.asyn

from ckptstore_s3.body import PartsReader
from ckptstore_s3.options import S3Options
from ckptstore_s3.retry import RequestError, call_with_retries

__all__ = ["MissingObjectError", "S3Client", "gather_all"]

T = TypeVar("T")
Body = bytes | bytearray | PartsReader
"""What a PUT sends: small bodies as bytes, large ones streamed from memory."""
_DELETE_BATCH = 1000
_READ_PIECE = 4 << 20


class MissingObjectError(RequestError, FileNotFoundError):
    """The object (not the bucket) does not exist.

    Example::

        except MissingObjectError: return None
    """


class S3Client:
    """Retried S3 calls on one bucket through an s3fs filesystem's aiobotocore client.

    Example::

        client.run(lambda: client.head("run/_ckptstore/catalog.json"))
    """

    def __init__(self, fs: Any, options: S3Options, bucket: str, display_url: str) -> None:
        self.fs = fs
        self.options = options
        self.bucket = bucket
        self.display_url = display_url
        self.endpoint = options.endpoint_url or "AWS S3"

    def run(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run ``factory()`` on the filesystem's event loop and wait for its result."""
        result: T = fsspec.asyn.sync(self.fs.loop, factory)
        return result

    def submit(self, factory: Callable[[], Awaitable[T]]) -> Any:
        """Start ``factory()`` on the event loop; returns a concurrent future."""
        return asyncio.run_coroutine_threadsafe(_call(factory), self.fs.loop)

    def describe(self, action: str, key: str) -> str:
        return f"{action} s3://{self.bucket}/{key}"

    async def call(self, method: str, describe: str, **params: Any) -> dict[str, Any]:
        """One S3 API call on the bucket, retried by the options' policy."""

        body = params.get("Body")

        async def attempt() -> dict[str, Any]:
            if isinstance(body, PartsReader):
                body.seek(0)  # a retry sends the whole body again
            client = await self.fs.set_session()
            response: dict[str, Any] = await getattr(client, method)(Bucket=self.bucket, **params)
            return response

        try:
            return await call_with_retries(
                attempt,
                self.options.retry,
                describe=describe,
                endpoint=self.endpoint,
                secrets=self.options.secrets(),
            )
        except RequestError as error:
            if error.status == 404 and error.code in ("NoSuchKey", "404", "NoSuchUpload"):
                raise MissingObjectError(
                    str(error),
                    status=error.status,
                    code=error.code,
                    attempts=error.attempts,
                    retryable=False,
                ) from None
            raise

    # -- objects ----------------------------------------------------------------------

    async def put(self, key: str, body: Body) -> None:
        await self.call("put_object", self.describe("PUT", key), Key=key, Body=body)

    async def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata, or ``None`` if it does not exist."""
        try:
            return await self.call("head_object", self.describe("HEAD", key), Key=key)
        except MissingObjectError:
            return None

    async def get(self, key: str, offset: int, length: int | None) -> bytes:
        """``length`` bytes (all, if ``None``) of ``key`` from ``offset``."""
        if length is None:
            ranged = {"Range": f"bytes={offset}-"} if offset else {}
        else:
            ranged = {"Range": f"bytes={offset}-{offset + length - 1}"}

        async def attempt() -> bytes:
            response = await self._get_response(key, ranged)
            async with response["Body"] as body:
                data: bytes = await body.read()
                return data

        return await self._retried_read(key, attempt, b"")

    async def get_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> int:
        """Stream ``key`` from ``offset`` into ``targets``; returns the bytes received
        (fewer than asked when the object is too short)."""
        total = sum(target.nbytes for target in targets)
        ranged = {"Range": f"bytes={offset}-{offset + total - 1}"}
        flat = [t.cast("B") if t.format != "B" or t.ndim != 1 else t for t in targets]

        async def attempt() -> int:
            response = await self._get_response(key, ranged)
            received = 0
            async with response["Body"] as body:
                for target in flat:
                    filled = 0
                    while filled < target.nbytes:
                        piece = await body.read(min(_READ_PIECE, target.nbytes - filled))
                        if not piece:
                            return received
                        target[filled : filled + len(piece)] = piece
                        filled += len(piece)
                        received += len(piece)
            return received

        return await self._retried_read(key, attempt, 0)

    async def _get_response(self, key: str, ranged: dict[str, str]) -> dict[str, Any]:
        client = await self.fs.set_session()
        response: dict[str, Any] = await client.get_object(Bucket=self.bucket, Key=key, **ranged)
        return response

    async def _retried_read(self, key: str, attempt: Callable[[], Awaitable[T]], empty: T) -> T:
        """A GET whose body is read inside the attempt, so that a connection dropped
        mid-body is retried like any other transient failure. A range that starts past
        the end of the object gives ``empty`` (the caller reports the object as short)."""
        try:
            return await call_with_retries(
                attempt,
                self.options.retry,
                describe=self.describe("GET", key),
                endpoint=self.endpoint,
                secrets=self.options.secrets(),
            )
        except RequestError as error:
            if error.code == "InvalidRange":
                return empty
            if error.status == 404 and error.code in ("NoSuchKey", "404"):
                raise MissingObjectError(
                    str(error),
                    status=404,
                    code=error.code,
                    attempts=error.attempts,
                    retryable=False,
                ) from None
            raise

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (missing ones are ignored), 1000 per request."""
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = keys[start : start + _DELETE_BATCH]
            response = await self.call(
                "delete_objects",
                self.describe("DELETE", batch[0])
                + (f" and {len(batch) - 1} more" if len(batch) > 1 else ""),
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
            errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise RequestError(
                    f"DELETE s3://{self.bucket}/{first.get('Key')} failed: {first.get('Code')} "
                    f"({first.get('Message')}); {len(errors)} of {len(batch)} objects not deleted",
                    status=None,
                    code=str(first.get("Code")),
                    attempts=1,
                    retryable=False,
                )

    async def bucket_exists(self) -> bool:
        """HEAD the bucket (never a listing)."""
        try:
            await self.call("head_bucket", f"HEAD s3://{self.bucket}")
        except RequestError:
            return False
        return True

    # -- multipart --------------------------------------------------------------------

    async def create_upload(self, key: str) -> str:
        response = await self.call(
            "create_multipart_upload", self.describe("start multipart upload of", key), Key=key
        )
        return str(response["UploadId"])

    async def upload_part(
        self, key: str, upload_id: str, number: int, body: Body
    ) -> dict[str, Any]:
        response = await self.call(
            "upload_part",
            self.describe(f"PUT part {number} of", key),
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body,
        )
        return {"PartNumber": number, "ETag": response["ETag"]}

    async def complete_upload(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        await self.call(
            "complete_multipart_upload",
            self.describe("complete multipart upload of", key),
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": sorted(parts, key=lambda part: part["PartNumber"])},
        )

    async def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort a multipart upload; failures are ignored (the bucket's lifecycle rule
        for incomplete uploads cleans up what this cannot)."""
        try:
            await self.call(
                "abort_multipart_upload",
                self.describe("abort multipart upload of", key),
                Key=key,
                UploadId=upload_id,
            )
        except RequestError:
            return

    async def upload_multipart(self, key: str, count: int, part: Callable[[int], Body]) -> None:
        """Upload ``count`` parts (``part(i)`` builds part ``i``'s bytes when its turn
        comes), at most ``max_concurrency`` at once, each retried on its own."""
        upload_id = await self.create_upload(key)
        limit = asyncio.Semaphore(self.options.max_concurrency)

        async def one(index: int) -> dict[str, Any]:
            async with limit:
                return await self.upload_part(key, upload_id, index + 1, part(index))

        try:
            parts = await gather_all([partial(one, i) for i in range(count)])
            await self.complete_upload(key, upload_id, parts)
        except BaseException:
            await asyncio.shield(self.abort_upload(key, upload_id))
            raise

    # -- listing (operator tools only) ------------------------------------------------

    async def list_keys(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (a LIST: never on save or resume)."""
        keys: list[str] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Prefix": prefix}
            if token:
                params["ContinuationToken"] = token
            response = await self.call(
                "list_objects_v2", f"LIST s3://{self.bucket}/{prefix}", **params
            )
            keys.extend(item["Key"] for item in response.get("Contents", []))
            if not response.get("IsTruncated"):
                return keys
            token = response.get("NextContinuationToken")


async def _call(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


async def gather_all(factories: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run every coroutine; on the first failure cancel the others and raise it."""
    tasks = [asyncio.ensure_future(factory()) for factory in factories]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
