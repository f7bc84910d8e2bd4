"""The ``local`` path type: checkpoints in a directory on local disk.

Writes go straight to the OS (``writev``/``pwritev``/``preadv`` on the arrays' own
memory, no copies). Durability: ``fsync`` (default) syncs each file written, and the
directories whose entries changed, once: a packed node checkpoint is a few files, so
that is a few syncs, and nothing else on the file system is flushed. ``syncfs`` flushes
the whole file system once per save instead (for formats writing thousands of files;
it also waits for other processes' data); ``none`` is for scratch space such as
``/dev/shm``. Control documents are always written to a temporary name, fsynced and
renamed.

Direct I/O: with ``fsync`` durability, the aligned interior of each large array written
into a data file goes ``O_DIRECT`` from the array's memory to the device (see
:mod:`ckptstore.io._direct`): no page-cache copy, no write-back left for the kernel, and
the file's ``fsync`` still makes it durable. ``direct_io=False`` (or
``CKPTSTORE_DIRECT_IO=off``) writes everything through the page cache; a file system
that refuses ``O_DIRECT``, and tmpfs (memory: no device to bypass the cache for), get the
page cache without being asked.

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
import errno
import fcntl
import io
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from typing import IO, Any, ClassVar

from ckptstore._environment import choice_variable
from ckptstore._types import Buffer, byte_view
from ckptstore.errors import (
    CorruptCheckpointError,
    DocumentChangedError,
    KeyExistsError,
    ObjectNotFoundError,
    StorageError,
    StorageNotWritableError,
    storage_error,
)
from ckptstore.io import DIRECT_FROM, IOSettings, run_together, usable_cpus
from ckptstore.paths._file_io import (
    EARLY_WRITEBACK_BYTES,
    _directory_in_memory,
    _in_memory,
    _libc_function,
    _LocalPositionalReader,
    _LocalPositionalWriter,
    _reopen_direct,
    _start_writeback,
    _SyncingFileIO,
    _write_all,
)
from ckptstore.plugin import PathType, PositionalReader, PositionalWriter, content_version, hookimpl
from ckptstore.records import current_limits, validate_key

__all__ = ["DURABILITY_MODES", "LocalPath"]

DURABILITY_MODES = ("syncfs", "fsync", "none")
DIRECT_IO_MODES = ("on", "off")
_SYNCFS = _libc_function("syncfs")


class LocalPath(PathType):
    """Checkpoints under a local directory (plain path or ``file://`` URL).

    ``durability``: ``"fsync"`` (default), ``"syncfs"`` or ``"none"``; also settable
    with ``CKPTSTORE_DURABILITY``. ``direct_io``: write large arrays ``O_DIRECT`` (default
    with ``fsync``), and read large ranges of files the page cache does not hold
    ``O_DIRECT`` into aligned memory; ``CKPTSTORE_DIRECT_IO=off`` or ``False`` turns
    both off.

    Example::

        >>> from ckptstore import CheckpointManager
        >>> manager = CheckpointManager("ckpt", "trainer_0", "zarr")
        >>> type(manager.location.storage).__name__
        'LocalPath'
    """

    name = "local"
    protocols: ClassVar[tuple[str, ...]] = ("", "file", "local")
    supports_rename = True
    atomic_create = True
    atomic_replace = True  # an exclusive flock on the document, then a rename
    copies_on_write = False
    copies_on_read = False
    default_io = IOSettings(chunk_bytes=32 << 20, concurrency=4, memory_budget=256 << 20)
    """32 MiB chunks, 4 in flight (docs/benchmarks-tables.md, "Chunk sizes side by
    side"); on tmpfs and ramfs, at most one chunk in flight per usable CPU."""
    max_component_bytes: ClassVar[int | None] = 255  # NAME_MAX of Linux file systems

    def __init__(
        self,
        url: str,
        *,
        durability: str | None = None,
        direct_io: bool | None = None,
        **options: object,
    ) -> None:
        if options:
            raise TypeError(
                f"local path type takes only 'durability' and 'direct_io', not "
                f"{sorted(options)}; storage options such as credentials belong to "
                "object-store URLs"
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
            or "fsync"
        )
        if mode not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, got {mode!r}")
        if mode == "syncfs" and _SYNCFS is None:
            mode = "fsync"
        self.durability = mode
        if direct_io is not None and not isinstance(direct_io, bool):
            raise ValueError(f"direct_io must be true or false, got {direct_io!r}")
        if direct_io is None:
            direct_io = choice_variable(os.environ, "CKPTSTORE_DIRECT_IO", DIRECT_IO_MODES) != "off"
        self.direct_io = direct_io and mode == "fsync" and hasattr(os, "O_DIRECT")
        self.direct_reads = direct_io and hasattr(os, "O_DIRECT")
        """Large aligned reads of a file not in the page cache go ``O_DIRECT``, from the
        device into the target (see :class:`~ckptstore.paths._file_io._LocalPositionalReader`)."""
        if _directory_in_memory(self.root):
            # every read and write is a copy done by a CPU: more of them at once than
            # there are CPUs only take turns, and evict each other's windows from the
            # caches before their checksums are taken (docs/design.md, "Threads on a memory
            # file system")
            cpus = min(self.default_io.concurrency, usable_cpus())
            self.default_io = self.default_io.merged(concurrency=cpus)
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
    def _parent(
        self, key: str, *, create: bool = False, durable: bool = False
    ) -> Iterator[tuple[int, str]]:
        """The directory holding ``key``, opened component by component from the root
        without following links (``O_NOFOLLOW``), and the key's last component.

        A symbolic link (or anything but a directory) on the way is refused with
        :class:`CorruptCheckpointError`: nothing outside the root is ever reached
        through a link placed inside it. ``create`` makes missing directories;
        ``durable`` also fsyncs the directory holding each one made (unless durability
        is ``"none"``), so that the entry written in it next survives a power loss:
        a fsync of a directory makes its own entries durable, not its entry in its
        parent."""
        *directories, name = validate_key(key).split("/")
        try:  # the root itself is the caller's choice: links in its path are theirs
            fd = os.open(self.root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        except FileNotFoundError:
            if not create:
                raise
            os.makedirs(self.root, exist_ok=True)
            fd = os.open(self.root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            for part in directories:
                child = self._enter(fd, part, key, create, durable)
                os.close(fd)
                fd = child
            yield fd, name
        finally:
            os.close(fd)

    def _enter(self, fd: int, part: str, key: str, create: bool, durable: bool = False) -> int:
        """Open directory ``part`` under ``fd`` without following a link (``create``:
        made if missing; ``durable``: then ``fd`` fsynced, see :meth:`_parent`)."""
        try:
            try:
                return os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if durable and self.durability != "none":
                        os.fsync(fd)
                return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as error:
            if error.errno in (errno.ENOTDIR, errno.ELOOP):
                raise self._not_followed(key, part) from None
            raise

    def _not_followed(self, key: str, part: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"{part!r} is a symbolic link or not a regular file/directory; ckptstore never "
            "follows links inside a checkpoint",
            url=self.display_url,
            file=key,
        )

    def _open_file(self, key: str, flags: int) -> int:
        """Open the regular file ``key`` for reading without following any link."""
        with self._parent(key) as (parent, name):
            try:
                fd = os.open(name, flags | _FILE_FLAGS, dir_fd=parent)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                    raise self._not_followed(key, name) from None
                raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._not_followed(key, name)
        return fd

    def _create_file(self, key: str) -> int:
        """Create ``key`` afresh (``O_EXCL``, no link followed): an existing entry,
        whether a file hard-linked elsewhere or a symbolic link, is unlinked first, so
        a write never changes a file outside the root."""
        with self._parent(key, create=True) as (parent, name):
            return _create_at(parent, name)

    @contextlib.contextmanager
    def _errors(self, action: str, key: str | None) -> Iterator[None]:
        try:
            yield
        except (StorageError, CorruptCheckpointError):
            raise
        except OSError as error:
            raise self._typed_error(action, key, error) from error

    def _typed_error(self, action: str, key: str | None, error: OSError) -> StorageError:
        """The typed error for ``error``, raised while doing ``action`` to ``key`` (a
        missing file read: :class:`ObjectNotFoundError`)."""
        if isinstance(error, FileNotFoundError) and action.startswith("read"):
            return ObjectNotFoundError(self.display_url, key, action, error)
        return storage_error(self.display_url, key, action, error)

    def _note_dir(self, path: str) -> None:
        if self.durability == "fsync":
            with self._lock:
                self._dirty_dirs.add(os.path.dirname(path))

    # -- contract ---------------------------------------------------------------------

    def prepare_keys(self, keys: Iterable[str]) -> None:
        directories = sorted({os.path.dirname(self._path(key)) for key in keys})
        with self._errors("create directories for", None):
            for directory in directories:
                relative = os.path.relpath(directory, self.root)
                if relative != ".":
                    with self._parent(f"{relative}/-", create=True):
                        pass
                self._note_dir(directory)  # its entry in the parent
                self._note_dir(os.path.join(directory, ""))  # the entries it will hold

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        path = self._path(key)
        with self._errors("write", key):
            fd = self._create_file(key)
            try:
                written = _write_all(fd, [byte_view(p) for p in parts])
                if self.durability == "fsync":
                    os.fsync(fd)
                elif self.durability == "syncfs" and written >= EARLY_WRITEBACK_BYTES:
                    _start_writeback(fd)
            finally:
                os.close(fd)
            self._note_dir(path)

    def open_positional(self, key: str, size: int) -> PositionalWriter:
        path = self._path(key)
        with self._errors("write", key):
            fd = self._create_file(key)
        self._note_dir(path)
        # tmpfs: no device to bypass the cache for, nor to start writing back to
        in_memory = _in_memory(fd)
        direct = -1
        if self.direct_io and size >= DIRECT_FROM and not in_memory:
            direct = _reopen_direct(fd)
        early = self.durability != "none" and not in_memory
        return _LocalPositionalWriter(self, key, size, fd, direct, early_writeback=early)

    def read_into(self, key: str, offset: int, targets: Sequence[memoryview]) -> None:
        with self.open_reader(key) as reader:
            reader.read_into(offset, targets)

    def open_reader(self, key: str) -> PositionalReader:
        with self._errors("read", key):
            fd = self._open_file(key, os.O_RDONLY)
        return _LocalPositionalReader(self, key, fd, direct=self.direct_reads)

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        with self._errors("read", key):
            fd = self._open_file(key, os.O_RDONLY)
            with open(fd, "rb") as file:
                file.seek(offset)
                return file.read() if length is None else file.read(length)

    def read_document(self, key: str) -> bytes:
        """A control document, refused by its size before it is read if it is larger
        than the document limit (a file that grows meanwhile is cut at that size)."""
        limit = current_limits().max_document_bytes
        size = self.size(key)
        if size > limit:
            raise CorruptCheckpointError(
                f"the document is {size} bytes, more than the limit of {limit} "
                "(CKPTSTORE_LIMIT_MAX_DOCUMENT_BYTES)",
                url=self.display_url,
                file=key,
            )
        return self.read_bytes(key, 0, size)

    def exists(self, key: str) -> bool:
        with self._errors("check", key):
            try:
                with self._parent(key) as (parent, name):
                    os.stat(name, dir_fd=parent, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return False
        return True

    def existing(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` that exist (entries of any kind, as :meth:`exists` says),
        each directory opened once, no link followed, then listed whole when it is not
        much larger than the names asked for, else asked a ``stat`` per name. 256
        chunks of an incremental save took 3 opens and a stat each: each call gives up
        the GIL, and a thread beside a busy one waits up to 5 ms to get it back."""
        by_directory: dict[str, list[str]] = {}
        for key in keys:
            directory, _, name = validate_key(key).rpartition("/")
            by_directory.setdefault(directory, []).append(name)
        found: set[str] = set()
        for directory, names in by_directory.items():
            inside = f"{directory}/-" if directory else "-"
            with (
                self._errors("check", inside),
                contextlib.suppress(FileNotFoundError, NotADirectoryError),
                self._parent(inside) as (parent, _),
            ):
                there = _names_in(parent, names)
                found.update(f"{directory}/{name}" if directory else name for name in there)
        return found

    def size(self, key: str) -> int:
        with self._errors("read size of", key), self._parent(key) as (parent, name):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise self._not_followed(key, name)
            return info.st_size

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            with (
                self._errors("delete", key),
                contextlib.suppress(FileNotFoundError),
                self._parent(key) as (parent, name),
            ):
                os.unlink(name, dir_fd=parent)  # a link is removed, never its target

    def delete_tree(self, prefix: str) -> None:
        with (
            self._errors("delete", prefix),
            contextlib.suppress(FileNotFoundError),
            self._parent(prefix) as (parent, name),
        ):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(name, dir_fd=parent)  # fd-based: never follows links
            else:
                os.unlink(name, dir_fd=parent)

    def remove_empty_directory(self, prefix: str) -> None:
        with (
            self._errors("delete", prefix),
            contextlib.suppress(FileNotFoundError, NotADirectoryError),
            self._parent(prefix) as (parent, name),
        ):
            try:
                os.rmdir(name, dir_fd=parent)  # fails on a directory that is not empty
            except OSError as error:
                if error.errno != errno.ENOTEMPTY:
                    raise

    def list_keys(self, prefix: str = "") -> list[str]:
        """Regular files under ``prefix``; links (and what they point to) are left out,
        and never opened."""
        return self._list(prefix, None)

    def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        """:meth:`list_keys` without walking the directory ``skip``."""
        return self._list(prefix, skip.rstrip("/"))

    def _list(self, prefix: str, skip: str | None) -> list[str]:
        keys: list[str] = []
        with self._errors("list", prefix or None):
            try:
                if prefix:
                    with self._parent(f"{prefix}/-") as (parent, _):
                        _collect_regular(parent, prefix, keys, skip)
                else:
                    fd = os.open(self.root, _DIR_FLAGS & ~os.O_NOFOLLOW)
                    try:
                        _collect_regular(fd, "", keys, skip)
                    finally:
                        os.close(fd)
            except (FileNotFoundError, NotADirectoryError, CorruptCheckpointError):
                return []
        return sorted(keys)

    def open_write(self, key: str) -> IO[bytes]:
        path = self._path(key)
        with self._errors("write", key):
            fd = self._create_file(key)
        self._note_dir(path)
        raw = _SyncingFileIO(
            fd,
            fsync=self.durability == "fsync",
            early=self.durability == "syncfs",
            errors=partial(self._errors, "write", key),
        )
        return io.BufferedWriter(raw, buffer_size=1 << 20)

    def put_document(self, key: str, data: bytes) -> None:
        with (
            self._errors("write", key),
            self._parent(key, create=True, durable=True) as (parent, name),
        ):
            _replace_entry(parent, name, data)

    def adopt(self, source: str, target: str) -> bool:
        """Hard-link ``source`` to ``target`` (``link`` fails if ``target`` exists, so
        an existing object is never replaced nor, for a moment, missing), then remove
        ``source``. The directory's new entry is made durable by :meth:`sync`."""
        with (
            self._errors("link", target),
            self._parent(source) as (src_parent, src_name),
            self._parent(target, create=True) as (parent, name),
        ):
            try:
                os.link(
                    src_name, name, src_dir_fd=src_parent, dst_dir_fd=parent, follow_symlinks=False
                )
                created = True
            except FileExistsError:
                created = False
            os.unlink(src_name, dir_fd=src_parent)
        if created:  # the new entry, and the directory's own if it was just made
            path = self._path(target)
            self._note_dir(path)
            self._note_dir(os.path.dirname(path))
        return created

    def create_document(self, key: str, data: bytes) -> None:
        """Write a temporary file beside ``key``, fsync it, then hard-link it to
        ``key``: ``link`` fails if ``key`` exists, so exactly one of two racing writers
        creates it, and readers see all of it or nothing. The directory is fsynced. Like
        every write here, it goes through directory descriptors and follows no link."""
        self._create_document(key, data, durable=True)

    def create_volatile_document(self, key: str, data: bytes) -> None:
        """:meth:`create_document` without its fsyncs (of the file, of the directory
        made for it, of its entry): other processes see it at once, a power cut may
        drop it (see :meth:`PathType.create_volatile_document`)."""
        self._create_document(key, data, durable=False)

    def _create_document(self, key: str, data: bytes, *, durable: bool) -> None:
        with (
            self._errors("create", key),
            self._parent(key, create=True, durable=durable) as (parent, name),
        ):
            temporary = _write_temporary(parent, name, data, sync=durable)
            try:
                os.link(
                    temporary, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False
                )
            except FileExistsError:
                raise KeyExistsError(self.display_url, key) from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=parent)
            if durable:
                os.fsync(parent)

    def replace_existing_document(self, key: str, data: bytes, version: str) -> None:
        """Compare and swap on local disk: open the document (no link followed), take
        an exclusive ``flock`` on it, check that ``key`` still names that file (a
        replace renames a new file over it, so a writer that waited on the lock of the
        old one sees a different file) and that its bytes are still at ``version``,
        then rename the new document over it and fsync the directory. Every writer of
        the document goes through the lock, so exactly one of several racing replaces
        from one version wins."""
        with self._errors("replace", key), self._parent(key) as (parent, name):
            try:
                fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                raise DocumentChangedError(self.display_url, key) from None
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                    raise self._not_followed(key, name) from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                opened = os.fstat(fd)
                try:
                    named = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    raise DocumentChangedError(self.display_url, key) from None
                if (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
                    raise DocumentChangedError(self.display_url, key)
                current = os.pread(fd, current_limits().max_document_bytes + 1, 0)
                if content_version(current) != version:
                    raise DocumentChangedError(self.display_url, key)
                _replace_entry(parent, name, data)
            finally:
                os.close(fd)  # releases the lock

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
                _fsync_dirs(sorted(directories))

    def check_writable(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as error:
            raise StorageNotWritableError(
                self.display_url, None, "create the checkpoint directory", error
            ) from error
        if not os.access(self.root, os.W_OK | os.X_OK):
            denied: OSError = PermissionError(
                errno.EACCES, "this user cannot write here", self.root
            )
            if os.statvfs(self.root).f_flag & os.ST_RDONLY:
                denied = OSError(errno.EROFS, "read-only file system", self.root)
            raise StorageNotWritableError(self.display_url, None, "write to", denied)

    def accessible(self) -> bool:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError:
            return False
        return os.access(self.root, os.W_OK | os.X_OK)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


_GONE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
"""What opening a listed directory fails with when it went away since: removed,
replaced by a file, or by a link (``O_NOFOLLOW``)."""


def _collect_regular(fd: int, relative: str, keys: list[str], skip: str | None = None) -> None:
    """Append the regular files under directory ``fd`` (named ``relative``) to ``keys``,
    descending only into real directories (but ``skip``), each opened with
    ``O_NOFOLLOW``."""
    with os.scandir(fd) as entries:
        found = [
            (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
            for e in entries
        ]
    for name, is_dir, is_file in found:
        key = f"{relative}/{name}" if relative else name
        if is_file:
            keys.append(key)
        elif is_dir and key != skip:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in _GONE:
                    continue  # gone, or replaced by a file or a link since it was listed
                raise  # a directory that cannot be read is not an empty one
            try:
                _collect_regular(child, key, keys, skip)
            finally:
                os.close(child)


_LISTED_ENTRY_BYTES = 128
""":meth:`LocalPath.existing` lists a directory whose size is at most this many bytes
per name asked for (ext4 and xfs: 40-48 bytes of directory per entry of a chunk's
32-character name; tmpfs: 20), else asks a ``stat`` per name."""


def _names_in(parent: int, names: Sequence[str]) -> list[str]:
    """Those of ``names`` directory ``parent`` holds (see :meth:`LocalPath.existing`)."""
    if os.fstat(parent).st_size <= _LISTED_ENTRY_BYTES * len(names):
        listed = set(os.listdir(parent))
        return [name for name in names if name in listed]
    there = []
    for name in names:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.stat(name, dir_fd=parent, follow_symlinks=False)
            there.append(name)
    return there


def _write_temporary(parent: int, name: str, data: bytes, *, sync: bool = True) -> str:
    """Write ``data`` to a new temporary file beside ``name`` in directory ``parent`` and
    (``sync``) fsync it; returns the temporary's name, for the caller to rename or link and remove.
    A full disk (or any failure) leaves no temporary file behind."""
    temporary = f".{name}.tmp-{secrets.token_hex(4)}"
    fd = _create_at(parent, temporary)
    try:
        try:
            _write_all(fd, [memoryview(data)])
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=parent)
        raise
    return temporary


def _replace_entry(parent: int, name: str, data: bytes) -> None:
    """Make ``name`` in directory ``parent`` a new file holding ``data``, all or nothing
    and durably: a fsynced temporary renamed over it, then the directory fsynced. The
    entry itself is replaced: a link at ``name`` is replaced, never followed."""
    temporary = _write_temporary(parent, name, data)
    try:
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=parent)
        raise
    os.fsync(parent)


def _create_at(parent: int, name: str) -> int:
    """Create ``name`` in directory ``parent``, replacing whatever entry is there."""
    try:
        return os.open(name, _CREATE_FLAGS, 0o644, dir_fd=parent)
    except FileExistsError:
        os.unlink(name, dir_fd=parent)  # a hard link or symlink: drop the entry only
        return os.open(name, _CREATE_FLAGS, 0o644, dir_fd=parent)


_SYNC_THREADS = 8


def _fsync_dirs(directories: Sequence[str]) -> None:
    """fsync every one of ``directories``, all at once: a journaling file system (ext4,
    xfs) commits what the waiting fsyncs need in one journal commit, where one after the
    other waited for a commit each (a save's attempt, node and root directories: three).
    A directory gone meanwhile (the staging of a failed save) has nothing to make
    durable. Returns once every one is synced; raises the first error."""
    calls = [partial(_fsync_dir_if_there, directory) for directory in directories]
    run_together("ckptstore-fsync", _SYNC_THREADS, calls)


def _fsync_dir_if_there(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [LocalPath]
