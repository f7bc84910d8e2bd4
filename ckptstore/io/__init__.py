"""The chunked, parallel I/O engine every DB type writes and reads through: a bounded
thread pool, a bytes-in-flight memory budget, chunking of arrays, checksums (CRC-32 for
chunks; CRC-32C for documents and for the chunks of manifests written before).

The bottom layer: imports nothing of ckptstore but :mod:`ckptstore.errors` (and the
package's shared helpers: types, environment variables). What it needs from a path type
is the :class:`EngineStorage` protocol. :func:`write_watch` tells incremental saves
which memory was written since they last read it.
"""

from ckptstore._types import Buffer, byte_view
from ckptstore.io._budget import MemoryBudget
from ckptstore.io._checksum import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_ALGORITHMS,
    checksum_of,
    crc32_buffer,
    crc32_combine,
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
from ckptstore.io._deflate import deflate_raw
from ckptstore.io._direct import (
    DIRECT_ALIGN,
    DIRECT_FROM,
    aligned_buffer,
    memory_residue,
    plan_direct,
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
from ckptstore.io._pools import borrowed_pool, kept_pool, run_together
from ckptstore.io._priority import lower_thread_priority
from ckptstore.io._progress import ByteProgress, NodeProgress
from ckptstore.io._settings import IOSettings, usable_cpus
from ckptstore.io._shared_keys import (
    CHUNK_STORE_DIR,
    SHARED_MARK,
    chunk_object_key,
    is_shared_key,
    resolve_key,
    shared_key,
)
from ckptstore.io._staging import StagingPool, StagingSlot
from ckptstore.io._storage import EngineStorage, PositionalReader, PositionalWriter
from ckptstore.io._views import slice_views, windows
from ckptstore.io._write_plan import (
    ARCHIVE_BYTES,
    GATHERED_FROM,
    GROUP_BYTES,
    GROUP_MEMBERS,
    MAX_ARCHIVES,
    PIECED_FROM,
    aligned_pieces,
    archive_shares,
    interleaved,
    write_groups,
)
from ckptstore.io._write_watch import ENV as WRITE_WATCH_ENV
from ckptstore.io._write_watch import Ends, Look, WriteWatch, write_watch
from ckptstore.io._zip import ZipLayout
from ckptstore.io._zip_check import ArchiveBounds, UnsafeArchiveError, check_archive

__all__ = [
    "ARCHIVE_BYTES",
    "CHECKSUM_ALGORITHM",
    "CHECKSUM_ALGORITHMS",
    "CHUNK_STORE_DIR",
    "DIRECT_ALIGN",
    "DIRECT_FROM",
    "GATHERED_FROM",
    "GROUP_BYTES",
    "GROUP_MEMBERS",
    "MAX_ARCHIVES",
    "PIECED_FROM",
    "SHARED_MARK",
    "VERIFY_WINDOW",
    "WRITE_WATCH_ENV",
    "ArchiveBounds",
    "ArrayChunk",
    "Buffer",
    "ByteProgress",
    "Ends",
    "EngineStorage",
    "IOSettings",
    "Look",
    "MemoryBudget",
    "NodeProgress",
    "ParallelIO",
    "PositionalReader",
    "PositionalWriter",
    "RangeCheck",
    "ReadRequest",
    "StagingPool",
    "StagingSlot",
    "UnsafeArchiveError",
    "WriteRequest",
    "WriteResult",
    "WriteWatch",
    "ZipLayout",
    "aligned_buffer",
    "aligned_pieces",
    "archive_shares",
    "array_bytes",
    "array_chunks",
    "borrowed_pool",
    "byte_view",
    "check_archive",
    "checksum_of",
    "chunk_data",
    "chunk_object_key",
    "crc32_buffer",
    "crc32_combine",
    "crc32_of",
    "crc32c_buffer",
    "crc32c_of",
    "deflate_raw",
    "grid_chunk_shape",
    "interleaved",
    "is_shared_key",
    "kept_pool",
    "lower_thread_priority",
    "memory_residue",
    "paused_gc",
    "plan_direct",
    "resolve_key",
    "run_together",
    "shared_key",
    "slice_views",
    "usable_cpus",
    "windows",
    "write_groups",
    "write_watch",
]
