"""The ``npz`` DB type: plain-numpy-readable archives, every byte checksummed, partial
loads that read only what they need, and no pickle anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from ckpt_helpers import (
    SMALL_CHUNKS,
    data_key,
    engine,
    flip_byte,
    memory_root,
    node_dir,
    partial_load,
)

from ckptstore import CheckpointManager, CorruptCheckpointError, LocalSession, protocol
from ckptstore.builtin import FsspecPath, LocalPath, NpzDB
from ckptstore.io._checksum import crc32_of, crc32c_of
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._registry import Registry
from ckptstore.records import BlobRecord, ChunkRecord, NodeManifest

NODE = "trainer_0"


def varied_blobs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    big = rng.normal(size=(50, 40))
    return {
        "model/w": big,  # several chunks
        "model/w_fortran": np.asfortranarray(big[:, :7]),
        "strided": np.arange(100)[::3],
        "reversed": np.arange(9.0)[::-1],
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
        "half": np.linspace(0, 1, 5, dtype=np.float16),
        "complex": np.array([1 + 2j, 3 - 4j]),
        "flags": np.array([True, False, True]),
        "scalar": np.array(42, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "text": np.array(["alpha", "β"]),
        "bytes": np.array([b"ab", b"c"]),
        "when": np.array(["2024-01-01T00:00"], dtype="M8[s]"),
        "delta": np.array([5], dtype="m8[ms]"),
    }


def save(root: Path, values: dict[str, np.ndarray], epoch: int = 1) -> LocalPath:
    storage = LocalPath(str(root))
    commit = protocol.write_node(storage, NODE, epoch, values, NpzDB(), engine())
    protocol.commit_epoch(storage, epoch, [commit])
    return storage


def test_archives_open_with_plain_numpy_and_no_pickle(tmp_path: Path) -> None:
    values = varied_blobs()
    save(tmp_path, values)
    with np.load(node_dir(tmp_path, "trainer_0", 1) / "blobs.npz", allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted(values)
        for name, value in values.items():
            assert archive[name].dtype == value.dtype
            np.testing.assert_array_equal(archive[name], value)


def test_ml_dtypes_open_with_plain_numpy_as_unsigned_integers(tmp_path: Path) -> None:
    values = {
        "bf16_be": np.array([1.5, -0.0, np.nan], dtype=ml_dtypes.bfloat16)
        .byteswap()
        .view(np.dtype(ml_dtypes.bfloat16).newbyteorder(">")),
        "f8": np.array([0.5, -2.0], dtype=ml_dtypes.float8_e5m2),
        "long": np.array([1.25, -0.0], dtype=np.longdouble),
    }
    save(tmp_path, values)
    with np.load(node_dir(tmp_path, "trainer_0", 1) / "blobs.npz", allow_pickle=False) as archive:
        assert archive["bf16_be"].dtype == np.dtype(">u2")
        assert archive["f8"].dtype == np.dtype("u1")
        assert archive["long"].dtype == np.longdouble
        for name, value in values.items():
            assert archive[name].view(value.dtype).tobytes() == value.tobytes(), name


def test_ckptstore_reads_back_every_dtype_and_layout(tmp_path: Path) -> None:
    values = varied_blobs()
    storage = save(tmp_path, values)
    manifest = protocol.open_node(storage, NODE, 1)
    loaded = protocol.read_blobs(storage, manifest, None, NpzDB(), engine())
    for name, value in values.items():
        assert loaded[name].dtype == value.dtype
        assert loaded[name].shape == value.shape
        np.testing.assert_array_equal(loaded[name], value)
    assert len(manifest.blobs["model/w"].chunks) == 5  # 50 rows, 12 rows (3840 B) a chunk


def test_every_byte_of_the_archive_is_covered_by_a_checksum(tmp_path: Path) -> None:
    save(tmp_path, varied_blobs())
    storage = LocalPath(str(tmp_path))
    manifest = protocol.open_node(storage, NODE, 1)
    chunks = [c for record in manifest.blobs.values() for c in record.chunks]
    assert {piece.key for piece in [*chunks, *manifest.files]} == {"blobs.npz"}

    def inside_a_format_range(chunk: ChunkRecord) -> bool:
        return any(
            f.offset <= chunk.offset and chunk.offset + chunk.stored <= f.offset + f.stored
            for f in manifest.files
        )

    # a run of small members is one format range (its blobs inside it); the pieces of
    # large members, their headers and the central directory tile the rest
    nested = [c for c in chunks if inside_a_format_range(c)]
    assert len(manifest.files) < len(nested)
    pieces = sorted(
        [*manifest.files, *(c for c in chunks if c not in nested)], key=lambda c: c.offset
    )
    position = 0
    for piece in pieces:
        assert piece.offset == position
        assert piece.stored == piece.size
        position += piece.stored
    assert position == (node_dir(tmp_path, "trainer_0", 1) / "blobs.npz").stat().st_size
    assert manifest.stored_bytes == position  # nested blob bytes count once


def test_flipping_any_byte_of_an_archive_is_reported_by_verify(tmp_path: Path) -> None:
    storage = save(tmp_path, {"w": np.arange(3, dtype=np.int8), "s": np.array(1.5)})
    archive = node_dir(tmp_path, "trainer_0", 1) / "blobs.npz"
    size = archive.stat().st_size
    db = NpzDB()
    io = ParallelIO(IOSettings(chunk_bytes=4096, concurrency=1, memory_budget=1 << 20))
    assert protocol.verify_node(storage, NODE, 1, db, io) == []
    missed = []
    for offset in range(size):
        flip_byte(archive, offset)
        if not protocol.verify_node(storage, NODE, 1, db, io):
            missed.append(offset)
        flip_byte(archive, offset)
    assert missed == []
    assert protocol.verify_node(storage, NODE, 1, db, io) == []


def test_a_damaged_blob_fails_its_load_with_its_name(tmp_path: Path) -> None:
    storage = save(tmp_path, {"a": np.arange(4.0), "b": np.arange(4.0)})
    manifest = protocol.open_node(storage, NODE, 1)
    flip_byte(
        node_dir(tmp_path, "trainer_0", 1) / "blobs.npz", manifest.blobs["b"].chunks[0].offset
    )
    with pytest.raises(CorruptCheckpointError) as info:
        protocol.read_blobs(storage, manifest, ["a", "b"], NpzDB(), engine())
    assert info.value.blob == "b"
    assert protocol.read_blobs(storage, manifest, ["a"], NpzDB(), engine())["a"][3] == 3.0


def test_partial_loads_read_only_the_requested_blobs_bytes(
    tmp_path: Path, registry: Registry
) -> None:
    session, storage = partial_load(tmp_path, registry, "npz", ["b"])
    assert session.workspace("reader")["b"].tolist() == list(range(10))
    assert storage.chunk_reads == {
        f"{data_key(LocalPath(str(tmp_path)), 'trainer_0', 1)}/blobs.npz": 40
    }
    assert sorted(storage.document_reads) == [
        "_ckptstore/epoch-1/trainer_0.commit.json",
        f"{data_key(LocalPath(str(tmp_path)), 'trainer_0', 1)}/ckptstore.manifest.json",
    ]


DETONATED: list[str] = []


def _detonate() -> str:
    DETONATED.append("unpickled!")
    return "payload"


class Bomb:
    """Unpickling this object records it."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _detonate, ()


