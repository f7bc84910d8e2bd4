"""Checking a ZIP archive before anyone else opens it: the structure a third-party
reader (``zipfile``, so ``numpy.load`` and zarr's ``ZipStore``) trusts, parsed and
bounded here (:func:`check_archive`). ckptstore itself never reads it: a node's
manifest says where every byte is. But docs/reading-without-ckptstore.md sends people
to open the archives of :mod:`ckptstore.io._zip` with those readers, and a forged
central directory passes every checksum (whoever forged it recomputed them).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable
from itertools import pairwise
from typing import NamedTuple

from ckptstore.io._zip import (
    _CENTRAL,
    _END,
    _END64,
    _LOCAL,
    _LOCATOR64,
    _U16,
    _U32,
    _UTF8_FLAG,
    CENTRAL_HEADER_SIZE,
    DEFLATED,
    END_SIZE,
    LOCAL_HEADER_SIZE,
    STORED,
)

__all__ = ["ArchiveBounds", "UnsafeArchiveError", "check_archive"]

_END_SIGNATURE = b"PK\x05\x06"
_LOCATOR64_SIGNATURE = b"PK\x06\x07"
_END64_SIGNATURE = b"PK\x06\x06"
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ZIP64_EXTRA_ID = 1
_ALLOWED_FLAGS = _UTF8_FLAG | 0x8 | 0x6
"""UTF-8 names, a data descriptor after the data, deflate's speed options: anything else
(encryption, patched data, masked headers) is no archive ckptstore writes."""
_DRIVE = re.compile(r"[A-Za-z]:")
_WINDOW = 1 << 20


class UnsafeArchiveError(ValueError):
    """A ZIP archive that a third-party reader (``zipfile``, ``numpy.load``, zarr's
    ``ZipStore``) could not open safely; the message says what is wrong."""


class ArchiveBounds(NamedTuple):
    """What :func:`check_archive` accepts: members, bytes one member may inflate to, and
    inflated bytes per stored byte of a deflated member."""

    max_members: int
    max_inflated: int
    max_ratio: int


class _Central(NamedTuple):
    name: str
    raw_name: bytes
    flags: int
    method: int
    crc: int
    compressed: int
    size: int
    offset: int


def check_archive(read: Callable[[int, int], bytes], size: int, bounds: ArchiveBounds) -> int:
    """Check that the ZIP archive of ``size`` bytes that ``read(offset, length)`` returns
    is safe to open with any ZIP reader, and return its member count; raise
    :class:`UnsafeArchiveError` otherwise.

    Checked: one end record (ZIP64's where its fields overflow) ending the file; a
    central directory inside the file holding exactly the members it declares; member
    names relative and plain (no ``..`` or ``.`` segment, no leading ``/``, no ``\\``,
    drive letter, control character or empty segment) and unique; stored or deflated
    members only, unencrypted; each local header where the directory says, naming the
    same member with the same method and sizes (ZIP64 extras read, sizes within the
    file); member data inside the file, before the directory, never overlapping
    another's; a stored member as long as its data; a deflated one inflating to at most
    ``bounds.max_inflated`` bytes and ``bounds.max_ratio`` times its stored size, which
    is checked by inflating it (to one byte past its declared size at most) against its
    declared size and CRC-32. Stored members' CRC-32s are not recomputed (the manifest's
    checksums cover their bytes).

    Example::

        >>> import io, zipfile
        >>> buffer = io.BytesIO()
        >>> with zipfile.ZipFile(buffer, "w") as archive:
        ...     archive.writestr("../evil", b"x")
        >>> data = buffer.getvalue()
        >>> check_archive(lambda at, n: data[at : at + n], len(data), ArchiveBounds(9, 9, 9))
        Traceback (most recent call last):
        ckptstore.io._zip_check.UnsafeArchiveError: member '../evil' has a '..' segment
    """
    reader = _WindowReader(read, size)
    start, count, directory_size, directory_end = _end_records(reader, size)
    if count > bounds.max_members:
        raise UnsafeArchiveError(f"{count} members, more than the limit of {bounds.max_members}")
    if directory_size < count * CENTRAL_HEADER_SIZE:
        raise UnsafeArchiveError(
            f"a central directory of {directory_size} bytes for {count} members"
        )
    if start + directory_size != directory_end:
        raise UnsafeArchiveError("the central directory does not end where the end record begins")
    members = _central_directory(reader.read(start, directory_size), count, size)
    spans = []
    for member in members:
        _check_name(member.name)
        data_offset = _check_local(reader, member)
        end = data_offset + member.compressed
        if end > start:
            raise UnsafeArchiveError(
                f"member {_shown(member.name)} runs into the central directory"
            )
        spans.append((member.offset, end, member.name))
        _check_sizes(reader, member, data_offset, bounds)
    spans.sort()
    for (_, previous_end, previous), (begin, _, name) in pairwise(spans):
        if begin < previous_end:
            raise UnsafeArchiveError(f"members {_shown(previous)} and {_shown(name)} overlap")
    return count


class _WindowReader:
    """``read`` through a window of :data:`_WINDOW` bytes: the headers of an archive of
    small members are read a window at a time, not one request each."""

    def __init__(self, read: Callable[[int, int], bytes], size: int) -> None:
        self._read, self._size = read, size
        self._start, self._data = 0, b""

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self._size:
            raise UnsafeArchiveError(
                f"a record at offset {offset} of {length} bytes ends past the file ({self._size})"
            )
        if not (self._start <= offset and offset + length <= self._start + len(self._data)):
            if length > _WINDOW:
                return self._checked(offset, length, self._read(offset, length))
            self._start = offset
            self._data = self._checked(
                offset,
                min(_WINDOW, self._size - offset),
                self._read(offset, min(_WINDOW, self._size - offset)),
            )
        return self._data[offset - self._start : offset - self._start + length]

    @staticmethod
    def _checked(offset: int, length: int, data: bytes) -> bytes:
        if len(data) != length:
            raise UnsafeArchiveError(f"{length} bytes at offset {offset} read as {len(data)}")
        return data


def _end_records(reader: _WindowReader, size: int) -> tuple[int, int, int, int]:
    """``(directory offset, member count, directory size, where the directory must
    end)`` from the end record (and the ZIP64 one where it says so)."""
    if size < END_SIZE:
        raise UnsafeArchiveError(f"{size} bytes: too short to be a ZIP archive")
    tail_start = max(0, size - END_SIZE - _U16)
    tail = reader.read(tail_start, size - tail_start)
    position = tail.rfind(_END_SIGNATURE)
    while position >= 0:
        fields = _END.unpack_from(tail, position) if position + END_SIZE <= len(tail) else None
        if fields is not None and position + END_SIZE + fields[7] == len(tail):
            break
        position = tail.rfind(_END_SIGNATURE, 0, position)
    else:
        raise UnsafeArchiveError("no end-of-central-directory record ends the file")
    end_offset = tail_start + position
    _, disk, directory_disk, on_disk, count, directory_size, start, _ = fields
    if disk or directory_disk or on_disk != count:
        raise UnsafeArchiveError("a multi-disk archive")
    if count != _U16 and directory_size != _U32 and start != _U32:
        return start, count, directory_size, end_offset
    locator_offset = end_offset - _LOCATOR64.size
    if locator_offset < 0:
        raise UnsafeArchiveError("the end record needs a ZIP64 locator that is missing")
    signature, disk, end64_offset, disks = _LOCATOR64.unpack(
        reader.read(locator_offset, _LOCATOR64.size)
    )
    if signature != int.from_bytes(_LOCATOR64_SIGNATURE, "little") or disk or disks != 1:
        raise UnsafeArchiveError("the end record needs a ZIP64 locator that is missing")
    if end64_offset + _END64.size > locator_offset:
        raise UnsafeArchiveError("the ZIP64 end record is not before its locator")
    record = _END64.unpack(reader.read(end64_offset, _END64.size))
    signature, _, _, _, disk, directory_disk, on_disk, count, directory_size, start = record
    if signature != int.from_bytes(_END64_SIGNATURE, "little"):
        raise UnsafeArchiveError("no ZIP64 end record where its locator says")
    if disk or directory_disk or on_disk != count:
        raise UnsafeArchiveError("a multi-disk archive")
    return start, count, directory_size, end64_offset


def _central_directory(data: bytes, count: int, size: int) -> list[_Central]:
    members: list[_Central] = []
    seen: set[str] = set()
    position = 0
    for _ in range(count):
        if position + CENTRAL_HEADER_SIZE > len(data):
            raise UnsafeArchiveError(f"the central directory holds fewer than {count} members")
        fields = _CENTRAL.unpack_from(data, position)
        if fields[0] != int.from_bytes(_CENTRAL_SIGNATURE, "little"):
            raise UnsafeArchiveError(f"central directory entry {len(members)} has no signature")
        flags, method, crc, compressed, inflated = (
            fields[3],
            fields[4],
            fields[7],
            fields[8],
            fields[9],
        )
        name_length, extra_length, comment_length, disk, offset = (
            fields[10], fields[11], fields[12], fields[13], fields[16]
        )  # fmt: skip
        name_start = position + CENTRAL_HEADER_SIZE
        position = name_start + name_length + extra_length + comment_length
        if position > len(data):
            raise UnsafeArchiveError(
                f"central directory entry {len(members)} runs past the directory"
            )
        raw_name = data[name_start : name_start + name_length]
        name = _decode_name(raw_name, flags)
        extra = _extra_fields(
            data[name_start + name_length : name_start + name_length + extra_length], name
        )
        inflated, compressed, offset = _zip64_values(
            extra.get(_ZIP64_EXTRA_ID, b""), name, (inflated, compressed, offset)
        )
        if disk:
            raise UnsafeArchiveError(f"member {_shown(name)} is on another disk")
        if flags & ~_ALLOWED_FLAGS:
            raise UnsafeArchiveError(
                f"member {_shown(name)} has flags {flags:#x} (encrypted or other)"
            )
        if method not in (STORED, DEFLATED):
            raise UnsafeArchiveError(f"member {_shown(name)} has compression method {method}")
        if compressed > size or offset >= size:
            raise UnsafeArchiveError(
                f"member {_shown(name)} declares sizes or an offset past the file"
            )
        if name in seen:
            raise UnsafeArchiveError(f"member {_shown(name)} appears twice")
        seen.add(name)
        members.append(_Central(name, raw_name, flags, method, crc, compressed, inflated, offset))
    if position != len(data):
        raise UnsafeArchiveError("the central directory holds more than its members")
    return members


def _shown(name: str) -> str:
    """A member name for a message: quoted, and cut (names are the forger's text)."""
    return repr(name if len(name) <= 120 else name[:117] + "...")


def _decode_name(raw: bytes, flags: int) -> str:
    try:
        return raw.decode("utf-8" if flags & _UTF8_FLAG else "cp437")
    except UnicodeDecodeError:
        raise UnsafeArchiveError(f"member name {raw[:80]!r} is not valid UTF-8") from None


def _extra_fields(data: bytes, name: str) -> dict[int, bytes]:
    fields: dict[int, bytes] = {}
    position = 0
    while position < len(data):
        if position + 4 > len(data):
            raise UnsafeArchiveError(f"member {_shown(name)} has a malformed extra field")
        field_id, length = struct.unpack_from("<HH", data, position)
        if position + 4 + length > len(data) or field_id in fields:
            raise UnsafeArchiveError(f"member {_shown(name)} has a malformed extra field")
        fields[field_id] = data[position + 4 : position + 4 + length]
        position += 4 + length
    return fields


def _zip64_values(extra: bytes, name: str, values: tuple[int, int, int]) -> tuple[int, int, int]:
    """``(inflated, compressed, offset)`` with each 32-bit field that overflowed
    (``0xFFFFFFFF``) taken, in that order, from the ZIP64 extra field."""
    out = list(values)
    position = 0
    for index, value in enumerate(values):
        if value == _U32:
            if position + 8 > len(extra):
                raise UnsafeArchiveError(f"member {_shown(name)} lacks the ZIP64 sizes it declares")
            out[index] = struct.unpack_from("<Q", extra, position)[0]
            position += 8
    return out[0], out[1], out[2]


def _check_name(name: str) -> None:
    """Refuse a member name that extracts outside its directory or means different
    files to different readers."""
    if not name:
        raise UnsafeArchiveError("a member has an empty name")
    problems = (
        ("\\" in name, "a backslash"),
        (name.startswith("/"), "an absolute path"),
        (_DRIVE.match(name) is not None, "a drive letter"),
        (any(ord(c) < 0x20 or ord(c) == 0x7F for c in name), "a control character"),
        (".." in name.split("/"), "a '..' segment"),
        ("." in name.split("/"), "a '.' segment"),
        ("" in name.rstrip("/").split("/"), "an empty segment"),
    )
    for bad, what in problems:
        if bad:
            raise UnsafeArchiveError(f"member {_shown(name)} has {what}")


def _check_local(reader: _WindowReader, member: _Central) -> int:
    """The offset of ``member``'s data, after checking its local header against the
    central directory."""
    fields: tuple[int, ...] = _LOCAL.unpack(reader.read(member.offset, LOCAL_HEADER_SIZE))
    signature, _, flags, method, _, _, crc, compressed, inflated, name_length, extra_length = fields
    if signature != int.from_bytes(_LOCAL_SIGNATURE, "little"):
        raise UnsafeArchiveError(f"no local header where member {_shown(member.name)} should start")
    name_start = member.offset + LOCAL_HEADER_SIZE
    raw_name = reader.read(name_start, name_length)
    extra = _extra_fields(reader.read(name_start + name_length, extra_length), member.name)
    if raw_name != member.raw_name:
        raise UnsafeArchiveError(
            f"member {_shown(member.name)} has another name in its local header"
        )
    if method != member.method or (flags ^ member.flags) & ~0x6:
        raise UnsafeArchiveError(
            f"member {_shown(member.name)} has another method or flags locally"
        )
    if not flags & 0x8:  # else they are in a data descriptor after the data
        inflated, compressed, _ = _zip64_values(
            extra.get(_ZIP64_EXTRA_ID, b""), member.name, (inflated, compressed, 0)
        )
        if (crc, compressed, inflated) != (member.crc, member.compressed, member.size):
            raise UnsafeArchiveError(
                f"member {_shown(member.name)} has other sizes or CRC in its local header"
            )
    return name_start + name_length + extra_length


def _check_sizes(
    reader: _WindowReader, member: _Central, data_offset: int, bounds: ArchiveBounds
) -> None:
    if member.method == STORED:
        if member.size != member.compressed:
            raise UnsafeArchiveError(
                f"stored member {_shown(member.name)} declares {member.size} bytes and holds "
                f"{member.compressed}"
            )
        return
    if member.compressed > member.size + (member.size >> 10) + 1024:  # deflate's worst
        raise UnsafeArchiveError(
            f"deflated member {_shown(member.name)} stores {member.compressed} bytes for "
            f"{member.size}, more than deflate ever needs"
        )
    most = min(bounds.max_inflated, max(member.compressed, 1) * bounds.max_ratio)
    if member.size > most:
        raise UnsafeArchiveError(
            f"deflated member {_shown(member.name)} inflates to {member.size} bytes, more than "
            f"{most} (the limit, or {bounds.max_ratio} times its {member.compressed} stored bytes)"
        )
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        inflated = inflater.decompress(reader.read(data_offset, member.compressed), member.size + 1)
    except zlib.error as error:
        raise UnsafeArchiveError(
            f"deflated member {_shown(member.name)} does not inflate ({error})"
        ) from None
    if len(inflated) != member.size or not inflater.eof:
        raise UnsafeArchiveError(
            f"deflated member {_shown(member.name)} does not inflate to its declared "
            f"{member.size} bytes"
        )
    if zlib.crc32(inflated) != member.crc:
        raise UnsafeArchiveError(f"deflated member {_shown(member.name)} does not match its CRC-32")
