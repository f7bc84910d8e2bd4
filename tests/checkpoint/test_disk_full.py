"""A full disk at every step of the save protocol, on a real (small) tmpfs mount.

Each test leaves room on the mount for exactly the files written before one step (the
data, the manifest, the commit record, the catalog: sizes measured by a first save of
the same job), or for half the data, and checks that the save fails with
:class:`StorageFullError` naming ENOSPC and the file, that nothing temporary is left
behind, that the last committed epoch still loads and that the next run resumes from it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from ckptstore import (
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
    protocol,
)
from ckptstore.errors import StorageFullError, TooManySaveFailuresError
from ckptstore.paths._local_path import LocalPath

NODE = "trainer_0"
BLOB_BYTES = 100_000  # random uint8: no format compresses it, so every epoch is one size
STEPS = ("data", "manifest", "commit", "catalog")


def pages(size: int) -> int:
    """The 4 KiB pages tmpfs charges for a file of ``size`` bytes."""
    return -(-size // 4096)


def step_of(key: str) -> str:
    """Which protocol step wrote ``key`` (relative to the checkpoint root)."""
    name = key.rsplit("/", 1)[-1]
    if name.startswith("catalog.") or key.startswith("_ckptstore/catalog/"):
        return "catalog"
    if key.startswith("_ckptstore/lease/"):
        return "lease"
    if key.startswith("_ckptstore/") and "commit" in name:
        return "commit"
    if name == "ckptstore.manifest.json":
        return "manifest"
    return "data"


def files(root: Path) -> dict[str, int]:
    """Every file under ``root`` (relative key -> size)."""
    found: dict[str, int] = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            found[path.relative_to(root).as_posix()] = path.stat().st_size
    return found


def build_job(epochs: int, before_epoch_save: list[object]) -> Job:
    """One node with an incompressible blob that changes every epoch; the callables in
    ``before_epoch_save`` run (once each, in order) in epochs 1, 2... before the save."""

    def train(ws: object) -> None:
        if before_epoch_save:
            action = before_epoch_save.pop(0)
            assert callable(action)
            action()
        rng = np.random.default_rng()
        ws.update(w=rng.integers(0, 256, BLOB_BYTES, dtype=np.uint8))  # type: ignore[attr-defined]

    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ws.update(w=np.zeros(BLOB_BYTES, dtype=np.uint8)))
        Task(train)
        epoch_limiter(job, epochs)
    return job


def room_before(step: str, db_type: str, catalog: str, dry_root: Path) -> int:
    """Bytes (whole pages) the save of epoch 1 writes before ``step``: measured by a
    dry run of the same job on ordinary disk."""
    manager = MultiNodeCheckpointManager(str(dry_root), db_type, catalog)
    JobRunner(build_job(1, []), manager).train(LocalSession())
    written = {
        key: size
        for key, size in files(dry_root).items()
        if key.startswith((f"{NODE}.1/", "_ckptstore/"))
    }
    if step == "data":  # room for half the node's data: the disk fills in its middle
        data = [
            size
            for key, size in written.items()
            if key.startswith(f"{NODE}.1/") and step_of(key) == "data"
        ]
        return sum(pages(size) for size in data) // 2 * 4096
    before = STEPS[: STEPS.index(step)]
    epoch_1 = {
        key: size
        for key, size in written.items()
        if step_of(key) not in ("commit", "catalog")
        or "epoch-1" in key
        or key.endswith(".sqlite")  # one database file for every epoch
    }
    chosen = [size for key, size in epoch_1.items() if step_of(key) in before]
    assert chosen, f"the dry run wrote nothing before {step}: {sorted(written)}"
    return sum(pages(size) for size in chosen) * 4096


def fill_leaving(mount: Path, room: int) -> None:
    """Allocate a filler file so that exactly ``room`` bytes stay free on ``mount``."""
    stats = os.statvfs(mount)
    free = stats.f_bavail * stats.f_frsize
    assert free > room, f"the test disk is too small: {free} free, {room} needed"
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, free - room)
    finally:
        os.close(fd)
    after = os.statvfs(mount)
    assert after.f_bavail * after.f_frsize == room


@pytest.mark.parametrize("catalog", ["json", "sqlite"])
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("db_type", ["zarr", "npz", "lmdb"])
@pytest.mark.parametrize("step", STEPS)
def test_a_full_disk_at_each_step_fails_typed_leaves_nothing_and_resumes(
    small_disk: Path, tmp_path: Path, step: str, db_type: str, async_save: bool, catalog: str
) -> None:
    room = room_before(step, db_type, catalog, tmp_path / "dry")
    root = small_disk / "ckpt"

    def fill() -> None:
        runner.collect_saves(0)  # epoch 0's background save is done writing
        fill_leaving(small_disk, room)

    job = build_job(5, [fill])
    manager = MultiNodeCheckpointManager(str(root), db_type, catalog)
    runner = JobRunner(job, manager, retry_backoff=0, async_save=async_save)

    with pytest.raises(TooManySaveFailuresError) as info:
        runner.train(LocalSession())

    assert runner.committed_epochs == [0]
    assert [failure.epoch for failure in runner.save_failures] == [1, 2, 3]
    first = runner.save_failures[0].error
    assert isinstance(first, StorageFullError), repr(first)
    assert isinstance(info.value.last_error, StorageFullError)
    assert first.errno == errno.ENOSPC
    assert "ENOSPC" in str(first)
    assert "free space" in str(first)
    assert first.key is not None
    assert step_of(first.key) == step, first.key
    # nothing temporary, no staging copy, no data of a failed epoch
    leftovers = {
        key for key in files(root) if ".tmp" in key or ".staging-" in key or ".retired-" in key
    }
    assert leftovers == set()
    # the exact directory: epoch 1's node data stays only once it was complete (it is
    # invisible without a commit record and replaced by the next save of epoch 1)
    node_dirs = {"trainer_0.0"} if step in ("data", "manifest") else {"trainer_0.0", "trainer_0.1"}
    assert set(os.listdir(root)) == {"_ckptstore", *node_dirs}
    records = {f"_ckptstore/epoch-0/{NODE}.commit.json"}
    if step == "catalog":  # committed; only its catalog entry was lost
        records.add(f"_ckptstore/epoch-1/{NODE}.commit.json")
    assert {key for key in files(root) if step_of(key) == "commit"} == records
    storage = LocalPath(str(root))
    assert protocol.read_commit(storage, 2) is None
    assert protocol.read_commit(storage, 3) is None
    assert protocol.open_node(storage, NODE, 0).blobs

    (small_disk / "filler").unlink()
    again = JobRunner(build_job(5, []), MultiNodeCheckpointManager(str(root), db_type, catalog))
    assert again.train(LocalSession()) >= 1
    start = again.committed_epochs[0] - 1
    assert protocol.read_commit(storage, start) is not None  # resumed from a committed epoch
    assert start in (0, 1)
    assert start == 0 or step == "catalog"  # only a lost catalog write leaves epoch 1 committed