def forge(tmp_path: Path, storage: LocalPath, dtype: str) -> bytes:
    """Replace trainer_0.1's archive with one holding a pickled object array, and commit
    a consistent manifest describing its first 8 bytes as blob ``w`` of ``dtype``."""
    archive = node_dir(tmp_path, "trainer_0", 1) / "blobs.npz"
    np.savez(archive, w=np.array([Bomb()], dtype=object))
    head = archive.read_bytes()[:8]
    chunk = ChunkRecord("blobs.npz", 0, 8, 8, crc32_of([head]))
    data = NodeManifest(NODE, 1, "npz", {"w": BlobRecord("w", dtype, (1,), (chunk,))}).encode()
    root = data_key(storage, NODE, 1)
    storage.write_bytes(f"{root}/ckptstore.manifest.json", data)
    commit = protocol.NodeCommit(
        NODE, 1, "npz", crc32c_of([data]), 8, len(data), 1, attempt=root.rsplit("-", 1)[1]
    )
    protocol.retract_epoch(storage, 1, [NODE])  # the forger replaces the record
    protocol.commit_epoch(storage, 1, [commit])
    return head


def test_loading_never_unpickles(tmp_path: Path) -> None:
    DETONATED.clear()
    storage = save(tmp_path, {"w": np.zeros(1, dtype=np.int64)})
    archive = node_dir(tmp_path, "trainer_0", 1) / "blobs.npz"
    manager = CheckpointManager(str(tmp_path), NODE, "npz")
    session = LocalSession()
    forge(tmp_path, storage, "|O")
    with pytest.raises(CorruptCheckpointError, match="not a plain numeric"):
        session.run(manager.init([NODE], retrieve_from_epoch=1))
    head = forge(tmp_path, storage, "<i8")  # a manifest that passes: raw bytes, no pickle
    session.run(manager.init([NODE], retrieve_from_epoch=1))
    session.run(manager.load(1))
    assert session.workspace(NODE)["w"].tobytes() == head
    assert DETONATED == []
    with pytest.raises(ValueError, match="allow_pickle"), np.load(archive) as npz:
        npz["w"]
    with np.load(archive, allow_pickle=True) as npz:  # the bomb is live: only pickle fires it
        npz["w"]
    assert DETONATED == ["unpickled!"]


def test_archives_stream_to_object_stores_and_load_back() -> None:
    values = varied_blobs()
    with memory_root() as url:
        session = LocalSession()
        for name, value in values.items():
            session.workspace(NODE)[name] = value
        manager = CheckpointManager(url, NODE, "npz", io=SMALL_CHUNKS)
        session.run(manager.init([NODE]))
        session.run(manager.save(1))
        storage = manager.location.storage
        assert isinstance(storage, FsspecPath)
        assert protocol.verify_node(storage, NODE, 1, NpzDB(), engine()) == []
        with storage.fs.open(
            f"{storage.root}/{data_key(storage, NODE, 1)}/blobs.npz", "rb"
        ) as file:
            archive = np.load(file, allow_pickle=False)
            np.testing.assert_array_equal(archive["model/w"], values["model/w"])
        fresh = LocalSession()
        fresh.run(manager.load(1))
        for name, value in values.items():
            np.testing.assert_array_equal(fresh.workspace(NODE)[name], value)
