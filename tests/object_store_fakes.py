"""An in-memory object store behind ``ckptstore.object_store``'s interfaces, for the
core's tests: no server, every request recorded, failures injected per request kind.

Objects live in a :class:`MemoryFilesystem` (the backend's "fsspec filesystem"), found
again by the ``store`` storage option, so a pickled path reads what the original wrote.

Example::

    fs = new_filesystem()
    storage = MemoryStorePath("mem://bucket/run", store=fs.name)
    storage.write_bytes("a", b"x")
    fs.kinds()  # ['put']
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec.asyn

from ckptstore.object_store import (
    Body,
    ErrorRules,
    Failure,
    MissingObjectError,
    MultipartUpload,
    ObjectInfo,
    ObjectStoreClient,
    ObjectStoreOptions,
    ObjectStorePath,
    RequestError,
)
from ckptstore.object_store._ranged import Read

T = TypeVar("T")
MiB = 1 << 20
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")

FILESYSTEMS: dict[str, MemoryFilesystem] = {}
"""Every fake filesystem by name (the ``store`` storage option)."""


class FakeHttpError(Exception):
    """An error answer of the fake store.

    Example::

        memory.fail_next("put", FakeHttpError(503, "SlowDown"))
    """

    def __init__(self, status: int, code: str | None = None) -> None:
        super().__init__(f"HTTP {status} {code or ''}".strip())
        self.status = status
        self.code = code


class FakeRules(ErrorRules):
    """5xx and 429 answers and dropped connections are retryable.

    Example::

        FakeRules().classify(FakeHttpError(503)).retryable  # True
    """

    endpoint_settings = "endpoint_url, FAKE_ENDPOINT"
    credential_settings = "FAKE_TOKEN or the token storage option"
    throttling_codes = frozenset({"SlowDown"})
    missing_bucket_codes = frozenset({"NoSuchBucket"})
    missing_object_code = "NoSuchKey"

    def classify(self, error: BaseException) -> Failure:
        if isinstance(error, FakeHttpError):
            retryable = error.status >= 500 or error.status == 429
            return Failure(retryable, error.status, error.code, summary=str(error))
        return Failure(isinstance(error, ConnectionError))


@dataclass
class MemoryFilesystem:
    """Buckets of objects, the requests made (``(kind, key)``), the uploads in parts
    started and the failures still to inject.

    Example::

        memory.fail_next("part", ConnectionResetError(), count=2)
        memory.kinds()  # ['start', 'part', 'part', 'part', 'complete']
    """

    name: str
    loop: Any = field(default_factory=fsspec.asyn.get_loop)
    buckets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    bodies: list[type] = field(default_factory=list)
    uploads: list[MemoryUpload] = field(default_factory=list)
    faults: list[tuple[str, BaseException]] = field(default_factory=list)
    closed: int = 0
    declared: dict[str, int | None] = field(default_factory=dict)
    """Object size a download's response declares, by key (default: the real one)."""
    ignores_range: bool = False
    """Whether downloads answer with the whole object whatever ``Range`` asked."""

    def fail_next(self, kind: str, error: BaseException, count: int = 1) -> None:
        """The next ``count`` requests of ``kind`` raise ``error``."""
        self.faults.extend([(kind, error)] * count)

    def kinds(self) -> list[str]:
        """The kinds of the requests made so far, in order."""
        return [kind for kind, _ in self.requests]

    def request(self, kind: str, key: str) -> None:
        """Record a request; raise the first failure waiting for its kind."""
        self.requests.append((kind, key))
        for index, (wanted, error) in enumerate(self.faults):
            if wanted == kind:
                del self.faults[index]
                raise error


def new_filesystem(*buckets: str) -> MemoryFilesystem:
    """A fresh filesystem holding empty ``buckets`` (default: ``"bucket"``)."""
    fs = MemoryFilesystem(f"fake-{uuid.uuid4().hex}")
    for bucket in buckets or ("bucket",):
        fs.buckets[bucket] = {}
    FILESYSTEMS[fs.name] = fs
    return fs


