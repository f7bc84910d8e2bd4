"""Type aliases shared across the package."""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

Array: TypeAlias = np.ndarray[tuple[int, ...], np.dtype[np.generic]]
"""A numpy array of any shape and dtype (the type of every blob ckptstore stores)."""

ByteArray: TypeAlias = np.ndarray[tuple[int, ...], np.dtype[np.uint8]]
"""A numpy array of bytes (``uint8``), as the chunking helpers return."""

JSONObject: TypeAlias = dict[str, object]
"""A JSON document's top level, as :func:`json.loads` returns it for an object."""

Buffer: TypeAlias = bytes | bytearray | memoryview | Array
"""Anything exposing the buffer protocol that ckptstore writes or checksums."""


def byte_view(data: Buffer) -> memoryview:
    """A flat, byte-formatted memoryview of a contiguous buffer (no copy)."""
    view = memoryview(data)  # type: ignore[arg-type]  # numpy's stubs omit __buffer__
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
