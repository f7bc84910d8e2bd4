"""Upload bodies streamed from the arrays' memory (:func:`ckptstore_gcs.client.streamed`)
reach the server whole, with their length announced (no chunked encoding), and again in
full when a request is retried."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
from aiohttp import web
from ckptstore_gcs.client import streamed

from ckptstore.object_store._body import PartsReader


async def post_twice(reader: PartsReader) -> list[tuple[str | None, str | None, bytes]]:
    """POST ``reader`` twice to a local server, as the client sends it; what the server
    saw each time."""
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
            for _ in range(2):
                body, headers = streamed(reader, None)
                url = f"http://127.0.0.1:{port}/upload"
                async with session.post(url, data=body, headers=headers) as answer:
                    assert answer.status == 200
    finally:
        await runner.cleanup()
    return seen


def test_a_streamed_body_arrives_whole_with_its_length_every_time() -> None:
    array = np.arange(300_000, dtype=np.float32)  # 1.2 MiB: several pieces
    reader = PartsReader([memoryview(b"header"), memoryview(array).cast("B")])
    expected = b"header" + array.tobytes()
    seen = asyncio.run(post_twice(reader))
    assert seen == [(str(len(expected)), None, expected)] * 2


def test_only_streamed_bodies_are_wrapped() -> None:
    assert streamed(b"abc", None) == (b"abc", None)
    assert streamed(None, {"X": "1"}) == (None, {"X": "1"})
