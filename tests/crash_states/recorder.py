"""Record every mutating file-system operation a process makes under one directory.

:class:`FsRecorder` wraps the ``os`` functions ckptstore's local I/O goes through
(``open`` with ``O_CREAT``, ``write``/``writev``/``pwrite``/``pwritev`` (``O_DIRECT``
descriptors included), ``fsync``/``fdatasync``, ``rename``/``replace``, ``link``,
``unlink``/``remove``, ``mkdir`` (so ``makedirs``), ``rmdir``, ``truncate``/``ftruncate``,
and ``shutil.rmtree``, which calls them) plus the buffered file of
``LocalPath.open_write``. Files and directories are named by the inode they are, not
by their path: an entry operation names its parent directory's inode and the entry's
name, a data operation its file's inode, so renames of a directory (a staging
directory published under its final name) and hard links (create-once records) are
followed as the file system follows them. Nothing about ckptstore's layout is assumed.

LMDB writes its file from C (``mmap`` or ``pwrite`` of its own): Python never sees
those writes. The recorder models them instead (:meth:`FsRecorder.watch_lmdb`): the
file's creation when ``lmdb.open`` returns, then, at ``Environment.sync(True)`` (its
fsync), one write of the file's whole content followed by the fsync. Until that fsync
the file's content is thus taken as absent, zero, or torn at any 4 KiB boundary, which
covers what LMDB's unsynced writes can leave (its pages land in any order; the states
hold a prefix of them, or none).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

ENTRY_KINDS = frozenset({"create", "mkdir", "rename", "link", "unlink", "rmdir"})
DATA_KINDS = frozenset({"write", "truncate"})


@dataclass(frozen=True)
class Op:
    """One recorded operation. ``node`` is the inode written or synced (data and sync
    operations) or the parent directory (entry operations: ``name`` in ``node``; a
    rename or link also names ``dest``/``dest_name``); ``new`` is the inode a create or
    mkdir made."""

    kind: str
    node: int
    name: str = ""
    dest: int = -1
    dest_name: str = ""
    new: int = -1
    offset: int = 0
    data: bytes = b""
    size: int = 0
    direct: bool = False

    def parents(self) -> tuple[int, ...]:
        """The directories whose entries this operation changes."""
        if self.kind in ("rename", "link"):
            return (self.node, self.dest) if self.dest != self.node else (self.node,)
        return (self.node,)

    def describe(self) -> str:
        if self.kind in ("rename", "link"):
            return f"{self.kind} {self.node}/{self.name} -> {self.dest}/{self.dest_name}"
        if self.kind in ("create", "mkdir"):
            return f"{self.kind} {self.node}/{self.name} (inode {self.new})"
        if self.kind in ("unlink", "rmdir"):
            return f"{self.kind} {self.node}/{self.name}"
        if self.kind == "write":
            how = " O_DIRECT" if self.direct else ""
            return f"write{how} inode {self.node} [{self.offset}, +{len(self.data)})"
        if self.kind == "truncate":
            return f"truncate inode {self.node} to {self.size}"
        return f"{self.kind} inode {self.node}"


@dataclass
class Recording:
    """What a recorder saw: the tree before (``initial``: parent, name, inode, is a
    directory; inode 0 is the root; ``initial_files``: each file's path relative to
    the root, to read its bytes from a snapshot of the tree) and the operations."""

    initial: list[tuple[int, str, int, bool]] = field(default_factory=list)
    initial_files: dict[int, str] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)


class FsRecorder:
    """Records the operations under ``root`` while :meth:`recording` is active.

    Example::

        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> recorder = FsRecorder(root)
        >>> with recorder.recording():
        ...     fd = os.open(os.path.join(root, "a"), os.O_WRONLY | os.O_CREAT)
        ...     _ = os.write(fd, b"hi")
        ...     os.fsync(fd)
        ...     os.close(fd)
        >>> [op.kind for op in recorder.result.ops]
        ['create', 'write', 'fsync']
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(root)
        self.result = Recording()
        self._ids: dict[int, int] = {}  # real inode number -> model inode
        self._dirs: set[int] = set()
        self._next = 1
        self._lock = threading.Lock()
        self._scan()

    # -- the tree before --------------------------------------------------------------

    def _scan(self) -> None:
        info = os.stat(self.root)
        self._ids[info.st_ino] = 0
        self._dirs.add(0)
        self._scan_dir(self.root, 0, "")

    def _scan_dir(self, path: str, parent: int, relative: str) -> None:
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            info = entry.stat(follow_symlinks=False)
            node = self._fresh(info.st_ino)
            child = f"{relative}{entry.name}"
            if stat.S_ISDIR(info.st_mode):
                self._dirs.add(node)
                self.result.initial.append((parent, entry.name, node, True))
                self._scan_dir(entry.path, node, child + "/")
            elif stat.S_ISREG(info.st_mode):
                self.result.initial.append((parent, entry.name, node, False))
                self.result.initial_files[node] = child

    def _fresh(self, ino: int) -> int:
        node = self._next
        self._next += 1
        self._ids[ino] = node
        return node

    # -- resolving names --------------------------------------------------------------

    def _dir_of(self, path: Any, dir_fd: int | None) -> tuple[int | None, str]:
        """The model inode of the directory holding ``path`` (None: outside the root)
        and the entry's name."""
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):
            head, name = os.path.split(path)
            base = os.readlink(f"/proc/self/fd/{dir_fd}")
            directory = os.path.join(base, head) if head else base
        else:
            directory, name = os.path.split(os.path.abspath(path))
        try:
            ino = os.stat(directory).st_ino
        except OSError:
            return None, name
        node = self._ids.get(ino)
        return (node if node in self._dirs else None), name

    def _node_of_fd(self, fd: int) -> int | None:
        return self._ids.get(os.fstat(fd).st_ino)

    def _add(self, op: Op) -> None:
        self.result.ops.append(op)

    # -- the wrappers -----------------------------------------------------------------

    @contextmanager
    def recording(self) -> Iterator[FsRecorder]:
        """Wrap the ``os`` functions (and ``LocalPath``'s buffered file) for the block."""
        saved: dict[str, Any] = {}
        replacements = self._replacements()
        for name, wrapper in replacements.items():
            saved[name] = getattr(os, name)
            setattr(os, name, wrapper)
        from ckptstore.paths import _local_path

        syncing = _local_path._SyncingFileIO
        original_write = syncing._write
        recorder = self

        def buffered_write(self: Any, data: Any) -> int:
            position = self.tell()
            count = int(original_write(self, data))
            recorder._written(self.fileno(), position, memoryview(data).cast("B")[:count])
            return count

        try:
            with mock.patch.object(syncing, "_write", buffered_write):
                yield self
        finally:
            for name, function in saved.items():
                setattr(os, name, function)

    def _written(self, fd: int, offset: int, data: Any) -> None:
        node = self._node_of_fd(fd)
        if node is None:
            return
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        with self._lock:
            self._add(Op("write", node, offset=offset, data=bytes(data), direct=direct))

    def _replacements(self) -> dict[str, Callable[..., Any]]:
        real = {name: getattr(os, name) for name in _WRAPPED}
        recorder = self

        def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            parent, name = (None, "")
            if flags & os.O_CREAT:
                parent, name = recorder._dir_of(path, dir_fd)
                existed = _exists(path, dir_fd)
            fd = real["open"](path, flags, mode, dir_fd=dir_fd)
            if flags & os.O_CREAT and parent is not None:
                info = os.fstat(fd)
                with recorder._lock:
                    if not existed:
                        node = recorder._fresh(info.st_ino)
                        recorder._add(Op("create", parent, name, new=node))
                    elif flags & os.O_TRUNC and info.st_ino in recorder._ids:
                        recorder._add(Op("truncate", recorder._ids[info.st_ino], size=0))
            return int(fd)

        def write(fd: int, data: Any) -> int:
            position = os.lseek(fd, 0, os.SEEK_CUR)
            count = int(real["write"](fd, data))
            recorder._written(fd, position, memoryview(data).cast("B")[:count])
            return count

        def writev(fd: int, buffers: Any) -> int:
            position = os.lseek(fd, 0, os.SEEK_CUR)
            buffers = list(buffers)
            count = int(real["writev"](fd, buffers))
            recorder._written(fd, position, _joined(buffers)[:count])
            return count

        def pwrite(fd: int, data: Any, offset: int) -> int:
            count = int(real["pwrite"](fd, data, offset))
            recorder._written(fd, offset, memoryview(data).cast("B")[:count])
            return count

        def pwritev(fd: int, buffers: Any, offset: int, *args: Any) -> int:
            buffers = list(buffers)
            count = int(real["pwritev"](fd, buffers, offset, *args))
            recorder._written(fd, offset, _joined(buffers)[:count])
            return count

        def sync(kind: str) -> Callable[[int], None]:
            def synced(fd: int) -> None:
                real[kind](fd)
                node = recorder._node_of_fd(fd)
                if node is not None:
                    with recorder._lock:
                        recorder._add(Op("fsync", node))

            return synced

        def renamed(kind: str) -> Callable[..., None]:
            def rename(
                src: Any,
                dst: Any,
                *,
                src_dir_fd: int | None = None,
                dst_dir_fd: int | None = None,
                **kwargs: Any,
            ) -> None:
                source, source_name = recorder._dir_of(src, src_dir_fd)
                target, target_name = recorder._dir_of(dst, dst_dir_fd)
                real[kind](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, **kwargs)
                if source is not None and target is not None:
                    op = "link" if kind == "link" else "rename"
                    with recorder._lock:
                        recorder._add(Op(op, source, source_name, target, target_name))

            return rename

        def removed(kind: str, op: str) -> Callable[..., None]:
            def remove(path: Any, *, dir_fd: int | None = None) -> None:
                parent, name = recorder._dir_of(path, dir_fd)
                real[kind](path, dir_fd=dir_fd)
                if parent is not None:
                    with recorder._lock:
                        recorder._add(Op(op, parent, name))

            return remove

        def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            parent, name = recorder._dir_of(path, dir_fd)
            real["mkdir"](path, mode, dir_fd=dir_fd)
            if parent is not None:
                info = os.stat(name if dir_fd is not None else path, dir_fd=dir_fd)
                with recorder._lock:
                    node = recorder._fresh(info.st_ino)
                    recorder._dirs.add(node)
                    recorder._add(Op("mkdir", parent, name, new=node))

        def truncate(path: Any, length: int) -> None:
            real["truncate"](path, length)
            ino = os.fstat(path).st_ino if isinstance(path, int) else os.stat(path).st_ino
            node = recorder._ids.get(ino)
            if node is not None:
                with recorder._lock:
                    recorder._add(Op("truncate", node, size=length))

        def ftruncate(fd: int, length: int) -> None:
            real["ftruncate"](fd, length)
            node = recorder._node_of_fd(fd)
            if node is not None:
                with recorder._lock:
                    recorder._add(Op("truncate", node, size=length))

        return {
            "open": open_,
            "write": write,
            "writev": writev,
            "pwrite": pwrite,
            "pwritev": pwritev,
            "fsync": sync("fsync"),
            "fdatasync": sync("fdatasync"),
            "rename": renamed("rename"),
            "replace": renamed("replace"),
            "link": renamed("link"),
            "unlink": removed("unlink", "unlink"),
            "remove": removed("remove", "unlink"),
            "rmdir": removed("rmdir", "rmdir"),
            "mkdir": mkdir,
            "truncate": truncate,
            "ftruncate": ftruncate,
        }

    # -- LMDB -------------------------------------------------------------------------

    @contextmanager
    def watch_lmdb(self) -> Iterator[None]:
        """Model the LMDB plugin's C-level writes (module docstring)."""
        from ckptstore_lmdb import db as lmdb_db

        module = lmdb_db.lmdb
        original_open = module.open
        recorder = self

        class Environment:
            def __init__(self, env: Any, directory: str) -> None:
                self._env = env
                self._path = os.path.join(directory, lmdb_db.DATA_FILE)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._env, name)

            def sync(self, force: bool = False) -> None:
                self._env.sync(force)
                ino = os.stat(self._path).st_ino
                with open(self._path, "rb") as file:
                    data = file.read()
                with recorder._lock:
                    node = recorder._ids[ino]
                    recorder._add(Op("write", node, offset=0, data=data))
                    recorder._add(Op("fsync", node))

        def open_lmdb(path: str, *args: Any, **kwargs: Any) -> Environment:
            env = original_open(path, *args, **kwargs)
            parent, _ = recorder._dir_of(os.path.join(path, "-"), None)
            info = os.stat(os.path.join(path, lmdb_db.DATA_FILE))
            if parent is not None:
                with recorder._lock:
                    node = recorder._fresh(info.st_ino)
                    recorder._add(Op("create", parent, lmdb_db.DATA_FILE, new=node))
            return Environment(env, path)

        with mock.patch.object(module, "open", open_lmdb):
            yield


_WRAPPED = (
    "open",
    "write",
    "writev",
    "pwrite",
    "pwritev",
    "fsync",
    "fdatasync",
    "rename",
    "replace",
    "link",
    "unlink",
    "remove",
    "rmdir",
    "mkdir",
    "truncate",
    "ftruncate",
)


def _exists(path: Any, dir_fd: int | None) -> bool:
    try:
        os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _joined(buffers: list[Any]) -> bytes:
    return b"".join(memoryview(buffer).cast("B") for buffer in buffers)


# shutil.rmtree goes through os.unlink/os.rmdir/os.open, wrapped above
assert shutil.rmtree.avoids_symlink_attacks
