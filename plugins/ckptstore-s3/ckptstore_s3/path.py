"""The ``s3`` path type: checkpoints under ``s3://bucket/prefix``.

Every request on the save and resume paths is a single-object call (PUT, ranged GET,
HEAD, DELETE, multipart), retried on its own with backoff; nothing lists the bucket
except the operator tools (``list_keys``, ``delete_tree``). Objects of at least
``multipart_threshold`` bytes, and every stream written with :meth:`S3Path.open_write`,
go up as multipart uploads with parts in parallel.

Example::

    CheckpointManager("s3://bucket/run", "trainer_0", "npz",
                      storage_options={"endpoint_url": "http://127.0.0.1:9000"})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO, Any, cast

from ckptstore.builtin.fsspec_path import FsspecPath
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError, StorageError
from ckptstore.io.settings import IOSettings
from ckptstore.names import validate_key
from ckptstore.types import Buffer, byte_view
from ckptstore_s3.body import PartsReader
from ckptstore_s3.client import MissingObjectError, S3Client
from ckptstore_s3.options import S3Options
from ckptstore_s3.redaction import protect
from ckptstore_s3.writer import MultipartWriter

__all__ = ["S3Path"]

MiB = 1 << 20
STREAM_THRESHOLD = 1 * MiB
"""Bodies at least this large are streamed from memory instead of copied."""


class S3Path(FsspecPath):
    """A checkpoint root in an S3 bucket (AWS, or any S3-compatible server).

    Storage options (keyword arguments) override the usual environment variables:
    ``endpoint_url``, ``region``, ``profile``, ``key``/``secret``/``token``, ``anon``,
    ``part_size``, ``multipart_threshold``, ``max_concurrency`` (parts of one object in
    flight), ``max_connections``, ``buffer_bytes`` (memory of one write stream),
    ``retries``, ``connect_timeout``, ``read_timeout``; see :mod:`ckptstore_s3.options`.

    Example::

        storage = S3Path("s3://bucket/run", endpoint_url="http://127.0.0.1:9000")
        storage.write_bytes("trainer_0.1/a", b"hello")
        storage.read_bytes("trainer_0.1/a")  # b'hello'
    """

    name = "s3"
    protocols = ("s3", "s3a")
    supports_rename = False
    copies_on_write = True
    copies_on_read = True
    # every request is a network round trip: they must all be in flight at once, not
    # batched one after another on a worker (read by engines that batch small requests)
    batches_small_requests = False
    default_io = IOSettings(chunk_bytes=16 * MiB, concurrency=64, memory_budget=512 * MiB)

    def __init__(self, url: str, **storage_options: Any) -> None:
        self.options = S3Options.resolve(storage_options)
        protect(self.options.secrets())
        super().__init__(url, **self.options.s3fs_kwargs())
        self._raw_options = dict(storage_options)
        bucket, _, prefix = self.root.partition("/")
        if not bucket:
            raise ValueError(
                f"an S3 URL names a bucket: s3://BUCKET/prefix, got {self.display_url!r}"
            )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = S3Client(self.fs, self.options, bucket, self.display_url)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.url, self._raw_options))

    def __repr__(self) -> str:
        return f"S3Path({self.display_url!r}, endpoint_url={self.options.endpoint_url!r})"

    def _object(self, key: str) -> str:
        key = validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- writes -----------------------------------------------------------------------

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        name = self._object(key)
        views = [byte_view(part) for part in parts]
        total = sum(view.nbytes for view in views)
        client = self.client
        with self._errors("write", key):
            if total < self.options.multipart_threshold:
                body = _body(views)
                client.run(lambda: client.put(name, body))
            else:
                size = self.options.part_size
                count = -(-total // size)
                client.run(
                    lambda: client.upload_multipart(
                        name, count, lambda i: PartsReader(_slice(views, i * size, size))
                    )
                )

    def open_write(self, key: str) -> IO[bytes]:
        size = self.options.part_size
        in_flight = max(1, min(self.options.max_concurrency, self.options.buffer_bytes // size - 1))
        url = self.display_url
        writer = MultipartWriter(
            self.client,
            self._object(key),
            part_size=size,
            max_in_flight=in_flight,
            wrap_error=lambda error: StorageError(url, key, "write", error),
        )
        return cast(IO[bytes], writer)

    def put_document(self, key: str, data: bytes) -> None:
        name = self._object(key)
        with self._errors("write", key):
            self.client.run(lambda: self.client.put(name, data))

    def delete(self, keys: Iterable[str]) -> None:
        names = [self._object(key) for key in keys]
        if names:
            with self._errors("delete", names[0]):
                self.client.run(lambda: self.client.delete_many(names))

    def delete_tree(self, prefix: str) -> None:
        base = self._object(prefix) + "/"
        with self._errors("delete", prefix):
            names = self.client.run(lambda: self.client.list_keys(base))
            self.client.run(lambda: self.client.delete_many(names))

    # -- reads ------------------------------------------------------------------------

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        name = self._object(key)
        total = sum(target.nbytes for target in targets)
        if total == 0:
            return
        with self._errors("read", key):
            received = self.client.run(lambda: self.client.get_into(name, offset, targets))
        if received < total:
            raise CorruptCheckpointError(
                f"the object ends {total - received} bytes before the end of the recorded range",
                url=self.display_url,
                file=key,
            )

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        name = self._object(key)
        if length == 0:
            return b""
        with self._errors("read", key):
            return self.client.run(lambda: self.client.get(name, offset, length))

    def get_document(self, key: str) -> bytes | None:
        try:
            return self.read_bytes(key)
        except ObjectNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        name = self._object(key)
        with self._errors("check", key):
            return self.client.run(lambda: self.client.head(name)) is not None

    def size(self, key: str) -> int:
        name = self._object(key)
        with self._errors("read size of", key):
            head = self.client.run(lambda: self.client.head(name))
            if head is None:
                raise MissingObjectError(
                    f"HEAD s3://{self.bucket}/{name}: no such object",
                    status=404,
                    code="NoSuchKey",
                    attempts=1,
                    retryable=False,
                )
            return int(head["ContentLength"])

    def list_keys(self, prefix: str = "") -> list[str]:
        base = self._object(prefix) if prefix else self.prefix
        with self._errors("list", prefix or None):
            names = self.client.run(lambda: self.client.list_keys(f"{base}/" if base else ""))
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(name[cut:] for name in names)

    # -- the rest ---------------------------------------------------------------------

    def accessible(self) -> bool:
        """Whether the bucket answers a HEAD (no listing, nothing written)."""
        return bool(self.client.run(self.client.bucket_exists))

    def sync(self) -> None:
        """Nothing to do: S3 acknowledges a PUT or a completed upload once it is durable."""

    def close(self) -> None:
        s3 = getattr(self.fs, "_s3", None)
        if s3 is not None:
            type(self.fs).close_session(self.fs.loop, s3)
            self.fs._s3 = None


def _body(views: list[memoryview]) -> bytes | PartsReader:
    """Small bodies as bytes (one copy is cheaper than streaming), large ones streamed
    from the views themselves."""
    if _is_whole_bytes(views):
        return cast(bytes, views[0].obj)
    if sum(view.nbytes for view in views) < STREAM_THRESHOLD:
        return b"".join(views)
    return PartsReader(views)


def _is_whole_bytes(views: list[memoryview]) -> bool:
    return (
        len(views) == 1 and isinstance(views[0].obj, bytes) and views[0].nbytes == len(views[0].obj)
    )


def _slice(views: Sequence[memoryview], start: int, size: int) -> list[memoryview]:
    """Views of ``size`` bytes from ``start`` of the concatenation of ``views``."""
    pieces: list[memoryview] = []
    position = 0
    end = start + size
    for view in views:
        low, high = position, position + view.nbytes
        position = high
        if high <= start or low >= end:
            continue
        pieces.append(view[max(start, low) - low : min(end, high) - low])
    return pieces


def _rebuild(cls: type[S3Path], url: str, options: dict[str, Any]) -> S3Path:
    return cls(url, **options)
