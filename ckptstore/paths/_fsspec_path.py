"""The ``fsspec`` path type: any URL fsspec understands (``memory://``, ``ftp://``...).

It serves every protocol no dedicated plugin claims, except the object stores that have
first-party plugins (``s3``, ``gs``), which need those plugins' retries and tuning.
Object-store plugins subclass it and only add options, retries and tuning.

fsspec answers some failures as if nothing were there (``exists`` is False on any
error, listings omit what they could not list, the HTTP filesystem raises
``FileNotFoundError`` for a refused connection): this path type looks behind them, so
that a store it cannot reach raises :class:`~ckptstore.errors.StorageError` instead of
looking empty (see :func:`_failure`).

Example::

    >>> from ckptstore import CheckpointManager
    >>> manager = CheckpointManager("memory://runs/a", "trainer_0", "npz")
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, ClassVar

from ckptstore._types import Buffer, byte_view
from ckptstore.errors import (
    CorruptCheckpointError,
    ObjectNotFoundError,
    RequestError,
    StorageError,
    storage_error,
)
from ckptstore.io import IOSettings
from ckptstore.plugin import PathType, hookimpl
from ckptstore.records import validate_key

if TYPE_CHECKING:  # fsspec is imported when a path opens: 0.08 s a local-disk run never pays
    import fsspec

__all__ = ["FsspecPath"]


class FsspecPath(PathType):
    """A checkpoint root on any fsspec filesystem; keyword options go to fsspec.

    Example::

        >>> storage = FsspecPath("memory://ckpt")
        >>> storage.write_bytes("a/b", b"data")
        >>> storage.read_bytes("a/b")
        b'data'
    """

    name = "fsspec"
    protocols: ClassVar[tuple[str, ...]] = ("*",)
    default_io = IOSettings(chunk_bytes=16 << 20, concurrency=16, memory_budget=256 << 20)

    def __init__(
        self,
        url: str,
        *,
        filesystem: fsspec.AbstractFileSystem | None = None,
        root: str | None = None,
        **storage_options: object,
    ) -> None:
        """Open ``url`` with fsspec (``storage_options`` go to the filesystem), or use an
        already opened ``filesystem`` whose path for ``url`` is ``root`` (what
        object-store subclasses pass after resolving their own options)."""
        super().__init__(url)
        self._storage_options = storage_options
        if filesystem is None:
            from fsspec.core import url_to_fs

            filesystem, root = url_to_fs(url, **storage_options)
        self.fs = filesystem
        self.root = (root or "").rstrip("/")
        self._checks_links = _on_local_disk(filesystem)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display_url!r})"

    def _path(self, key: str) -> str:
        key = validate_key(key)
        path = f"{self.root}/{key}" if self.root else key
        if self._checks_links:  # fsspec's local filesystem follows symbolic links
            self._refuse_links(path, key)
        return path

    def _refuse_links(self, path: str, key: str) -> None:
        """On a local-disk fsspec filesystem, refuse a key reached through a symbolic
        link (resolved-path check: the key's real directory must be the one under the
        root, and the key itself no link), like the ``local`` path type does."""
        root = os.path.realpath(self.root or "/")
        relative = os.path.dirname(key)
        while relative and not os.path.lexists(os.path.join(self.root or "/", relative)):
            relative = os.path.dirname(relative)  # the nearest existing ancestor
        expected = os.path.normpath(os.path.join(root, relative))
        resolved = os.path.realpath(os.path.join(self.root or "/", relative))
        if resolved != expected or os.path.islink(path):
            raise CorruptCheckpointError(
                "a symbolic link inside the checkpoint; ckptstore never follows links there",
                url=self.display_url,
                file=key,
            )

    @contextlib.contextmanager
    def _errors(self, action: str, key: str | None) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            # typed already; a request's failure (a StorageError too) is judged below
            typed = isinstance(error, StorageError) and not isinstance(error, RequestError)
            if typed or isinstance(error, CorruptCheckpointError):
                raise
            failure = _failure(error)
            if failure is None:
                raise ObjectNotFoundError(self.display_url, key, action, error) from None
            if isinstance(failure, OSError):
                raise storage_error(self.display_url, key, action, failure) from failure
            raise

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        path = self._path(key)
        data = b"".join(byte_view(p) for p in parts)
        with self._errors("write", key):
            try:
                self.fs.pipe_file(path, data)
            except FileNotFoundError:
                self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
                self.fs.pipe_file(path, data)

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        total = sum(target.nbytes for target in targets)
        data = self.read_bytes(key, offset, total)
        if len(data) < total:
            raise CorruptCheckpointError(
                f"the object ends {total - len(data)} bytes before the end of the recorded range",
                url=self.display_url,
                file=key,
            )
        position = 0
        for target in targets:
            flat = target.cast("B") if target.format != "B" else target
            flat[:] = data[position : position + flat.nbytes]
            position += flat.nbytes

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        path = self._path(key)
        end = None if length is None else offset + length
        with self._errors("read", key):
            data = bytes(self.fs.cat_file(path, start=offset or None, end=end))
        if length is not None and len(data) > length:  # fsspec returns what it got
            ignored = RequestError(
                f"asked for {length} bytes at offset {offset}, the storage sent {len(data)} "
                "bytes: it ignores byte ranges (an HTTP server without Range support, such "
                "as `python -m http.server`); serve the checkpoint from storage that honours "
                "them, or download its files whole to local disk and load from there",
                status=None,
                attempts=1,
                retryable=False,
            )
            raise StorageError(self.display_url, key, "read", ignored)
        return data

    def exists(self, key: str) -> bool:
        # not fs.exists, which answers False to any error: an unreachable store would
        # look empty
        try:
            with self._errors("check", key):
                self.fs.info(self._path(key))
        except ObjectNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        with self._errors("read size of", key):
            return int(self.fs.size(self._path(key)))

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            with self._errors("delete", key), contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._path(key))

    def delete_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        with self._errors("delete", prefix), contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)

    def list_keys(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        try:
            with self._errors("list", prefix or None):
                found = self.fs.find(base, on_error=_omit_missing)
        except ObjectNotFoundError:  # nothing under the prefix (a real "not found")
            return []
        cut = len(self.root) + 1 if self.root else 0
        return sorted(path[cut:] for path in found)

    def open_write(self, key: str) -> IO[bytes]:
        path = self._path(key)
        with self._errors("write", key):
            with contextlib.suppress(OSError):  # a store without directories
                self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
            return _AppendOnly(self.fs.open(path, "wb"))  # type: ignore[return-value]

    def accessible(self) -> bool:
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError:
            return False
        return True


def _failure(error: Exception) -> Exception | None:
    """What went wrong behind an error of fsspec: ``None`` when it says that nothing is
    there; a failed HTTP request as a :class:`~ckptstore.errors.RequestError` with its
    status (401 and 403 are permanent, 429 and 5xx transient); else the error itself.

    fsspec's HTTP filesystem raises ``FileNotFoundError`` from the real error when a
    request fails: a refused connection (an ``OSError``) or a server error is not an
    absent object, and taking it for one would show a store that cannot be reached as
    empty. Other causes (the in-memory filesystem's ``KeyError``) are lookups that
    found nothing.
    """
    if isinstance(error, FileNotFoundError):
        cause = error.__cause__
        if not isinstance(cause, Exception) or isinstance(cause, FileNotFoundError):
            return None
        if not isinstance(cause, OSError) and _status(cause) is None:
            return None
        error = cause
    status = _status(error)
    if status is None or isinstance(error, OSError):  # typed already (a RequestError)
        return error
    if status in _ABSENT_STATUSES:
        return None
    request = RequestError(
        f"HTTP {status} {getattr(error, 'message', None) or error}",
        status=status,
        attempts=1,
        retryable=status == 429 or status >= 500,
    )
    request.__cause__ = error
    return request


def _status(error: Exception) -> int | None:
    """The HTTP status an error of an fsspec backend carries (aiohttp's ``status``)."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


_ABSENT_STATUSES = (404, 410)
"""HTTP statuses that do mean the object is not there."""


def _omit_missing(error: OSError) -> None:
    """fsspec's ``walk`` error handler for listings: a directory that is not there (or
    went away during the listing) lists as empty; every other error is raised. fsspec's
    default omits every error, so that a store that cannot be reached lists as empty."""
    if _failure(error) is not None:
        raise error


class _AppendOnly(io.RawIOBase):
    """A write stream that says plainly it cannot seek (zipfile then streams)."""

    def __init__(self, inner: IO[bytes]) -> None:
        super().__init__()
        self._inner = inner
        self._position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        count: int = self._inner.write(data)
        self._position += count
        return count

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
        super().close()


def _on_local_disk(filesystem: fsspec.AbstractFileSystem) -> bool:
    """Whether ``filesystem`` is fsspec's local one (whose keys must not go through
    symbolic links)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(filesystem, LocalFileSystem)


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [FsspecPath]
