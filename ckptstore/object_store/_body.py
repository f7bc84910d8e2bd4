"""Request bodies streamed straight from the arrays' memory.

A :class:`PartsReader` presents a sequence of buffers as one seekable file: an HTTP
client reads it a piece at a time, so sending a chunk makes neither a joined copy of
it nor a copy in the socket's send buffer (a ``bytes`` body would be copied whole into
the transport's buffer whenever the socket cannot take it at once). Memory held per
request stays a few hundred KiB, whatever its size. :func:`request_body` picks the
body of one request (:mod:`ckptstore.io._views` cuts an object into parts without
copying).

Example::

    >>> header, array = b"NUMPY", np.arange(2, dtype=np.uint8)
    >>> body = PartsReader([memoryview(header), memoryview(array).cast("B")])
    >>> body.read()  # what ``put_object(Bucket="b", Key="k", Body=body)`` would send
    b'NUMPY\\x00\\x01'
"""

from __future__ import annotations

import bisect
import io
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, TypeAlias, cast

if TYPE_CHECKING:
    from typing_extensions import Buffer as WriteableBuffer

__all__ = ["STREAM_THRESHOLD", "Body", "PartsReader", "StreamedBody", "request_body"]

STREAM_THRESHOLD = 1 << 20
"""Bodies at least this large are streamed from memory instead of copied."""


class PartsReader(io.RawIOBase):
    """A read-only, seekable file over the concatenation of byte views.

    Example::

        >>> PartsReader([memoryview(b"ab"), memoryview(b"cd")]).read()
        b'abcd'
    """

    def __init__(self, views: Sequence[memoryview]) -> None:
        super().__init__()
        self._views = [view for view in views if view.nbytes]
        self._starts: list[int] = []
        position = 0
        for view in self._views:
            self._starts.append(position)
            position += view.nbytes
        self._size = position
        self._position = 0

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = min(max(0, base + offset), self._size)
        return self._position

    def readinto(self, buffer: WriteableBuffer) -> int:
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < target.nbytes and self._position < self._size:
            piece = self._next_piece(target.nbytes - filled)
            target[filled : filled + piece.nbytes] = piece
            filled += piece.nbytes
        return filled

    def read(self, size: int | None = -1) -> bytes:
        remaining = self._size - self._position
        count = remaining if size is None or size < 0 else min(size, remaining)
        pieces: list[memoryview] = []
        while count > 0:
            piece = self._next_piece(count)
            pieces.append(piece)
            count -= piece.nbytes
        return pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)

    def pieces(self, size: int) -> Iterator[memoryview]:
        """The bytes from the current position on, as views of at most ``size`` bytes
        of the underlying buffers (no copy); each piece taken advances the position."""
        while size > 0 and self._position < self._size:
            yield self._next_piece(size)

    def _next_piece(self, most: int) -> memoryview:
        """A view of at most ``most`` (> 0) bytes from the current position, which it
        passes."""
        index = bisect.bisect_right(self._starts, self._position) - 1
        view = self._views[index]
        inner = self._position - self._starts[index]
        take = min(view.nbytes - inner, most)
        self._position += take
        return view[inner : inner + take]


class StreamedBody:
    """A :class:`PartsReader` as an HTTP client that takes async iterables sends it:
    its pieces handed to the transport in turn, no copy, no thread. aiohttp reads a
    file-like body in a thread, 256 KiB at a time, copying each (under aiobotocore,
    S3 uploads spent twice the CPU this way). It is no file (an ``io`` object would
    be read as one), but has what botocore needs of a body: ``read``, ``seek``,
    ``tell`` and ``len``. One request each: a retry wraps the reader anew.

    Example::

        >>> import asyncio
        >>> body = StreamedBody(PartsReader([memoryview(b"ab"), memoryview(b"cd")]))
        >>> async def sent() -> list[bytes]:
        ...     return [bytes(piece) async for piece in body]
        >>> len(body), asyncio.run(sent())
        (4, [b'ab', b'cd'])
    """

    PIECE = 256 << 10
    """Bytes handed to the transport at once."""

    def __init__(self, reader: PartsReader) -> None:
        self._reader = reader
        reader.seek(0)

    def __len__(self) -> int:
        return len(self._reader)

    def read(self, size: int | None = -1) -> bytes:
        return self._reader.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._reader.seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell()

    async def __aiter__(self) -> AsyncIterator[memoryview]:
        for piece in self._reader.pieces(self.PIECE):
            yield piece


Body: TypeAlias = bytes | bytearray | PartsReader
"""What one upload request sends: small bodies as bytes, large ones streamed."""


def request_body(views: Sequence[memoryview]) -> Body:
    """The body of one upload of the concatenation of ``views``: a whole ``bytes``
    object as is, small bodies joined (one copy is cheaper than streaming), large ones
    streamed from the views themselves."""
    if _is_whole_bytes(views):
        return cast(bytes, views[0].obj)
    if sum(view.nbytes for view in views) < STREAM_THRESHOLD:
        return b"".join(views)
    return PartsReader(views)


def _is_whole_bytes(views: Sequence[memoryview]) -> bool:
    return (
        len(views) == 1 and isinstance(views[0].obj, bytes) and views[0].nbytes == len(views[0].obj)
    )
