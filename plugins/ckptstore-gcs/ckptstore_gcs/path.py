"""The ``gs`` path type: checkpoints under ``gs://bucket/prefix``.

Every request on the save and resume paths is a single-object call (upload, ranged
download, metadata, delete, compose), retried on its own with backoff; nothing lists
the bucket except the operator tools (``list_keys``, ``delete_tree``). Objects of at
least ``composite_threshold`` bytes, and every stream written with
:meth:`GCSPath.open_write`, go up as parallel composite uploads.

Example::

    CheckpointManager("gs://bucket/run", "trainer_0", "npz",
                      storage_options={"project": "my-project"})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO, Any, cast

from gcsfs.core import GCSFileSystem

from ckptstore.builtin.fsspec_path import FsspecPath
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError, StorageError
from ckptstore.io.settings import IOSettings
from ckptstore.names import validate_key
from ckptstore.path_type import PathType
from ckptstore.types import Buffer, byte_view
from ckptstore_gcs.client import GCSClient
from ckptstore_gcs.options import GCSOptions
from ckptstore_gcs.retry import MissingObjectError
from ckptstore_gcs.writer import CompositeWriter

__all__ = ["GCSPath"]

MiB = 1 << 20


class GCSPath(FsspecPath):
    """A checkpoint root in a Google Cloud Storage bucket (or an emulator).

    Storage options (keyword arguments) override the usual environment variables:
    ``endpoint_url``, ``project``, ``token``, ``part_size``, ``composite_threshold``,
    ``max_concurrency`` (parts of one object in flight), ``buffer_bytes`` (memory of one
    write stream), ``retries``, ``connect_timeout``, ``read_timeout``; see
    :mod:`ckptstore_gcs.options`.

    Example::

        storage = GCSPath("gs://bucket/run", endpoint_url="http://127.0.0.1:9023")
        storage.write_bytes("trainer_0.1/a", b"hello")
        storage.read_bytes("trainer_0.1/a")  # b'hello'
    """

    name = "gcs"
    protocols = ("gs", "gcs")
    supports_rename = False
    copies_on_write = True
    copies_on_read = True
    # every request is a network round trip: they must all be in flight at once, not
    # batched one after another on a worker (read by engines that batch small requests)
    batches_small_requests = False
    default_io = IOSettings(chunk_bytes=16 * MiB, concurrency=64, memory_budget=512 * MiB)

    def __init__(self, url: str, **storage_options: Any) -> None:
        self.options = GCSOptions.resolve(storage_options)
        PathType.__init__(self, url)
        # gcsfs's plain filesystem: its default "extended" one asks a gRPC API for each
        # bucket's layout first (emulators lack it), and nothing here needs it.
        self.fs = GCSFileSystem(**self.options.gcsfs_kwargs())
        self.root = str(GCSFileSystem._strip_protocol(url)).rstrip("/")
        self._storage_options = self.options.gcsfs_kwargs()
        self._raw_options = dict(storage_options)
        bucket, _, prefix = self.root.partition("/")
        if not bucket:
            raise ValueError(
                f"a GCS URL names a bucket: gs://BUCKET/prefix, got {self.display_url!r}"
            )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = GCSClient(self.fs, self.options, bucket)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.url, self._raw_options))

    def __repr__(self) -> str:
        return f"GCSPath({self.display_url!r}, endpoint_url={self.options.endpoint_url!r})"

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
            if total < self.options.composite_threshold:
                body = cast(bytes, views[0].obj) if _is_whole_bytes(views) else b"".join(views)
                client.run(lambda: client.put(name, body))
            else:
                size = self.options.part_size
                count = -(-total // size)
                client.run(
                    lambda: client.upload_composite(
                        name, count, lambda i: _slice(views, i * size, size)
                    )
                )

    def open_write(self, key: str) -> IO[bytes]:
        size = self.options.part_size
        in_flight = max(1, min(self.options.max_concurrency, self.options.buffer_bytes // size - 1))
        url = self.display_url
        writer = CompositeWriter(
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
                    f"stat gs://{self.bucket}/{name}: no such object",
                    status=404,
                    attempts=1,
                    retryable=False,
                )
            return int(head["size"])

    def list_keys(self, prefix: str = "") -> list[str]:
        base = self._object(prefix) if prefix else self.prefix
        with self._errors("list", prefix or None):
            names = self.client.run(lambda: self.client.list_keys(f"{base}/" if base else ""))
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(name[cut:] for name in names)

    # -- the rest ---------------------------------------------------------------------

    def accessible(self) -> bool:
        """Whether the bucket's metadata can be read (no listing, nothing written)."""
        return bool(self.client.run(self.client.bucket_exists))

    def sync(self) -> None:
        """Nothing to do: GCS acknowledges an upload or a compose once it is durable."""

    def close(self) -> None:
        session = getattr(self.fs, "_session", None)
        if session is not None and not session.closed:
            self.client.run(session.close)
        self.fs._session = None


def _is_whole_bytes(views: list[memoryview]) -> bool:
    return (
        len(views) == 1 and isinstance(views[0].obj, bytes) and views[0].nbytes == len(views[0].obj)
    )


def _slice(views: Sequence[memoryview], start: int, size: int) -> bytes:
    """``size`` bytes from ``start`` of the concatenation of ``views`` (one copy)."""
    pieces: list[memoryview] = []
    position = 0
    end = start + size
    for view in views:
        low, high = position, position + view.nbytes
        position = high
        if high <= start or low >= end:
            continue
        pieces.append(view[max(start, low) - low : min(end, high) - low])
    return b"".join(pieces)


def _rebuild(cls: type[GCSPath], url: str, options: dict[str, Any]) -> GCSPath:
    return cls(url, **options)
