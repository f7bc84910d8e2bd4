"""Ranged downloads: the ``Range`` header of a read, the object size a response
declares, and a response body streamed straight into the caller's buffers or read with
a cap on its length (a stored object is untrusted: see docs/security.md).

Example::

    >>> range_header(1024, 4096)
    {'Range': 'bytes=1024-5119'}
    >>> declared_size("bytes 1024-5119/65536", 4096)
    65536
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

__all__ = [
    "READ_PIECE",
    "Read",
    "declared_size",
    "fill_targets",
    "range_header",
    "read_all",
    "read_at_most",
]

READ_PIECE = 4 << 20
"""Most bytes asked of a response body at once while filling buffers."""

Read = Callable[[int | None], Awaitable[bytes]]
"""Reads a response body: at most ``n`` bytes (``b""`` at its end), all of it with
``None``."""


_CONTENT_RANGE = re.compile(r"bytes (?:\d+-\d+|\*)/(\d+)\s*$")


def declared_size(content_range: str | None, content_length: int | None) -> int | None:
    """The whole object's size as a download's response declares it: the total of its
    ``Content-Range`` (``bytes 0-99/4096``: 4096), or, for an answer holding the whole
    object (no ``Content-Range``), its ``Content-Length``; ``None`` if it says neither
    (or ``*``: the size is unknown)."""
    if content_range:
        match = _CONTENT_RANGE.match(content_range)
        return int(match.group(1)) if match else None
    return content_length


def range_header(offset: int, length: int | None) -> dict[str, str]:
    """The headers asking for ``length`` bytes from ``offset`` (to the end if ``None``;
    no header for a whole object)."""
    if length is None:
        return {"Range": f"bytes={offset}-"} if offset else {}
    return {"Range": f"bytes={offset}-{offset + length - 1}"}


async def read_all(read: Read) -> bytes:
    """The whole body."""
    return await read(None)


async def read_at_most(read: Read, most: int) -> bytes:
    """The body, but never more than ``most + 1`` bytes of it: a result longer than
    ``most`` says the body holds more (the rest is left unread)."""
    pieces: list[bytes] = []
    received = 0
    while received <= most:
        piece = await read(min(READ_PIECE, most + 1 - received))
        if not piece:
            break
        pieces.append(piece)
        received += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def fill_targets(read: Read, targets: Sequence[memoryview]) -> int:
    """Fill ``targets`` in order from a body; returns the bytes received (fewer than
    the targets hold when the body ends early)."""
    received = 0
    for target in targets:
        flat = target.cast("B") if target.format != "B" or target.ndim != 1 else target
        filled = 0
        while filled < flat.nbytes:
            piece = await read(min(READ_PIECE, flat.nbytes - filled))
            if not piece:
                return received
            flat[filled : filled + len(piece)] = piece
            filled += len(piece)
            received += len(piece)
    return received
