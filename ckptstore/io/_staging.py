"""Staging buffers for asynchronous saves: a node's blobs are copied into reusable
buffers, so training can change the live arrays while the copy is written.

A pool holds ``slots`` staging areas (one per save that may be in flight). A slot keeps
its buffers between saves and reuses them whenever a blob's shape and dtype are
unchanged, so after the first save a snapshot is ``np.copyto`` into those buffers, with
no allocation. Memory held: one copy of the staged state per slot.

The copy is what blocks training, so a large snapshot is split into pieces of about
``COPY_PIECE`` bytes copied by ``copy_threads`` threads at once (``np.copyto`` releases
the GIL): with an idle core the snapshot takes less time than one thread's
``np.copyto``. On a busy machine it costs the same as one thread.

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
from collections.abc import Mapping, Sequence

import numpy as np

from ckptstore._types import Array
from ckptstore.io._pools import kept_pool
from ckptstore.io._settings import usable_cpus

__all__ = ["COPY_PIECE", "StagingPool", "StagingSlot", "copy_all", "default_copy_threads"]

COPY_PIECE = 16 << 20
"""Bytes per piece of a parallel snapshot (a snapshot smaller than two pieces is
copied by the calling thread alone)."""

_Pair = tuple[Array, Array]


def default_copy_threads() -> int:
    """Threads copying one snapshot: the CPUs this process may run on, at most 4."""
    return max(1, min(4, usable_cpus()))


def _pieces(pairs: Sequence[_Pair]) -> list[_Pair]:
    """``pairs`` (buffer, source) with each large contiguous pair cut into pieces of
    about :data:`COPY_PIECE` bytes (non-contiguous sources are copied whole)."""
    pieces: list[_Pair] = []
    for buffer, array in pairs:
        if array.nbytes < 2 * COPY_PIECE or not array.flags.c_contiguous:
            pieces.append((buffer, array))
            continue
        flat_buffer, flat_array = buffer.reshape(-1), array.reshape(-1)
        step = max(1, COPY_PIECE // array.itemsize)
        for start in range(0, flat_array.size, step):
            pieces.append((flat_buffer[start : start + step], flat_array[start : start + step]))
    return pieces


def _copy(pieces: Sequence[_Pair]) -> None:
    for buffer, array in pieces:
        np.copyto(buffer, array, casting="no")


def copy_all(pairs: Sequence[_Pair], threads: int) -> None:
    """``np.copyto(buffer, source)`` for every pair, on up to ``threads`` threads (the
    caller's one of them); returns when every copy is done, raising the first error."""
    total = sum(array.nbytes for _, array in pairs)
    if threads <= 1 or total < 2 * COPY_PIECE:
        _copy(pairs)
        return
    pieces = _pieces(pairs)
    share = -(-total // threads)
    groups: list[list[_Pair]] = [[]]
    filled = 0
    for piece in pieces:  # consecutive pieces, about the same bytes per thread
        if filled >= share and len(groups) < threads:
            groups.append([])
            filled = 0
        groups[-1].append(piece)
        filled += piece[1].nbytes
    pool = kept_pool("ckptstore-stage-copy", 4)
    others = [pool.submit(_copy, group) for group in groups[1:]]
    try:
        _copy(groups[0])
    finally:
        for future in others:
            future.exception()  # wait for every thread before anyone touches the buffers
    for future in others:
        future.result()


class StagingSlot:
    """One staging area: a buffer per blob name, reused from save to save; a snapshot
    is copied by up to ``copy_threads`` threads (default :func:`default_copy_threads`)."""

    def __init__(self, copy_threads: int | None = None) -> None:
        self._buffers: dict[str, Array] = {}
        self.copy_threads = default_copy_threads() if copy_threads is None else copy_threads

    def stage(self, arrays: Mapping[str, Array]) -> dict[str, Array]:
        """Copy ``arrays`` into this slot's buffers; returns the copies, by name.

        Buffers of names not in ``arrays`` are dropped, so a slot never holds more than
        one copy of what it staged last.
        """
        buffers = self._buffers
        staged: dict[str, Array] = {}
        pairs: list[_Pair] = []
        for name, array in arrays.items():
            buffer = buffers.get(name)
            if buffer is None or buffer.shape != array.shape or buffer.dtype != array.dtype:
                buffer = buffers[name] = np.empty(array.shape, array.dtype)
            pairs.append((buffer, array))
            staged[name] = buffer
        copy_all(pairs, self.copy_threads)
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
    (the back-pressure that bounds saves in flight, and so staging memory). Each
    snapshot is copied by up to ``copy_threads`` threads.

    Example::

        >>> pool = StagingPool(2)
        >>> slot = pool.acquire()
        >>> pool.release(slot)
    """

    def __init__(self, slots: int = 1, copy_threads: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a staging pool needs at least one slot, got {slots}")
        self.slots = slots
        self._free = [StagingSlot(copy_threads) for _ in range(slots)]
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
