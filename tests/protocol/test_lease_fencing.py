"""Fencing: a writer that lost its lease cannot commit, and a commit record it still
managed to create (its create landed after its last check) is not committed once the
new holder recorded where it resumed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.errors import LeaseLostError
from ckptstore.io import ParallelIO
from ckptstore.protocol import (
    CommitListing,
    WriterLease,
    check_not_committed,
    commit_epoch,
    read_commit,
    read_lease_document,
    write_node,
)

NODE = "trainer_0"


def save(storage: LocalPath, epoch: int, lease: WriterLease | None) -> None:
    commit = write_node(storage, NODE, epoch, {"w": np.full(2, epoch)}, NpzDB(), ParallelIO())
    commit_epoch(storage, epoch, [commit], fence=lease.fence() if lease is not None else None)


def took_over(storage: LocalPath) -> tuple[WriterLease, WriterLease]:
    """An old holder (generation 1) whose lease a new job took over (generation 2) once
    it expired: the new job's clock is a day later."""
    old = WriterLease(storage, [NODE], ttl=60, heartbeat=False)
    old.acquire()
    new = WriterLease(storage, [NODE], ttl=60, heartbeat=False, clock=lambda: 4e9)
    new.acquire()
    return old, new


def test_every_commit_record_carries_the_lease_generation(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    with WriterLease(storage, [NODE], heartbeat=False) as lease:
        save(storage, 1, lease)
    save(storage, 2, None)  # without a lease: no generation
    first, second = read_commit(storage, 1, [NODE]), read_commit(storage, 2, [NODE])
    assert first is not None
    assert second is not None
    assert first.nodes[NODE].lease_generation == 1
    assert second.nodes[NODE].lease_generation is None


def test_a_writer_that_lost_its_lease_cannot_commit(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    old, new = took_over(storage)
    fence = old.fence()  # handed to its commit before it lost the lease
    commit = write_node(storage, NODE, 4, {"w": np.zeros(2)}, NpzDB(), ParallelIO())
    with pytest.raises(LeaseLostError, match="another job took it over"):
        commit_epoch(storage, 4, [commit], fence=fence)
    assert read_commit(storage, 4, [NODE]) is None  # checked right before the create
    new.release()


def test_a_record_created_after_the_takeover_is_fenced_out(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    old = WriterLease(storage, [NODE], ttl=60, heartbeat=False)
    old.acquire()
    for epoch in (1, 2, 3):
        save(storage, epoch, old)
    fence = old.fence()
    new = WriterLease(storage, [NODE], ttl=60, heartbeat=False, clock=lambda: 4e9)
    new.acquire()
    new.record_resume(3)  # the new holder resumes from epoch 3, before it saves
    stored = read_lease_document(storage, NODE)
    assert stored is not None
    assert stored.fences == ((2, 3),)
    # the old holder passed its check just before the takeover; its create lands after
    commit = write_node(storage, NODE, 4, {"w": np.zeros(2)}, NpzDB(), ParallelIO())
    commit_epoch(storage, 4, [replace(commit, lease_generation=fence.generations[NODE])])
    assert fence.generations == {NODE: 1}
    # readers that resume (a listing) do not count it: epoch 3 is the newest committed
    assert CommitListing.of(storage).newest_complete([NODE]) == 3
    # the new holder saves epoch 4 over it
    check_not_committed(storage, 4, [NODE], fence=new.fence())
    save(storage, 4, new)
    record = read_commit(storage, 4, [NODE])
    assert record is not None
    assert record.nodes[NODE].lease_generation == 2
    assert CommitListing.of(storage).newest_complete([NODE]) == 4
    new.release()
