"""The GCS JSON-API requests a checkpoint needs, each retried on its own, on gcsfs's
event loop and HTTP session (and so with gcsfs's credentials).

Only object-level calls are made on the save and resume paths (upload, ranged
download, metadata, delete, compose); listing is confined to :meth:`GCSClient.list_keys`,
which only operator tools reach.

Example::

    client = GCSClient(fs, options, "bucket")
    client.run(lambda: client.put("run/a", b"data"))
"""

from __future__ import annotations

import asyncio
import json
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import aiohttp
import fsspec.asyn

from ckptstore_gcs.options import GCSOptions
from ckptstore_gcs.retry import HttpStatusError, MissingObjectError, call_with_retries

__all__ = ["MAX_COMPOSE", "GCSClient", "gather_all"]

T = TypeVar("T")
MAX_COMPOSE = 32
"""GCS composes at most this many objects in one request."""
_READ_PIECE = 4 << 20


class GCSClient:
    """Retried GCS calls on one bucket through a gcsfs filesystem's session.

    Example::

        client.run(lambda: client.head("run/_ckptstore/catalog.json"))
    """

    def __init__(self, fs: Any, options: GCSOptions, bucket: str) -> None:
        self.fs = fs
        self.options = options
        self.bucket = bucket
        self.endpoint = options.endpoint_url
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=options.connect_timeout, sock_read=options.read_timeout
        )

    def run(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run ``factory()`` on the filesystem's event loop and wait for its result."""
        result: T = fsspec.asyn.sync(self.fs.loop, factory)
        return result

    def submit(self, factory: Callable[[], Awaitable[T]]) -> Any:
        """Start ``factory()`` on the event loop; returns a concurrent future."""
        return asyncio.run_coroutine_threadsafe(_call(factory), self.fs.loop)

    def describe(self, action: str, key: str) -> str:
        return f"{action} gs://{self.bucket}/{key}"

    def _object_url(self, key: str, *, api: str = "storage") -> str:
        name = urllib.parse.quote(key, safe="")
        return f"{self.endpoint}/{api}/v1/b/{self.bucket}/o/{name}"

    async def request(
        self,
        method: str,
        url: str,
        describe: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        data: bytes | bytearray | None = None,
        json_body: Any = None,
        read: Callable[[aiohttp.ClientResponse], Awaitable[T]] | None = None,
    ) -> Any:
        """One request, retried; ``read`` consumes a successful response inside the
        attempt (so a body cut off mid-way is retried too)."""

        async def attempt() -> Any:
            session = await self.fs._set_session()
            request_headers = self.fs._get_headers(headers)
            async with session.request(
                method,
                url,
                params=self.fs._get_params(params or {}),
                headers=request_headers,
                data=data,
                json=json_body,
                timeout=self._timeout,
            ) as response:
                if response.status >= 400:
                    raise HttpStatusError(response.status, await _reason(response))
                if read is not None:
                    return await read(response)
                return await response.read()

        return await call_with_retries(
            attempt,
            self.options.retry,
            describe=describe,
            endpoint=self.endpoint,
            secrets=self.options.secrets(),
        )

    # -- objects ----------------------------------------------------------------------

    async def put(self, key: str, body: bytes | bytearray) -> None:
        await self.request(
            "POST",
            f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o",
            self.describe("upload", key),
            params={"uploadType": "media", "name": key},
            headers={"Content-Type": "application/octet-stream"},
            data=body,
        )

    async def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata, or ``None`` if it does not exist."""
        try:
            raw = await self.request("GET", self._object_url(key), self.describe("stat", key))
        except MissingObjectError:
            return None
        document: dict[str, Any] = json.loads(raw)
        return document

    def _ranged(self, offset: int, length: int | None) -> dict[str, str]:
        if length is None:
            return {"Range": f"bytes={offset}-"} if offset else {}
        return {"Range": f"bytes={offset}-{offset + length - 1}"}

    async def get(self, key: str, offset: int, length: int | None) -> bytes:
        """``length`` bytes (all, if ``None``) of ``key`` from ``offset``."""
        try:
            data: bytes = await self.request(
                "GET",
                self._object_url(key, api="download/storage"),
                self.describe("download", key),
                params={"alt": "media"},
                headers=self._ranged(offset, length),
            )
        except OSError as error:
            if getattr(error, "status", None) == 416:
                return b""
            raise
        return data

    async def get_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> int:
        """Stream ``key`` from ``offset`` into ``targets``; returns the bytes received."""
        total = sum(target.nbytes for target in targets)
        flat = [t.cast("B") if t.format != "B" or t.ndim != 1 else t for t in targets]

        async def fill(response: aiohttp.ClientResponse) -> int:
            received = 0
            for target in flat:
                filled = 0
                while filled < target.nbytes:
                    piece = await response.content.read(min(_READ_PIECE, target.nbytes - filled))
                    if not piece:
                        return received
                    target[filled : filled + len(piece)] = piece
                    filled += len(piece)
                    received += len(piece)
            return received

        try:
            received: int = await self.request(
                "GET",
                self._object_url(key, api="download/storage"),
                self.describe("download", key),
                params={"alt": "media"},
                headers=self._ranged(offset, total),
                read=fill,
            )
        except OSError as error:
            if getattr(error, "status", None) == 416:
                return 0
            raise
        return received

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (missing ones are ignored), several at once."""
        limit = asyncio.Semaphore(self.options.max_concurrency)

        async def one(key: str) -> None:
            async with limit:
                try:
                    await self.request(
                        "DELETE", self._object_url(key), self.describe("delete", key)
                    )
                except MissingObjectError:
                    return

        await gather_all([partial(one, key) for key in keys])

    async def bucket_exists(self) -> bool:
        """GET the bucket's metadata (never a listing)."""
        try:
            await self.request(
                "GET", f"{self.endpoint}/storage/v1/b/{self.bucket}", f"stat gs://{self.bucket}"
            )
        except OSError:
            return False
        return True

    async def compose(self, key: str, sources: Sequence[str]) -> None:
        """Make ``key`` the concatenation of ``sources`` (at most 32)."""
        await self.request(
            "POST",
            f"{self._object_url(key)}/compose",
            self.describe("compose", key),
            json_body={
                "kind": "storage#composeRequest",
                "sourceObjects": [{"name": source} for source in sources],
                "destination": {"contentType": "application/octet-stream"},
            },
        )

    # -- parallel composite uploads ---------------------------------------------------

    def part_name(self, key: str, token: str, number: int) -> str:
        """The temporary object holding part ``number`` of an upload of ``key``."""
        return f"{key}.ckptstore-part-{token}-{number:05d}"

    @staticmethod
    def new_token() -> str:
        return secrets.token_hex(6)

    async def compose_parts(self, key: str, parts: Sequence[str], token: str) -> None:
        """Compose ``parts`` (in order) into ``key``, 32 at a time, then delete them and
        any intermediate objects. On failure the temporary objects are deleted too."""
        created: list[str] = []
        try:
            level = list(parts)
            round_number = 0
            while len(level) > MAX_COMPOSE:
                groups = [level[i : i + MAX_COMPOSE] for i in range(0, len(level), MAX_COMPOSE)]
                names = [
                    f"{key}.ckptstore-compose-{token}-{round_number}-{index:05d}"
                    for index in range(len(groups))
                ]
                created.extend(names)
                await gather_all(
                    [
                        partial(self.compose, name, group)
                        for name, group in zip(names, groups, strict=True)
                    ]
                )
                level = names
                round_number += 1
            await self.compose(key, level)
        finally:
            await asyncio.shield(self._delete_quietly([*parts, *created]))

    async def _delete_quietly(self, keys: Sequence[str]) -> None:
        try:
            await self.delete_many(keys)
        except OSError:
            return

    async def upload_composite(
        self, key: str, count: int, part: Callable[[int], bytes | bytearray]
    ) -> None:
        """Upload ``count`` parts as temporary objects in parallel (``part(i)`` builds
        part ``i``'s bytes when its turn comes), then compose them into ``key``."""
        token = self.new_token()
        names = [self.part_name(key, token, number) for number in range(count)]
        limit = asyncio.Semaphore(self.options.max_concurrency)

        async def one(index: int) -> None:
            async with limit:
                await self.put(names[index], part(index))

        try:
            await gather_all([partial(one, i) for i in range(count)])
        except BaseException:
            await asyncio.shield(self._delete_quietly(names))
            raise
        await self.compose_parts(key, names, token)

    # -- listing (operator tools only) ------------------------------------------------

    async def list_keys(self, prefix: str) -> list[str]:
        """Every object name under ``prefix`` (a listing: never on save or resume)."""
        names: list[str] = []
        token = ""
        while True:
            params = {"prefix": prefix}
            if token:
                params["pageToken"] = token
            raw = await self.request(
                "GET",
                f"{self.endpoint}/storage/v1/b/{self.bucket}/o",
                f"list gs://{self.bucket}/{prefix}",
                params=params,
            )
            document = json.loads(raw)
            names.extend(item["name"] for item in document.get("items", []))
            token = document.get("nextPageToken") or ""
            if not token:
                return names


async def _reason(response: aiohttp.ClientResponse) -> str:
    text = (await response.read()).decode("utf-8", "replace")
    try:
        error = json.loads(text)["error"]
        reasons = [e.get("reason") for e in error.get("errors", []) if e.get("reason")]
        message = str(error.get("message", ""))
        return f"{reasons[0]}: {message}" if reasons else message
    except (ValueError, KeyError, TypeError, AttributeError):
        return text[:200]


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
