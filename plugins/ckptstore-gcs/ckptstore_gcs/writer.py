"""A write stream that uploads an object as a parallel composite upload.

Formats that write sequentially (``npz``) get their bytes cut into ``part_size`` parts;
each full part is uploaded as a temporary object in the background (retried on its
own) while the next one fills, with at most ``max_in_flight`` parts held at once. On
close the parts are composed into the object and deleted. An object smaller than one
part is a single upload. Leaving a ``with`` block on an exception deletes the parts:
no partial object is ever created.

Example::

    with CompositeWriter(client, "run/trainer_0.3/blobs.npz", part_size=16 << 20,
                         max_in_flight=8) as out:
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
from ckptstore_gcs.client import GCSClient

__all__ = ["CompositeWriter"]


class CompositeWriter(io.RawIOBase):
    """Buffers ``part_size`` bytes at a time and uploads full parts concurrently.

    Example::

        writer = CompositeWriter(client, key, part_size=8 << 20, max_in_flight=4)
        writer.write(b"..."); writer.close()  # the object exists once close returns
    """

    def __init__(
        self,
        client: GCSClient,
        key: str,
        *,
        part_size: int,
        max_in_flight: int,
        wrap_error: Callable[[OSError], Exception] | None = None,
    ) -> None:
        super().__init__()
        self._client = client
        self._key = key
        self._part_size = part_size
        self._max_in_flight = max(1, max_in_flight)
        self._wrap_error = wrap_error
        self._buffer = bytearray(part_size)
        self._filled = 0
        self._position = 0
        self._token = client.new_token()
        self._parts: list[str] = []
        self._in_flight: deque[Future[None]] = deque()
        self._failed = False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    @contextlib.contextmanager
    def _reported(self) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            self._failed = True
            if self._wrap_error is None:
                raise
            raise self._wrap_error(error) from error

    def write(self, data: Any) -> int:
        with self._reported():
            if self.closed:
                raise ValueError("write to a closed GCS object stream")
            view = byte_view(data)
            total = view.nbytes
            while view.nbytes:
                take = min(self._part_size - self._filled, view.nbytes)
                self._buffer[self._filled : self._filled + take] = view[:take]
                self._filled += take
                view = view[take:]
                if self._filled == self._part_size:
                    self._send_part()
            self._position += total
            return total

    def _send_part(self) -> None:
        while len(self._in_flight) >= self._max_in_flight:
            self._collect(self._in_flight.popleft())
        client = self._client
        name = client.part_name(self._key, self._token, len(self._parts))
        full = self._filled == self._part_size
        body = self._buffer if full else self._buffer[: self._filled]
        self._parts.append(name)
        self._in_flight.append(client.submit(lambda: client.put(name, body)))
        self._buffer = bytearray(self._part_size)
        self._filled = 0

    def _collect(self, future: Future[None]) -> None:
        try:
            future.result()
        except BaseException:
            self._failed = True
            raise

    def close(self) -> None:
        if self.closed:
            return
        with self._reported():
            try:
                if self._failed:
                    self._abort()
                elif not self._parts:
                    body = self._buffer[: self._filled]
                    self._client.run(lambda: self._client.put(self._key, body))
                else:
                    if self._filled:
                        self._send_part()
                    try:
                        while self._in_flight:
                            self._collect(self._in_flight.popleft())
                    except BaseException:
                        self._abort()
                        raise
                    parts = list(self._parts)
                    self._client.run(
                        lambda: self._client.compose_parts(self._key, parts, self._token)
                    )
            finally:
                self._buffer = bytearray()
                super().close()

    def abort(self) -> None:
        """Give up: delete the uploaded parts; the object is not created."""
        if not self.closed:
            self._abort()
            self._buffer = bytearray()
            super().close()

    def _abort(self) -> None:
        for future in self._in_flight:
            future.cancel()
        for future in self._in_flight:
            with contextlib.suppress(BaseException):
                future.exception()
        self._in_flight.clear()
        parts = list(self._parts)
        if parts:
            with contextlib.suppress(OSError):
                self._client.run(lambda: self._client.delete_many(parts))

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
