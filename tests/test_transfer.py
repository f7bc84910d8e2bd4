"""Copying committed node checkpoints between roots, verified on the way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import memory_keys, memory_root

from ckptstore import CheckpointNotFoundError, CorruptCheckpointError, protocol
from ckptstore.builtin import FsspecPath, LocalPath, NpzDB
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.io._checksum import crc32c_of
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._db_type import DBType
from ckptstore.plugin._path_type import PathType
from ckptstore.protocol._location import CheckpointLocation
from ckptstore.protocol._transfer import copy_node
from ckptstore.records import NodeManifest

NODE = "trainer_0"
IO = IOSettings(chunk_bytes=4096, memory_budget=1 << 20)


def source_location(root: Path, db_type: DBType) -> CheckpointLocation:
    storage = LocalPath(str(root))
    values = {"w": np.arange(2000.0), "b": np.ones(3, dtype=np.float32)}
    commit = protocol.write_node(storage, NODE, 4, values, db_type, ParallelIO(IO))
    protocol.commit_epoch(storage, 4, [commit])
    return CheckpointLocation(storage, db_type, IO)


def manifest_root(storage: PathType) -> str:
    return protocol.open_node(storage, NODE, 4).data_key


@pytest.mark.parametrize("db_type", [NpzDB(), ZarrDB(), ZarrDB(compression="zstd")], ids=str)
def test_a_copy_is_identical_and_committed_only_when_asked(tmp_path: Path, db_type: DBType) -> None:
    source = source_location(tmp_path / "src", db_type)
    with memory_root() as url:
        dest = FsspecPath(url)
        stats = copy_node(source=source, dest=dest, node=NODE, epoch=4)
        assert stats.action == "checkpoint_upload"
        assert stats.db_path == f"{url}/trainer_0.4"
        assert stats.nblobs == 2
        assert stats.nbytes == 2000 * 8 + 12
        assert sorted(stats.blobs) == ["b", "w"]
        with pytest.raises(CheckpointNotFoundError):
            protocol.open_node(dest, NODE, 4)  # copied, not committed yet
        assert stats.commit is not None
        protocol.commit_epoch(dest, 4, [stats.commit])
        manifest = protocol.open_node(dest, NODE, 4)
        loaded = protocol.read_blobs(dest, manifest, None, db_type, ParallelIO(IO))
        assert loaded["w"].tolist() == list(np.arange(2000.0))
        origin, copy = manifest_root(source.storage), manifest_root(dest)
        assert origin != copy  # the copy is a new attempt of its own
        src_keys = source.storage.list_keys("trainer_0.4")
        dest_keys = [k for k in memory_keys(url) if k.startswith("trainer_0.4/")]
        assert dest_keys == [key.replace(origin, copy) for key in src_keys]
        for key in src_keys:
            assert dest.read_bytes(key.replace(origin, copy)) == source.storage.read_bytes(key)
        assert protocol.verify_node(dest, NODE, 4, db_type, ParallelIO(IO)) == []


def test_an_archive_with_unrecorded_bytes_cannot_be_copied(tmp_path: Path) -> None:
    source = source_location(tmp_path / "src", NpzDB())
    storage = source.storage
    manifest = protocol.open_node(storage, NODE, 4)
    holey = NodeManifest(NODE, 4, "npz", manifest.blobs, manifest.files[1:])  # drop a gap
    data = holey.encode()
    storage.write_bytes(f"{manifest.data_key}/ckptstore.manifest.json", data)
    record = protocol.read_commit(storage, 4)
    assert record is not None
    node = record.nodes[NODE]
    forged = protocol.NodeCommit(
        NODE, 4, "npz", crc32c_of([data]), node.nbytes, node.stored_bytes, node.nblobs
    )
    forged = replace(forged, attempt=node.attempt)
    protocol.retract_epoch(storage, 4, [NODE])  # the forger replaces the record
    protocol.commit_epoch(storage, 4, [forged])
    dest = tmp_path / "dest"
    with pytest.raises(CorruptCheckpointError, match="unrecorded"):
        copy_node(source=source, dest=LocalPath(str(dest)), node=NODE, epoch=4)
    assert [p for p in dest.rglob("*") if p.is_file()] == []  # its attempt deleted
