"""A write stream that uploads an object as a multipart upload, parts in parallel.

Formats that write sequentially (``npz``) get their bytes cut into ``part_size`` parts;
each full part is uploaded in the background (retried on its own) while the next one
fills, with at most ``buffer_bytes // part_size`` parts held at once, so memory stays
bounded however large the object. An object smaller than one part is sent as a single
PUT on close. Leaving a ``with`` block on an exception aborts the upload: no partial
object is ever created.

Example::

    with MultipartWriter(client, "run/trainer_0.3/blobs.npz", part_size=16 << 20,
                         max_in_flight=8) as out:
        out.write(header)
        out.write(array_bytes)
"""

from __future__ import annotations

import contextlib
import io
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from ckptstore.types import byte_view
from ckptstore_s3.body import PartsReader
from ckptstore_s3.client import S3Client

__all__ = ["MultipartWriter"]


class MultipartWriter(io.RawIOBase):
    """Buffers ``part_size`` bytes at a time and uploads full parts concurrently.

    Example::

        writer = MultipartWriter(client, key, part_size=8 << 20, max_in_flight=4)
        writer.write(b"..."); writer.close()  # the object exists once close returns
    """

    def __init__(
        self,
        client: S3Client,
        key: str,
        *,
        part_size: int,
        max_in_flight: int,
        wrap_error: Callable[[OSError], Exception] | None = None,
    ) -> None:
        super().__init__()
        self._wrap_error = wrap_error
        self._client = client
        self._key = key
        self._part_size = part_size
        self._max_in_flight = max(1, max_in_flight)
        self._buffer = bytearray(part_size)
        self._filled = 0
        self._position = 0
        self._upload_id: str | None = None
        self._next_part = 1
        self._in_flight: deque[Future[dict[str, Any]]] = deque()
        self._parts: list[dict[str, Any]] = []
        self._failed = False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        with self._reported():
            return self._write(data)

    @contextlib.contextmanager
    def _reported(self) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            self._failed = True
            if self._wrap_error is None:
                raise
            raise self._wrap_error(error) from error

    def _write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed S3 object stream")
        view = byte_view(data)
        total = view.nbytes
        while view.nbytes:
            room = self._part_size - self._filled
            take = min(room, view.nbytes)
            self._buffer[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == self._part_size:
                self._send_part()
        self._position += total
        return total

    def _send_part(self) -> None:
        client = self._client
        if self._upload_id is None:
            self._upload_id = client.run(lambda: client.create_upload(self._key))
        while len(self._in_flight) >= self._max_in_flight:
            self._collect(self._in_flight.popleft())
        body = PartsReader([memoryview(self._buffer)[: self._filled]])
        number, upload_id = self._next_part, self._upload_id
        self._in_flight.append(
            client.submit(lambda: client.upload_part(self._key, upload_id, number, body))
        )
        self._next_part += 1
        self._buffer = bytearray(self._part_size)
        self._filled = 0

    def _collect(self, future: Future[dict[str, Any]]) -> None:
        try:
            self._parts.append(future.result())
        except BaseException:
            self._failed = True
            raise

    def close(self) -> None:
        if self.closed:
            return
        with self._reported():
            self._close()

    def _close(self) -> None:
        try:
            if self._failed:
                self._abort()
            elif self._upload_id is None:
                body = self._buffer[: self._filled]
                self._client.run(lambda: self._client.put(self._key, body))
            else:
                if self._filled:
                    self._send_part()
                try:
                    while self._in_flight:
                        self._collect(self._in_flight.popleft())
                    upload_id = self._upload_id
                    self._client.run(
                        lambda: self._client.complete_upload(self._key, upload_id, self._parts)
                    )
                except BaseException:
                    self._abort()
                    raise
        finally:
            self._buffer = bytearray()
            super().close()

    def abort(self) -> None:
        """Give up: cancel the upload; the object is not created (or keeps its old value)."""
        if not self.closed:
            self._abort()
            self._buffer = bytearray()
            super().close()

    def _abort(self) -> None:
        for future in self._in_flight:
            future.cancel()
        for future in self._in_flight:
            try:
                future.exception()
            except BaseException:  # a cancelled future raises CancelledError here
                continue
        self._in_flight.clear()
        if self._upload_id is not None:
            upload_id = self._upload_id
            self._client.run(lambda: self._client.abort_upload(self._key, upload_id))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # A stream dropped without close() was abandoned: never complete it.
        if not self.closed:
            with contextlib.suppress(Exception):
                self.abort()
