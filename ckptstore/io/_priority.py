"""Background threads at a lower CPU priority than the training thread.

An asynchronous save's checksums and copies compete with training for the CPU; on a
machine whose cores training keeps busy (BLAS on every core), an equal-priority writer
slows every compute step. On Linux the nice value is a per-thread attribute, inherited
by the threads a thread starts, so lowering it on a save's writer thread also lowers it
for the I/O workers that thread starts. Elsewhere this does nothing.

Example::

    >>> import threading
    >>> result = []
    >>> worker = threading.Thread(target=lambda: result.append(lower_thread_priority(5)))
    >>> worker.start(); worker.join()
    >>> result[0] >= 0  # the nice value the worker thread runs at (Linux), or 0
    True
"""

from __future__ import annotations

import logging
import os
import sys
import threading

__all__ = ["MAX_NICE", "lower_thread_priority", "thread_nice"]

log = logging.getLogger(__name__)

MAX_NICE = 19
"""The lowest priority Linux gives a thread."""


def thread_nice() -> int:
    """The calling thread's nice value (0 where threads have none of their own)."""
    if not sys.platform.startswith("linux"):
        return 0
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def lower_thread_priority(steps: int) -> int:
    """Make the calling thread (and the threads it starts from now on) ``steps`` nice
    levels lower than it runs at, at most :data:`MAX_NICE`; returns its nice value.

    Only lowers (which needs no privilege), never raises: a thread that cannot be
    reniced (a sandbox refusing ``setpriority``) keeps running at its priority, and the
    refusal is logged at debug level."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if steps == 0 or not sys.platform.startswith("linux"):
        return thread_nice()
    thread = threading.get_native_id()
    try:
        nice = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, thread) + steps)
        os.setpriority(os.PRIO_PROCESS, thread, nice)
    except OSError as error:
        log.debug("could not lower the priority of thread %d: %s", thread, error)
    return thread_nice()
