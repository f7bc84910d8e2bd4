"""The ``local`` path type: checkpoints in a directory on local disk.

Writes go straight to the OS (``writev``/``preadv`` on the arrays' own memory, no
copies). Durability is a barrier taken once per save: ``syncfs`` on Linux (one flush
for thousands of files), per-file ``fsync`` elsewhere or on request, or ``none`` for
scratch space such as ``/dev/shm``. Control documents are always written to a temporary
name, fsynced and renamed.

Example::

    >>> storage = LocalPath("ckpt", durability="fsync")
    >>> storage.write_bytes("a", b"data")
    >>> storage.read_bytes("a")
    b'data'
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import os
import secrets
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any, ClassVar

from ckptstore._environment import choice_variable
from ckptstore._types import Buffer, byte_view
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError, StorageError
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._markers import hookimpl
from ckptstore.plugin._path_type import PathType
from ckptstore.records._layout import RETIRED_MARK, STAGING_MARK, retired_key
from ckptstore.records._names import validate_key

__all__ = ["DURABILITY_MODES", "LocalPath"]

DURABILITY_MODES = ("syncfs", "fsync", "none")
_IOV_MAX = 512
_MAX_RW = 0x7FFFF000  # Linux moves at most this many bytes per read/write call


def _libc_function(name: str) -> Any:
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    return getattr(ctypes.CDLL(library, use_errno=True), name, None)


_SYNCFS = _libc_function("syncfs")
_SYNC_FILE_RANGE = _libc_function("sync_file_range")
if _SYNC_FILE_RANGE is not None:
    _SYNC_FILE_RANGE.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_SYNC_FILE_RANGE_WRITE = 2
EARLY_WRITEBACK_BYTES = 1 << 20
"""Files at least this large have their write-back started as soon as they are written
(``syncfs`` mode), so the disk works while the rest of the save is still being
written, instead of all at the final barrier."""


def _start_writeback(fd: int, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to start writing a file's dirty pages now (does not wait)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class LocalPath(PathType):
    """Checkpoints under a local directory (plain path or ``file://`` URL).

    ``durability``: ``"syncfs"`` (default where available), ``"fsync"`` or ``"none"``;
    also settable with ``CKPTSTORE_DURABILITY``.

    Example::

        >>> from ckptstore import CheckpointManager
        >>> manager = CheckpointManager("ckpt", "trainer_0", "zarr")
        >>> type(manager.location.storage).__name__
        'LocalPath'
    """

    name = "local"
    protocols: ClassVar[tuple[str, ...]] = ("", "file", "local")
    supports_rename = True
    copies_on_write = False
    copies_on_read = False
    default_io = IOSettings(chunk_bytes=16 << 20, concurrency=4, memory_budget=256 << 20)

    def __init__(self, url: str, *, durability: str | None = None, **options: object) -> None:
        if options:
            raise TypeError(
                f"local path type takes only 'durability', not {sorted(options)}; storage "
                "options such as credentials belong to object-store URLs"
            )
        super().__init__(url)
        path = url
        for scheme in ("file://", "local://"):
            if path.startswith(scheme):
                path = path[len(scheme) :]
        self.root = os.path.abspath(os.path.expanduser(path))
        mode = (
            durability
            or choice_variable(os.environ, "CKPTSTORE_DURABILITY", DURABILITY_MODES)
            or ("syncfs" if _SYNCFS is not None else "fsync")
        )
        if mode not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, got {mode!r}")
        if mode == "syncfs" and _SYNCFS is None:
            mode = "fsync"
        self.durability = mode
        self._dirty_dirs: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_dirty_dirs"] = set()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------

    def local_directory(self) -> str | None:
        return self.root

    def _path(self, key: str) -> str:
        return f"{self.root}/{validate_key(key)}"

    @contextlib.contextmanager
    def _errors(self, action: str, key: str | None) -> Iterator[None]:
        try:
            yield
        except (StorageError, CorruptCheckpointError):
            raise
        except FileNotFoundError as error:
            if action.startswith("read"):
                raise ObjectNotFoundError(self.display_url, key, action, error) from None
            raise StorageError(self.display_url, key, action, error) from error
        except OSError as error:
            raise StorageError(self.display_url, key, action, error) from error

    def _open_for_write(self, path: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            return os.open(path, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return os.open(path, flags, 0o644)

    def _note_dir(self, path: str) -> None:
        if self.durability == "fsync":
            with self._lock:
                self._dirty_dirs.add(os.path.dirname(path))

    # -- contract ---------------------------------------------------------------------

    def prepare_keys(self, keys: Iterable[str]) -> None:
        directories = sorted({os.path.dirname(self._path(key)) for key in keys})
        with self._errors("create directories for", None):
            for directory in directories:
                os.makedirs(directory, exist_ok=True)
                self._note_dir(directory)  # its entry in the parent
                self._note_dir(os.path.join(directory, ""))  # the entries it will hold

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        path = self._path(key)
        with self._errors("write", key):
            fd = self._open_for_write(path)
            try:
                written = _write_all(fd, [byte_view(p) for p in parts])
                if self.durability == "fsync":
                    os.fsync(fd)
                elif self.durability == "syncfs" and written >= EARLY_WRITEBACK_BYTES:
                    _start_writeback(fd)
            finally:
                os.close(fd)
            self._note_dir(path)

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        path = self._path(key)
        with self._errors("read", key):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                missing = _read_all(fd, list(targets), offset)
            finally:
                os.close(fd)
        if missing:
            raise CorruptCheckpointError(
                f"the file ends {missing} bytes before the end of the recorded range",
                url=self.display_url,
                file=key,
            )

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        path = self._path(key)
        with self._errors("read", key), open(path, "rb") as file:
            file.seek(offset)
            return file.read() if length is None else file.read(length)

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def size(self, key: str) -> int:
        with self._errors("read size of", key):
            return os.path.getsize(self._path(key))

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            with self._errors("delete", key), contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))

    def delete_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        with self._errors("delete", prefix):
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)

    def list_keys(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        keys: list[str] = []
        for directory, _, files in os.walk(base):
            relative = os.path.relpath(directory, self.root)
            for name in files:
                keys.append(name if relative == "." else f"{relative}/{name}".replace(os.sep, "/"))
        return sorted(keys)

    def open_write(self, key: str) -> IO[bytes]:
        path = self._path(key)
        with self._errors("write", key):
            fd = self._open_for_write(path)
        self._note_dir(path)
        raw = _SyncingFileIO(
            fd, fsync=self.durability == "fsync", early=self.durability == "syncfs"
        )
        return io.BufferedWriter(raw, buffer_size=1 << 20)

    def put_document(self, key: str, data: bytes) -> None:
        path = self._path(key)
        directory = os.path.dirname(path)
        temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp-{secrets.token_hex(4)}")
        with self._errors("write", key):
            fd = self._open_for_write(temporary)
            try:
                _write_all(fd, [memoryview(data)])
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, path)
            _fsync_dir(directory)

    def sync(self) -> None:
        with self._errors("sync", None):
            if self.durability == "syncfs":
                fd = os.open(self.root, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if _SYNCFS(fd) != 0:
                        error = ctypes.get_errno()
                        raise OSError(error, os.strerror(error))
                finally:
                    os.close(fd)
            elif self.durability == "fsync":
                with self._lock:
                    directories, self._dirty_dirs = self._dirty_dirs, set()
                for directory in directories:
                    _fsync_dir(directory)

    def accessible(self) -> bool:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError:
            return False
        return os.access(self.root, os.W_OK | os.X_OK)

    def replace_tree(self, source: str, target: str) -> None:
        source_path, target_path = self._path(source), self._path(target)
        with self._errors("rename into", target):
            if os.path.exists(target_path):
                retired = self._path(retired_key(target, secrets.token_hex(4)))
                os.rename(target_path, retired)
                os.rename(source_path, target_path)
                _fsync_dir(os.path.dirname(target_path))
                shutil.rmtree(retired, ignore_errors=True)
            else:
                os.rename(source_path, target_path)
                _fsync_dir(os.path.dirname(target_path))

    def staging_keys(self, db_key: str) -> list[str]:
        starts = (f".{db_key}{STAGING_MARK}", f".{db_key}{RETIRED_MARK}")
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StorageError(self.display_url, None, "list", error) from error
        return sorted(name for name in names if name.startswith(starts))


class _SyncingFileIO(io.FileIO):
    """A raw file that fsyncs before closing when asked to, or (``early``) starts the
    write-back of every ``EARLY_WRITEBACK_BYTES`` written as it goes."""

    def __init__(self, fd: int, *, fsync: bool, early: bool = False) -> None:
        super().__init__(fd, "wb", closefd=True)
        self._fsync = fsync
        self._early = early
        self._written = 0
        self._kicked = 0

    def write(self, data: Any) -> int:
        count = super().write(data) or 0
        self._written += count
        if self._early and self._written - self._kicked >= EARLY_WRITEBACK_BYTES:
            _start_writeback(self.fileno(), self._kicked, self._written - self._kicked)
            self._kicked = self._written
        return count

    def close(self) -> None:
        if not self.closed and self._fsync:
            os.fsync(self.fileno())
        super().close()


def _write_all(fd: int, views: list[memoryview]) -> int:
    """Write every view in order; returns the number of bytes written."""
    views = [v for v in views if v.nbytes]
    total = sum(view.nbytes for view in views)
    while views:
        batch: list[memoryview] = []
        size = 0
        for view in views[:_IOV_MAX]:
            if size + view.nbytes > _MAX_RW:
                if not batch:
                    batch.append(view[:_MAX_RW])
                break
            batch.append(view)
            size += view.nbytes
        written = os.writev(fd, batch)
        while written:
            head = views[0]
            if written >= head.nbytes:
                written -= head.nbytes
                views.pop(0)
            else:
                views[0] = head[written:]
                written = 0
    return total


def _read_all(fd: int, views: list[memoryview], offset: int) -> int:
    """Fill ``views`` from ``offset``; returns how many bytes were missing at EOF."""
    views = [v.cast("B") if v.format != "B" else v for v in views if v.nbytes]
    while views:
        batch = views[:_IOV_MAX]
        count = os.preadv(fd, batch, offset)
        if count == 0:
            return sum(v.nbytes for v in views)
        offset += count
        while count:
            head = views[0]
            if count >= head.nbytes:
                count -= head.nbytes
                views.pop(0)
            else:
                views[0] = head[count:]
                count = 0
    return 0


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [LocalPath]
