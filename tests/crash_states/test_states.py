"""The crash-state model itself: what each kind of state keeps and loses, on small
recordings made by hand, and the regression its first run found."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from crash_states.recorder import FsRecorder
from crash_states.states import CrashState, build, distinct_states, enumerate_states, tear_points

from ckptstore.builtin import LocalPath


def _record(root: Path, steps: Callable[[str], None]) -> tuple[FsRecorder, Path]:
    root.mkdir()
    before = root.with_name("before")
    shutil.copytree(root, before)
    recorder = FsRecorder(root)
    with recorder.recording():
        steps(str(root))
    return recorder, before


def _tree(recorder: FsRecorder, before: Path, state: CrashState, target: Path) -> dict[str, bytes]:
    build(recorder.result, state, before).write_to(target, before)
    return {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()}


def write_sync_rename(root: str) -> None:
    fd = os.open(root + "/a.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, b"x" * 10000)
    os.fsync(fd)
    os.pwrite(fd, b"y" * 100, 10000)  # never synced
    os.close(fd)
    os.rename(root + "/a.tmp", root + "/a")  # its directory never synced


def and_sync_the_directory(root: str) -> None:
    write_sync_rename(root)
    fd = os.open(root, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def test_each_kind_of_state_keeps_what_the_model_says(tmp_path: Path) -> None:
    recorder, before = _record(tmp_path / "root", write_sync_rename)
    ops = recorder.result.ops
    assert [op.kind for op in ops] == ["create", "write", "fsync", "write", "rename"]
    end = len(ops)
    assert _tree(recorder, before, CrashState(end, "process"), tmp_path / "p") == {
        "a": b"x" * 10000 + b"y" * 100
    }
    assert _tree(recorder, before, CrashState(end, "data-lost"), tmp_path / "l") == {
        "a": b"x" * 10000
    }
    assert _tree(recorder, before, CrashState(end, "data-zeroed"), tmp_path / "z") == {
        "a": b"x" * 10000 + bytes(100)
    }
    # neither the create nor the rename reached the disk: the directory was never synced
    assert _tree(recorder, before, CrashState(end, "durable"), tmp_path / "d") == {}
    torn = _tree(recorder, before, CrashState(2, "torn", 4096), tmp_path / "t")
    assert torn == {"a.tmp": b"x" * 4096}


def test_a_directory_fsync_makes_its_entries_durable_and_equal_trees_count_once(
    tmp_path: Path,
) -> None:
    recorder, before = _record(tmp_path / "root", and_sync_the_directory)
    end = len(recorder.result.ops)
    assert _tree(recorder, before, CrashState(end, "durable"), tmp_path / "d") == {
        "a": b"x" * 10000
    }
    states = enumerate_states(recorder.result, every_tear=True)
    distinct = distinct_states(recorder.result, before, every_tear=True)
    assert len(states) > len(distinct) > end
    assert tear_points(recorder.result.ops[1], every=True) == [4096, 8192]


def test_a_commit_record_in_a_new_directory_survives_a_power_loss(tmp_path: Path) -> None:
    """Found by the explorer: ``create_document`` made ``_ckptstore/epoch-N/`` and
    fsynced it, but not ``_ckptstore/`` which holds its entry, so after a power loss
    the directory, and every record in it, could be gone although the commit returned."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "_ckptstore").mkdir()
    before = tmp_path / "before"
    shutil.copytree(root, before)
    recorder = FsRecorder(root)
    storage = LocalPath(str(root))
    with recorder.recording():
        storage.create_document("_ckptstore/epoch-7/node.commit.json", b"{}")
    end = len(recorder.result.ops)
    tree = _tree(recorder, before, CrashState(end, "durable"), tmp_path / "d")
    assert tree == {"_ckptstore/epoch-7/node.commit.json": b"{}"}
