"""The GCS JSON-API requests a checkpoint needs, made on gcsfs's event loop and HTTP
session (and so with gcsfs's credentials), each retried on its own
(:class:`~ckptstore.object_store.ObjectStoreClient` supplies the retries and the reads
built on :meth:`GCSClient.ranged_get`).

Example::

    >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
    >>> from ckptstore_gcs import GCSPath
    >>> client = GCSPath("gs://bucket/run", **options).client  # GCSClient(fs, options, "bucket")
    >>> client.run(lambda: client.put("run/a", b"data"))
    >>> client.run(lambda: client.head("run/a"))
    ObjectInfo(size=4, version=...)
    >>> client.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

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
    gather_all,
    keys_around,
)
from ckptstore_gcs.composite import GCSCompositeUpload
from ckptstore_gcs.errors import GCSErrorRules, HttpStatusError

if TYPE_CHECKING:  # aiohttp is imported when a session opens (0.2 s: not at registration)
    import aiohttp

__all__ = ["GCSClient", "streamed"]

T = TypeVar("T")


class GCSClient(ObjectStoreClient):
    """JSON-API requests on the client's own aiohttp session (opened on the event loop
    of a gcsfs filesystem), authorised by the filesystem's credentials.

    Example::

        >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
        >>> from ckptstore_gcs import GCSPath
        >>> client = GCSPath("gs://bucket/run", **options).client
        >>> client.run(lambda: client.put("run/blob.part-0", b"abc"))
        >>> client.run(lambda: client.put("run/blob.part-1", b"def"))
        >>> client.run(lambda: client.compose("run/blob", ["run/blob.part-0", "run/blob.part-1"]))
        >>> client.run(lambda: client.get("run/blob", 0, None))
        b'abcdef'
        >>> client.close()
    """

    rules = GCSErrorRules()
    scheme = "gs"
    head_action = "stat"
    get_action = "download"
    _session: aiohttp.ClientSession | None = None
    _closes_at_exit: (
        weakref.finalize[[asyncio.AbstractEventLoop, aiohttp.ClientSession], GCSClient] | None
    ) = None

    async def _http(self) -> aiohttp.ClientSession:
        """This client's session, opened on first use (and again after :meth:`close`)."""
        if self._session is None or self._session.closed:
            import aiohttp

            session = self._session = aiohttp.ClientSession(**self.fs.session_kwargs)
            # closed when the client is collected or the interpreter exits, whichever
            # comes first: a script that never calls close() ends without aiohttp's
            # "Unclosed client session" warning
            self._closes_at_exit = weakref.finalize(self, _close_session, self.loop, session)
        return self._session

    def _params(self, given: dict[str, str]) -> dict[str, str]:
        """``given``, plus the project billed for a requester-pays bucket."""
        pays = self.fs.requester_pays
        if not pays:
            return dict(given)
        return {**given, "userProject": pays if isinstance(pays, str) else self.fs.project}

    def _headers(self, given: dict[str, str] | None) -> dict[str, str]:
        """``given``, plus the authorization the filesystem's credentials add."""
        headers = {"User-Agent": "ckptstore-gcs", **(given or {})}
        self.fs.credentials.apply(headers)
        return headers

    def _object_url(self, key: str, *, api: str = "storage") -> str:
        name = urllib.parse.quote(key, safe="")
        return f"{self.endpoint}/{api}/v1/b/{self.bucket}/o/{name}"

    async def _send(
        self,
        method: str,
        url: str,
        read: Callable[[aiohttp.ClientResponse], Awaitable[T]],
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        data: Body | None = None,
        json_body: Any = None,
    ) -> T:
        """One request (not retried); ``read`` consumes a successful response."""
        import aiohttp

        session = await self._http()
        body, headers = streamed(data, headers)
        async with session.request(
            method,
            url,
            params=self._params(params or {}),
            headers=self._headers(headers),
            data=body,
            json=json_body,
            timeout=aiohttp.ClientTimeout(
                sock_connect=self.options.connect_timeout, sock_read=self.options.read_timeout
            ),
        ) as response:
            if response.status >= 400:
                raise HttpStatusError(response.status, await _reason(response))
            return await read(response)

    async def request(
        self,
        method: str,
        url: str,
        describe: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        data: Body | None = None,
        json_body: Any = None,
    ) -> bytes:
        """One request, retried; returns the body of its answer."""
        send = partial(
            self._send,
            method,
            url,
            _whole_body,
            params=params,
            headers=headers,
            data=data,
            json_body=json_body,
        )
        return await self.retried(send, describe)

    # -- objects ----------------------------------------------------------------------

    async def put(self, key: str, body: Body) -> None:
        await self.request(
            "POST",
            f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o",
            self.describe("upload", key),
            params={"uploadType": "media", "name": key},
            headers={"Content-Type": "application/octet-stream"},
            data=body,
        )

    async def put_if_absent(self, key: str, body: Body) -> bool:
        """Upload with ``ifGenerationMatch=0``: GCS itself refuses it (412
        ``conditionNotMet``) when ``key`` exists. A metadata request goes first, so a
        store that ignores the precondition (gcp-storage-emulator does) still refuses
        a create of an existing key, though not two racing ones."""
        return await self._upload_at_generation(key, body, None)

    async def put_if_version(self, key: str, body: Body, version: str) -> bool:
        """Upload with ``ifGenerationMatch=<generation>``: GCS itself refuses it (412
        ``conditionNotMet``) when ``key`` changed. A metadata request goes first, so a
        store that ignores the precondition (gcp-storage-emulator does) still refuses
        a stale writer, though not two racing ones."""
        return await self._upload_at_generation(key, body, version)

    async def _upload_at_generation(self, key: str, body: Body, generation: str | None) -> bool:
        """Upload ``body`` as ``key`` only if the object is at ``generation`` (``None``:
        absent, GCS's generation 0): a HEAD, then the upload with ``ifGenerationMatch``;
        ``False`` (nothing written) if either finds it elsewhere."""
        info = await self.head(key)
        if (info is None) != (generation is None):
            return False  # exists though it should not, or gone
        if info is not None and info.version != generation:
            return False  # changed since it was read
        match = generation or "0"
        try:
            await self.request(
                "POST",
                f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o",
                self.describe("upload", key) + f" (ifGenerationMatch={match})",
                params={"uploadType": "media", "name": key, "ifGenerationMatch": match},
                headers={"Content-Type": "application/octet-stream"},
                data=body,
            )
        except RequestError as error:
            if error.status == 412:
                return False
            raise
        return True

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            raw = await self.request("GET", self._object_url(key), self.describe("stat", key))
        except MissingObjectError:
            return None
        metadata = json.loads(raw)
        generation = metadata.get("generation")
        return ObjectInfo(
            size=int(metadata["size"]), version=None if generation is None else str(generation)
        )

    async def ranged_get(
        self,
        key: str,
        headers: dict[str, str],
        consume: Callable[[Read, int | None], Awaitable[T]],
    ) -> T:
        async def body(response: aiohttp.ClientResponse) -> T:
            async def read(count: int | None) -> bytes:
                return await response.content.read(-1 if count is None else count)

            size = declared_size(response.headers.get("Content-Range"), response.content_length)
            return await consume(read, size)

        return await self._send(
            "GET",
            self._object_url(key, api="download/storage"),
            body,
            params={"alt": "media"},
            headers=headers,
        )

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

    def multipart(self, key: str) -> GCSCompositeUpload:
        return GCSCompositeUpload(self, key)

    # -- listing (operator tools only) ------------------------------------------------

    async def list_keys(self, prefix: str) -> list[str]:
        """Every object name under ``prefix`` (a listing: never on save or resume)."""
        return [name async for name in self._names(prefix, None)]

    async def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        return await keys_around(partial(self._names, prefix), skip)

    async def _names(self, prefix: str, past: str | None) -> AsyncGenerator[str, None]:
        """Names under ``prefix``, page by page; with ``past`` (ending with ``/``),
        from the first name after every name under it (``startOffset``: ``past`` with
        its ``/`` made the next character, ``0``; the emulator ignores it)."""
        token = ""
        while True:
            params = {"prefix": prefix}
            if past is not None:
                params["startOffset"] = past[:-1] + "0"
            if token:
                params["pageToken"] = token
            raw = await self.request(
                "GET",
                f"{self.endpoint}/storage/v1/b/{self.bucket}/o",
                f"list gs://{self.bucket}/{prefix}",
                params=params,
            )
            document = json.loads(raw)
            for item in document.get("items", []):
                yield item["name"]
            token = document.get("nextPageToken") or ""
            if not token:
                return

    def close(self) -> None:
        session, self._session = self._session, None
        if self._closes_at_exit is not None:  # closed here: the finalizer lets it go
            self._closes_at_exit.detach()
            self._closes_at_exit = None
        if session is not None and not session.closed:
            self.run(session.close)


