"""Byte progress: how operators' tools (``ckptstore cp``, ``verify``, ``convert``, ``gc``)
learn, while one node's checkpoint is being moved, how many of its bytes are done.

A :data:`ByteProgress` is called with the number of bytes just moved, once per request
(a chunk, a range of an archive), never per byte, from whichever I/O thread moved
them: the engine reports through it (``ParallelIO(progress=...)``). A
:class:`NodeProgress` holds one node's count to the node's size, so the counts of a node
add up to exactly that size however its bytes were read.

Example::

    >>> heard = []
    >>> node = NodeProgress(heard.append, total=100)
    >>> node(40)
    >>> node(70)  # more than is left: only the rest is reported
    >>> node.finish()  # nothing left
    >>> heard
    [40, 60]
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ByteProgress", "NodeProgress"]

ByteProgress = Callable[[int], None]
"""Called with how many more bytes were moved (called from I/O threads)."""


class NodeProgress:
    """Forwards one node's byte counts to ``report``, at most ``total`` in all;
    :meth:`finish` reports what is left (bytes not moved through the engine, such as the
    manifest, or a node skipped or found broken). Safe to call from several threads;
    ``report=None`` only counts.

    Example::

        >>> heard = []
        >>> node = NodeProgress(heard.append, total=10)
        >>> node(4)
        >>> node.finish()
        >>> heard, node.reported
        ([4, 6], 10)
    """

    def __init__(self, report: ByteProgress | None, total: int) -> None:
        self.report = report
        self.total = max(total, 0)
        self.reported = 0
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            nbytes = min(nbytes, self.total - self.reported)
            if nbytes <= 0:
                return
            self.reported += nbytes
            if self.report is not None:
                self.report(nbytes)

    def finish(self) -> None:
        """Report the bytes not reported yet: the node is done."""
        self(self.total - self.reported)
