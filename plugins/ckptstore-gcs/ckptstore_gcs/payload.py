"""Upload bodies streamed to aiohttp straight from the arrays' memory.

aiohttp would send a :class:`~ckptstore.object_store.PartsReader` as a file of unknown
length (chunked, read in a thread); :class:`ViewsPayload` gives it the length and
writes the underlying views a piece at a time, without copying them.

Example::

    >>> from ckptstore.object_store import PartsReader
    >>> views = [memoryview(b"header"), memoryview(np.zeros(4, np.uint8))]
    >>> payload = ViewsPayload(PartsReader(views))  # session.post(url, data=payload)
    >>> payload.size
    10
"""

from __future__ import annotations

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

from ckptstore.object_store import PartsReader

__all__ = ["ViewsPayload", "as_payload"]

PIECE = 256 << 10
"""Bytes handed to the transport at once."""


class ViewsPayload(Payload):
    """An aiohttp request body over a :class:`~ckptstore.object_store.PartsReader`.

    Example::

        >>> from ckptstore.object_store import PartsReader
        >>> ViewsPayload(PartsReader([memoryview(b"ab"), memoryview(b"cd")])).size
        4
    """

    _autoclose = True  # memory only: nothing to close

    def __init__(self, reader: PartsReader) -> None:
        super().__init__(reader, content_type="application/octet-stream")
        self._reader = reader
        self._size = len(reader)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        position = self._reader.tell()
        self._reader.seek(0)
        try:
            return self._reader.read().decode(encoding, errors)
        finally:
            self._reader.seek(position)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        remaining = len(self._reader) if content_length is None else content_length
        self._reader.seek(0)  # a redirect or a retry sends the whole body again
        for piece in self._reader.pieces(PIECE):
            if remaining <= 0:
                return
            chunk = piece[:remaining]
            await writer.write(chunk)
            remaining -= chunk.nbytes


def as_payload(body: bytes | bytearray | PartsReader | None) -> bytes | bytearray | Payload | None:
    """What to hand aiohttp as ``data=`` for ``body`` (a new payload per attempt)."""
    return ViewsPayload(body) if isinstance(body, PartsReader) else body
