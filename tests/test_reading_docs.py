"""docs/reading-without-ckptstore.md works as written: its code blocks, run on
checkpoints ckptstore wrote (local disk, and a moto S3 server), find the newest
committed epoch and read blobs with plain zarr-python, numpy, boto3 and fsspec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._location import CheckpointLocation

GUIDE = (
    Path(__file__).resolve().parent.parent / "docs" / "reading-without-ckptstore.md"
).read_text()
WEIGHTS = np.arange(12, dtype=np.float32).reshape(3, 4)


def blocks(section: str) -> list[str]:
    """The Python code blocks of one ``## section`` of the guide, in order."""
    match = re.search(rf"^## {section}\n(.*?)(?=^## |\Z)", GUIDE, re.M | re.S)
    assert match, f"the guide has no '## {section}' section"
    return re.findall(r"```python\n(.*?)```", match.group(1), re.S)


def write_checkpoints(url: str) -> None:
    """Epochs 1 and 2 of trainer_0 (zarr) and trainer_1 (npz); epoch 3 is written but
    never committed, so the guide's steps must pick epoch 2."""
    locations = {db: CheckpointLocation.open(url, db) for db in ("zarr", "npz")}
    nodes = {"trainer_0": locations["zarr"], "trainer_1": locations["npz"]}
    for epoch in (1, 2, 3):
        commits = []
        for node, location in nodes.items():
            blobs = {"model/w": WEIGHTS * epoch, "other": np.zeros(5)}
            commits.append(
                protocol.write_node(
                    location.storage, node, epoch, blobs, location.db_type, location.engine()
                )
            )
        if epoch < 3:
            protocol.commit_epoch(locations["zarr"].storage, epoch, commits)


def test_local_steps_read_the_newest_committed_epoch(tmp_path: Path) -> None:
    write_checkpoints(str(tmp_path))
    namespace: dict[str, Any] = {}
    for code in blocks("Local disk"):
        exec(code.replace('"/data/ckpt"', repr(str(tmp_path))), namespace)
    assert namespace["epoch"] == 2
    assert sorted(namespace["nodes"]) == ["trainer_0", "trainer_1"]
    np.testing.assert_array_equal(namespace["weights"], WEIGHTS * 2)
    np.testing.assert_array_equal(namespace["total"], WEIGHTS * 2)


def test_s3_steps_read_the_newest_committed_epoch(s3_url: str) -> None:
    write_checkpoints(s3_url)
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    (code,) = blocks("S3")
    code = code.replace('"my-bucket", "runs/exp1"', f"{bucket!r}, {prefix!r}")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    assert namespace["epoch"] == 2
    np.testing.assert_array_equal(namespace["weights"], WEIGHTS * 2)
    np.testing.assert_array_equal(namespace["total"], WEIGHTS * 2)


@pytest.mark.parametrize("section", ["Local disk", "S3"])
def test_the_guide_names_the_locations_the_tests_replace(section: str) -> None:
    text = "".join(blocks(section))
    assert ('"/data/ckpt"' if section == "Local disk" else '"my-bucket", "runs/exp1"') in text
