"""StagingPool: snapshots that are private copies, buffers reused from save to save,
and back-pressure when every slot is in use."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ckptstore.io import StagingPool
from ckptstore.io import _staging as staging


def test_a_staged_copy_is_private_and_buffers_are_reused() -> None:
    pool = StagingPool(1)
    live = {"w": np.arange(8.0), "s": np.array(["ab", "cd"]), "x": np.ones((2, 3))[:, ::2]}
    slot = pool.acquire()
    first = slot.stage(live)
    live["w"] += 1
    assert np.array_equal(first["w"], np.arange(8.0))
    assert np.array_equal(first["x"], np.ones((2, 2)))  # a strided view staged contiguous
    assert first["x"].flags.c_contiguous
    assert first["s"].dtype == live["s"].dtype
    second = slot.stage(live)
    assert second["w"] is first["w"]  # same shape and dtype: the buffer is reused
    assert np.array_equal(second["w"], np.arange(8.0) + 1)
    assert slot.nbytes == sum(array.nbytes for array in second.values())


def test_a_changed_shape_or_dtype_gets_a_new_buffer_and_gone_names_are_dropped() -> None:
    slot = StagingPool(1).acquire()
    first = slot.stage({"w": np.zeros(4), "gone": np.zeros(1000)})
    second = slot.stage({"w": np.zeros(4, dtype=np.float32)})
    assert second["w"] is not first["w"]
    assert second["w"].dtype == np.float32
    assert slot.nbytes == 16  # the dropped blob's buffer is not held any more


def test_acquire_waits_for_a_free_slot() -> None:
    pool = StagingPool(2)
    first, second = pool.acquire(), pool.acquire()
    with pytest.raises(TimeoutError):
        pool.acquire(timeout=0.01)
    pool.release(first)
    assert pool.acquire(timeout=0) is first
    pool.release(second)


def test_a_pool_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        StagingPool(0)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_snapshot_copied_in_pieces_by_several_threads_is_exact(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging, "COPY_PIECE", 1000)  # so small blobs are cut into pieces
    rng = np.random.default_rng(7)
    live = {
        "big": rng.random((37, 101)),  # 29896 bytes: 30 pieces
        "odd": rng.integers(0, 255, 5001, dtype=np.uint8),  # a last piece shorter than others
        "strided": rng.random((40, 60))[:, ::3],  # not contiguous: copied whole
        "small": np.arange(3, dtype=np.int16),
        "scalar": np.array(2.5),
    }
    slot = StagingPool(1, copy_threads=threads).acquire()
    assert slot.copy_threads == threads
    staged = slot.stage(live)
    for name, array in live.items():
        assert staged[name].shape == array.shape
        assert np.array_equal(staged[name], array), name
    live["big"] *= 2
    again = slot.stage(live)
    assert again["big"] is staged["big"]  # reused, and refilled in place
    assert np.array_equal(again["big"], live["big"])


def test_the_default_copy_threads_follow_the_cpus_this_process_may_use() -> None:
    assert staging.default_copy_threads() == min(4, len(os.sched_getaffinity(0)))
    assert StagingPool(1).acquire().copy_threads == staging.default_copy_threads()