@dataclass(frozen=True, repr=False)
class MemoryOptions(ObjectStoreOptions):
    """The fake's options: ``store`` names its filesystem, ``token`` is a credential.

    Example::

        MemoryOptions.resolve({"store": memory.name, "retries": 0}, {})
    """

    STORE = "Memory"
    DEFAULT_ENDPOINT = "memory"
    ENV_PREFIX = "CKPTSTORE_MEMORY"
    PASSTHROUGH = frozenset({"cache_size"})

    store: str = "default"
    token: str | None = None
    multipart_threshold: int = 64 * MiB

    @property
    def parts_threshold(self) -> int:
        return self.multipart_threshold

    def secrets(self) -> tuple[str, ...]:
        return (self.token,) if self.token else ()

    def open_filesystem(self, url: str) -> tuple[Any, str]:
        return FILESYSTEMS[self.store], url.split("://", 1)[1]

    @classmethod
    def _with_environment(cls, given: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        values = dict(given)
        if "token" not in values and env.get("MEMORY_TOKEN"):
            values["token"] = env["MEMORY_TOKEN"]
        return values


def _content(body: Body) -> bytes:
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    body.seek(0)
    return body.read()


class MemoryClient(ObjectStoreClient):
    """Requests on a :class:`MemoryFilesystem`, each one retried like a real one.

    Example::

        client = MemoryClient(memory, MemoryOptions(store=memory.name), "bucket")
        client.run(lambda: client.get("k", 0, None))
    """

    rules = FakeRules()
    scheme = "mem"
    head_action = "HEAD"
    get_action = "GET"
    fs: MemoryFilesystem

    def objects(self) -> dict[str, bytes]:
        """The bucket's objects; a missing bucket answers 404 ``NoSuchBucket``."""
        if self.bucket not in self.fs.buckets:
            raise FakeHttpError(404, "NoSuchBucket")
        return self.fs.buckets[self.bucket]

    def stored(self, key: str) -> bytes:
        try:
            return self.objects()[key]
        except KeyError:
            raise FakeHttpError(404, "NoSuchKey") from None

    async def attempt(self, kind: str, key: str, action: Callable[[], T]) -> T:
        """One request of ``kind`` on ``key``, retried; ``action`` is what it does."""

        async def once() -> T:
            self.fs.request(kind, key)
            return action()

        return await self.retried(once, self.describe(kind.upper(), key))

    async def put(self, key: str, body: Body) -> None:
        self.fs.bodies.append(type(body))
        await self.attempt("put", key, lambda: self.objects().__setitem__(key, _content(body)))

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            size = await self.attempt("head", key, lambda: len(self.stored(key)))
        except MissingObjectError:
            return None
        return ObjectInfo(size)

    async def ranged_get(
        self,
        key: str,
        headers: dict[str, str],
        consume: Callable[[Read, int | None], Awaitable[T]],
    ) -> T:
        self.fs.request("get", key)
        data = self.stored(key)
        start, end = 0, len(data)
        if "Range" in headers and not self.fs.ignores_range:
            match = _RANGE.match(headers["Range"])
            assert match is not None, headers
            start = int(match.group(1))
            end = int(match.group(2)) + 1 if match.group(2) else len(data)
            if start >= len(data):
                raise FakeHttpError(416, "InvalidRange")
        stream = io.BytesIO(data[start:end])

        async def read(count: int | None) -> bytes:
            self.fs.request("read", key)  # a fault here cuts the body off
            return stream.read(-1 if count is None else count)

        return await consume(read, self.fs.declared.get(key, len(data)))

    async def delete_many(self, keys: Sequence[str]) -> None:
        def delete() -> None:
            for key in keys:
                self.objects().pop(key, None)

        await self.attempt("delete", ",".join(keys), delete)

    async def bucket_exists(self) -> bool:
        try:
            await self.attempt("bucket", "", self.objects)
        except RequestError:
            return False
        return True

    async def list_keys(self, prefix: str) -> list[str]:
        return await self.attempt(
            "list", prefix, lambda: sorted(k for k in self.objects() if k.startswith(prefix))
        )

    def multipart(self, key: str) -> MemoryUpload:
        return MemoryUpload(self, key)

    def close(self) -> None:
        self.fs.closed += 1


class MemoryUpload(MultipartUpload):
    """Parts kept aside until :meth:`complete` joins them into the object; ``state`` is
    ``"new"``, ``"open"``, ``"completed"`` or ``"aborted"``.

    Example::

        [upload.state for upload in memory.uploads]  # ['completed']
    """

    def __init__(self, client: MemoryClient, key: str) -> None:
        super().__init__(key)
        self._client = client
        self.parts: dict[int, bytes] = {}
        self.state = "new"
        client.fs.uploads.append(self)

    def _set_state(self, state: str) -> None:
        self.state = state

    async def start(self) -> None:
        await self._client.attempt("start", self.key, lambda: self._set_state("open"))

    async def upload_part(self, index: int, body: Body) -> None:
        content = _content(body)
        await self._client.attempt("part", self.key, lambda: self.parts.__setitem__(index, content))

    async def complete(self) -> None:
        def join() -> None:
            whole = b"".join(self.parts[index] for index in sorted(self.parts))
            self._client.objects()[self.key] = whole
            self.state = "completed"

        await self._client.attempt("complete", self.key, join)

    async def abort(self) -> None:
        self.parts.clear()
        self.state = "aborted"
        try:
            await self._client.attempt("abort", self.key, lambda: None)
        except RequestError:
            return


class MemoryStorePath(ObjectStorePath[MemoryOptions, MemoryClient]):
    """``mem://bucket/prefix`` roots on the fake store.

    Example::

        MemoryStorePath("mem://bucket/run", store=new_filesystem().name)
    """

    name = "memory-store"
    protocols = ("mem",)
    bucket_rule = "a memory URL names a bucket: mem://BUCKET/prefix"
    options_type = MemoryOptions
    client_type = MemoryClient
