"""docs/reading-without-ckptstore.md works as written: its code blocks, run on
checkpoints ckptstore wrote (local disk, and a moto S3 server), find the newest
committed epoch and read blobs with plain zarr-python, xarray, TensorStore, dask.array,
numpy and fsspec, from nodes of one archive or several, with plain or gzip-compressed
manifests, and large arrays stored as chunks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import data_key, node_dir

from ckptstore.formats import _zarr_db
from ckptstore.io import _write_plan
from ckptstore.paths import LocalPath
from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._location import CheckpointLocation
from ckptstore.records._documents import GZIP_MAGIC
from ckptstore.records._layout import MANIFEST_NAME

GUIDE = (
    Path(__file__).resolve().parent.parent / "docs" / "reading-without-ckptstore.md"
).read_text()
WEIGHTS = np.arange(12, dtype=np.float32).reshape(3, 4)
LARGE_WEIGHTS = np.arange(360_000, dtype=np.float32).reshape(600, 600)  # 1.4 MiB
SMALL_BLOBS = 2000
"""Blobs of a few floats per node that make its manifest gzip-compressed."""


@dataclass(frozen=True)
class Layout:
    """The blob the guide reads, and how many small blobs each node holds besides."""

    weights: np.ndarray
    small_blobs: int = 0


@pytest.fixture(params=["one archive", "several archives", "compressed manifest", "chunks"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Layout:
    """Small weights; large ones in a node checkpoint of several archives (archives of
    1 MiB of large blobs; 256 MiB by default); small ones among 2,000 small blobs,
    whose manifest is stored gzip-compressed; or large ones stored as chunks (of 64
    KiB, for arrays over 1 MiB; 16 and 64 MiB by default)."""
    if request.param == "one archive":
        return Layout(WEIGHTS)
    if request.param == "compressed manifest":
        return Layout(WEIGHTS, SMALL_BLOBS)
    if request.param == "chunks":
        monkeypatch.setattr(_zarr_db, "CHUNKED_FROM", 1 << 20)
        monkeypatch.setattr(_zarr_db, "CHUNK_BYTES", 64 << 10)
        return Layout(LARGE_WEIGHTS)
    monkeypatch.setattr(_write_plan, "ARCHIVE_BYTES", 1 << 20)
    return Layout(LARGE_WEIGHTS)


def blocks(section: str) -> list[str]:
    """The Python code blocks of one ``## section`` of the guide, in order."""
    match = re.search(rf"^## {section}\n(.*?)(?=^## |\Z)", GUIDE, re.M | re.S)
    assert match, f"the guide has no '## {section}' section"
    return re.findall(r"```python\n(.*?)```", match.group(1), re.S)


def write_checkpoints(url: str, weights: np.ndarray, small_blobs: int = 0) -> None:
    """Epochs 1 and 2 of trainer_0 (zarr) and trainer_1 (npz); epoch 3 is written but
    never committed, so the guide's steps must pick epoch 2. With large ``weights``,
    "model/w" is in the node's second archive; with ``small_blobs``, each node holds that
    many more blobs (``small/<i>``, 4 floats each)."""
    locations = {db: CheckpointLocation.open(url, db) for db in ("zarr", "npz")}
    nodes = {"trainer_0": locations["zarr"], "trainer_1": locations["npz"]}
    for epoch in (1, 2, 3):
        commits = []
        for node, location in nodes.items():
            other = np.zeros(5 if weights is WEIGHTS else 300_000)
            blobs = {"model/w": weights * epoch, "other": other}
            blobs.update({f"small/{i}": np.full(4, i, np.float32) for i in range(small_blobs)})
            commits.append(
                protocol.write_node(
                    location.storage, node, epoch, blobs, location.db_type, location.engine()
                )
            )
        if epoch < 3:
            protocol.commit_epoch(locations["zarr"].storage, epoch, commits)


