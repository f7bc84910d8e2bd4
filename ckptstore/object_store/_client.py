"""The requests a checkpoint makes of an object store: one abstract method per request
kind, implemented by each backend, each request retried on its own.

Only object-level requests are made on the save and resume paths (upload, ranged
download, metadata, delete, parts); listing is confined to
:meth:`ObjectStoreClient.list_keys`, which only operator tools reach. Requests are
coroutines on the backend's event loop; :meth:`ObjectStoreClient.run` waits for one
from a worker thread, :meth:`ObjectStoreClient.submit` starts one in the background.

Example::

    >>> import boto3
    >>> from contextlib import ExitStack
    >>> from ckptstore.testing import in_process_moto
    >>> from ckptstore_s3 import S3Path
    >>> stack = ExitStack()
    >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
    >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
    >>> _ = s3.create_bucket(Bucket="object-store-client")
    >>> client = S3Path("s3://object-store-client/run").client  # an ObjectStoreClient
    >>> client.run(lambda: client.put("run/a", b"data"))  # wait for one request
    >>> future = client.submit(lambda: client.get("run/a", 1, 2))  # or start it
    >>> future.result()
    b'at'
    >>> stack.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

from ckptstore.errors import CorruptCheckpointError
from ckptstore.object_store._body import Body
from ckptstore.object_store._failures import (
    ErrorRules,
    MissingObjectError,
    RangeNotSatisfiableError,
)
from ckptstore.object_store._multipart import MultipartUpload
from ckptstore.object_store._options import ObjectStoreOptions
from ckptstore.object_store._ranged import Read, fill_targets, range_header, read_at_most
from ckptstore.object_store._retry import call_with_retries

if TYPE_CHECKING:  # annotations only: fsspec is imported by the filesystem a client is made for
    import fsspec

__all__ = ["ObjectInfo", "ObjectStoreClient"]

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """What a metadata request tells about an object.

    Example::

        >>> ObjectInfo(size=4096).size  # what ``await client.head("run/a")`` returns
        4096

    ``version`` is what a conditional write checks (S3: the ETag, GCS: the
    generation); ``None`` if the store does not say.
    """

    size: int
    version: str | None = None


class ObjectStoreClient(ABC):
    """Retried requests on one bucket, on the event loop of an fsspec async filesystem.

    Class attributes: ``rules`` judge the backend's errors for the retry loop;
    ``scheme`` (``"s3"``), ``head_action`` and ``get_action`` (what a metadata and a
    download request are called: ``"HEAD"``, ``"GET"``) shape messages.

    Example::

        >>> from ckptstore_s3 import S3Path
        >>> client = S3Path("s3://bucket/run").client  # S3Client(fs, options, "bucket")
        >>> client.bucket, client.describe(client.get_action, "run/a")  # no request yet
        ('bucket', 'GET s3://bucket/run/a')
    """

    rules: ClassVar[ErrorRules]
    scheme: ClassVar[str]
    head_action: ClassVar[str]
    get_action: ClassVar[str]

    def __init__(
        self, fs: fsspec.AbstractFileSystem, options: ObjectStoreOptions, bucket: str
    ) -> None:
        self.fs = fs
        self.options = options
        self.bucket = bucket
        self.loop: asyncio.AbstractEventLoop = fs.loop
        self.endpoint = options.endpoint
        self.secrets = options.secrets()

    # -- the event loop ---------------------------------------------------------------

    def run(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run ``factory()`` on the event loop and wait for its result."""
        from fsspec.asyn import sync

        result: T = sync(self.loop, factory)
        return result

    def submit(self, factory: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Start ``factory()`` on the event loop; returns a concurrent future."""
        return asyncio.run_coroutine_threadsafe(_call(factory), self.loop)

    def describe(self, action: str, key: str) -> str:
        """``"PUT s3://bucket/key"``: a request, for messages."""
        return f"{action} {self.scheme}://{self.bucket}/{key}"

    async def retried(self, attempt: Callable[[], Awaitable[T]], describe: str) -> T:
        """Await ``attempt()`` (one request) under the retry policy; failures become
        :class:`~ckptstore.object_store._failures.RequestError`."""
        return await call_with_retries(
            attempt,
            self.options.retry,
            self.rules,
            describe=describe,
            endpoint=self.endpoint,
            secrets=self.secrets,
        )

    # -- reads built on the backend's requests ----------------------------------------

    async def get(self, key: str, offset: int, length: int | None) -> bytes:
        """``length`` bytes (all, if ``None``) of ``key`` from ``offset``; ``b""`` if
        ``offset`` is past the end. A body longer than asked for, or than the object
        size its response declares, is refused
        (:class:`~ckptstore.errors.CorruptCheckpointError`) after reading one byte
        more than that."""
        headers = range_header(offset, length)

        async def bounded(read: Read, size: int | None) -> bytes:
            expected = length
            if size is not None:
                rest = max(size - offset, 0)
                expected = rest if expected is None else min(expected, rest)
            if expected is None:
                return await read(None)
            data = await read_at_most(read, expected)
            if len(data) > expected:
                raise self._corrupt(key, f"the download sent more than the {expected} bytes due")
            return data

        return await self._read(key, lambda: self.ranged_get(key, headers, bounded), b"")

    async def get_document(self, key: str, limit: int) -> bytes:
        """The whole of ``key``, a control document of at most ``limit`` bytes: one
        download asking for ``limit + 1`` bytes, refused
        (:class:`~ckptstore.errors.CorruptCheckpointError`) before its body is read if
        the response declares a larger object, and after at most ``limit + 1`` bytes
        if the body is longer than declared or than ``limit``."""
        headers = range_header(0, limit + 1)

        async def bounded(read: Read, size: int | None) -> bytes:
            if size is not None and size > limit:
                raise self._corrupt(key, _too_large(f"{size} bytes", limit))
            data = await read_at_most(read, limit if size is None else size)
            if size is not None and len(data) > size:
                raise self._corrupt(
                    key, f"the download sent more than the {size} bytes its response declared"
                )
            if len(data) > limit:
                raise self._corrupt(key, _too_large(f"more than {limit} bytes", limit))
            return data

        return await self._read(key, lambda: self.ranged_get(key, headers, bounded), b"")

    async def get_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> int:
        """Stream ``key`` from ``offset`` into ``targets``; returns the bytes received
        (fewer than asked when the object is too short). Never more than the targets
        hold is read."""
        headers = range_header(offset, sum(target.nbytes for target in targets))

        async def fill(read: Read, size: int | None) -> int:
            return await fill_targets(read, targets)

        return await self._read(key, lambda: self.ranged_get(key, headers, fill), 0)

    async def _read(self, key: str, attempt: Callable[[], Awaitable[T]], empty: T) -> T:
        """A download whose body is read inside the attempt, so that a connection
        dropped mid-body is retried like any other transient failure. A range that
        starts past the end of the object gives ``empty`` (the caller reports the
        object as short)."""
        try:
            return await self.retried(attempt, self.describe(self.get_action, key))
        except RangeNotSatisfiableError:
            return empty

    def _corrupt(self, key: str, detail: str) -> CorruptCheckpointError:
        """Stored bytes refused while downloading ``key`` (the path type names the
        checkpoint URL and the relative key instead)."""
        return CorruptCheckpointError(detail, url=f"{self.scheme}://{self.bucket}", file=key)

    async def size(self, key: str) -> int:
        """The length of ``key``; :class:`MissingObjectError` if it does not exist."""
        info = await self.head(key)
        if info is None:
            raise MissingObjectError(
                f"{self.describe(self.head_action, key)}: no such object",
                status=404,
                code=self.rules.missing_object_code,
                attempts=1,
                retryable=False,
            )
        return info.size

    # -- the backend's requests -------------------------------------------------------

    @abstractmethod
    async def put(self, key: str, body: Body) -> None:
        """Upload ``body`` as ``key`` in one request (retried)."""

    async def put_if_absent(self, key: str, body: Body) -> bool:
        """Upload ``body`` as ``key`` only if no object ``key`` exists; ``True`` if it was
        created, ``False`` if it already existed (nothing written).

        Backends whose store takes a precondition (S3 ``If-None-Match: *``, GCS
        ``ifGenerationMatch=0``) override this so the store itself refuses the second
        writer, and their path type sets ``atomic_create``. This default checks with a
        metadata request, then uploads: two writers racing can both succeed.
        """
        if await self.head(key) is not None:
            return False
        await self.put(key, body)
        return True

    async def put_if_version(self, key: str, body: Body, version: str) -> bool:
        """Upload ``body`` as ``key`` only if the object is still at ``version`` (its
        :attr:`ObjectInfo.version`); ``True`` if written, ``False`` if it changed or is
        gone (nothing written).

        Backends whose store takes a precondition (S3 ``If-Match``, GCS
        ``ifGenerationMatch``) override this so the store itself refuses a stale
        writer, and their path type sets ``atomic_replace``. This default checks with a
        metadata request, then uploads: two writers racing can both succeed.
        """
        info = await self.head(key)
        if info is None or info.version != version:
            return False
        await self.put(key, body)
        return True

    @abstractmethod
    async def head(self, key: str) -> ObjectInfo | None:
        """The object's metadata, or ``None`` if it does not exist (retried)."""

    @abstractmethod
    async def ranged_get(
        self,
        key: str,
        headers: dict[str, str],
        consume: Callable[[Read, int | None], Awaitable[T]],
    ) -> T:
        """One attempt (not retried) at downloading ``key`` with ``headers`` (a
        ``Range``): hands ``consume`` a reader of the body and the whole object's size
        as the response declares it (:func:`~ckptstore.object_store._ranged.declared_size`
        of its ``Content-Range`` and ``Content-Length``; ``None`` if unknown), before
        reading any of the body, inside the response; returns what it returns."""

    @abstractmethod
    async def delete_many(self, keys: Sequence[str]) -> None:
        """Delete ``keys``; missing ones are ignored (retried)."""

    @abstractmethod
    async def bucket_exists(self) -> bool:
        """Whether the bucket answers a metadata request (never a listing)."""

    @abstractmethod
    async def list_keys(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` (a listing: never on save or resume)."""

    async def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        """Every object key under ``prefix`` but those starting with ``skip`` (which
        ends with ``/``). Here, :meth:`list_keys` filtered; a client whose store lists
        from a given key lists the two sides of ``skip`` only."""
        return [key for key in await self.list_keys(prefix) if not key.startswith(skip)]

    @abstractmethod
    def multipart(self, key: str) -> MultipartUpload:
        """A new upload of ``key`` in parts."""

    @abstractmethod
    def close(self) -> None:
        """Release the HTTP session and its connections."""


def _too_large(size: str, limit: int) -> str:
    return (
        f"the document is {size}, more than the limit of {limit} "
        "(CKPTSTORE_LIMIT_MAX_DOCUMENT_BYTES)"
    )


async def _call(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()
