"""What the I/O engine needs from a storage: a few calls of a path type
(:class:`EngineStorage`) and files written and read in pieces at known offsets.

Path types (:class:`ckptstore.plugin.PathType`) provide all of it. The engine names only
these contracts, so it stays below the plugins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from ckptstore._types import Buffer

__all__ = ["EngineStorage", "PositionalReader", "PositionalWriter"]


class PositionalWriter(ABC):
    """One file of known size, written in pieces at known offsets from many threads.

    The file exists once :meth:`close` returns: whole, and as durable as the path type
    makes files. :meth:`abort` gives up.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> storage = LocalPath("positional")
        >>> with storage.open_positional("trainer_0.3/blobs.bin", 8) as out:
        ...     out.write_at(4, [b"5678"])  # pieces in any order, from any thread
        ...     out.write_at(0, [b"12", b"34"])
        >>> storage.read_bytes("trainer_0.3/blobs.bin")
        b'12345678'
    """

    def __init__(self, key: str, size: int) -> None:
        self.key = key
        self.size = size

    @abstractmethod
    def write_at(self, offset: int, parts: Sequence[Buffer]) -> None:
        """Write the concatenation of ``parts`` at ``offset`` (thread-safe)."""

    @abstractmethod
    def close(self) -> None:
        """Finish the file: every byte of ``[0, size)`` must have been written."""

    @abstractmethod
    def abort(self) -> None:
        """Give up: the file is left incomplete or not created (never published)."""

    def __enter__(self) -> PositionalWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class PositionalReader(ABC):
    """One stored file, opened once and read in ranges at known offsets.

    :meth:`ckptstore.plugin.PathType.open_reader` opens it. A load that checks a large
    range window by window pays one open for the range, not one per window.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> storage = LocalPath("reading")
        >>> storage.write_bytes("trainer_0.3/blobs.bin", b"12345678")
        >>> first, second = bytearray(4), bytearray(4)
        >>> with storage.open_reader("trainer_0.3/blobs.bin") as source:
        ...     source.read_into(4, [memoryview(second)])  # in any order
        ...     source.read_into(0, [memoryview(first)])
        >>> bytes(first + second)
        b'12345678'
    """

    def __init__(self, key: str) -> None:
        self.key = key

    @abstractmethod
    def read_into(self, offset: int, targets: Sequence[memoryview]) -> None:
        """Fill ``targets`` in order with the file's bytes from ``offset`` on (raises
        as :meth:`ckptstore.plugin.PathType.read_into` does)."""

    def close(self) -> None:
        """Let go of the file (the default holds nothing)."""

    def __enter__(self) -> PositionalReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EngineStorage(Protocol):
    """The part of a path type the engine calls (:class:`ckptstore.plugin.PathType`
    documents each member)."""

    @property
    def copies_on_write(self) -> bool: ...

    @property
    def copies_on_read(self) -> bool: ...

    @property
    def batches_small_requests(self) -> bool: ...

    @property
    def always_verified(self) -> bool: ...

    @property
    def display_url(self) -> str: ...

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None: ...

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None: ...

    def open_reader(self, key: str) -> PositionalReader: ...
