"""Background threads at a lower priority: the nice value is per thread on Linux and
inherited by the threads a thread starts; the calling thread's own priority is untouched."""

from __future__ import annotations

import sys
import threading

import pytest

from ckptstore.io._priority import MAX_NICE, lower_thread_priority, thread_nice

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux feature"
)


def in_thread(work: object) -> list[int]:
    found: list[int] = []

    def run() -> None:
        found.extend(work())  # type: ignore[operator]

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return found


def test_a_thread_lowers_only_its_own_priority_and_its_children_inherit_it() -> None:
    main = thread_nice()

    def work() -> list[int]:
        lowered = lower_thread_priority(3)
        child = in_thread(lambda: [thread_nice()])
        return [lowered, thread_nice(), *child]

    lowered, own, child = in_thread(work)
    assert lowered == own == child == min(MAX_NICE, main + 3)
    assert thread_nice() == main  # the calling (training) thread keeps its priority


def test_the_priority_stops_at_the_lowest_and_zero_steps_change_nothing() -> None:
    assert in_thread(lambda: [lower_thread_priority(100)]) == [MAX_NICE]
    assert in_thread(lambda: [lower_thread_priority(0)]) == [thread_nice()]


def test_negative_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="steps must be >= 0"):
        lower_thread_priority(-1)
