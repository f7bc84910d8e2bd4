"""Storage helpers for the conformance kit: a read-counting wrapper and damage.

Example::

    >>> from ckptstore.builtin import LocalPath, NpzDB
    >>> from ckptstore.io import ParallelIO
    >>> from ckptstore.plugin import DBLocation
    >>> counting = CountingPath(LocalPath("ckpt"))
    >>> db = DBLocation(counting, "trainer_0.1", ParallelIO())
    >>> written = NpzDB().write(db, {"w": np.ones(1000), "b": np.zeros(2)})
    >>> NpzDB().read(db, [written.blobs["b"]])["b"]  # a partial load
    array([0., 0.])
    >>> counting.bytes_read  # b's 16 bytes, not w's 8000
    16
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import IO

from ckptstore._types import Buffer
from ckptstore.plugin import PathType

__all__ = ["CountingPath", "flip_byte", "truncate"]


class CountingPath(PathType):
    """Delegates to ``inner`` and counts the bytes read through it.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> counting = CountingPath(LocalPath("counted"))
        >>> counting.write_bytes("a", b"hello")
        >>> counting.read_bytes("a", offset=1, length=3)
        b'ell'
        >>> counting.bytes_read
        3
    """

    name = "counting"

    def __init__(self, inner: PathType) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += nbytes

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        self.inner.write_parts(key, parts)

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        self.inner.read_into(key, offset, targets)
        self._count(sum(target.nbytes for target in targets))

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = self.inner.read_bytes(key, offset, length)
        self._count(len(data))
        return data

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)

    def delete_tree(self, prefix: str) -> None:
        self.inner.delete_tree(prefix)

    def list_keys(self, prefix: str = "") -> list[str]:
        return self.inner.list_keys(prefix)

    def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        return self.inner.list_keys_except(prefix, skip)

    def open_write(self, key: str) -> IO[bytes]:
        return self.inner.open_write(key)


def flip_byte(storage: PathType, key: str, offset: int) -> None:
    """Invert every bit of the byte at ``offset`` of object ``key``."""
    data = bytearray(storage.read_bytes(key))
    data[offset] ^= 0xFF
    storage.write_bytes(key, bytes(data))


def truncate(storage: PathType, key: str, length: int) -> None:
    """Cut object ``key`` down to its first ``length`` bytes."""
    storage.write_bytes(key, storage.read_bytes(key, 0, length))