_CLOSING: set[asyncio.Task[None]] = set()


def _close_session(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    """Close ``session`` on its event loop (the filesystem's I/O thread), waiting at most
    a second; from that loop's own thread, schedule the close instead of waiting on it."""
    if session.closed or loop.is_closed() or not loop.is_running():
        return
    with contextlib.suppress(RuntimeError):  # no loop running in this thread
        if asyncio.get_running_loop() is loop:
            task = loop.create_task(session.close())
            _CLOSING.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(_CLOSING.discard)
            return
    future = asyncio.run_coroutine_threadsafe(session.close(), loop)
    with contextlib.suppress(Exception):  # the loop is stopping: nothing left to release
        future.result(timeout=1)


async def _whole_body(response: aiohttp.ClientResponse) -> bytes:
    return await response.read()


async def _reason(response: aiohttp.ClientResponse) -> str:
    text = (await response.read()).decode("utf-8", "replace")
    try:
        error = json.loads(text)["error"]
        reasons = [e.get("reason") for e in error.get("errors", []) if e.get("reason")]
        message = str(error.get("message", ""))
        return f"{reasons[0]}: {message}" if reasons else message
    except (ValueError, KeyError, TypeError, AttributeError):
        return text[:200]


def streamed(
    data: Body | None, headers: dict[str, str] | None
) -> tuple[bytes | bytearray | StreamedBody | None, dict[str, str] | None]:
    """What to hand aiohttp for ``data``: a :class:`PartsReader` as a
    :class:`~ckptstore.object_store.StreamedBody` (from its start: a retry sends it
    all again) with its length announced, so not sent in chunked encoding; other
    bodies as they are.

    Example::

        >>> body, headers = streamed(PartsReader([memoryview(b"ab")]), {"X": "1"})
        >>> type(body).__name__, headers
        ('StreamedBody', {'X': '1', 'Content-Length': '2'})
    """
    if not isinstance(data, PartsReader):
        return data, headers
    return StreamedBody(data), {**(headers or {}), "Content-Length": str(len(data))}
