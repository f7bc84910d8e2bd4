"""``run_together``: every call runs, none is left running when it returns or raises,
and the first failure in the calls' order is the one raised."""

from __future__ import annotations

import threading

import pytest

from ckptstore.io import run_together


def test_a_failure_is_raised_only_once_every_call_has_ended() -> None:
    release = threading.Event()
    ended: list[str] = []

    def first() -> None:
        release.set()
        raise ValueError("first")

    def slow() -> None:
        release.wait()
        ended.append("slow")

    def later() -> None:
        raise KeyError("later")

    with pytest.raises(ValueError, match="first"):
        run_together("ckptstore-test", 2, [first, slow, later])
    assert ended == ["slow"]  # the pool's call had ended before the raise


def test_the_first_call_runs_on_the_callers_thread_the_others_on_the_pool() -> None:
    where: list[str] = []

    def note() -> None:
        where.append(threading.current_thread().name)

    run_together("ckptstore-test-where", 2, [note, note, note])
    assert threading.current_thread().name in where
    assert sorted(name.startswith("ckptstore-test-where") for name in where) == [False, True, True]
