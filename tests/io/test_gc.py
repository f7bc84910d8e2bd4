"""paused_gc: the cyclic collector is paused on the main thread only, and restored."""

from __future__ import annotations

import gc
import threading

from ckptstore.io import paused_gc


def test_the_main_thread_pauses_and_restores_the_collector() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested: the inner block does not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_by_the_caller_stays_disabled() -> None:
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_background_thread_leaves_the_collector_alone() -> None:
    seen: list[bool] = []

    def background() -> None:
        with paused_gc():
            seen.append(gc.isenabled())

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == [True]
    assert gc.isenabled()
