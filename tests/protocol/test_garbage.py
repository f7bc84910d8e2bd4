"""Garbage: attempts no commit record names, collected only once their node and epoch
is committed to another attempt (see ckptstore/protocol/_garbage.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ckpt_helpers import files_under, flip_byte

from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.io import ParallelIO
from ckptstore.protocol import (
    NodeCommit,
    check_not_committed,
    commit_epoch,
    open_node,
    read_blobs,
    write_node,
)
from ckptstore.protocol._garbage import collect_garbage, find_garbage, group_node_data
from ckptstore.records._layout import node_commit_key


def write(storage: LocalPath, node: str, epoch: int, value: float) -> NodeCommit:
    blobs = {"w": np.full(3, value)}
    return write_node(storage, node, epoch, blobs, NpzDB(), ParallelIO())


def test_node_data_is_grouped_by_attempt_and_an_earlier_versions_files() -> None:
    grouped = group_node_data(
        [
            "trainer_0.1/attempt-0123456789ab/blobs.npz",
            "trainer_0.1/attempt-0123456789ab/ckptstore.manifest.json",
            "trainer_0.1/blobs.npz",  # an earlier version's layout
            "trainer_0.1/attempt-nothex000000/x",  # not an attempt name: loose
            "_ckptstore/epoch-1/trainer_0.commit.json",
            "notes.txt",
        ]
    )
    assert list(grouped) == [("trainer_0", 1)]
    data = grouped["trainer_0", 1]
    assert dict(data.attempts) == {
        "0123456789ab": [
            "trainer_0.1/attempt-0123456789ab/blobs.npz",
            "trainer_0.1/attempt-0123456789ab/ckptstore.manifest.json",
        ]
    }
    assert data.loose == ["trainer_0.1/blobs.npz", "trainer_0.1/attempt-nothex000000/x"]


def test_attempts_of_an_uncommitted_epoch_are_never_garbage(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    write(storage, "trainer_0", 1, 1.0)  # crashed before its commit, or still writing
    write(storage, "trainer_0", 1, 2.0)
    assert find_garbage(storage) == []


def test_an_overwritten_attempt_is_garbage_and_the_committed_one_never(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    old = write(storage, "trainer_0", 1, 1.0)
    commit_epoch(storage, 1, [old])
    check_not_committed(storage, 1, ["trainer_0"], overwrite=True)
    new = write(storage, "trainer_0", 1, 2.0)
    assert find_garbage(storage) == []  # retracted: the new save may still be writing
    commit_epoch(storage, 1, [new])
    (garbage,) = find_garbage(storage)
    assert (garbage.node, garbage.epoch, garbage.key) == ("trainer_0", 1, old.data_key)
    assert garbage.stored_bytes == sum(
        (tmp_path / old.data_key / name).stat().st_size
        for name in files_under(tmp_path / old.data_key)
    )
    assert (tmp_path / old.data_key).is_dir()  # finding deletes nothing
    collect_garbage(storage, [garbage])
    assert not (tmp_path / old.data_key).exists()
    manifest = open_node(storage, "trainer_0", 1)
    assert read_blobs(storage, manifest, None, NpzDB(), ParallelIO())["w"].tolist() == [2.0] * 3


def test_only_the_given_nodes_garbage_is_found(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    for node in ("trainer_0", "trainer_1"):
        write(storage, node, 1, 0.0)  # a lost attempt
        commit_epoch(storage, 1, [write(storage, node, 1, 1.0)])
    assert [item.node for item in find_garbage(storage)] == ["trainer_0", "trainer_1"]
    assert [item.node for item in find_garbage(storage, ["trainer_1"])] == ["trainer_1"]


def test_a_damaged_commit_record_keeps_every_attempt(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    write(storage, "trainer_0", 1, 0.0)
    commit_epoch(storage, 1, [write(storage, "trainer_0", 1, 1.0)])
    flip_byte(tmp_path / node_commit_key(1, "trainer_0"), 20)
    assert find_garbage(storage) == []  # which attempt it names is unknown: keep both
