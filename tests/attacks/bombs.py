"""Compression bombs that expand far beyond what a test may allocate, and a guard that
keeps a load which decodes one anyway from exhausting the machine. Used by
``test_attacks.py``.

Each bomb is a whole compressed frame of zeros stored as the first chunk of a blob, its
manifest record (stored size, checksum) rewritten to match, while the manifest still says
the chunk decodes to its 256 bytes: only the bound on decompression (the chunk's declared
size, checked before decoding) stands between the frame and gigabytes of memory."""

from __future__ import annotations

import contextlib
import functools
import resource
import struct
from collections.abc import Iterator
from pathlib import Path

import numcodecs
import numpy as np

from tests.attacks.attacks import Spec, replace_chunk
from tests.attacks.forge import Forge

ZSTD_BOMB_BYTES = 8 << 30
BLOSC_BOMB_BYTES = numcodecs.blosc.MAX_BUFFERSIZE  # a blosc chunk's largest: 2 GiB - 17
GUARD_HEADROOM = 1 << 30
"""How much more address space a guarded test may map: less than any bomb expands to."""

_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_BLOCK = 128 << 10  # the largest zstd block


def zstd_zeros_frame(nbytes: int) -> bytes:
    """A zstd frame (RFC 8878) of ``nbytes`` zeros, its header declaring them: a single
    segment of RLE blocks, 4 bytes for each 128 KiB (8 GiB in 256 KiB), built without
    compressing anything."""
    count, rest = divmod(nbytes, _ZSTD_BLOCK)
    assert count > 0
    assert rest == 0

    def block(last: int) -> bytes:  # an RLE block (type 1) repeating the byte 0
        return ((_ZSTD_BLOCK << 3) | (1 << 1) | last).to_bytes(3, "little") + b"\0"

    # descriptor 0xE0: an 8-byte content size, single segment, no checksum or dictionary
    return struct.pack("<IBQ", _ZSTD_MAGIC, 0xE0, nbytes) + block(0) * (count - 1) + block(1)


@functools.cache
def blosc_zeros_frame() -> bytes:
    """A blosc frame (zstd inside, as ``ZarrDB(compression="blosc")`` writes) of
    :data:`BLOSC_BOMB_BYTES` zeros in ~0.5 MB; the zeros are never touched (calloc), so
    building it maps no memory, and it is built once."""
    codec = numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.SHUFFLE)
    return bytes(codec.encode(np.zeros(BLOSC_BOMB_BYTES, np.uint8)))


def zstd_bomb_8gib(forge: Forge, outside: Path) -> None:
    # 8 GiB of zeros in 256 KiB, where the manifest says the chunk holds 256 bytes
    replace_chunk(forge, zstd_zeros_frame(ZSTD_BOMB_BYTES))


def blosc_bomb_2gib(forge: Forge, outside: Path) -> None:
    # 2 GiB of zeros in ~0.5 MB, where the manifest says the chunk holds 256 bytes
    replace_chunk(forge, blosc_zeros_frame())


BOMBS: dict[str, Spec] = {
    "zstd_bomb_8gib": Spec(zstd_bomb_8gib, ("zarr-zstd",)),
    "blosc_bomb_2gib": Spec(blosc_bomb_2gib, ("zarr-blosc",)),
}


def _mapped_bytes() -> int:
    """The address space this process maps now (``VmSize``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def address_space_guard(headroom: int = GUARD_HEADROOM) -> Iterator[None]:
    """Within: at most ``headroom`` more address space (``RLIMIT_AS``, the soft limit),
    so a load that decodes a bomb gets a MemoryError rather than gigabytes of memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _mapped_bytes() + headroom
    for current in (soft, hard):
        if current != resource.RLIM_INFINITY:
            limit = min(limit, current)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
