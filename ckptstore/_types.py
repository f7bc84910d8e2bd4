"""Type aliases shared across the package."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

Buffer: TypeAlias = bytes | bytearray | memoryview | np.ndarray[Any, Any]
"""Anything exposing the buffer protocol that ckptstore writes or checksums."""


def byte_view(data: Buffer) -> memoryview:
    """A flat, byte-formatted memoryview of a contiguous buffer (no copy)."""
    view = memoryview(data)  # type: ignore[arg-type]  # numpy's stubs omit __buffer__
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
