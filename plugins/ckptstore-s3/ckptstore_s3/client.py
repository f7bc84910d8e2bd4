"""The S3 requests a checkpoint needs, made through s3fs's aiobotocore client on its
event loop, each retried on its own (:class:`~ckptstore.object_store.ObjectStoreClient`
supplies the retries and the reads built on :meth:`S3Client.ranged_get`).

Example::

    >>> options = s3_options("client-module")  # endpoint and keys of a fresh bucket
    >>> from ckptstore_s3 import S3Path
    >>> client = S3Path("s3://client-module/run", **options).client  # an S3Client
    >>> client.run(lambda: client.put("run/a", b"data"))
    >>> client.run(lambda: client.head("run/a"))
    ObjectInfo(size=4, version='"8d777f385d3dfec8815d20f7496026dc"')
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from ckptstore.errors import InProcessMockError
from ckptstore.object_store import (
    Body,
    MissingObjectError,
    ObjectInfo,
    ObjectStoreClient,
    PartsReader,
    Read,
    RequestError,
    StreamedBody,
    declared_size,
    keys_around,
)
from ckptstore_s3.errors import S3ErrorRules
from ckptstore_s3.moto_mock import intercepted, mock_aws_active, server_endpoint
from ckptstore_s3.multipart import S3MultipartUpload
from ckptstore_s3.options import S3Options

__all__ = ["S3Client"]

T = TypeVar("T")
_LAST_CHARACTER = "\U0010ffff"
"""The largest code point: ``skip`` followed by it sorts after every key under ``skip``
that ckptstore writes (UTF-8 order is code point order)."""
_DELETE_BATCH = 1000
_CONFLICT_ATTEMPTS = 5

_MOCK_AWS_SYMPTOMS = (
    # aiobotocore awaiting the bytes of moto's synchronous AWSResponse (aiobotocore#1320)
    "can't be used in 'await' expression",
    # moto reading an aiobotocore 3 request body without awaiting it (moto#9784)
    "'coroutine' object has no attribute",
)


@contextlib.contextmanager
def _refuse_mock_aws(describe: str) -> Iterator[None]:
    """Turn the failures of moto's in-process ``mock_aws`` answering an aiobotocore
    request (one :meth:`S3Client._filesystem` did not send to moto's server) into
    :class:`~ckptstore.errors.InProcessMockError`, which says what to use."""
    try:
        yield
    except (TypeError, AttributeError) as error:
        if "moto" in sys.modules and any(s in str(error) for s in _MOCK_AWS_SYMPTOMS):
            raise InProcessMockError(describe) from error
        raise


class S3Client(ObjectStoreClient):
    """Requests made through the aiobotocore client of an s3fs filesystem.

    Example::

        >>> options = s3_options("client-call")  # endpoint and keys of a fresh bucket
        >>> from ckptstore_s3 import S3Path
        >>> client = S3Path("s3://client-call/run", **options).client
        >>> response = client.run(lambda: client.call("head_bucket", "HEAD s3://client-call"))
        >>> response["ResponseMetadata"]["HTTPStatusCode"]
        200
    """

    rules = S3ErrorRules()
    scheme = "s3"
    head_action = "HEAD"
    get_action = "GET"

    def __init__(self, fs: Any, options: S3Options, bucket: str) -> None:
        super().__init__(fs, options, bucket)
        self.options: S3Options = options
        self._opened: dict[int, tuple[Any, object]] = {}
        """The aiobotocore client last handed out by s3fs's public ``set_session`` (which
        opens a new one by itself once that one is closed), by filesystem: the options'
        one, and the one for moto's server (:meth:`_filesystem`). Replaced, never
        changed in place: :meth:`close` may run in another thread."""
        self._mock_fs: tuple[str, Any] | None = None
        """moto's server's URL and an s3fs filesystem sending requests to it."""

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages ("the bucket does not exist at ...")."""
        return "moto's mock_aws" if self._mocked() else self._endpoint

    @endpoint.setter
    def endpoint(self, value: str) -> None:
        self._endpoint = value

    def _mocked(self) -> bool:
        """Whether moto's in-process ``mock_aws`` intercepts this client's requests now."""
        return mock_aws_active() and intercepted(self.options.endpoint_url)

    def _filesystem(self, describe: str) -> Any:
        """The options' s3fs filesystem, or, for a request moto's in-process
        ``mock_aws`` would intercept, one sending it to moto's server in this process
        instead (:mod:`ckptstore_s3.moto_mock`). Decided for every request, so a client
        made before a mock started, or used after it ended, goes where the mock says."""
        if not self._mocked():
            return self.fs
        try:
            endpoint = server_endpoint()
        except ImportError as error:
            raise InProcessMockError(describe, missing=str(error)) from error
        if self._mock_fs is None or self._mock_fs[0] != endpoint:
            kwargs = {**self.options.s3fs_kwargs(), "endpoint_url": endpoint, "loop": self.loop}
            self._mock_fs = (endpoint, type(self.fs)(**kwargs))
        return self._mock_fs[1]

    async def _s3_client(self, describe: str) -> Any:
        fs = self._filesystem(describe)
        client = await fs.set_session()
        self._opened = {**self._opened, id(fs): (fs, client)}
        return client

    async def call(self, method: str, describe: str, **params: Any) -> dict[str, Any]:
        """One S3 API call on the bucket, retried by the options' policy."""
        body = params.get("Body")

        async def attempt() -> dict[str, Any]:
            sent = params
            if isinstance(body, PartsReader):  # from its start at each attempt, streamed
                sent = {**params, "Body": StreamedBody(body)}
            client = await self._s3_client(describe)
            with _refuse_mock_aws(describe):
                response: dict[str, Any] = await getattr(client, method)(Bucket=self.bucket, **sent)
            return response

        return await self.retried(attempt, describe)

    # -- objects ----------------------------------------------------------------------

    async def put(self, key: str, body: Body) -> None:
        await self.call("put_object", self.describe("PUT", key), Key=key, Body=body)

    async def put_if_absent(self, key: str, body: Body) -> bool:
        """PUT with ``If-None-Match: *``: S3 itself refuses it (412
        ``PreconditionFailed``) when ``key`` exists. A 409
        ``ConditionalRequestConflict`` (another conditional write of ``key`` in flight)
        is settled by looking again: if the object now exists the other writer won,
        otherwise the PUT is sent again."""
        describe = self.describe("PUT", key) + " (If-None-Match: *)"
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                await self.call("put_object", describe, Key=key, Body=body, IfNoneMatch="*")
            except RequestError as error:
                if error.status == 412 or error.code == "PreconditionFailed":
                    return False
                if error.status != 409 and error.code != "ConditionalRequestConflict":
                    raise
                if await self.head(key) is not None:
                    return False
                continue
            return True
        raise RequestError(
            f"{describe} failed: HTTP 409 ConditionalRequestConflict {_CONFLICT_ATTEMPTS} times "
            "in a row; another writer keeps creating this object at the same moment",
            status=409,
            code="ConditionalRequestConflict",
            attempts=_CONFLICT_ATTEMPTS,
            retryable=True,
        )

    async def put_if_version(self, key: str, body: Body, version: str) -> bool:
        """PUT with ``If-Match: <ETag>``: S3 itself refuses it (412
        ``PreconditionFailed``; 404 if the object is gone) when ``key`` changed. A 409
        ``ConditionalRequestConflict`` is settled by looking again, as in
        :meth:`put_if_absent`."""
        describe = self.describe("PUT", key) + " (If-Match)"
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                await self.call("put_object", describe, Key=key, Body=body, IfMatch=version)
            except MissingObjectError:
                return False
            except RequestError as error:
                if error.status == 412 or error.code == "PreconditionFailed":
                    return False
                if error.status != 409 and error.code != "ConditionalRequestConflict":
                    raise
                info = await self.head(key)
                if info is None or info.version != version:
                    return False
                continue
            return True
        raise RequestError(
            f"{describe} failed: HTTP 409 ConditionalRequestConflict {_CONFLICT_ATTEMPTS} times "
            "in a row; another writer keeps replacing this object at the same moment",
            status=409,
            code="ConditionalRequestConflict",
            attempts=_CONFLICT_ATTEMPTS,
            retryable=True,
        )

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            response = await self.call("head_object", self.describe("HEAD", key), Key=key)
        except MissingObjectError:
            return None
        etag = response.get("ETag")
        return ObjectInfo(size=int(response["ContentLength"]), version=etag and str(etag))

    async def ranged_get(
        self,
        key: str,
        headers: dict[str, str],
        consume: Callable[[Read, int | None], Awaitable[T]],
    ) -> T:
        describe = self.describe("GET", key)
        client = await self._s3_client(describe)
        with _refuse_mock_aws(describe):
            response = await client.get_object(Bucket=self.bucket, Key=key, **headers)
        size = declared_size(response.get("ContentRange"), response.get("ContentLength"))
        async with response["Body"] as body:
            return await consume(body.read, size)

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

    def multipart(self, key: str) -> S3MultipartUpload:
        return S3MultipartUpload(self, key)

    # -- listing (operator tools only) ------------------------------------------------

    async def list_keys(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (a LIST: never on save or resume)."""
        return [key async for key in self._keys(prefix, None)]

    async def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        return await keys_around(partial(self._keys, prefix), skip)

    async def _keys(self, prefix: str, past: str | None) -> AsyncGenerator[str, None]:
        """Keys under ``prefix``, page by page; with ``past``, from after every key
        under it (``StartAfter``)."""
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Prefix": prefix}
            if token:
                params["ContinuationToken"] = token
            elif past is not None:
                params["StartAfter"] = past + _LAST_CHARACTER
            response = await self.call(
                "list_objects_v2", f"LIST s3://{self.bucket}/{prefix}", **params
            )
            for item in response.get("Contents", []):
                yield item["Key"]
            if not response.get("IsTruncated"):
                return
            token = response.get("NextContinuationToken")

    def close(self) -> None:
        opened, self._opened = self._opened, {}
        for fs, client in opened.values():
            type(fs).close_session(fs.loop, client)
