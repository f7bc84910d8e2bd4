"""Flip single bytes in every file a save wrote; every flip must be detected.

Data and format files: ``verify_node`` names the file (and the blob, for data); a load
of an affected blob raises CorruptCheckpointError naming the blob, chunk and file.
Manifests and commit records: opening the checkpoint raises. The catalog: the damage
is detected and the catalog rebuilt from the commit records.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ckptstore import (
    CorruptCheckpointError,
    IOSettings,
    LocalPath,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    Workspace,
    get_registry,
)
from ckptstore.builtin._json_catalog import CATALOG_DIR, JsonCatalog
from ckptstore.io import ParallelIO
from ckptstore.protocol._commit import open_node, read_blobs, verify_node
from ckptstore.records._layout import CONTROL_DIR, MANIFEST_NAME, parse_node_commit_key
from ckptstore.records._manifest import NodeManifest

NODES = ["trainer_0", "trainer_1"]
SAMPLES_PER_FILE = 12


def blobs_for(node: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(len(node))
    return {
        f"{node}/weights": rng.random((37, 50), dtype=np.float32),  # several padded chunks
        f"{node}/bias": rng.random(50).astype(np.float64),
        f"{node}/step": np.array(7, dtype=np.int64),
        f"{node}/mask": rng.random(33) > 0.5,
    }


def save_checkpoint(root: Path, db_type: str) -> MultiNodeCheckpointManager:
    session = LocalSession()
    for node in NODES:
        with Node(node):
            session.run(Task(lambda ws, node=node: _fill(ws, node)))
    manager = MultiNodeCheckpointManager(
        str(root), db_type, metadata_handler="json", io=IOSettings(chunk_bytes=4096)
    )
    manager.set_params(NODES)
    session.run(manager.init(NODES))
    session.run(manager.save(1))
    manager.write_checkpoint_metadata(1)
    return manager


def _fill(ws: Workspace, node: str) -> None:
    ws.update(blobs_for(node))


def file_owners(storage: LocalPath, node: str) -> dict[str, list[tuple[str, int, int]]]:
    """For each file of a node checkpoint: the (blob, first byte, end) ranges in it."""
    manifest = open_node(storage, node, 1)
    owners: dict[str, list[tuple[str, int, int]]] = {}
    for record in manifest.blobs.values():
        for chunk in record.chunks:
            owners.setdefault(f"{node}.1/{chunk.key}", []).append(
                (record.name, chunk.offset, chunk.offset + chunk.stored)
            )
    return owners


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def positions(size: int, rng: random.Random) -> list[int]:
    if size <= SAMPLES_PER_FILE:
        return list(range(size))
    return sorted({0, size - 1, size // 2, *rng.sample(range(size), SAMPLES_PER_FILE - 3)})


@pytest.mark.parametrize("db_type", sorted(get_registry().db_types))
def test_every_flipped_byte_is_detected(tmp_path: Path, db_type: str) -> None:
    save_checkpoint(tmp_path, db_type)
    storage = LocalPath(str(tmp_path))
    io = ParallelIO()
    reader = get_registry().db_type(db_type)
    owners = {key: ranges for node in NODES for key, ranges in file_owners(storage, node).items()}
    files = sorted(storage.list_keys())
    rng = random.Random(db_type)
    checked = 0
    for key in files:
        path = tmp_path / key
        for position in positions(path.stat().st_size, rng):
            flip(path, position)
            try:
                check_detected(storage, key, position, owners, reader, io)
            finally:
                if not is_catalog(key):  # a detected bad catalog entry was rewritten
                    flip(path, position)
            checked += 1
    assert checked >= len(files)
    for node in NODES:  # everything restored: the checkpoint is whole again
        assert verify_node(storage, node, 1, reader, io) == []


def is_catalog(key: str) -> bool:
    return key.startswith(CATALOG_DIR + "/")


def check_detected(
    storage: LocalPath,
    key: str,
    position: int,
    owners: dict[str, list[tuple[str, int, int]]],
    reader: object,
    io: ParallelIO,
) -> None:
    if is_catalog(key):
        original = (storage.root + "/" + key, Path(storage.root, key).read_bytes())
        catalog = JsonCatalog()
        catalog.set_params(storage.url, "", NODES, storage=storage)
        assert catalog.last_epoch() == 1  # detected, rebuilt from the commit records
        assert Path(original[0]).read_bytes() != original[1]
        return
    if key.startswith(CONTROL_DIR + "/") or key.endswith(MANIFEST_NAME):
        record = parse_node_commit_key(key)  # a node's commit record: that node is refused
        node = key.split(".", 1)[0] if record is None else record[1]
        with pytest.raises(CorruptCheckpointError):
            open_node(storage, node, 1)
        return
    node = key.split(".", 1)[0]
    problems = verify_node(storage, node, 1, reader, io)  # type: ignore[arg-type]
    assert problems, f"flip at {key}:{position} went unnoticed by verify"
    assert any(problem.file and problem.file.endswith(key) for problem in problems)
    for blob, start, end in owners.get(key, []):
        if start <= position < end:
            manifest = open_node(storage, node, 1)
            with pytest.raises(CorruptCheckpointError) as caught:
                read_blobs(storage, manifest, [blob], reader, io)  # type: ignore[arg-type]
            assert caught.value.blob == blob
            assert caught.value.file is not None
            assert caught.value.file.endswith(key)
            assert blob in str(caught.value)


def test_manifest_decoding_rejects_a_hand_edited_dtype(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, "npz")
    path = tmp_path / "trainer_0.1" / MANIFEST_NAME
    edited = path.read_bytes().replace(b'"<f4"', b'"|O8"')
    with pytest.raises(CorruptCheckpointError):
        NodeManifest.decode(edited, url=str(tmp_path), key="m")
