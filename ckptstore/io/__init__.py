"""The chunked, parallel I/O engine every DB type writes and reads through: a bounded
thread pool, a bytes-in-flight memory budget, chunking of arrays, checksums (CRC-32 for
chunks; CRC-32C for documents and for the chunks of manifests written before).

The bottom layer: imports nothing of ckptstore but :mod:`ckptstore.errors`. What it needs
from a path type is the :class:`EngineStorage` protocol.
"""

from ckptstore._types import Buffer, byte_view
from ckptstore.io._budget import MemoryBudget
from ckptstore.io._checksum import (
    CHECKSUM_ALGORITHM,
    checksum_of,
    crc32_buffer,
    crc32_of,
    crc32c_buffer,
    crc32c_of,
)
from ckptstore.io._chunking import (
    ArrayChunk,
    array_bytes,
    array_chunks,
    chunk_data,
    grid_chunk_shape,
)
from ckptstore.io._engine import (
    VERIFY_WINDOW,
    ParallelIO,
    RangeCheck,
    ReadRequest,
    WriteRequest,
    WriteResult,
)
from ckptstore.io._gc import paused_gc
from ckptstore.io._priority import lower_thread_priority
from ckptstore.io._settings import IOSettings, usable_cpus
from ckptstore.io._shared_keys import (
    CHUNK_STORE_DIR,
    chunk_object_key,
    is_shared_key,
    resolve_key,
    shared_key,
)
from ckptstore.io._staging import StagingPool, StagingSlot
from ckptstore.io._storage import EngineStorage, PositionalReader, PositionalWriter

__all__ = [
    "CHECKSUM_ALGORITHM",
    "CHUNK_STORE_DIR",
    "VERIFY_WINDOW",
    "ArrayChunk",
    "Buffer",
    "EngineStorage",
    "IOSettings",
    "MemoryBudget",
    "ParallelIO",
    "PositionalReader",
    "PositionalWriter",
    "RangeCheck",
    "ReadRequest",
    "StagingPool",
    "StagingSlot",
    "WriteRequest",
    "WriteResult",
    "array_bytes",
    "array_chunks",
    "byte_view",
    "checksum_of",
    "chunk_data",
    "chunk_object_key",
    "crc32_buffer",
    "crc32_of",
    "crc32c_buffer",
    "crc32c_of",
    "grid_chunk_shape",
    "is_shared_key",
    "lower_thread_priority",
    "paused_gc",
    "resolve_key",
    "shared_key",
    "usable_cpus",
]