def test_local_steps_read_the_newest_committed_epoch(tmp_path: Path, layout: Layout) -> None:
    weights = layout.weights
    write_checkpoints(str(tmp_path), weights, layout.small_blobs)
    assert_manifests_compressed(tmp_path, compressed=layout.small_blobs > 0)
    storage = LocalPath(str(tmp_path))
    holders = {
        node: {chunk.key for chunk in protocol.open_node(storage, node, 2).blobs["model/w"].chunks}
        for node in ("trainer_0", "trainer_1")
    }
    if weights is LARGE_WEIGHTS and weights.nbytes < _zarr_db.CHUNKED_FROM:
        # the guide must find it in the second archive
        assert holders == {"trainer_0": {"blobs.1.zarr.zip"}, "trainer_1": {"blobs.1.npz"}}
    namespace: dict[str, Any] = {}
    for code in blocks("Local disk"):
        exec(code.replace('"/data/ckpt"', repr(str(tmp_path))), namespace)
    assert namespace["epoch"] == 2
    assert sorted(namespace["nodes"]) == ["trainer_0", "trainer_1"]
    readers = ["weights", "weights_xarray", "weights_tree", "weights_tensorstore"]
    for name in [*readers, "weights_dask", "total"]:
        np.testing.assert_array_equal(namespace[name], weights * 2, err_msg=name)
    chunked = weights.nbytes > _zarr_db.CHUNKED_FROM
    assert (namespace["group"]["model/w"].chunks == weights.shape) is not chunked


def assert_manifests_compressed(url: str | Path, *, compressed: bool) -> None:
    """Whether every manifest of epoch 2 under ``url`` is gzip-compressed."""
    storage = CheckpointLocation.open(str(url), "zarr").storage
    for node in ("trainer_0", "trainer_1"):
        data = storage.read_bytes(f"{data_key(storage, node, 2)}/{MANIFEST_NAME}")
        assert data.startswith(GZIP_MAGIC) == compressed


def test_s3_steps_read_the_newest_committed_epoch(s3_url: str, layout: Layout) -> None:
    weights = layout.weights
    write_checkpoints(s3_url, weights, layout.small_blobs)
    assert_manifests_compressed(s3_url, compressed=layout.small_blobs > 0)
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    (code,) = blocks("S3")
    code = code.replace('"my-bucket", "runs/exp1"', f"{bucket!r}, {prefix!r}")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    assert namespace["epoch"] == 2
    np.testing.assert_array_equal(namespace["weights"], weights * 2)
    np.testing.assert_array_equal(namespace["total"], weights * 2)


@pytest.mark.parametrize("small_blobs", [0, SMALL_BLOBS], ids=["plain", "compressed manifest"])
def test_the_integrity_check_finds_a_flipped_byte_and_nothing_else(
    tmp_path: Path, small_blobs: int
) -> None:
    """The guide's check, with ``zlib.crc32`` alone, passes an intact node checkpoint
    and names the range of a byte flipped anywhere in it."""
    write_checkpoints(str(tmp_path), WEIGHTS, small_blobs)
    assert_manifests_compressed(tmp_path, compressed=small_blobs > 0)
    namespace: dict[str, Any] = {}
    for code in blocks("Local disk"):
        exec(code.replace('"/data/ckpt"', repr(str(tmp_path))), namespace)
    (code,) = blocks("Checking integrity yourself")
    exec(code, namespace)
    assert namespace["damaged"] == []
    archive = node_dir(tmp_path, "trainer_0", 2) / "blobs.zarr.zip"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 1
    archive.write_bytes(bytes(data))
    damaged = namespace["damaged_ranges"](str(node_dir(tmp_path, "trainer_0", 2)))
    assert damaged
    assert all(name == "blobs.zarr.zip" for name, _, _ in damaged)
    assert all(offset <= len(data) // 2 < offset + stored for _, offset, stored in damaged)


@pytest.mark.parametrize("section", ["Local disk", "S3"])
def test_the_guide_names_the_locations_the_tests_replace(section: str) -> None:
    text = "".join(blocks(section))
    assert ('"/data/ckpt"' if section == "Local disk" else '"my-bucket", "runs/exp1"') in text
