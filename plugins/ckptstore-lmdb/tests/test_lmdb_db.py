"""What the ``lmdb`` format adds to the contract: a genuine LMDB file, values per chunk,
every byte checksummed, registration through the entry point."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from ckpt_helpers import node_dir
from ckptstore_lmdb import DATA_FILE, LmdbDB, lmdb_key

from ckptstore import (
    CheckpointManager,
    CorruptCheckpointError,
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
)
from ckptstore.io._settings import IOSettings
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import get_registry
from ckptstore.testing.conformance import Checkpoints, assert_same_blob, dtype_sample

Array = np.ndarray[Any, Any]


@pytest.fixture
def checkpoints(tmp_path: Path) -> Checkpoints:
    settings = IOSettings(chunk_bytes=4096, memory_budget=1 << 20)
    return Checkpoints(LocalPath(str(tmp_path)), LmdbDB(), settings)


def open_values(path: Path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(key): bytes(value) for key, value in txn.cursor()}
    finally:
        env.close()


def test_registered_through_the_entry_point() -> None:
    assert get_registry().db_types["lmdb"] is LmdbDB
    plugin = {info.name: info for info in get_registry().plugins()}["lmdb"]
    assert plugin.db_types == ("lmdb",)
    assert str(plugin.distribution).startswith("ckptstore-lmdb")


def test_the_checkpoint_is_a_plain_lmdb_database(checkpoints: Checkpoints, tmp_path: Path) -> None:
    w = dtype_sample("<f8", (30, 30))  # 7200 bytes: two chunks of 4 KiB
    checkpoints.save({"w": w, "step": np.array(7, dtype="<i8")})
    values = open_values(node_dir(tmp_path, "trainer_0", 1))
    assert sorted(values) == [lmdb_key("step", 0), lmdb_key("w", 0), lmdb_key("w", 1)]
    assert values[lmdb_key("w", 0)] + values[lmdb_key("w", 1)] == w.tobytes()
    assert np.frombuffer(values[lmdb_key("step", 0)], "<i8")[0] == 7
    assert sorted(os.listdir(node_dir(tmp_path, "trainer_0", 1))) == [
        "ckptstore.manifest.json",
        DATA_FILE,
    ]


def test_every_byte_of_the_file_is_covered(
    checkpoints: Checkpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The format records tile the file (so verify checks every byte); the values'
    ranges lie apart inside it."""
    monkeypatch.setattr("ckptstore_lmdb.db.COVER_BYTES", 8192)  # several records
    checkpoints.save({f"b{i}": np.full(i * 37, i, "<i2") for i in range(60)})
    manifest = checkpoints.manifest()
    size = (node_dir(tmp_path, "trainer_0", 1) / DATA_FILE).stat().st_size
    position = 0
    for record in sorted(manifest.files, key=lambda record: record.offset):
        assert record.offset == position
        position += record.stored
    assert position == size
    assert len(manifest.files) == -(-size // 8192)
    values = sorted((c.offset, c.stored) for r in manifest.blobs.values() for c in r.chunks)
    for (offset, length), (following, _) in itertools.pairwise(values):
        assert offset + length <= following
    assert values[-1][0] + values[-1][1] <= size


def test_long_names_use_a_digest_key(checkpoints: Checkpoints, tmp_path: Path) -> None:
    name = "/".join(["n" * 200] * 3)
    checkpoints.save({name: np.arange(3)})
    key = lmdb_key(name, 0)
    assert key.startswith(b"\x01")
    assert len(key) < 511
    assert open_values(node_dir(tmp_path, "trainer_0", 1))[key] == np.arange(3).tobytes()


def test_many_small_blobs_span_several_transactions(
    checkpoints: Checkpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ckptstore_lmdb.db.BATCH_VALUES", 100)
    blobs = {f"p/{i:05d}": np.array([i, -i], dtype="<i4") for i in range(2500)}
    checkpoints.save(blobs)
    loaded = checkpoints.load()
    assert len(loaded) == 2500
    for name in ("p/00000", "p/01234", "p/02499"):
        assert_same_blob(loaded[name], blobs[name])
    assert checkpoints.verify() == []


def test_flipped_byte_in_lmdb_pages_is_reported(checkpoints: Checkpoints, tmp_path: Path) -> None:
    checkpoints.save({"w": np.arange(100.0)})
    manifest = checkpoints.manifest()
    page_bytes = manifest.files[0]
    data = node_dir(tmp_path, "trainer_0", 1) / DATA_FILE
    raw = bytearray(data.read_bytes())
    raw[page_bytes.offset + 3] ^= 0x40
    data.write_bytes(bytes(raw))
    problems = checkpoints.verify()
    assert len(problems) == 1
    assert str(problems[0].file).endswith(DATA_FILE)
    assert_same_blob(checkpoints.load()["w"], np.arange(100.0))  # the blob's bytes are intact


def test_jobs_checkpoint_and_resume_with_lmdb(tmp_path: Path) -> None:
    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(lambda ws: ws.update(total=np.array([100]), steps=np.zeros(2)), name="init")
        Task(lambda ws: ws["total"].__iadd__(3), name="epoch")
        epoch_limiter(job, 3)
    manager = MultiNodeCheckpointManager(str(tmp_path), "lmdb", "json")
    assert JobRunner(job, manager).train(LocalSession()) == 3
    session = LocalSession()
    single = CheckpointManager(str(tmp_path), "trainer_0", "lmdb")
    session.run(single.init(["trainer_0"], retrieve_from_epoch=2))
    session.run(single.load(2))
    assert session.workspace("trainer_0")["total"].tolist() == [106]


def test_transactions_stay_within_half_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptstore_lmdb import db as lmdb_db

    from ckptstore.io import IOSettings, ParallelIO
    from ckptstore.protocol._commit import write_node

    held: list[int] = []
    batches = lmdb_db._batches

    def recording(values: Any, batch_bytes: int) -> Any:
        for batch in batches(values, batch_bytes):
            held.append(sum(value.chunk.nbytes for value in batch))
            yield batch

    monkeypatch.setattr(lmdb_db, "_batches", recording)
    blobs = {f"w{i}": np.ones(64 << 10, dtype=np.float32) for i in range(12)}  # 12 x 256 KiB
    settings = IOSettings(chunk_bytes=256 << 10, memory_budget=1 << 20)
    write_node(LocalPath(str(tmp_path)), "n", 1, blobs, LmdbDB(), ParallelIO(settings))
    assert len(held) > 1
    assert max(held) <= (1 << 20) // 2


class ReadCountingPath(LocalPath):
    """Local disk counting ranged reads."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.reads = 0

    def read_into(self, key: str, offset: int, targets: Any) -> None:
        self.reads += 1
        super().read_into(key, offset, targets)


def test_many_small_values_are_read_together_and_checked_one_by_one(tmp_path: Path) -> None:
    from ckptstore.io._engine import ParallelIO
    from ckptstore.protocol import _commit as protocol

    storage = ReadCountingPath(str(tmp_path))
    values = {f"w{i:03}": np.full(100, i, dtype=np.int64) for i in range(300)}
    commit = protocol.write_node(storage, "trainer_0", 1, values, LmdbDB(), ParallelIO())
    protocol.commit_epoch(storage, 1, [commit])
    manifest = protocol.open_node(storage, "trainer_0", 1)
    loaded = protocol.read_blobs(storage, manifest, None, LmdbDB(), ParallelIO())
    assert all(loaded[name].tolist() == value.tolist() for name, value in values.items())
    assert storage.reads < 30  # 300 values, neighbours read with one request
    path = node_dir(tmp_path, "trainer_0", 1) / DATA_FILE
    with open(path, "r+b") as file:  # damage one value in the middle of a run
        file.seek(manifest.blobs["w157"].chunks[0].offset + 9)
        byte = file.read(1)[0]
        file.seek(-1, 1)
        file.write(bytes([byte ^ 1]))
    with pytest.raises(CorruptCheckpointError) as caught:
        protocol.read_blobs(storage, manifest, None, LmdbDB(), ParallelIO())
    assert (caught.value.blob, caught.value.chunk) == ("w157", 0)


def test_an_io_error_stays_one_unless_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LMDB reports a write cut short as EIO: on a full disk that is ENOSPC (a full disk
    is not a failing device; tests/checkpoint/test_disk_full.py fills a real one)."""
    import errno

    from ckptstore_lmdb import db as lmdb_db

    error = lmdb.Error(f"{tmp_path}: {os.strerror(errno.EIO)}")
    assert lmdb_db._os_error(error, str(tmp_path)).errno == errno.EIO
    full = os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255))
    monkeypatch.setattr(lmdb_db.os, "statvfs", lambda path: full)
    assert lmdb_db._os_error(error, str(tmp_path)).errno == errno.ENOSPC


def _drop_one(spans: dict[bytes, Any]) -> None:
    spans.popitem()


def _rename_one(spans: dict[bytes, Any]) -> None:
    spans[b"x"] = spans.pop(lmdb_key("b", 0))


def _shrink_one(spans: dict[bytes, Any]) -> None:
    spans[lmdb_key("b", 0)] = spans[lmdb_key("b", 0)]._replace(size=1)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_drop_one, "holds 2 values, 3 were written"),
        (_rename_one, "holds no value b'b"),
        (_shrink_one, "holds 1 bytes, 24 were written"),
    ],
)
def test_a_file_unlike_what_was_written_is_refused(
    checkpoints: Checkpoints, monkeypatch: pytest.MonkeyPatch, damage: Any, message: str
) -> None:
    """The values the walk finds must be those written, each of the size written."""
    from ckptstore_lmdb import db as lmdb_db

    walk = lmdb_db.value_spans

    def damaged(view: memoryview) -> Any:
        spans = walk(view)
        damage(spans)
        return spans

    monkeypatch.setattr(lmdb_db, "value_spans", damaged)
    with pytest.raises(CorruptCheckpointError, match=message):
        checkpoints.save({name: np.zeros(3) for name in ("a", "b", "c")})
