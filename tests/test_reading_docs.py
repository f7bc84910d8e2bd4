"""docs/reading-without-ckptstore.md works as written: its code blocks, run on
checkpoints ckptstore wrote (local disk, and a moto S3 server), find the newest
committed epoch and read blobs with plain zarr-python, numpy, boto3 and fsspec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore import LocalPath
from ckptstore.builtin import _packed
from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._location import CheckpointLocation

GUIDE = (
    Path(__file__).resolve().parent.parent / "docs" / "reading-without-ckptstore.md"
).read_text()
WEIGHTS = np.arange(12, dtype=np.float32).reshape(3, 4)
LARGE_WEIGHTS = np.arange(360_000, dtype=np.float32).reshape(600, 600)  # 1.4 MiB


@pytest.fixture(params=["one archive", "several archives"])
def weights(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The blob the guide reads: small, or large in a node checkpoint of several archives
    (archives of 1 MiB of large blobs; 256 MiB by default)."""
    if request.param == "one archive":
        return WEIGHTS
    monkeypatch.setattr(_packed, "ARCHIVE_BYTES", 1 << 20)
    return LARGE_WEIGHTS


def blocks(section: str) -> list[str]:
    """The Python code blocks of one ``## section`` of the guide, in order."""
    match = re.search(rf"^## {section}\n(.*?)(?=^## |\Z)", GUIDE, re.M | re.S)
    assert match, f"the guide has no '## {section}' section"
    return re.findall(r"```python\n(.*?)```", match.group(1), re.S)


def write_checkpoints(url: str, weights: np.ndarray) -> None:
    """Epochs 1 and 2 of trainer_0 (zarr) and trainer_1 (npz); epoch 3 is written but
    never committed, so the guide's steps must pick epoch 2. With large ``weights``,
    "model/w" is in the node's second archive."""
    locations = {db: CheckpointLocation.open(url, db) for db in ("zarr", "npz")}
    nodes = {"trainer_0": locations["zarr"], "trainer_1": locations["npz"]}
    for epoch in (1, 2, 3):
        commits = []
        for node, location in nodes.items():
            other = np.zeros(5 if weights is WEIGHTS else 300_000)
            blobs = {"model/w": weights * epoch, "other": other}
            commits.append(
                protocol.write_node(
                    location.storage, node, epoch, blobs, location.db_type, location.engine()
                )
            )
        if epoch < 3:
            protocol.commit_epoch(locations["zarr"].storage, epoch, commits)


def test_local_steps_read_the_newest_committed_epoch(tmp_path: Path, weights: np.ndarray) -> None:
    write_checkpoints(str(tmp_path), weights)
    storage = LocalPath(str(tmp_path))
    holders = {
        node: {chunk.key for chunk in protocol.open_node(storage, node, 2).blobs["model/w"].chunks}
        for node in ("trainer_0", "trainer_1")
    }
    if weights is LARGE_WEIGHTS:  # the guide must find it in the second archive
        assert holders == {"trainer_0": {"blobs.1.zarr.zip"}, "trainer_1": {"blobs.1.npz"}}
    namespace: dict[str, Any] = {}
    for code in blocks("Local disk"):
        exec(code.replace('"/data/ckpt"', repr(str(tmp_path))), namespace)
    assert namespace["epoch"] == 2
    assert sorted(namespace["nodes"]) == ["trainer_0", "trainer_1"]
    np.testing.assert_array_equal(namespace["weights"], weights * 2)
    np.testing.assert_array_equal(namespace["total"], weights * 2)


def test_s3_steps_read_the_newest_committed_epoch(s3_url: str, weights: np.ndarray) -> None:
    write_checkpoints(s3_url, weights)
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    (code,) = blocks("S3")
    code = code.replace('"my-bucket", "runs/exp1"', f"{bucket!r}, {prefix!r}")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    assert namespace["epoch"] == 2
    np.testing.assert_array_equal(namespace["weights"], weights * 2)
    np.testing.assert_array_equal(namespace["total"], weights * 2)


def test_the_integrity_check_finds_a_flipped_byte_and_nothing_else(tmp_path: Path) -> None:
    """The guide's check, with ``zlib.crc32`` alone, passes an intact node checkpoint
    and names the range of a byte flipped anywhere in it."""
    write_checkpoints(str(tmp_path), WEIGHTS)
    namespace: dict[str, Any] = {}
    for code in blocks("Local disk"):
        exec(code.replace('"/data/ckpt"', repr(str(tmp_path))), namespace)
    (code,) = blocks("Checking integrity yourself")
    exec(code, namespace)
    assert namespace["damaged"] == []
    archive = tmp_path / "trainer_0.2" / "blobs.zarr.zip"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 1
    archive.write_bytes(bytes(data))
    damaged = namespace["damaged_ranges"](str(tmp_path / "trainer_0.2"))
    assert damaged
    assert all(name == "blobs.zarr.zip" for name, _, _ in damaged)
    assert all(offset <= len(data) // 2 < offset + stored for _, offset, stored in damaged)


@pytest.mark.parametrize("section", ["Local disk", "S3"])
def test_the_guide_names_the_locations_the_tests_replace(section: str) -> None:
    text = "".join(blocks(section))
    assert ('"/data/ckpt"' if section == "Local disk" else '"my-bucket", "runs/exp1"') in text
