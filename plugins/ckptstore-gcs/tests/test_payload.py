"""Upload bodies streamed from the arrays' memory reach the server whole, with their
length announced (no chunked encoding), and again in full when a request is retried."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
from aiohttp import web
from ckptstore_gcs.payload import ViewsPayload, as_payload

from ckptstore.object_store._body import PartsReader


async def post_twice(payloads: list[ViewsPayload]) -> list[tuple[str | None, str | None, bytes]]:
    """POST each payload to a local server; what the server saw of each."""
    seen: list[tuple[str | None, str | None, bytes]] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(
            (request.headers.get("Content-Length"), request.headers.get("Transfer-Encoding"), body)
        )
        return web.Response(text="ok")

    app = web.Application(client_max_size=8 << 20)
    app.router.add_post("/upload", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            for payload in payloads:
                async with session.post(f"http://127.0.0.1:{port}/upload", data=payload) as answer:
                    assert answer.status == 200
    finally:
        await runner.cleanup()
    return seen


def test_a_streamed_body_arrives_whole_with_its_length_every_time() -> None:
    array = np.arange(300_000, dtype=np.float32)  # 1.2 MiB: several pieces
    reader = PartsReader([memoryview(b"header"), memoryview(array).cast("B")])
    expected = b"header" + array.tobytes()
    seen = asyncio.run(post_twice([ViewsPayload(reader), ViewsPayload(reader)]))
    assert seen == [(str(len(expected)), None, expected)] * 2


def test_only_streamed_bodies_are_wrapped() -> None:
    reader = PartsReader([memoryview(b"abc")])
    assert isinstance(as_payload(reader), ViewsPayload)
    assert as_payload(b"abc") == b"abc"
    assert as_payload(None) is None
    assert ViewsPayload(reader).decode() == "abc"
