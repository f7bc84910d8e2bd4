"""Flip single bytes in every file a save wrote; every flip must be detected.

Data and format files: ``verify_node`` names the file (and the blob, for data); a load
of an affected blob raises CorruptCheckpointError naming the blob, chunk and file.
Manifests and commit records: opening the checkpoint raises. The catalog: the damage
is detected and the catalog rebuilt from the commit records. A node of many small blobs
stores its manifest gzip-compressed: it loads back, a flip anywhere in it is refused, and
a resume past such damage falls back to the previous intact epoch.
"""

from __future__ import annotations

import gzip
import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import node_dir

from ckptstore import (
    CorruptCheckpointError,
    IOSettings,
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    Workspace,
    epoch_limiter,
)
from ckptstore.builtin import LocalPath
from ckptstore.builtin._json_catalog import CATALOG_DIR, JsonCatalog
from ckptstore.io import ParallelIO
from ckptstore.plugin import get_registry
from ckptstore.protocol._commit import open_node, read_blobs, verify_node
from ckptstore.records._documents import GZIP_MAGIC
from ckptstore.records._layout import CONTROL_DIR, MANIFEST_NAME, parse_node_commit_key
from ckptstore.records._manifest import GZIP_MANIFESTS_LARGER_THAN, NodeManifest
from tests.attacks.forge import Forge

NODES = ["trainer_0", "trainer_1"]
SAMPLES_PER_FILE = 12
SMALL_BLOBS = 2000
"""Blobs of a few floats that make a node's manifest JSON larger than
``GZIP_MANIFESTS_LARGER_THAN``: it is stored compressed."""


def blobs_for(node: str, small: int = 0) -> dict[str, np.ndarray]:
    """A node's blobs; ``small``: that many more, of 4 float32 each."""
    rng = np.random.default_rng(len(node))
    return {
        f"{node}/weights": rng.random((37, 50), dtype=np.float32),  # several padded chunks
        f"{node}/bias": rng.random(50).astype(np.float64),
        f"{node}/step": np.array(7, dtype=np.int64),
        f"{node}/mask": rng.random(33) > 0.5,
        **{f"{node}/small/{i}": np.full(4, i, dtype=np.float32) for i in range(small)},
    }


def save_checkpoint(root: Path, db_type: str, small: int = 0) -> MultiNodeCheckpointManager:
    session = LocalSession()
    for node in NODES:
        with Node(node):
            session.run(Task(lambda ws, node=node: _fill(ws, node, small)))
    manager = MultiNodeCheckpointManager(
        str(root), db_type, metadata_handler="json", io=IOSettings(chunk_bytes=4096)
    )
    manager.set_params(NODES)
    session.run(manager.init(NODES))
    session.run(manager.save(1))
    manager.write_checkpoint_metadata(1)
    return manager


def _fill(ws: Workspace, node: str, small: int = 0) -> None:
    ws.update(blobs_for(node, small))


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
    path = node_dir(tmp_path, "trainer_0", 1) / MANIFEST_NAME
    edited = path.read_bytes().replace(b'"<f4"', b'"|O8"')
    with pytest.raises(CorruptCheckpointError):
        NodeManifest.decode(edited, url=str(tmp_path), key="m")


# -- compressed manifests (nodes of many small blobs) -------------------------------------


