"""Shared helpers for the core's unit tests: small jobs, storages that count or record
what they do, and plugin objects that register them."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import numpy as np
import pytest

from ckptstore import (
    CheckpointManager,
    Job,
    LocalSession,
    Node,
    Task,
    Workspace,
    epoch_limiter,
)
from ckptstore._types import Buffer, byte_view
from ckptstore.errors import storage_error
from ckptstore.execution import TaskOutput
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.paths._fsspec_path import FsspecPath
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin import hookimpl
from ckptstore.plugin._db_type import DBType
from ckptstore.plugin._metadata import MetadataHandler
from ckptstore.plugin._path_type import PathType, PositionalReader
from ckptstore.plugin._registry import Registry
from ckptstore.records._layout import parse_commit_record_key
from ckptstore.records._stats import NodeStats

SMALL_CHUNKS = IOSettings(chunk_bytes=4096, concurrency=2, memory_budget=1 << 20)
"""Chunks of 4 KiB, so that small test blobs span several."""


def engine() -> ParallelIO:
    """An I/O engine with :data:`SMALL_CHUNKS`."""
    return ParallelIO(SMALL_CHUNKS)


# -- storages ----------------------------------------------------------------------------


class CountingReader(PositionalReader):
    """A reader that passes each read on to ``inner`` and then its byte count to
    ``record``."""

    def __init__(self, inner: PositionalReader, record: Callable[[int], None]) -> None:
        super().__init__(inner.key)
        self._inner = inner
        self._record = record

    def read_into(self, offset: int, targets: Sequence[memoryview]) -> None:
        self._inner.read_into(offset, targets)
        self._record(sum(byte_view(target).nbytes for target in targets))

    def close(self) -> None:
        self._inner.close()


class CountingLocalPath(LocalPath):
    """Local disk that counts the bytes moved by bulk reads (``read_into`` and its
    readers) and by document reads (``read_bytes``), per key."""

    name = "counting_local"
    protocols: ClassVar[tuple[str, ...]] = ()

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.chunk_reads: dict[str, int] = {}
        self.document_reads: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_count_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._count_lock = threading.Lock()

    def open_reader(self, key: str) -> PositionalReader:
        # local disk's read_into reads through a reader too: every bulk read is seen here
        return CountingReader(super().open_reader(key), partial(self._count_chunk, key))

    def _count_chunk(self, key: str, nbytes: int) -> None:
        with self._count_lock:
            self.chunk_reads[key] = self.chunk_reads.get(key, 0) + nbytes

    def read_bytes(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = super().read_bytes(key, offset, length)
        with self._count_lock:
            self.document_reads[key] = self.document_reads.get(key, 0) + len(data)
        return data

    def reset(self) -> None:
        self.chunk_reads.clear()
        self.document_reads.clear()


class RequestCountingPath(CountingLocalPath):
    """Local disk that also records every listing (its prefix), every commit record
    read (its epoch) and every document read (its key: one GET on an object store)."""

    name = "request_counting"

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.listings: list[str] = []
        self.record_reads: list[int] = []
        self.document_keys: list[str] = []

    def list_keys(self, prefix: str = "") -> list[str]:
        with self._count_lock:
            self.listings.append(prefix)
        return super().list_keys(prefix)

    def list_keys_except(self, prefix: str, skip: str) -> list[str]:
        with self._count_lock:
            self.listings.append(prefix)
        return super().list_keys_except(prefix, skip)

    def get_document(self, key: str) -> bytes | None:
        epoch = parse_commit_record_key(key)
        if epoch is not None:
            with self._count_lock:
                self.record_reads.append(epoch)
        return super().get_document(key)

    def read_document(self, key: str) -> bytes:
        with self._count_lock:
            self.document_keys.append(key)
        return super().read_document(key)


class RecordingMemoryPath(FsspecPath):
    """An fsspec storage (use it with ``memory://`` URLs) that records every mutating
    call, in order: ``("write", key)``, ``("delete", key)``, ``("put", key)``."""

    name = "recording_memory"
    protocols: ClassVar[tuple[str, ...]] = ()

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.calls: list[tuple[str, str]] = []
        self._record_lock = threading.Lock()

    def _record(self, action: str, key: str) -> None:
        with self._record_lock:
            self.calls.append((action, key))

    def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        self._record("write", key)
        super().write_parts(key, parts)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:
            self._record("delete", key)
        super().delete(keys)

    def put_document(self, key: str, data: bytes) -> None:
        self._record("put", key)
        super().put_document(key, data)

    def open_write(self, key: str) -> Any:
        self._record("write", key)
        return super().open_write(key)


class PathTypesPlugin:
    """A plugin object providing the given path types."""

    def __init__(self, *classes: type[PathType]) -> None:
        self.classes = list(classes)

    @hookimpl
    def ckptstore_path_types(self) -> list[type[PathType]]:
        return self.classes


class DBTypesPlugin:
    """A plugin object providing the given DB types."""

    def __init__(self, *classes: type[DBType]) -> None:
        self.classes = list(classes)

    @hookimpl
    def ckptstore_db_types(self) -> list[type[DBType]]:
        return self.classes


class ReportRecorder:
    """A ``ckptstore_report`` plugin keeping every report it hears."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, dict[str, NodeStats]]] = []

    @hookimpl
    def ckptstore_report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        self.reports.append((action_name, dict(stats)))

    def actions(self) -> list[str]:
        return [action for action, _ in self.reports]


def register_storage(registry: Registry, *classes: type[PathType]) -> None:
    registry.register(PathTypesPlugin(*classes))


# -- metadata handlers ---------------------------------------------------------------------


class RecordingHandler(MetadataHandler):
    """A metadata handler that records every call; ``last_epoch`` returns ``answer``
    (the user's epoch when ``answer`` is ``...``)."""

    name = "recording"

    def __init__(self, answer: Any = ..., accessible: bool = True) -> None:
        super().__init__()
        self.answer = answer
        self.accessible = accessible
        self.calls: list[tuple[str, Any]] = []
        self.reports: list[tuple[str, dict[str, NodeStats]]] = []

    def set_params(self, *args: Any, **kwargs: Any) -> None:
        super().set_params(*args, **kwargs)
        self.calls.append(("set_params", dict(kwargs)))

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        self.calls.append(("last_epoch", user_epoch))
        return user_epoch if self.answer is ... else self.answer

    def write(self, epoch: int) -> None:
        self.calls.append(("write", epoch))

    def cp_accessible(self, epoch: int | None = None) -> bool:
        self.calls.append(("cp_accessible", epoch))
        return self.accessible

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        self.reports.append((action_name, dict(stats)))

    def written(self) -> list[int]:
        return [epoch for call, epoch in self.calls if call == "write"]


# -- memory:// roots -------------------------------------------------------------------------


@contextmanager
def memory_root(name: str = "ckpt") -> Iterator[str]:
    """A fresh ``memory://`` root, removed afterwards (the memory filesystem is global)."""
    url = f"memory://{name}-{uuid.uuid4().hex}"
    try:
        yield url
    finally:
        fs = fsspec.filesystem("memory")
        path = url[len("memory://") :]
        if fs.exists(path):
            fs.rm(path, recursive=True)


def memory_keys(url: str) -> list[str]:
    """Every key under a ``memory://`` root, relative to it."""
    fs = fsspec.filesystem("memory")
    root = "/" + url[len("memory://") :]
    return sorted(path[len(root) + 1 :] for path in fs.find(root))


# -- file permissions, even as root -------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_DAC_OVERRIDE = 1 << 1 | 1 << 2  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


@contextmanager
def file_permissions_enforced() -> Iterator[None]:
    """Make the calling thread obey file permissions, even as root: CAP_DAC_OVERRIDE
    and CAP_DAC_READ_SEARCH leave its effective capabilities (Linux keeps them per
    thread) and come back afterwards, from the permitted set. A no-op for a user
    without them, whom permissions bind anyway."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    saved = data[0].effective
    data[0].effective = saved & ~_DAC_OVERRIDE
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    try:
        yield
    finally:
        data[0].effective = saved
        if libc.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")


# -- http:// roots ---------------------------------------------------------------------------


@contextmanager
def http_server(directory: Path | None = None, *, status: int = 200) -> Iterator[str]:
    """A real HTTP server on loopback, serving ``directory``'s files and listings (or,
    with another ``status``, answering every request with that error); yields its URL."""

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(directory or os.devnull), **kwargs)

        def send_head(self) -> Any:
            if status != 200:
                self.send_error(status)
                return None
            return super().send_head()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# -- files ---------------------------------------------------------------------------------


def flip_byte(path: Path | str, offset: int, mask: int = 0xFF) -> None:
    """XOR one byte of a file in place."""
    with open(path, "r+b") as file:
        file.seek(offset)
        value = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([value ^ mask]))


def files_under(root: Path) -> list[str]:
    """Every file under ``root``, relative and sorted."""
    return sorted(
        os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
        for d, _, fs in os.walk(root)
        for f in fs
    )


def partial_load(
    root: Path,
    registry: Registry,
    db_type: str,
    names: Sequence[str],
    *,
    io: IOSettings | None = None,
) -> tuple[LocalSession, CountingLocalPath]:
    """Save blobs ``a`` (5000 float64), ``b`` (10 int32) and ``c`` (300x2 float32) of node
    ``trainer_0`` in ``db_type`` on a :class:`CountingLocalPath` at ``root``, then load
    ``names`` into node ``reader``; the storage counts only the reads of that load."""
    register_storage(registry, CountingLocalPath)
    session = LocalSession()
    ws = session.workspace("trainer_0")
    ws["a"] = np.zeros(5000)
    ws["b"] = np.arange(10, dtype=np.int32)
    ws["c"] = np.ones((300, 2), dtype=np.float32)
    manager = CheckpointManager(str(root), "trainer_0", db_type, path_type="counting_local", io=io)
    session.run(manager.init(["trainer_0"]))
    session.run(manager.save(1))
    storage = manager.location.storage
    assert isinstance(storage, CountingLocalPath)
    storage.reset()
    with Node("reader"):
        session.run(manager.load_blobs_from_checkpoint(list(names), 1))
    return session, storage


# -- a small job ---------------------------------------------------------------------------


def _init_counter(ws: Workspace, *, node: str, size: int) -> None:
    ws[f"{node}/w"] = np.zeros(size, dtype=np.float64)
    ws[f"{node}/step"] = np.array(0, dtype=np.int64)


def _train(ws: Workspace, *, node: str) -> None:
    ws[f"{node}/w"] += 1.0
    ws[f"{node}/step"] += 1
    ws[f"{node}/scratch"] = np.ones(3)  # private: vanishes after the epoch


def build_counter_job(
    nodes: Sequence[str] = ("trainer_0",), epochs: int = 3, size: int = 4
) -> tuple[Job, list[TaskOutput]]:
    """A job whose nodes each add 1 to ``<node>/w`` and ``<node>/step`` every epoch,
    stopped by ``epoch_limiter`` after ``epochs`` epochs; returns the job and each
    node's ``w`` output."""
    outputs = []
    with Job() as job:
        for node in nodes:
            with Node(node):
                with job.init_group:
                    init = Task(
                        partial(_init_counter, node=node, size=size),
                        outputs=[f"{node}/w"],
                        name=f"{node}/init",
                    )
                Task(partial(_train, node=node), name=f"{node}/train")
                outputs.append(init.outputs()[0])
        with Node(nodes[0]):
            epoch_limiter(job, epochs)
    return job, outputs


