"""CRC-32C checksums over buffers, with ``google-crc32c`` (Apache-2.0, hardware-accelerated;
the same implementation zarr uses).

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
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable

import google_crc32c
import numpy as np

from ckptstore._types import Buffer, byte_view

__all__ = ["CHECKSUM_ALGORITHM", "crc32c_buffer", "crc32c_of", "releases_the_gil"]

CHECKSUM_ALGORITHM = "crc32c"

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


def _shared_bytes(view: memoryview) -> ctypes.Array[ctypes.c_char]:
    """A ctypes char array over ``view``'s memory (no copy); ``view`` must outlive it."""
    if not view.readonly:
        return (ctypes.c_char * view.nbytes).from_buffer(view)
    address = np.frombuffer(view, dtype=np.uint8).ctypes.data
    return (ctypes.c_char * view.nbytes).from_address(address)
