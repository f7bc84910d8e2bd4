"""The path-type contract: a checkpoint root (a directory or a bucket prefix) addressed
by relative keys. Path types are plugins; see ``docs/plugins.md``.

Keys are validated on every call, so nothing addressed through a path type can land
outside its root.

Example (what a new path type implements; the rest has defaults)::

    >>> sorted(PathType.__abstractmethods__)  # doctest: +NORMALIZE_WHITESPACE
    ['delete', 'delete_tree', 'exists', 'list_keys', 'open_write', 'read_bytes',
     'read_into', 'size', 'write_parts']
"""

from __future__ import annotations

import hashlib
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import IO, ClassVar

from ckptstore._types import Buffer, byte_view
from ckptstore.errors import (
    DocumentChangedError,
    InvalidNameError,
    KeyExistsError,
    ObjectNotFoundError,
)
from ckptstore.io import IOSettings, PositionalReader, PositionalWriter
from ckptstore.records import current_limits

__all__ = [
    "CONTENT_VERSION",
    "PathType",
    "PositionalReader",
    "PositionalWriter",
    "content_version",
    "redact_url",
]

_CREDENTIALS_IN_URL = re.compile(r"(?<=://)[^/@]*@")


CONTENT_VERSION = "sha256:"
"""The prefix of a version that is the hash of the bytes (:func:`content_version`)."""


def content_version(data: bytes) -> str:
    """The version of a document that is its bytes' SHA-256 (``sha256:<hex>``).

    What :meth:`PathType.get_versioned_document` gives by default.

    Example::

        >>> content_version(b"lease")[:15]
        'sha256:b544a768'
    """
    return CONTENT_VERSION + hashlib.sha256(data).hexdigest()


def redact_url(url: str) -> str:
    """``url`` with any ``user:secret@`` part and query string removed, for messages."""
    return _CREDENTIALS_IN_URL.sub("", url).split("?", 1)[0]


class _DelegatingReader(PositionalReader):
    """The default :class:`PositionalReader`: each read is one
    :meth:`PathType.read_into` (an object store's ranged request)."""

    def __init__(self, storage: PathType, key: str) -> None:
        super().__init__(key)
        self._storage = storage

    def read_into(self, offset: int, targets: Sequence[memoryview]) -> None:
        self._storage.read_into(self.key, offset, targets)


class _GatheringWriter(PositionalWriter):
    """The default :class:`PositionalWriter`: keeps the written views (no copies: they
    point into the caller's buffers, which live until the save ends) and stores them as
    one object with :meth:`PathType.write_parts` on close, which object stores upload
    as one multipart upload with parallel parts."""

    def __init__(self, storage: PathType, key: str, size: int) -> None:
        super().__init__(key, size)
        self._storage = storage
        self._pieces: list[tuple[int, list[memoryview]]] = []
        self._lock = threading.Lock()

    def write_at(self, offset: int, parts: Sequence[Buffer]) -> None:
        views = [byte_view(part) for part in parts]
        with self._lock:
            self._pieces.append((offset, views))

    def close(self) -> None:
        pieces, self._pieces = sorted(self._pieces, key=lambda piece: piece[0]), []
        views: list[memoryview] = []
        position = 0
        for offset, parts in pieces:
            if offset != position:
                raise ValueError(f"{self.key}: bytes {position}..{offset} were never written")
            views.extend(parts)
            position += sum(view.nbytes for view in parts)
        if position != self.size:
            raise ValueError(f"{self.key}: wrote {position} bytes of {self.size}")
        self._storage.write_parts(self.key, views)

    def abort(self) -> None:
        self._pieces = []


