"""A write stream that uploads an object in parts, in parallel, under a memory limit.

Formats that write sequentially (``npz``) get their bytes cut into ``part_size`` parts;
each full part is uploaded in the background (retried on its own) while the next one
fills, with at most ``max_in_flight`` parts held at once, so memory stays bounded
however large the object. An object smaller than one part is sent as a single upload
on close. Leaving a ``with`` block on an exception, or any failure, aborts the upload:
no partial object is ever created.

Example::

    >>> import boto3
    >>> from contextlib import ExitStack
    >>> from ckptstore.testing import in_process_moto
    >>> from ckptstore_s3 import S3Path
    >>> stack = ExitStack()
    >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
    >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
    >>> _ = s3.create_bucket(Bucket="multipart-writer")
    >>> client = S3Path("s3://multipart-writer/run").client
    >>> with MultipartWriter(client, "run/trainer_0.3/blobs.npz", part_size=5 << 20,
    ...                      max_in_flight=2) as out:  # S3's smallest part: 5 MiB
    ...     _ = out.write(b"header")
    ...     _ = out.write(bytes(6 << 20))  # the first part goes up while this fills
    >>> client.run(lambda: client.size("run/trainer_0.3/blobs.npz"))
    6291462
    >>> stack.close()
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
from collections import deque
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from ckptstore._types import byte_view
from ckptstore.object_store._body import PartsReader
from ckptstore.object_store._client import ObjectStoreClient
from ckptstore.object_store._multipart import MultipartUpload

if TYPE_CHECKING:
    from typing_extensions import Buffer as ReadableBuffer

__all__ = ["MultipartWriter"]


class MultipartWriter(io.RawIOBase):
    """Buffers ``part_size`` bytes at a time and uploads full parts concurrently
    through the client's :class:`~ckptstore.object_store._multipart.MultipartUpload`.

    ``wrap_error`` turns a failed request into the error the caller raises (a
    :class:`~ckptstore.errors.StorageError` naming the URL and key).

    Example::

        >>> import boto3
        >>> from contextlib import ExitStack
        >>> from ckptstore.testing import in_process_moto
        >>> from ckptstore_s3 import S3Path
        >>> stack = ExitStack()
        >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
        >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
        >>> _ = s3.create_bucket(Bucket="multipart-writer-close")
        >>> client = S3Path("s3://multipart-writer-close/run").client
        >>> writer = MultipartWriter(client, "run/a", part_size=8 << 20, max_in_flight=4)
        >>> writer.write(b"small")  # less than a part: one plain upload on close
        5
        >>> client.run(lambda: client.head("run/a")) is None
        True
        >>> writer.close()  # the object exists once close returns
        >>> client.run(lambda: client.head("run/a"))
        ObjectInfo(size=5, version=...)
        >>> stack.close()
    """

    def __init__(
        self,
        client: ObjectStoreClient,
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
        self._upload: MultipartUpload | None = None
        self._next_part = 0
        self._in_flight: deque[concurrent.futures.Future[None]] = deque()
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

    def write(self, data: ReadableBuffer) -> int:
        with self._reported():
            if self.closed:
                raise ValueError(f"write to a closed {self._client.options.STORE} object stream")
            view = byte_view(memoryview(data))
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
        client = self._client
        upload = self._upload
        if upload is None:
            upload = self._upload = client.multipart(self._key)
            client.run(upload.start)
        while len(self._in_flight) >= self._max_in_flight:
            self._collect(self._in_flight.popleft())
        body = PartsReader([memoryview(self._buffer)[: self._filled]])
        index = self._next_part
        self._in_flight.append(client.submit(lambda: upload.upload_part(index, body)))
        self._next_part += 1
        self._buffer = bytearray(self._part_size)
        self._filled = 0

    def _collect(self, future: concurrent.futures.Future[None]) -> None:
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
                self._finish()
            finally:
                self._buffer = bytearray()
                super().close()

    def _finish(self) -> None:
        """Abort after a failure, send a small object in one request, or send the last
        part, wait for every part and complete the upload (aborting it on failure)."""
        if self._failed:
            self._abort()
            return
        upload = self._upload
        if upload is None:
            body = self._buffer[: self._filled]
            self._client.run(lambda: self._client.put(self._key, body))
            return
        try:
            if self._filled:
                self._send_part()
            while self._in_flight:
                self._collect(self._in_flight.popleft())
            self._client.run(upload.complete)
        except BaseException:
            self._abort()
            raise

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
            with contextlib.suppress(BaseException):  # a cancelled future raises here
                future.exception()
        self._in_flight.clear()
        if self._upload is not None:
            self._client.run(self._upload.abort)

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
