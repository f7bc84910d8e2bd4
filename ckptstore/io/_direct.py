"""Direct I/O planning: which bytes of a positional write may bypass the page cache.

A durable save of large arrays through the page cache copies every byte into freshly
allocated cache pages, then has the kernel write them back and wait for them in
``fsync``: on a virtual machine most of a save's time (and the CPU it takes from a
training loop saving in the background) goes there. ``O_DIRECT`` writes go from the
array's own memory to the device, but only in whole blocks whose memory address and
file offset are both aligned. :func:`plan_direct` cuts a positional write into the
aligned interior of each large buffer (written with ``O_DIRECT``) and everything else
(headers, small members, the unaligned head and tail of a buffer: written through the
page cache). A page is written by one path only, so the two never share a page.

Memory and file offset only need the same remainder modulo :data:`DIRECT_ALIGN`: the
packed archive layout places large members so that a member's data starts at a file
offset with its array's remainder (:func:`memory_residue`).

Example::

    >>> import numpy as np
    >>> data = np.zeros(4 * DIRECT_ALIGN, np.uint8)[1 : 3 * DIRECT_ALIGN + 1]  # unaligned
    >>> at = 2 * DIRECT_ALIGN + memory_residue(data)  # data's remainder: congruent
    >>> plan = plan_direct(at, [memoryview(data)], direct_from=DIRECT_ALIGN)
    >>> head, body, tail = [(sum(v.nbytes for v in views), direct) for _, views, direct in plan]
    >>> head[0] + body[0] + tail[0] == data.nbytes, body == (2 * DIRECT_ALIGN, True)
    (True, True)
    >>> plan_direct(at + 1, [memoryview(data)], direct_from=DIRECT_ALIGN)[0][2]  # not congruent
    False
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckptstore._types import Buffer, byte_view

__all__ = [
    "DIRECT_ALIGN",
    "DIRECT_FROM",
    "DirectSegment",
    "aligned_buffer",
    "memory_residue",
    "plan_direct",
]

DIRECT_ALIGN = 4096
"""Alignment of memory, file offset and length for ``O_DIRECT`` (a page: a multiple of
every logical block size Linux file systems use)."""

DIRECT_FROM = 1 << 20
"""Buffers smaller than this are written through the page cache (a direct write waits
for the device: worth it only for large transfers)."""

DirectSegment = tuple[int, list[memoryview], bool]
"""A file offset, the views written there in order, and whether they go ``O_DIRECT``."""


def memory_residue(data: Buffer) -> int:
    """The address of ``data``'s first byte modulo :data:`DIRECT_ALIGN` (any object
    exposing a contiguous buffer)."""
    if isinstance(data, np.ndarray):  # any dtype, even one without a buffer format
        return int(data.ctypes.data % DIRECT_ALIGN)
    view = byte_view(data)
    if view.nbytes == 0:
        return 0
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data % DIRECT_ALIGN)


def aligned_buffer(offset: int, nbytes: int) -> memoryview:
    """A new writable buffer of ``nbytes`` whose address has ``offset``'s remainder
    modulo :data:`DIRECT_ALIGN`, so that it can be written ``O_DIRECT`` at ``offset``
    (a plain ``bytearray`` below :data:`DIRECT_FROM`, where nothing goes direct)."""
    if nbytes < DIRECT_FROM:
        return memoryview(bytearray(nbytes))
    spare = np.empty(nbytes + DIRECT_ALIGN, np.uint8)
    shift = (offset - spare.ctypes.data) % DIRECT_ALIGN
    return spare[shift : shift + nbytes].data


def plan_direct(
    offset: int, views: Sequence[memoryview], *, direct_from: int = DIRECT_FROM
) -> list[DirectSegment]:
    """Cut ``views`` written one after the other from ``offset`` into segments: the
    whole aligned blocks of each view of at least ``direct_from`` bytes whose memory
    and file position share their remainder modulo :data:`DIRECT_ALIGN` are direct;
    the rest is grouped into buffered segments of consecutive bytes."""
    segments: list[DirectSegment] = []
    pending: list[memoryview] = []
    pending_at = offset
    position = offset
    for view in views:
        size = view.nbytes
        if size >= direct_from:
            head = -position % DIRECT_ALIGN
            body = max(0, size - head) // DIRECT_ALIGN * DIRECT_ALIGN
            if body and (memory_residue(view) + head) % DIRECT_ALIGN == 0:
                if head:
                    pending.append(view[:head])
                if pending:
                    segments.append((pending_at, pending, False))
                segments.append((position + head, [view[head : head + body]], True))
                pending, pending_at = [], position + head + body
                if head + body < size:
                    pending.append(view[head + body :])
                position += size
                continue
        if size:
            pending.append(view)
        position += size
    if pending:
        segments.append((pending_at, pending, False))
    return segments
