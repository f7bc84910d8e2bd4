"""The chunked, parallel I/O engine every DB type writes and reads through."""

from ckptstore.io.budget import MemoryBudget
from ckptstore.io.checksum import crc32c_of
from ckptstore.io.engine import ParallelIO, ReadRequest, WriteRequest, WriteResult
from ckptstore.io.settings import IOSettings

__all__ = [
    "IOSettings",
    "MemoryBudget",
    "ParallelIO",
    "ReadRequest",
    "WriteRequest",
    "WriteResult",
    "crc32c_of",
]
