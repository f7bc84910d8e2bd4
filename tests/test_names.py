"""Checkpoint names: Caffe2's helpers, and the rules that keep every name inside its
checkpoint prefix (for blob names, node names and storage keys, and in the built-in
path types)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import memory_keys, memory_root

from ckptstore import (
    CheckpointManager,
    MultiNodeCheckpointManager,
    Node,
    Task,
    Workspace,
    db_name,
    get_ckpt_filename,
)
from ckptstore.builtin import FsspecPath, LocalPath
from ckptstore.errors import InvalidEpochError, InvalidNameError
from ckptstore.plugin._path_type import PathType
from ckptstore.records._layout import commit_record_key, epoch_commit_dir, node_commit_key
from ckptstore.records._names import (
    MAX_EPOCH,
    join_url,
    validate_blob_name,
    validate_epoch,
    validate_key,
    validate_node_name,
)

# -- Caffe2's helpers ------------------------------------------------------------------------


def test_get_ckpt_filename_is_node_dot_epoch() -> None:
    assert get_ckpt_filename("trainer_0", 5) == "trainer_0.5"
    assert get_ckpt_filename("trainer:0", 0) == "trainer:0.0"


# -- epochs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "epoch", [0, 7, MAX_EPOCH, np.int64(3), np.uint8(3), np.int32(0)], ids=repr
)
def test_an_epoch_is_a_non_negative_integer_returned_as_an_int(epoch: object) -> None:
    checked = validate_epoch(epoch)
    assert type(checked) is int
    assert checked == epoch


@pytest.mark.parametrize(
    ("epoch", "reason"),
    [
        ("1", "it is a str"),
        (4.0, "it is a float"),
        (np.float32(4), "it is a float32"),
        (True, "it is a bool"),
        (np.bool_(False), "it is a bool"),
        (None, "it is a NoneType"),
        (-1, "it is negative"),
        (np.int8(-1), "it is negative"),
        (MAX_EPOCH + 1, "it does not fit a signed 64-bit integer"),
    ],
    ids=repr,
)
def test_what_is_not_an_epoch_is_refused_naming_the_argument(epoch: object, reason: str) -> None:
    with pytest.raises(InvalidEpochError) as raised:
        validate_epoch(epoch, "resume_from_epoch")
    error = raised.value
    assert isinstance(error, ValueError)
    assert (error.argument, error.value) == ("resume_from_epoch", epoch)
    assert str(error).startswith(f"resume_from_epoch={epoch!r} is not an epoch: {reason}")
    assert "pass a non-negative integer" in str(error)


NAMERS: dict[str, Callable[[Any], str]] = {
    "get_ckpt_filename": lambda epoch: get_ckpt_filename("trainer_0", epoch),
    "db_name": lambda epoch: db_name(epoch, "trainer_0", "/ckpt"),
    "epoch_commit_dir": epoch_commit_dir,
    "commit_record_key": commit_record_key,
    "node_commit_key": lambda epoch: node_commit_key(epoch, "trainer_0"),
}


@pytest.mark.parametrize("namer", NAMERS.values(), ids=list(NAMERS))
def test_every_epoch_name_is_formed_from_a_checked_epoch(namer: Callable[[Any], str]) -> None:
    """The backstop under every API: no key like ``trainer_0.True`` or ``epoch-4.0``
    can be formed, whichever caller forgot to check."""
    for bad in ("1", 4.0, True, -1):
        with pytest.raises(InvalidEpochError, match=r"^epoch="):
            namer(bad)
    assert namer(np.int64(4)) == namer(4)


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("/tmp/x", "/tmp/x/trainer_0.5"),
        ("/tmp/x/", "/tmp/x/trainer_0.5"),
        ("relative/dir", "relative/dir/trainer_0.5"),
        ("s3://bucket/run", "s3://bucket/run/trainer_0.5"),
        ("s3://bucket/run/", "s3://bucket/run/trainer_0.5"),
        ("s3://bucket", "s3://bucket/trainer_0.5"),
        ("memory://", "memory://trainer_0.5"),
        ("file:///", "file:///trainer_0.5"),
    ],
)
def test_db_name_joins_the_prefix_with_one_separator(prefix: str, expected: str) -> None:
    assert db_name(5, "trainer_0", prefix) == expected


def test_db_name_concatenates_path_prefix_without_separator() -> None:
    assert db_name(5, "trainer_0", "/tmp/x", "/upload/run_") == "/upload/run_trainer_0.5"
    assert db_name(5, "trainer_0", "/tmp/x", "/upload/") == "/upload/trainer_0.5"
    assert db_name(7, "n", "/ignored", "s3://b/p") == "s3://b/pn.7"


@pytest.mark.parametrize("empty", [None, ""])
def test_db_name_treats_an_empty_path_prefix_as_absent(empty: str | None) -> None:
    assert db_name(1, "n", "/tmp/x", empty) == "/tmp/x/n.1"


def test_join_url_keeps_local_paths_posix() -> None:
    assert join_url("/a/b", "c/d") == "/a/b/c/d"
    assert join_url("gs://bucket//", "k") == "gs://bucket/k"


# -- validation ------------------------------------------------------------------------------

ESCAPING_NAMES = [
    "",
    "/etc/passwd",
    "../x",
    "a/../../x",
    "a/..",
    "..",
    ".",
    "a/./b",
    "a//b",
    "a/",
    "a\\..\\b",
    "a\\b",
    "a\x00b",
    "a\nb",
    "tab\there",
    "del\x7f",
]


@pytest.mark.parametrize("name", ESCAPING_NAMES)
def test_blob_names_that_could_escape_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_blob_name(name)
    assert info.value.name == name
    assert "blob name" in str(info.value)


@pytest.mark.parametrize("name", ESCAPING_NAMES)
def test_storage_keys_that_could_escape_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".hidden",
        "-dash",
        "a/b",
        "..",
        "../x",
        "a b",
        "a\\b",
        "x" * 201,
        "é",
        "a\x00",
    ],
)
def test_unsafe_node_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_node_name(name)


@pytest.mark.parametrize("value", [None, 3, b"bytes", ["a"]])
def test_names_must_be_strings(value: Any) -> None:
    for validate in (validate_blob_name, validate_node_name, validate_key):
        with pytest.raises(InvalidNameError):
            validate(value)


@pytest.mark.parametrize(
    "name", ["trainer_1/total", "a.b", "..a/b..", "w", "poids/é", "/".join(["x" * 255] * 4)]
)
def test_ordinary_blob_names_are_accepted(name: str) -> None:
    assert validate_blob_name(name) == name


def test_blob_names_longer_than_1024_characters_are_refused() -> None:
    with pytest.raises(InvalidNameError):
        validate_blob_name("x" * 1025)


@pytest.mark.parametrize("name", ["x" * 256, "a/" + "y" * 256 + "/b", "é" * 128])
def test_a_segment_longer_than_255_utf8_bytes_is_refused_naming_the_blob_and_limit(
    name: str,
) -> None:
    with pytest.raises(InvalidNameError, match="255") as caught:
        validate_blob_name(name)
    assert caught.value.name == name
    assert "bytes" in str(caught.value)


def test_names_from_existing_manifests_are_not_held_to_the_segment_limit() -> None:
    name = "n" * 600
    assert validate_blob_name(name, new=False) == name
    assert validate_blob_name("é" * 127) == "é" * 127  # 254 bytes


@pytest.mark.parametrize("name", ["trainer_0", "trainer:0", "local", "a.b-c", "_", "x" * 200])
def test_ordinary_node_names_are_accepted(name: str) -> None:
    assert validate_node_name(name) == name


def test_every_entry_point_taking_a_name_validates_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidNameError):
        Workspace()["../escape"] = np.zeros(1)
    with pytest.raises(InvalidNameError):
        Workspace({"/abs": 1})
    with pytest.raises(InvalidNameError):
        Node("../up")
    with pytest.raises(InvalidNameError):
        Task(outputs=["a/../b"])
    with pytest.raises(InvalidNameError):
        Task(node="a/b")
    with pytest.raises(InvalidNameError):
        CheckpointManager(str(tmp_path), "../evil", "npz")
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
    with pytest.raises(InvalidNameError):
        manager.init(["trainer_0", "../evil"])
    assert list(tmp_path.iterdir()) == []


# -- path types refuse escaping keys ---------------------------------------------------------

KEY_OPERATIONS: dict[str, Callable[[PathType, str], Any]] = {
    "write_parts": lambda s, k: s.write_parts(k, [b"data"]),
    "write_bytes": lambda s, k: s.write_bytes(k, b"data"),
    "put_document": lambda s, k: s.put_document(k, b"{}"),
    "get_document": lambda s, k: s.get_document(k),
    "read_bytes": lambda s, k: s.read_bytes(k),
    "read_into": lambda s, k: s.read_into(k, 0, [memoryview(bytearray(4))]),
    "exists": lambda s, k: s.exists(k),
    "size": lambda s, k: s.size(k),
    "delete": lambda s, k: s.delete([k]),
    "delete_tree": lambda s, k: s.delete_tree(k),
    "list_keys": lambda s, k: s.list_keys(k),
    "open_write": lambda s, k: s.open_write(k),
}
BAD_KEYS = ["../outside", "/etc/passwd", "a/../../outside", "a\\b", "a//b", "a\x00", ""]


@pytest.mark.parametrize("operation", sorted(KEY_OPERATIONS))
def test_local_path_refuses_every_escaping_key(tmp_path: Path, operation: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").write_bytes(b"keep me")
    storage = LocalPath(str(root))
    for key in BAD_KEYS:
        if operation == "list_keys" and key == "":
            continue  # the whole root: allowed
        with pytest.raises(InvalidNameError):
            KEY_OPERATIONS[operation](storage, key)
    assert (tmp_path / "outside").read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "root"]
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("operation", sorted(KEY_OPERATIONS))
def test_fsspec_path_refuses_every_escaping_key(operation: str) -> None:
    with memory_root("outer") as outer:
        sibling = FsspecPath(outer + "/sibling")
        sibling.write_bytes("keep", b"keep me")
        storage = FsspecPath(outer + "/root")
        for key in BAD_KEYS:
            if operation == "list_keys" and key == "":
                continue
            with pytest.raises(InvalidNameError):
                KEY_OPERATIONS[operation](storage, key)
        assert memory_keys(outer) == ["sibling/keep"]
        assert sibling.read_bytes("keep") == b"keep me"


def test_a_name_checked_from_a_manifest_is_still_held_to_the_limit_when_new() -> None:
    # names are remembered once valid; being valid as old must not make them valid as new
    for name in ("m" * 600, "é" * 128, "a/" + "b" * 256):
        assert validate_blob_name(name, new=False) == name
        with pytest.raises(InvalidNameError, match="255"):
            validate_blob_name(name)
    short = "layer/ok"
    assert validate_blob_name(short, new=False) == short
    assert validate_blob_name(short) == short


def test_remembering_valid_names_gives_the_garbage_collector_nothing_to_walk() -> None:
    """Filling a workspace with 5,000 new names leaves no object for the cyclic
    collector (a tracked object per name set off full collections over the whole heap).

    The count is of every tracked object in the process, and other threads (the event
    loop of a Dask cluster another test left running for the session) make some too: of
    three rounds of fresh names the quietest counts, and one tracked object per name
    would add 5,000 to every round."""
    added = []
    for round_ in range(3):
        names = [f"gc_probe/{round_}/{i}" for i in range(5000)]
        gc.collect()
        before = len(gc.get_objects())
        for name in names:
            assert validate_blob_name(name, new=False) == name
        added.append(len(gc.get_objects()) - before)
        assert all(validate_blob_name(name) == name for name in names)
    assert min(added) < 50, added