@pytest.mark.parametrize("db_type", sorted(get_registry().db_types))
def test_a_compressed_manifest_loads_back_and_a_flip_in_it_is_refused(
    tmp_path: Path, db_type: str
) -> None:
    """A node of 2,000 small blobs stores its manifest gzip-compressed (smaller than the
    threshold, its JSON larger); it loads and verifies; a flipped byte anywhere in it is
    refused by the commit record's CRC-32C, and, past the gzip header's unread fields,
    by the manifest's own decoding too (what stops a damage the record vouches for)."""
    save_checkpoint(tmp_path, db_type, small=SMALL_BLOBS)
    storage = LocalPath(str(tmp_path))
    reader = get_registry().db_type(db_type)
    io = ParallelIO()
    path = node_dir(tmp_path, "trainer_0", 1) / MANIFEST_NAME
    data = path.read_bytes()
    assert data.startswith(GZIP_MAGIC)
    assert len(gzip.decompress(data)) > GZIP_MANIFESTS_LARGER_THAN > len(data)
    session = LocalSession()
    manager = MultiNodeCheckpointManager(str(tmp_path), db_type)
    session.run(manager.init(NODES, retrieve_from_epoch=1))
    session.run(manager.load(1))
    for node in NODES:
        assert verify_node(storage, node, 1, reader, io) == []
        for name, value in blobs_for(node, SMALL_BLOBS).items():
            np.testing.assert_array_equal(session.fetch_blob(node, name), value)
    body = range(10, len(data) - 9)  # past the header, before the padding and trailer
    for position in [*positions(len(data), random.Random(db_type)), *body[:: len(body) // 12]]:
        flip(path, position)
        try:
            with pytest.raises(CorruptCheckpointError, match="CRC-32C"):
                open_node(storage, "trainer_0", 1)  # the commit record's CRC-32C
            if position in body or position >= len(data) - 8:  # read: refused unvouched
                with pytest.raises(CorruptCheckpointError):
                    NodeManifest.decode(path.read_bytes(), url=str(tmp_path), key="m")
        finally:
            flip(path, position)
    assert (
        open_node(storage, "trainer_0", 1).blobs.keys()
        == blobs_for("trainer_0", SMALL_BLOBS).keys()
    )


def _init_small(ws: Workspace) -> None:
    ws.update(blobs_for("trainer_0", SMALL_BLOBS))


def _train_small(ws: Workspace) -> None:
    ws["trainer_0/step"] += 1
    ws["trainer_0/small/0"] += 1


def small_blob_job(epochs: int) -> Job:
    """One node of :data:`SMALL_BLOBS` small blobs (a compressed manifest); each epoch
    adds 1 to ``step`` and to ``small/0``."""
    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(_init_small, name="init")
        Task(_train_small, name="train")
        epoch_limiter(job, epochs)
    return job


@pytest.mark.parametrize(
    ("damage", "refused_by"),
    [("flipped byte", "CRC-32C"), ("truncated, commit record re-signed", "truncated")],
)
@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_a_damaged_compressed_manifest_falls_back_to_the_previous_epoch(
    tmp_path: Path, db_type: str, damage: str, refused_by: str
) -> None:
    """Damage the commit record does not vouch for is refused by its CRC-32C; damage it
    vouches for (an attacker's, who can write checksums) by the gzip checks. Either way
    the resume falls back to epoch 2 and saves epoch 3 again."""
    root = str(tmp_path)
    new_manager = partial(MultiNodeCheckpointManager, root, db_type, metadata_handler="json")
    assert JobRunner(small_blob_job(3), new_manager()).train(LocalSession()) == 3
    path = node_dir(tmp_path, "trainer_0", 3) / MANIFEST_NAME
    data = path.read_bytes()
    assert data.startswith(GZIP_MAGIC)
    if damage == "flipped byte":
        flip(path, len(data) // 2)
    else:
        Forge(tmp_path, "trainer_0", 3).write_manifest_bytes(data[: len(data) // 2])
    session = LocalSession()
    runner = JobRunner(small_blob_job(3), new_manager())
    # the catalog picks epoch 3; its manifest is damaged, so epoch 2 is restored and one
    # more epoch runs (the limiter's counter, restored from epoch 2, allows one)
    assert runner.train(session) == 3
    assert [failure.epoch for failure in runner.restore_failures] == [3]
    error = runner.restore_failures[0].error
    assert isinstance(error, CorruptCheckpointError)
    assert refused_by in str(error)
    assert session.workspace("trainer_0")["trainer_0/small/0"].tolist() == [3.0] * 4
    path = node_dir(tmp_path, "trainer_0", 3) / MANIFEST_NAME
    assert path.read_bytes().startswith(GZIP_MAGIC)  # epoch 3 saved again, whole
    saved = open_node(LocalPath(root), "trainer_0", 3).blobs
    assert saved.keys() >= blobs_for("trainer_0", SMALL_BLOBS).keys()
