"""Two writers of one node and epoch, on local disk, moto S3 and the GCS emulator, with
no lease between them: each save writes its own attempt, the create-once commit record
picks exactly one, and the committed epoch always loads exactly what its winner saved.

The races are driven deterministically: writer A's storage runs writer B's save at a
chosen point of A's save (no sleeps, no threads racing)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore.errors import AlreadyCommittedError
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import (
    check_not_committed,
    commit_epoch,
    open_node,
    read_blobs,
    verify_node,
    write_node,
)
from ckptstore.protocol._garbage import collect_garbage, find_garbage
from ckptstore.records._layout import MANIFEST_NAME, node_commit_key

NODE = "trainer_0"
EPOCH = 1
FORMAT = ZarrDB(compression="zstd")  # one file per chunk: a save is many writes
IO = IOSettings(chunk_bytes=4096, memory_budget=1 << 20)
A_VALUES = np.arange(1500.0)  # 12000 bytes: three chunks
B_VALUES = np.full(1500, 7.0)


@pytest.fixture(params=["local", "s3", "gcs"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "ckpt")
    return str(request.getfixturevalue(f"{request.param}_url"))


def open_storage(url: str) -> PathType:
    return get_registry().open_path(url)


def engine() -> ParallelIO:
    return ParallelIO(IO)


def save(storage: PathType, values: np.ndarray, *, commit: bool = True) -> Any:
    """One writer's save of NODE's EPOCH: check, write its attempt, commit."""
    check_not_committed(storage, EPOCH, [NODE])
    written = write_node(storage, NODE, EPOCH, {"w": values}, FORMAT, engine())
    if commit:
        commit_epoch(storage, EPOCH, [written])
    return written


def loaded(storage: PathType) -> np.ndarray:
    manifest = open_node(storage, NODE, EPOCH)
    assert verify_node(storage, NODE, EPOCH, FORMAT, engine()) == []
    return read_blobs(storage, manifest, ["w"], FORMAT, engine())["w"]


class Hook:
    """Runs ``action`` once, the first time ``storage`` reaches a chosen call."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.fired = False
        self._lock = threading.Lock()

    def fire(self) -> None:
        with self._lock:
            if not self.fired:
                self.fired = True
                self.action()

    def before_publishing(self, storage: PathType) -> None:
        """Fire right before ``storage`` makes its node data visible: the creation of
        the node's commit record. (Run on 054a46d, these tests also hooked the rename
        into place that made local data visible then: that is the window they close.)"""
        record = node_commit_key(EPOCH, NODE)
        create = storage.create_document

        def create_document(key: str, data: bytes) -> None:
            if key == record:
                self.fire()
            create(key, data)

        storage.create_document = create_document  # type: ignore[method-assign]

    def after_first_data_write(self, storage: PathType) -> None:
        """Fire once ``storage`` has written its first data file of the node."""
        for name in ("write_parts", "write_bytes"):
            original = getattr(storage, name)

            def written(key: str, data: Any, _original: Any = original) -> None:
                _original(key, data)
                if not key.startswith("_") and not key.endswith(MANIFEST_NAME):
                    self.fire()

            setattr(storage, name, written)


def test_a_writer_committing_right_before_another_publishes_keeps_its_epoch(url: str) -> None:
    """The open window: B starts first and is paused in the middle of its data; A
    writes everything and passes every check; right before A publishes, B finishes
    and commits. A loses at its create-once record and nothing of it is visible: B's
    epoch loads exactly."""
    a, b = open_storage(url), open_storage(url)
    b_paused, b_go = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def pause_b() -> None:
        b_paused.set()
        b_go.wait()

    Hook(pause_b).after_first_data_write(b)

    def run_b() -> None:
        try:
            save(b, B_VALUES)
            outcome.append(None)
        except BaseException as error:  # reported below
            outcome.append(error)

    writer_b = threading.Thread(target=run_b)
    writer_b.start()
    try:
        assert b_paused.wait(60)

        def let_b_commit() -> None:
            b_go.set()
            writer_b.join(60)

        hook = Hook(let_b_commit)
        hook.before_publishing(a)
        with pytest.raises(AlreadyCommittedError):
            save(a, A_VALUES)
        assert hook.fired
    finally:
        b_go.set()
        writer_b.join(60)
    assert outcome == [None]  # B committed
    assert loaded(open_storage(url)).tolist() == B_VALUES.tolist()
    assert find_garbage(open_storage(url)) == []  # the loser deleted its own attempt


def test_two_writers_in_flight_never_delete_or_overwrite_each_others_data(url: str) -> None:
    """The staging deletion: B starts (and writes everything) while A is half way
    through its data; A commits first. A's epoch loads exactly; B loses at its record."""
    a, b = open_storage(url), open_storage(url)
    in_flight: list[Any] = []
    hook = Hook(lambda: in_flight.append(save(b, B_VALUES, commit=False)))
    hook.after_first_data_write(a)
    save(a, A_VALUES)
    assert hook.fired
    with pytest.raises(AlreadyCommittedError):
        commit_epoch(b, EPOCH, in_flight)
    assert loaded(open_storage(url)).tolist() == A_VALUES.tolist()


def test_gc_never_collects_an_attempt_in_flight_and_collects_the_losers(url: str) -> None:
    """While A writes, its (node, epoch) is not committed: gc leaves every attempt of it
    alone. Once A commits, a crashed writer's attempt of the same epoch is garbage."""
    storage = open_storage(url)
    crashed = save(open_storage(url), B_VALUES, commit=False)  # a writer killed before commit
    seen: list[list[str]] = []

    def collect() -> None:
        garbage = find_garbage(storage)
        seen.append([item.key for item in garbage])
        collect_garbage(storage, garbage)

    a = open_storage(url)
    hook = Hook(collect)
    hook.after_first_data_write(a)
    save(a, A_VALUES)
    assert seen == [[]]  # in flight: nothing collected, neither A's nor the crashed one
    assert loaded(storage).tolist() == A_VALUES.tolist()
    assert [item.key for item in find_garbage(storage)] == [crashed.data_key]
    collect_garbage(storage, find_garbage(storage))
    assert find_garbage(storage) == []
    assert not [key for key in storage.list_keys() if key.startswith(f"{crashed.data_key}/")]
    assert loaded(storage).tolist() == A_VALUES.tolist()
