"""A counting semaphore in bytes: caps the memory held by in-flight chunks."""

from __future__ import annotations

import threading

__all__ = ["MemoryBudget"]


class MemoryBudget:
    """At most ``capacity`` bytes may be held at once; :meth:`acquire` blocks until free.

    A single request larger than the whole budget is let through alone (it waits until
    nothing else is in flight), so an oversized chunk can never deadlock a save.

    Example::

        >>> budget = MemoryBudget(256 << 20)
        >>> budget.acquire(16 << 20)
        >>> budget.in_use
        16777216
        >>> budget.release(16 << 20)
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._in_use = 0
        self.peak = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int) -> None:
        with self._cond:
            while self._in_use and self._in_use + nbytes > self.capacity:
                self._cond.wait()
            self._in_use += nbytes
            self.peak = max(self.peak, self._in_use)

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._in_use -= nbytes
            self._cond.notify_all()

    @property
    def in_use(self) -> int:
        return self._in_use
