"""Request bodies streamed straight from the arrays' memory.

A :class:`PartsReader` presents a sequence of buffers as one seekable file: the HTTP
client reads it 256 KiB at a time, so sending a chunk makes neither a joined copy of
it nor a copy in the socket's send buffer (a ``bytes`` body would be copied whole into
the transport's buffer whenever the socket cannot take it at once). Memory held per
request stays a few hundred KiB, whatever its size.

Example::

    body = PartsReader([memoryview(header), memoryview(array).cast("B")])
    await client.put_object(Bucket="b", Key="k", Body=body)
"""

from __future__ import annotations

import bisect
import io
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["PartsReader"]


class PartsReader(io.RawIOBase):
    """A read-only, seekable file over the concatenation of byte views.

    Example::

        PartsReader([memoryview(b"ab"), memoryview(b"cd")]).read()  # b'abcd'
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

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < target.nbytes and self._position < self._size:
            index = bisect.bisect_right(self._starts, self._position) - 1
            view = self._views[index]
            inner = self._position - self._starts[index]
            take = min(view.nbytes - inner, target.nbytes - filled)
            target[filled : filled + take] = view[inner : inner + take]
            filled += take
            self._position += take
        return filled

    def read(self, size: int | None = -1) -> bytes:
        remaining = self._size - self._position
        count = remaining if size is None or size < 0 else min(size, remaining)
        pieces: list[memoryview] = []
        while count > 0:
            index = bisect.bisect_right(self._starts, self._position) - 1
            view = self._views[index]
            inner = self._position - self._starts[index]
            take = min(view.nbytes - inner, count)
            pieces.append(view[inner : inner + take])
            self._position += take
            count -= take
        return pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)