class PathType(ABC):
    """Where checkpoints live: one root (``url``) and objects under it named by keys.

    Subclasses set ``name`` (the registered name) and ``protocols`` (URL schemes they
    serve, ``""`` for plain paths) and implement the abstract methods. Optional
    capabilities have safe defaults:

    * ``supports_rename``: the root is a file system that renames and hard-links
      atomically (local disk): formats that need one (LMDB) may write there, and the
      shared chunk store links finished chunks into place.
    * ``copies_on_write`` / ``copies_on_read``: whether a transfer copies the bytes
      (object stores do); the I/O engine counts those copies against its budget.
    * ``default_io``: the I/O engine settings measured to suit this storage (a class
      attribute, or set per instance when they depend on where the root is: local
      disk moves fewer chunks at once on a memory file system).
    * ``batches_small_requests``: whether the engine may run small requests one after
      another on a worker (cheap local calls), or must give each its own slot (network
      round trips: object stores set it to False).
    * ``atomic_create``: whether :meth:`create_document` is race-free (the storage
      refuses the write itself if the key exists: link on local disk, ``If-None-Match:
      *`` on S3, ``ifGenerationMatch=0`` on GCS). The default implementation checks,
      then writes: correct for one writer, not for two racing ones.
    * ``atomic_replace``: whether :meth:`replace_document` is race-free (the storage
      refuses a write whose version precondition fails: a lock on local disk,
      ``If-Match`` on S3, ``ifGenerationMatch`` on GCS). Writer leases rely on it.
    * ``always_verified``: every read is checked against its checksum even with
      ``IOSettings(verify=False)`` (a peer replica: bytes from another machine).
    * ``archive_bytes`` / ``max_archives``: a node checkpoint of the packed formats
      (zarr, npz) goes into one archive per ``archive_bytes`` of its large blobs, at
      most ``max_archives`` (:func:`~ckptstore.io.archive_shares`; ``None``: its
      defaults, made for local disk); object stores take archives of about one part,
      each sent as one PUT, all at once.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> storage = LocalPath("ckpt")
        >>> storage.write_parts("trainer_0.1/a", [b"hello"])
        >>> storage.read_bytes("trainer_0.1/a")
        b'hello'
    """

    name: ClassVar[str]
    protocols: ClassVar[tuple[str, ...]] = ()
    supports_rename: ClassVar[bool] = False
    copies_on_write: ClassVar[bool] = True
    copies_on_read: ClassVar[bool] = True
    default_io: IOSettings = IOSettings()
    batches_small_requests: ClassVar[bool] = True
    atomic_create: ClassVar[bool] = False
    atomic_replace: ClassVar[bool] = False
    always_verified: ClassVar[bool] = False
    archive_bytes: ClassVar[int | None] = None
    max_archives: ClassVar[int | None] = None
    max_key_bytes: ClassVar[int | None] = None
    """The longest object name the storage accepts, in UTF-8 bytes (S3, GCS: 1024)."""
    max_component_bytes: ClassVar[int | None] = None
    """The longest ``/``-separated part of a key, in UTF-8 bytes (local disk: 255)."""

    def __init__(self, url: str, **options: object) -> None:
        self.url = url

    @property
    def display_url(self) -> str:
        """The root URL without credentials: safe for logs, errors and reports."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display_url!r})"

    # -- required ---------------------------------------------------------------------

    @abstractmethod
    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        """Store the concatenation of ``parts`` as ``key``, replacing any old object."""

    @abstractmethod
    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        """Fill ``targets`` in order with the bytes of ``key`` from ``offset`` on.

        Raise :class:`ObjectNotFoundError` for a missing key and
        :class:`~ckptstore.errors.CorruptCheckpointError` if the object is too short.
        """

    @abstractmethod
    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of ``key`` (a range of them with ``offset``/``length``)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the object ``key`` exists."""

    def existing(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` that exist: one :meth:`exists` each here; a path type may
        look them up together (local disk: each directory opened once)."""
        return {key for key in keys if self.exists(key)}

    @abstractmethod
    def size(self, key: str) -> int:
        """The length of ``key`` in bytes."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete objects; keys that do not exist are ignored."""

    @abstractmethod
    def delete_tree(self, prefix: str) -> None:
        """Delete every object under ``prefix/`` (lists on object stores: never on the
        save or resume path)."""

    @abstractmethod
    def list_keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (recursive, sorted). Used by operator tools, and by
        resume and retention on the control directory only."""

    def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        """Every key under ``prefix`` but those under ``skip`` (a prefix inside it),
        sorted: the control directory without its chunk store, which holds as many
        objects as the incremental saves kept. Here, :meth:`list_keys` filtered; a path
        type that can leave ``skip`` unlisted does (local disk: not walked; S3 and GCS:
        listed around)."""
        inside = skip.rstrip("/") + "/"
        return [key for key in self.list_keys(prefix) if not key.startswith(inside)]

    @abstractmethod
    def open_write(self, key: str) -> IO[bytes]:
        """A binary stream that creates ``key``; the object exists once it is closed."""

    # -- optional ---------------------------------------------------------------------

    def write_bytes(self, key: str, data: Buffer) -> None:
        """Store ``data`` as ``key``."""
        self.write_parts(key, [data])

    def lend(self, key: str, spans: Sequence[tuple[int, int]]) -> memoryview | None:
        """The bytes of ``key``'s ``spans`` (``(offset, nbytes)`` each, in order: a
        blob's chunks), one after another, as a writable view of memory this storage
        holds and gives up for good, for a read to make it the blob itself instead of
        copying it (the read still checks its checksums); ``None``: copy.
        Only storages holding objects in memory that nothing reads again lend (a peer
        replica being restored); each byte is lent at most once."""
        return None

    def adopt(self, source: str, target: str) -> bool:
        """Give the complete, durable object ``source`` the name ``target`` unless
        ``target`` exists; ``source`` is gone either way. Returns whether ``target`` was
        created. Local disk links (``link`` fails if the name exists: never a window
        without ``target``); this default copies, for path types that rename nothing
        (incremental saves write to the final name there instead)."""
        if self.exists(target):
            self.delete([source])
            return False
        self.write_bytes(target, self.read_bytes(source))
        self.delete([source])
        return True

    def put_document(self, key: str, data: bytes) -> None:
        """Store a small control document so that readers see all of it or none of it,
        durably. Object stores get this from a single PUT; local disk renames."""
        self.write_bytes(key, data)

    def create_volatile_document(self, key: str, data: bytes) -> None:
        """:meth:`create_document`, for a document that matters only while the process
        that creates it lives (an incremental save's intent: a power cut ends that save
        too, and no commit record refers to it), so it need not survive a power cut:
        local disk skips its two fsyncs. Other path types create a document."""
        self.create_document(key, data)

    def create_document(self, key: str, data: bytes) -> None:
        """Store a control document only if ``key`` does not exist yet, all or nothing
        and durably; raise :class:`~ckptstore.errors.KeyExistsError` (and write nothing)
        if it does. Commit records and writer leases are created this way, so two
        writers can never both believe they created the same one.

        This default checks, then writes (``atomic_create = False``): two writers racing
        can both succeed. Path types whose storage can refuse the write itself override
        it and set ``atomic_create = True``; the conformance kit holds them to it.
        """
        if self.get_document(key) is not None:
            raise KeyExistsError(self.display_url, key)
        self.put_document(key, data)

    def get_versioned_document(self, key: str) -> tuple[bytes, str] | None:
        """A control document's bytes and its version (an opaque string that changes
        at every write of it), or ``None`` if it does not exist; the version is what
        :meth:`replace_document` checks. The default version is the SHA-256 of the
        bytes; object stores use the ETag (S3) or generation (GCS). A version may be
        older than the bytes (read in two requests): a replace with it then fails, on
        the safe side."""
        data = self.get_document(key)
        if data is None:
            return None
        return data, content_version(data)

    def replace_document(self, key: str, data: bytes, version: str | None) -> None:
        """Store a control document only if it is still at ``version`` (from
        :meth:`get_versioned_document`; ``None``: only if it does not exist), all or
        nothing and durably; raise :class:`~ckptstore.errors.DocumentChangedError`
        (and write nothing) if another writer changed, created or deleted it since.
        Writer leases are renewed and taken over this way.

        This default checks, then writes (``atomic_replace = False``): two writers
        racing can both succeed. Path types whose storage can refuse the write itself
        override :meth:`replace_existing_document` and set ``atomic_replace = True``; the
        conformance kit holds them to it.
        """
        if version is None:
            try:
                self.create_document(key, data)
            except KeyExistsError:
                raise DocumentChangedError(self.display_url, key) from None
            return
        self.replace_existing_document(key, data, version)

    def replace_existing_document(self, key: str, data: bytes, version: str) -> None:
        """:meth:`replace_document` of a document read at ``version`` (not ``None``):
        what a path type with a precondition overrides. The default checks, then
        writes."""
        current = self.get_versioned_document(key)
        if current is None or current[1] != version:
            raise DocumentChangedError(self.display_url, key)
        self.put_document(key, data)

    def get_document(self, key: str) -> bytes | None:
        """A control document's bytes, or ``None`` if it does not exist.

        Storages on local disk read at most one byte more than the document size limit
        (:class:`~ckptstore.records.Limits`), so a forged giant document is refused
        without being read whole."""
        try:
            return self.read_document(key)
        except ObjectNotFoundError:
            return None

    def open_positional(self, key: str, size: int) -> PositionalWriter:
        """A writer creating ``key`` (``size`` bytes) from pieces written at offsets in
        parallel. The default gathers the pieces and stores them with
        :meth:`write_parts` on close; local disk writes each piece in place."""
        return _GatheringWriter(self, key, size)

    def open_reader(self, key: str) -> PositionalReader:
        """A reader of ``key`` for many ranges (:class:`PositionalReader`). The default
        makes each read one :meth:`read_into`; local disk opens the file once, and its
        own :meth:`read_into` reads through a reader, so a subclass of it that watches
        reads overrides this method, not :meth:`read_into`."""
        return _DelegatingReader(self, key)

    def read_document(self, key: str) -> bytes:
        """A stored document's bytes (bounded read on local disk, see
        :meth:`get_document`); raises ``ObjectNotFoundError`` if it does not exist."""
        if self.local_directory() is not None:
            return self.read_bytes(key, 0, current_limits().max_document_bytes + 1)
        return self.read_bytes(key)

    def prepare_keys(self, keys: Iterable[str]) -> None:
        """Get ready to write ``keys`` (called before a batch of parallel writes).

        Storages with directories create the parents here, once each and in order,
        instead of letting parallel writers race to create them; the default does
        nothing.
        """

    def remove_empty_directory(self, prefix: str) -> None:
        """Remove the directory ``prefix`` if it is empty, else leave it (atomic: a
        directory another writer just wrote into stays). Storages without directories
        have nothing to remove; the default does nothing."""

    def sync(self) -> None:
        """Make everything written through this object so far durable (a barrier)."""

    def accessible(self) -> bool:
        """Whether checkpoints can be written under the root right now."""
        return True

    def stored_name_bytes(self, key: str) -> int:
        """The length in bytes of the name ``key`` is stored under (object stores add
        the URL's prefix); compared with ``max_key_bytes``."""
        return len(key.encode())

    def check_key_limits(self, key: str, what: str, name: str) -> None:
        """Raise :class:`~ckptstore.errors.InvalidNameError` naming ``what`` ``name`` if
        ``key`` is longer than this storage allows (``max_key_bytes``,
        ``max_component_bytes``), so a job fails at init, not at its first save."""
        limit = self.max_component_bytes
        parts = key.split("/") if limit is not None else []
        for part in parts:
            if limit is not None and len(part.encode()) > limit:
                raise InvalidNameError(
                    what,
                    name,
                    f"it makes the {len(part.encode())}-byte path component {part[:60]!r}..., "
                    f"over the {limit}-byte limit of {self.name!r} storage; shorten it",
                )
        limit = self.max_key_bytes
        if limit is not None and self.stored_name_bytes(key) > limit:
            raise InvalidNameError(
                what,
                name,
                f"it makes a {self.stored_name_bytes(key)}-byte object name under "
                f"{self.display_url}, over the {limit}-byte limit of {self.name!r} storage; "
                "shorten it or the URL's prefix",
            )

    def check_writable(self) -> None:
        """Raise :class:`~ckptstore.errors.StorageNotWritableError` if checkpoints can
        never be written under the root (permission denied, read-only, cannot be
        created), so a job fails at start instead of at every save. The default checks
        nothing (object stores learn it from the first write)."""

    def local_directory(self) -> str | None:
        """The root's directory on this machine's file system, if it has one (local
        disk); ``None`` for remote storage. Catalogs that keep a local file use it."""
        return None

    def close(self) -> None:
        """Release connections and handles."""
