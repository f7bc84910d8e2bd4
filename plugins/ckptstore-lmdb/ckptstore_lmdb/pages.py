"""Where every value of an LMDB file lies: a read-only walk of its B-tree pages.

LMDB stores each value as one contiguous byte range of ``data.mdb``: inside a leaf
page (small values) or after the header of a run of overflow pages (large ones). The
walk follows the newest meta page to the main database's root and down every branch,
so the format can record each chunk as a byte range with a checksum and read it back
with a plain ranged read, on any storage. It reads LMDB's stable 0.9 file format
(``mdb_version`` 1); anything else is refused, never guessed at.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.zeros(1000, np.float32)
    >>> manager = CheckpointManager("ckpt", "trainer_0", "lmdb")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(3))
    >>> from ckptstore.protocol import open_node
    >>> files = open_node(manager.location.storage, "trainer_0", 3).data_key  # its attempt
    >>> with open(f"ckpt/{files}/data.mdb", "rb") as file:
    ...     spans = value_spans(file.read())
    >>> spans[b"w\\x00\\x00\\x00\\x00\\x00"].size
    4000
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ckptstore.errors import CkptStoreError
from ckptstore.io import Buffer, byte_view

__all__ = ["LmdbFormatError", "ValueSpan", "value_spans"]

PAGE_HEADER = 16
NODE_HEADER = 8
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
INVALID_PAGE = 0xFFFFFFFFFFFFFFFF

P_BRANCH = 0x01
P_LEAF = 0x02
P_LEAF2 = 0x20
F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04

# offsets inside a meta page: MDB_meta follows the page header
_META = PAGE_HEADER
_META_PSIZE = _META + 24  # mm_dbs[FREE_DBI].md_pad holds the page size
_META_MAIN_ROOT = _META + 24 + 48 + 40  # mm_dbs[MAIN_DBI].md_root
_META_TXNID = _META + 24 + 96 + 8

# a node's header (MDB_node): data size (low, high 16 bits), flags, key size; a branch
# node's first three fields are its child's page number instead
_NODE = struct.Struct("=HHHH")
_PAGE_NUMBER = struct.Struct("=Q")  # where a large value's overflow pages start


class LmdbFormatError(CkptStoreError, ValueError):
    """The bytes are not an LMDB file this walk understands (see the message).

    Example::

        >>> value_spans(b"not lmdb")
        Traceback (most recent call last):
        ckptstore_lmdb.pages.LmdbFormatError: ...
    """


class ValueSpan(NamedTuple):
    """One value: ``size`` bytes at ``offset`` of the file (a tuple: one is made per value,
    thousands per file, and ``(offset, size)`` pairs sort by offset as they are).

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.zeros(1000, np.float32)
        >>> manager = CheckpointManager("spans", "trainer_0", "lmdb")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(3))
        >>> from ckptstore.protocol import open_node
        >>> files = open_node(manager.location.storage, "trainer_0", 3).data_key
        >>> data = open(f"spans/{files}/data.mdb", "rb").read()
        >>> span = value_spans(data)[b"w\\x00\\x00\\x00\\x00\\x00"]
        >>> len(data[span.offset : span.offset + span.size])  # the value's bytes
        4000
    """

    offset: int
    size: int


def value_spans(data: Buffer) -> dict[bytes, ValueSpan]:
    """Every key of the main database and where its value lies in ``data``."""
    view = byte_view(data)
    if view.nbytes < 2 * PAGE_HEADER + _META_TXNID:
        raise LmdbFormatError(f"{view.nbytes} bytes is too short for an LMDB file")
    psize = _unpack("=I", view, _META_PSIZE)
    if psize < 512 or psize & (psize - 1):
        raise LmdbFormatError(f"page size {psize} is not a power of two >= 512")
    root = max((_meta(view, 0), _meta(view, psize)))[1]
    spans: dict[bytes, ValueSpan] = {}
    pending = [] if root == INVALID_PAGE else [root]
    visited: set[int] = set()
    while pending:
        page = pending.pop()
        if page in visited:
            raise LmdbFormatError(f"page {page} is reached twice: the tree is damaged")
        visited.add(page)
        _walk_page(view, page, psize, pending, spans)
    return spans


def _meta(view: memoryview, base: int) -> tuple[int, int]:
    """(transaction id, main root page) of the meta page at ``base``."""
    magic, version = struct.unpack_from("=II", view, base + _META)
    if magic != MAGIC:
        raise LmdbFormatError(f"no LMDB meta page at offset {base} (magic {magic:#x})")
    if version != DATA_VERSION:
        raise LmdbFormatError(
            f"LMDB data format version {version} is not supported (this reads version "
            f"{DATA_VERSION}, written by LMDB 0.9)"
        )
    return _unpack("=Q", view, base + _META_TXNID), _unpack("=Q", view, base + _META_MAIN_ROOT)


def _walk_page(
    view: memoryview,
    page: int,
    psize: int,
    pending: list[int],
    spans: dict[bytes, ValueSpan],
) -> None:
    base = page * psize
    if base + psize > view.nbytes:
        raise LmdbFormatError(f"page {page} lies beyond the end of the file")
    flags, lower = struct.unpack_from("=HH", view, base + 10)
    count = (lower - PAGE_HEADER) // 2
    if lower < PAGE_HEADER or lower > psize:
        raise LmdbFormatError(f"page {page} has a damaged header")
    pointers = struct.unpack_from(f"={count}H", view, base + PAGE_HEADER)
    if flags & P_BRANCH:
        for pointer in pointers:
            low, high, extra, _ = _NODE.unpack_from(view, base + pointer)
            pending.append(low | high << 16 | extra << 32)
    elif flags & P_LEAF and not flags & P_LEAF2:
        _walk_leaf(view, page, base, pointers, psize, spans)
    else:
        raise LmdbFormatError(f"page {page} is neither a branch nor a leaf (flags {flags:#x})")


def _walk_leaf(
    view: memoryview,
    page: int,
    base: int,
    pointers: tuple[int, ...],
    psize: int,
    spans: dict[bytes, ValueSpan],
) -> None:
    """Add the value of every node of leaf page ``page`` (at offset ``base``) to
    ``spans``: the loop runs once per value of the file, so it holds its lookups in
    locals (precompiled structs, the file's size)."""
    unpack_node = _NODE.unpack_from
    unpack_page_number = _PAGE_NUMBER.unpack_from
    end = view.nbytes
    for pointer in pointers:
        low, high, node_flags, key_size = unpack_node(view, base + pointer)
        key_start = base + pointer + NODE_HEADER
        if node_flags & (F_SUBDATA | F_DUPDATA):
            raise LmdbFormatError("named or duplicate-key databases are not supported")
        offset = key_start + key_size
        if node_flags & F_BIGDATA:
            offset = unpack_page_number(view, offset)[0] * psize + PAGE_HEADER
        size = low | high << 16
        if offset + size > end:
            raise LmdbFormatError(f"a value on page {page} runs past the end of the file")
        spans[bytes(view[key_start : key_start + key_size])] = ValueSpan(offset, size)


def _unpack(fmt: str, view: memoryview, offset: int) -> int:
    value: int = struct.unpack_from(fmt, view, offset)[0]
    return value
