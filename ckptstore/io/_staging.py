"""Staging buffers for asynchronous saves: a node's blobs are copied into reusable
buffers, so training can change the live arrays while the copy is written.

A pool holds ``slots`` staging areas (one per save that may be in flight). A slot keeps
its buffers between saves and reuses them whenever a blob's shape and dtype are
unchanged, so after the first save a snapshot is one ``np.copyto`` per blob, with no
allocation. Memory held: one copy of the staged state per slot.

Example::

    >>> weights = np.ones(4, np.float32)
    >>> pool = StagingPool(slots=1)
    >>> slot = pool.acquire()
    >>> staged = slot.stage({"w": weights})  # a private copy of weights
    >>> weights[0] = 7  # training goes on; the staged copy is what gets written
    >>> staged["w"].tolist()
    [1.0, 1.0, 1.0, 1.0]
    >>> pool.release(slot)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from ckptstore._types import Array

__all__ = ["StagingPool", "StagingSlot"]


class StagingSlot:
    """One staging area: a buffer per blob name, reused from save to save."""

    def __init__(self) -> None:
        self._buffers: dict[str, Array] = {}

    def stage(self, arrays: Mapping[str, Array]) -> dict[str, Array]:
        """Copy ``arrays`` into this slot's buffers; returns the copies, by name.

        Buffers of names not in ``arrays`` are dropped, so a slot never holds more than
        one copy of what it staged last.
        """
        buffers = self._buffers
        staged: dict[str, Array] = {}
        for name, array in arrays.items():
            buffer = buffers.get(name)
            if buffer is None or buffer.shape != array.shape or buffer.dtype != array.dtype:
                buffer = buffers[name] = np.empty(array.shape, array.dtype)
            np.copyto(buffer, array, casting="no")
            staged[name] = buffer
        if len(buffers) != len(staged):
            for stale in buffers.keys() - staged.keys():
                del buffers[stale]
        return staged

    @property
    def nbytes(self) -> int:
        """Bytes held by this slot's buffers."""
        return sum(buffer.nbytes for buffer in self._buffers.values())


class StagingPool:
    """``slots`` staging areas; :meth:`acquire` blocks while every slot is in use
    (the back-pressure that bounds saves in flight, and so staging memory).

    Example::

        >>> pool = StagingPool(2)
        >>> slot = pool.acquire()
        >>> pool.release(slot)
    """

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"a staging pool needs at least one slot, got {slots}")
        self.slots = slots
        self._free = [StagingSlot() for _ in range(slots)]
        self._cond = threading.Condition()

    def acquire(self, timeout: float | None = None) -> StagingSlot:
        """A free slot, waiting up to ``timeout`` seconds (None: forever) for one;
        raises :class:`TimeoutError` if none frees up in time."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._free), timeout):
                raise TimeoutError(f"no staging slot became free within {timeout} s")
            return self._free.pop()

    def release(self, slot: StagingSlot) -> None:
        """Give ``slot`` back (its buffers are kept for the next save)."""
        with self._cond:
            self._free.append(slot)
            self._cond.notify()

    @property
    def nbytes(self) -> int:
        """Bytes held by the free slots' buffers."""
        with self._cond:
            return sum(slot.nbytes for slot in self._free)
