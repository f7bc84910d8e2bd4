"""Thread pools kept by the process between calls: starting threads cost a small save
10-50 ms on the loaded 2-core VM (a new thread first ran 30-50 ms after it was
started). A forked child makes its own pools: the parent's threads are not in it.

* :func:`kept_pool`: one pool per name and size, shared by every caller (for work that
  never waits on other work of the same pool).
* :func:`borrowed_pool`: a pool of a call's own while it runs, taken from the idle ones
  and given back (for a call whose work may start another call: it never waits on a
  busy pool).
* :func:`run_together`: calls run at once on a kept pool, the first on the caller's
  thread; returns once all ended, raising the first failure.

Example::

    >>> kept_pool("ckptstore-example", 2) is kept_pool("ckptstore-example", 2)
    True
    >>> with borrowed_pool("ckptstore-example", 2, []) as pool:
    ...     pool.submit(sum, [1, 2]).result()
    3
    >>> done = []
    >>> run_together("ckptstore-example", 2, [lambda: done.append(1), lambda: done.append(2)])
    >>> sorted(done)
    [1, 2]
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["borrowed_pool", "kept_pool", "run_together"]

_KEPT: dict[tuple[int, str, int], ThreadPoolExecutor] = {}
_IDLE: dict[tuple[int, str, int], list[ThreadPoolExecutor]] = {}
_LOCK = threading.Lock()
_T = TypeVar("_T")

IDLE_KEPT = 4
"""Idle borrowed pools kept per name and size; one given back beyond that is shut down."""


def kept_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool ``name`` of ``threads`` threads, made at first use."""
    place = (os.getpid(), name, threads)
    with _LOCK:
        pool = _KEPT.get(place)
        if pool is None:
            pool = _KEPT[place] = ThreadPoolExecutor(threads, thread_name_prefix=name)
        return pool


def run_together(name: str, threads: int, calls: Sequence[Callable[[], object]]) -> None:
    """Run ``calls`` at once: the first on this thread, the others on the kept pool
    ``name`` of ``threads`` threads. Returns once every one has ended (none is left
    running), raising the first failure in their order."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    pool = kept_pool(name, threads)
    others = [pool.submit(call) for call in calls[1:]]
    try:
        calls[0]()
    finally:
        wait(others)
    for future in others:
        future.result()


@contextmanager
def borrowed_pool(
    name: str, threads: int, futures: Sequence[Future[_T]]
) -> Iterator[ThreadPoolExecutor]:
    """A pool of ``threads`` threads for one call, taken from this process's idle ones
    (or made), given back once every one of ``futures`` (the call's work, which may
    grow while the call runs) is done."""
    place = (os.getpid(), name, threads)
    with _LOCK:
        idle = _IDLE.get(place)
        pool = idle.pop() if idle else None
    if pool is None:
        pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    try:
        yield pool
    finally:
        wait(futures)  # as leaving a pool's `with` did: nothing of the call runs on
        with _LOCK:
            kept = _IDLE.setdefault(place, [])
            if len(kept) < IDLE_KEPT:
                kept.append(pool)
                pool = None
        if pool is not None:
            pool.shutdown(wait=False)
