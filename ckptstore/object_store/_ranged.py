"""Ranged downloads: the ``Range`` header of a read, and a response body streamed
straight into the caller's buffers.

Example::

    >>> range_header(1024, 4096)
    {'Range': 'bytes=1024-5119'}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

__all__ = ["READ_PIECE", "Read", "fill_targets", "range_header", "read_all"]

READ_PIECE = 4 << 20
"""Most bytes asked of a response body at once while filling buffers."""

Read = Callable[[int | None], Awaitable[bytes]]
"""Reads a response body: at most ``n`` bytes (``b""`` at its end), all of it with
``None``."""


def range_header(offset: int, length: int | None) -> dict[str, str]:
    """The headers asking for ``length`` bytes from ``offset`` (to the end if ``None``;
    no header for a whole object)."""
    if length is None:
        return {"Range": f"bytes={offset}-"} if offset else {}
    return {"Range": f"bytes={offset}-{offset + length - 1}"}


async def read_all(read: Read) -> bytes:
    """The whole body."""
    return await read(None)


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
