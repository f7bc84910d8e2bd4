"""Pausing Python's cyclic garbage collector around bulk work on thousands of blobs.

Each automatic collection walks every container the process holds; loading or saving
10,000 small blobs makes hundreds of thousands of short-lived, acyclic objects
(records, parsed JSON, views), so without a pause the collector runs hundreds of times
and costs more than the work itself. Reference counting still frees everything at once;
only cycles made during the pause wait for the next collection.

Example::

    >>> import gc
    >>> with paused_gc():  # on the main thread: collection waits for the block
    ...     print(gc.isenabled())
    False
    >>> gc.isenabled()
    True
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector for the ``with`` block, then restore it (if the
    caller had disabled it, it stays disabled; nested uses are safe: the outermost one
    that found it enabled turns it back on).

    Only on the main thread, while it waits for the work: the collector is global to
    the process, so a background save (``async_save``, a Dask worker's thread) leaves it
    alone rather than pause collection for the training code running meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
