"""MemoryBudget: a counting semaphore in bytes."""

from __future__ import annotations

import threading

from ckptstore.io._budget import MemoryBudget


def test_acquire_and_release_track_use_and_peak() -> None:
    budget = MemoryBudget(100)
    budget.acquire(60)
    budget.acquire(40)
    assert budget.in_use == 100
    budget.release(60)
    assert budget.in_use == 40
    assert budget.peak == 100


def acquire_in_thread(budget: MemoryBudget, nbytes: int) -> tuple[threading.Thread, list[int]]:
    """Start a thread that acquires ``nbytes``; returns it and what it saw: the bytes in
    use right after its acquire returned."""
    seen: list[int] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        budget.acquire(nbytes)
        seen.append(budget.in_use)

    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    return thread, seen


def test_an_acquire_that_does_not_fit_waits_for_a_release() -> None:
    budget = MemoryBudget(100)
    budget.acquire(60)
    thread, seen = acquire_in_thread(budget, 50)
    budget.release(60)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert seen == [50]  # it got in only after the release
    assert budget.peak == 60


def test_an_oversize_request_waits_until_nothing_else_is_held() -> None:
    budget = MemoryBudget(100)
    budget.acquire(10)
    thread, seen = acquire_in_thread(budget, 250)
    budget.release(10)
    thread.join(timeout=30)
    assert seen == [250]
    assert budget.peak == 250


def test_an_oversize_request_on_an_idle_budget_goes_at_once() -> None:
    budget = MemoryBudget(100)
    budget.acquire(1000)
    assert budget.in_use == 1000
    budget.release(1000)
    budget.acquire(100)
    assert budget.in_use == 100
