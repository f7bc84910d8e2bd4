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

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import IO, ClassVar

from ckptstore._types import Buffer
from ckptstore.errors import ObjectNotFoundError
from ckptstore.io._settings import IOSettings

__all__ = ["PathType", "redact_url"]

_CREDENTIALS_IN_URL = re.compile(r"(?<=://)[^/@]*@")


def redact_url(url: str) -> str:
    """``url`` with any ``user:secret@`` part and query string removed, for messages."""
    return _CREDENTIALS_IN_URL.sub("", url).split("?", 1)[0]


class PathType(ABC):
    """Where checkpoints live: one root (``url``) and objects under it named by keys.

    Subclasses set ``name`` (the registered name) and ``protocols`` (URL schemes they
    serve, ``""`` for plain paths) and implement the abstract methods. Optional
    capabilities have safe defaults:

    * ``supports_rename``: the root can rename a whole key prefix atomically (local
      disk); the commit protocol then writes to a staging name and renames it.
    * ``copies_on_write`` / ``copies_on_read``: whether a transfer copies the bytes
      (object stores do); the I/O engine counts those copies against its budget.
    * ``default_io``: the I/O engine settings measured to suit this storage.
    * ``batches_small_requests``: whether the engine may run small requests one after
      another on a worker (cheap local calls), or must give each its own slot (network
      round trips: object stores set it to False).

    Example::

        >>> from ckptstore import LocalPath
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
    default_io: ClassVar[IOSettings] = IOSettings()
    batches_small_requests: ClassVar[bool] = True

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
        """Every key under ``prefix`` (recursive, sorted). Used by operator tools only."""

    @abstractmethod
    def open_write(self, key: str) -> IO[bytes]:
        """A binary stream that creates ``key``; the object exists once it is closed."""

    # -- optional ---------------------------------------------------------------------

    def write_bytes(self, key: str, data: Buffer) -> None:
        """Store ``data`` as ``key``."""
        self.write_parts(key, [data])

    def put_document(self, key: str, data: bytes) -> None:
        """Store a small control document so that readers see all of it or none of it,
        durably. Object stores get this from a single PUT; local disk renames."""
        self.write_bytes(key, data)

    def get_document(self, key: str) -> bytes | None:
        """A control document's bytes, or ``None`` if it does not exist."""
        try:
            return self.read_bytes(key)
        except ObjectNotFoundError:
            return None

    def prepare_keys(self, keys: Iterable[str]) -> None:
        """Get ready to write ``keys`` (called before a batch of parallel writes).

        Storages with directories create the parents here, once each and in order,
        instead of letting parallel writers race to create them; the default does
        nothing.
        """

    def sync(self) -> None:
        """Make everything written through this object so far durable (a barrier)."""

    def accessible(self) -> bool:
        """Whether checkpoints can be written under the root right now."""
        return True

    def replace_tree(self, source: str, target: str) -> None:
        """Atomically make prefix ``source`` visible as ``target`` (replacing it).

        Only called when ``supports_rename`` is true; the default refuses.
        """
        raise TypeError(f"path type {self.name!r} cannot rename; set supports_rename=False")

    def staging_keys(self, db_key: str) -> list[str]:
        """Leftovers of interrupted saves of ``db_key``: staging prefixes, and older
        copies set aside while a new one was renamed into place (renaming path types
        only). The next save of ``db_key`` deletes them."""
        return []

    def local_directory(self) -> str | None:
        """The root's directory on this machine's file system, if it has one (local
        disk); ``None`` for remote storage. Catalogs that keep a local file use it."""
        return None

    def close(self) -> None:
        """Release connections and handles."""
