"""Cutting a sequence of byte views (the parts of one object or range, in order) into
consecutive pieces without copying a byte: the windows a checked local read goes in
(:mod:`ckptstore.io._engine`) and the parts of a multipart upload
(:mod:`ckptstore.object_store`).

Example::

    >>> parts = [memoryview(b"ab"), memoryview(b"cdefg"), memoryview(b"h")]
    >>> [b"|".join(bytes(v) for v in window) for window in windows(parts, 3)]
    [b'ab|c', b'def', b'g|h']
    >>> [bytes(v) for v in slice_views(parts, 1, 3)]
    [b'b', b'cd']
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["slice_views", "windows"]


def windows(views: Sequence[memoryview], size: int) -> Iterator[list[memoryview]]:
    """``views`` (of bytes) regrouped, in order, into windows of ``size`` bytes (the
    last one shorter): small views share a window, a large one is cut. One pass, however
    many views and windows."""
    window: list[memoryview] = []
    room = size
    for view in views:
        while view.nbytes:
            part = view[:room]
            window.append(part)
            room -= part.nbytes
            view = view[part.nbytes :]
            if not room:
                yield window
                window, room = [], size
    if window:
        yield window


def slice_views(views: Sequence[memoryview], start: int, size: int) -> list[memoryview]:
    """Views of ``size`` bytes from ``start`` of the concatenation of ``views`` (one
    slice anywhere; :func:`windows` cuts the whole in one pass)."""
    pieces: list[memoryview] = []
    position = 0
    end = start + size
    for view in views:
        low, high = position, position + view.nbytes
        position = high
        if high <= start or low >= end:
            continue
        pieces.append(view[max(start, low) - low : min(end, high) - low])
    return pieces