# -- storages that fail --------------------------------------------------------------------


def failing_local_path(
    should_fail: Callable[[str], bool], code: int = errno.ECONNRESET
) -> type[LocalPath]:
    """A local path type (registered name ``failing_local``) whose writes of keys for
    which ``should_fail(key)`` is true fail with errno ``code``: by default like a
    transient hiccup (a connection reset: retried, then counted; a full disk is not
    retried at once, see test_disk_full.py)."""

    class FailingLocalPath(LocalPath):
        name = "failing_local"
        protocols: ClassVar[tuple[str, ...]] = ()

        def _check(self, key: str) -> None:
            if should_fail(key):
                cause = OSError(code, f"{os.strerror(code)} (simulated)")
                raise storage_error(self.display_url, key, "write", cause)

        def write_parts(self, key: str, parts: Sequence[Buffer]) -> None:
            self._check(key)
            super().write_parts(key, parts)

        def open_write(self, key: str) -> Any:
            self._check(key)
            return super().open_write(key)

    return FailingLocalPath


def fail_first(count: int) -> Callable[[str], bool]:
    """``should_fail`` for :func:`failing_local_path`: the first ``count`` writes fail."""
    remaining = [count]

    def should_fail(key: str) -> bool:
        if remaining[0] > 0:
            remaining[0] -= 1
            return True
        return False

    return should_fail


