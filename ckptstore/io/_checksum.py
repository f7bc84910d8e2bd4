"""Checksums over buffers: CRC-32 for the chunks of new checkpoints, CRC-32C for control
documents, commit records and the chunks of manifests written before.

A manifest names its chunks' algorithm (``"checksum"``): :func:`checksum_of` gives the
function for a name, so one load reads old and new checkpoints alike.

**CRC-32** (zlib's polynomial, the one ZIP archives carry) comes from ISA-L (``isal``,
PSF-2.0; ~30 GiB/s here, twice CRC-32C), which releases the GIL over large buffers. A
packed archive's member CRC-32s are then joined from the chunks' own
(:func:`crc32_combine`): one pass over the data serves the manifest and the ZIP format,
where two algorithms took two. Anyone can check it with ``zlib.crc32``.

**CRC-32C** comes from ``google-crc32c`` (Apache-2.0, hardware-accelerated; the same
implementation zarr uses).

``google_crc32c.extend`` holds the GIL while it runs (about 1.3 ms per 16 MiB) and accepts
only ``bytes``-like objects that need no buffer release, so a memoryview or numpy array
cannot be passed as it is (``bytes(view)`` would copy). Large parts therefore go to the
package's own C function, ``crc32c_extend``, through ctypes: given the part's address, it
reads the memory in place (no copy, ~17 GiB/s), and ctypes releases the GIL for the call,
so a training thread is not held up by the checksums of a background save (nor the I/O
threads of a save by each other's). Where that function cannot be found (a build without
the C library), large parts fall back to ``extend`` over a ctypes array over the same
memory, still without a copy. Small parts are copied to ``bytes`` for ``extend``, which is
cheaper than either for a few KiB.

Example::

    >>> crc32c_of([b"1234", memoryview(b"56789")]) == 0xE3069283
    True
    >>> import zlib
    >>> checksum_of("crc32")([b"1234", memoryview(b"56789")]) == zlib.crc32(b"123456789")
    True
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from typing import Protocol

import google_crc32c
import numpy as np

# ISA-L's CRC-32 is ~5x faster than zlib's (same polynomial, same values), and its
# crc32_combine is C (the one in Python's zlib module is not exposed)
from isal.isal_zlib import crc32 as _crc32
from isal.isal_zlib import crc32_combine as _crc32_combine

from ckptstore._types import Buffer, byte_view

__all__ = [
    "CHECKSUM_ALGORITHM",
    "CHECKSUM_ALGORITHMS",
    "ChecksumFunction",
    "checksum_of",
    "crc32_buffer",
    "crc32_combine",
    "crc32_of",
    "crc32c_buffer",
    "crc32c_of",
    "releases_the_gil",
]

CHECKSUM_ALGORITHM = "crc32"
"""The algorithm of the chunks a save records (a manifest's ``"checksum"``)."""


class ChecksumFunction(Protocol):
    """The checksum of the concatenation of some buffers, continuing from ``value`` (the
    checksum of what came before them)."""

    def __call__(self, parts: Iterable[Buffer], value: int = 0, /) -> int: ...


_U32 = 0xFFFFFFFF

COPY_BELOW = 16 * 1024
"""Parts smaller than this many bytes are copied to ``bytes`` (faster than a ctypes view)."""


def _native_extend() -> Callable[[int, int, int], int] | None:
    """google-crc32c's C ``crc32c_extend(crc, data, count)``, looked up in the library its
    extension module loaded; None where it is not there."""
    try:
        from google_crc32c import _crc32c

        function = ctypes.CDLL(_crc32c.__file__).crc32c_extend
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    function.restype = ctypes.c_uint32
    extend: Callable[[int, int, int], int] = function
    return extend


_NATIVE = _native_extend()


def releases_the_gil() -> bool:
    """Whether large parts are checksummed without the GIL (google-crc32c's C function
    was found)."""
    return _NATIVE is not None


def crc32c_buffer(data: Buffer, value: int = 0) -> int:
    """CRC-32C of one contiguous byte buffer, continuing from ``value``: the hot path for
    thousands of small pieces, without :func:`crc32c_of`'s loop."""
    if isinstance(data, bytes):
        return int(google_crc32c.extend(value, data))
    return crc32c_of((data,), value)


def crc32c_of(parts: Iterable[Buffer], value: int = 0) -> int:
    """CRC-32C of the concatenation of ``parts``, without concatenating them."""
    for part in parts:
        if isinstance(part, bytes):
            value = google_crc32c.extend(value, part)
            continue
        view = byte_view(part)
        if view.nbytes < COPY_BELOW:
            value = google_crc32c.extend(value, view.tobytes())
            continue
        shared = _shared_bytes(view)  # held through the call: the buffer stays exported
        if _NATIVE is not None:
            value = _NATIVE(value, ctypes.addressof(shared), view.nbytes)
        else:
            value = google_crc32c.extend(value, shared)
    return int(value)


crc32_buffer = _crc32
"""CRC-32 of one contiguous byte buffer (``crc32_buffer(view, previous=0)``)."""


def crc32_of(parts: Iterable[Buffer], value: int = 0) -> int:
    """CRC-32 (the ZIP/zlib polynomial) of the concatenation of ``parts``."""
    for part in parts:
        value = _crc32(part if isinstance(part, bytes) else byte_view(part), value)
    return value & _U32


def crc32_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (zlib's
    ``crc32_combine``)."""
    if length_b == 0:  # ISA-L's would return crc_a ^ crc_b
        return crc_a
    return _crc32_combine(crc_a, crc_b, length_b) & _U32


_FUNCTIONS: dict[str, ChecksumFunction] = {"crc32": crc32_of, "crc32c": crc32c_of}
CHECKSUM_ALGORITHMS = tuple(_FUNCTIONS)
"""The algorithms a manifest may name: what loads can check."""


def checksum_of(algorithm: str) -> ChecksumFunction:
    """The function computing ``algorithm`` (one of :data:`CHECKSUM_ALGORITHMS`); a
    ``KeyError`` for any other name (manifests are checked when decoded)."""
    return _FUNCTIONS[algorithm]


def _shared_bytes(view: memoryview) -> ctypes.Array[ctypes.c_char]:
    """A ctypes char array over ``view``'s memory (no copy); ``view`` must outlive it."""
    if not view.readonly:
        return (ctypes.c_char * view.nbytes).from_buffer(view)
    address = np.frombuffer(view, dtype=np.uint8).ctypes.data
    return (ctypes.c_char * view.nbytes).from_address(address)
