"""The path type every object store shares: checkpoints under ``scheme://bucket/prefix``.

Every request on the save and resume paths is a single-object request (upload, ranged
download, metadata, delete, parts), retried on its own with backoff; nothing lists the
bucket except the operator tools (``list_keys``, ``delete_tree``). Objects of at least
``parts_threshold`` bytes, and every stream written with
:meth:`ObjectStorePath.open_write`, go up in parts, in parallel.

A backend subclasses :class:`ObjectStorePath` and names its
:class:`~ckptstore.object_store._options.ObjectStoreOptions` and its
:class:`~ckptstore.object_store._client.ObjectStoreClient`.

Example::

    >>> from ckptstore_s3 import S3Path  # a backend: the ckptstore-s3 plugin's path type
    >>> S3Path.name, S3Path.protocols, S3Path.bucket_rule
    ('s3', ('s3', 's3a'), 'an S3 URL names a bucket: s3://BUCKET/prefix')
    >>> S3Path.options_type.__name__, S3Path.client_type.__name__
    ('S3Options', 'S3Client')
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any, ClassVar, Generic, TypeVar, cast

from ckptstore._types import Buffer, byte_view
from ckptstore.errors import (
    CorruptCheckpointError,
    DocumentChangedError,
    KeyExistsError,
    StorageError,
)
from ckptstore.io import IOSettings, windows
from ckptstore.object_store._body import PartsReader, request_body
from ckptstore.object_store._client import ObjectStoreClient
from ckptstore.object_store._multipart import upload_in_parts
from ckptstore.object_store._options import ObjectStoreOptions
from ckptstore.object_store._writer import MultipartWriter
from ckptstore.paths import FsspecPath
from ckptstore.plugin import CONTENT_VERSION, PathType
from ckptstore.records import current_limits, validate_key

__all__ = ["ObjectStorePath"]

MiB = 1 << 20
OptionsT = TypeVar("OptionsT", bound=ObjectStoreOptions)
ClientT = TypeVar("ClientT", bound=ObjectStoreClient)


class ObjectStorePath(FsspecPath, Generic[OptionsT, ClientT]):
    """A checkpoint root in an object-store bucket, on top of a backend's client.

    Subclasses set ``name``, ``protocols``, ``bucket_rule`` (the message for a URL
    without a bucket), ``options_type`` (which also opens the fsspec filesystem) and
    ``client_type``. Pickling rebuilds the path from its URL and storage options;
    ``repr`` shows the URL and endpoint, never credentials.

    Example::

        >>> import boto3
        >>> from contextlib import ExitStack
        >>> from ckptstore.testing import in_process_moto
        >>> from ckptstore_s3 import S3Path
        >>> stack = ExitStack()
        >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
        >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
        >>> _ = s3.create_bucket(Bucket="object-store-path")
        >>> storage = S3Path("s3://object-store-path/run", endpoint_url=moto.endpoint_url)
        >>> storage.write_bytes("trainer_0.1/a", b"hello")
        >>> storage.read_bytes("trainer_0.1/a", offset=1)
        b'ello'
        >>> import pickle
        >>> pickle.loads(pickle.dumps(storage)).read_bytes("trainer_0.1/a")  # from its URL
        b'hello'
        >>> stack.close()
    """

    supports_rename = False
    copies_on_write = True
    copies_on_read = True
    # every request is a network round trip: they must all be in flight at once, not
    # batched one after another on a worker (read by engines that batch small requests)
    batches_small_requests = False
    default_io = IOSettings(chunk_bytes=16 * MiB, concurrency=64, memory_budget=512 * MiB)
    max_key_bytes: ClassVar[int | None] = 1024  # S3 and GCS object names
    # a node's data in archives of about one part (16 MiB) of large blobs each, every
    # archive under the multipart threshold sent as one PUT, all at once: parallel like
    # a multipart upload's parts, without its two extra round trips and the store's
    # joining of the parts (docs/design.md, "Object stores")
    archive_bytes: ClassVar[int | None] = 16 * MiB
    max_archives: ClassVar[int | None] = 16
    bucket_rule: ClassVar[str]
    """What a URL must look like, said when it names no bucket."""
    options_type: type[OptionsT]
    """The backend's options (resolved from the storage options)."""
    client_type: type[ClientT]
    """The backend's client (made from the filesystem, the options and the bucket)."""

    options: OptionsT
    client: ClientT

    def __init__(self, url: str, **storage_options: object) -> None:
        if url.startswith(("/", "./", "../", "~", "file:")):  # a path type forced on it
            raise ValueError(
                f"{url!r} is a local path, not an object store URL: the {self.name!r} path "
                f"type takes {self.protocols[0]}://BUCKET/prefix URLs (drop the path type "
                "to write to local disk)"
            )
        self._raw_options = dict(storage_options)
        self.options = self.options_type.resolve(storage_options)
        filesystem, root = self.options.open_filesystem(url)
        super().__init__(url, filesystem=filesystem, root=root)
        bucket, _, prefix = self.root.partition("/")
        if not bucket:
            raise ValueError(f"{self.bucket_rule}, got {self.display_url!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = self.client_type(self.fs, self.options, bucket)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.url, self._raw_options))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.display_url!r}, "
            f"endpoint_url={self.options.endpoint_url!r})"
        )

    def stored_name_bytes(self, key: str) -> int:
        return len(self._object(key).encode())

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
            if total < self.options.parts_threshold:
                body = request_body(views)
                client.run(lambda: client.put(name, body))
            else:
                pieces = list(windows(views, self.options.part_size))  # one pass
                client.run(
                    lambda: upload_in_parts(
                        client.multipart(name),
                        len(pieces),
                        lambda i: PartsReader(pieces[i]),
                        limit=self.options.max_concurrency,
                    )
                )

    def open_write(self, key: str) -> IO[bytes]:
        url = self.display_url
        writer = MultipartWriter(
            self.client,
            self._object(key),
            part_size=self.options.part_size,
            max_in_flight=self.options.stream_parts_in_flight,
            wrap_error=lambda error: StorageError(url, key, "write", error),
        )
        return cast(IO[bytes], writer)

    def put_document(self, key: str, data: bytes) -> None:
        name = self._object(key)
        with self._errors("write", key):
            self.client.run(lambda: self.client.put(name, data))

    def create_document(self, key: str, data: bytes) -> None:
        """A single conditional upload (:meth:`ObjectStoreClient.put_if_absent`):
        control documents are small, so never multipart."""
        name = self._object(key)
        with self._errors("create", key):
            created = self.client.run(lambda: self.client.put_if_absent(name, data))
        if not created and not self._holds(key, data):
            # (the same bytes: our own create, whose first answer was lost and whose
            # retry found it done; commit records and leases carry unique content)
            raise KeyExistsError(self.display_url, key)

    def get_versioned_document(self, key: str) -> tuple[bytes, str] | None:
        """A metadata request for the version (ETag, generation), then the document:
        if it changes in between, the version is the older one, so a replace with it
        fails (on the safe side)."""
        name = self._object(key)
        with self._errors("read", key):
            info = self.client.run(lambda: self.client.head(name))
        if info is None:
            return None
        data = self.get_document(key)
        if data is None:
            return None
        if info.version is None:  # the store names no version: the bytes are it
            return super().get_versioned_document(key)
        return data, info.version

    def replace_existing_document(self, key: str, data: bytes, version: str) -> None:
        """A single conditional upload (:meth:`ObjectStoreClient.put_if_version`); for a
        store that names no versions (a content version), a check, then a write."""
        if version.startswith(CONTENT_VERSION):
            super().replace_existing_document(key, data, version)
            return
        name = self._object(key)
        with self._errors("replace", key):
            replaced = self.client.run(lambda: self.client.put_if_version(name, data, version))
        if not replaced and not self._holds(key, data):
            # (the same bytes: our own replace, whose first answer was lost and whose
            # retry found the version moved on; lease documents carry unique content)
            raise DocumentChangedError(self.display_url, key)

    def _holds(self, key: str, data: bytes) -> bool:
        """Whether the document ``key`` holds exactly ``data`` (not if it is refused
        unread, as larger than the document limit)."""
        try:
            return self.get_document(key) == data
        except CorruptCheckpointError:
            return False

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        names = [self._object(key) for key in keys]
        if names:
            with self._errors("delete", keys[0] if len(keys) == 1 else f"{len(keys)} keys"):
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
        with self._errors("read", key), self._refused(key):
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
        with self._errors("read", key), self._refused(key):
            return self.client.run(lambda: self.client.get(name, offset, length))

    def read_document(self, key: str) -> bytes:
        """A control document in one download of at most ``max_document_bytes + 1``
        bytes (:class:`~ckptstore.records.Limits`): refused before its body is read if
        the response declares a larger object, and as soon as the body outgrows the
        limit or the size the response declared."""
        name = self._object(key)
        limit = current_limits().max_document_bytes
        with self._errors("read", key), self._refused(key):
            return self.client.run(lambda: self.client.get_document(name, limit))

    @contextlib.contextmanager
    def _refused(self, key: str) -> Iterator[None]:
        """Stored bytes the client refused, reported at ``key`` of this checkpoint."""
        try:
            yield
        except CorruptCheckpointError as error:
            raise CorruptCheckpointError(error.detail, url=self.display_url, file=key) from None

    def exists(self, key: str) -> bool:
        name = self._object(key)
        with self._errors("check", key):
            return self.client.run(lambda: self.client.head(name)) is not None

    def size(self, key: str) -> int:
        name = self._object(key)
        with self._errors("read size of", key):
            return self.client.run(lambda: self.client.size(name))

    def list_keys(self, prefix: str = "") -> list[str]:
        return self._list(prefix, None)

    def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        return self._list(prefix, self._object(skip.rstrip("/")) + "/")

    def _list(self, prefix: str, skip: str | None) -> list[str]:
        """Keys under ``prefix``, but the objects whose names start with ``skip``."""
        base = self._object(prefix) if prefix else self.prefix
        under = f"{base}/" if base else ""
        client = self.client
        with self._errors("list", prefix or None):
            if skip is None:
                names = client.run(lambda: client.list_keys(under))
            else:
                names = client.run(lambda: client.list_keys_except(under, skip))
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(name[cut:] for name in names)

    # -- the rest ---------------------------------------------------------------------

    def accessible(self) -> bool:
        """Whether the bucket answers a metadata request (no listing, nothing written)."""
        return bool(self.client.run(self.client.bucket_exists))

    def sync(self) -> None:
        """Nothing to do: object stores acknowledge an upload (whole, or completed from
        parts) once it is durable."""

    def close(self) -> None:
        self.client.close()


def _rebuild(cls: type[PathType], url: str, options: dict[str, Any]) -> PathType:
    return cls(url, **options)