def fail_epochs(*epochs: int) -> Callable[[str], bool]:
    """``should_fail`` for :func:`failing_local_path`: writes of these epochs' data fail."""

    def should_fail(key: str) -> bool:
        head = key.split("/", 1)[0]
        if ".staging-" in head:
            head = head[1:].split(".staging-", 1)[0]
        return any(head.endswith(f".{epoch}") for epoch in epochs)

    return should_fail


def without_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS endpoint or credential from the machine or other fixtures leaks in: no
    ``AWS_*`` or ``MOTO_*`` variable, no config or credentials file, no instance
    metadata."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "MOTO_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def data_key(storage: PathType, node: str, epoch: int) -> str:
    """Where ``node``'s committed checkpoint of ``epoch`` keeps its files: the attempt
    its commit record names (``<node>.<epoch>/attempt-<id>``)."""
    from ckptstore.protocol import read_commit

    record = read_commit(storage, epoch, [node])
    assert record is not None, f"epoch {epoch} is not committed"
    assert node in record.nodes, f"{node}.{epoch} is not committed"
    return record.nodes[node].data_key


def node_dir(root: Path | str, node: str, epoch: int) -> Path:
    """The directory of ``node``'s committed checkpoint of ``epoch`` under the local
    checkpoint root ``root`` (see :func:`data_key`)."""
    return Path(root) / data_key(LocalPath(str(root)), node, epoch)


def recorded_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the files and directories fsynced from now on (every thread), each
    still synced."""
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    return synced
