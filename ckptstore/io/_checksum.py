"""CRC-32C checksums (hardware-accelerated by the ``crc32c`` package) over buffers."""

from __future__ import annotations

from collections.abc import Iterable

import crc32c as _crc32c

from ckptstore._types import Buffer, byte_view

__all__ = ["CHECKSUM_ALGORITHM", "crc32c_buffer", "crc32c_of"]

CHECKSUM_ALGORITHM = "crc32c"

crc32c_buffer = _crc32c.crc32c
"""CRC-32C of one contiguous byte buffer (``crc32c_buffer(view, previous=0)``): the
hot path for thousands of small pieces, without :func:`crc32c_of`'s loop."""


def crc32c_of(parts: Iterable[Buffer], value: int = 0) -> int:
    """CRC-32C of the concatenation of ``parts``, without concatenating them."""
    for part in parts:
        value = _crc32c.crc32c(byte_view(part), value)
    return int(value)
