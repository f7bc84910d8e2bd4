"""A ZIP archive laid out before a byte of it is written.

Members are stored (uncompressed), but for small documents the caller compressed
already (ZIP method 8, raw deflate: a zarr ``zarr.json`` per blob, 300 bytes stored, 174
deflated). Every member's length is known up front (documents, npy headers, array
bytes), so the offset of every local header, every member's data and the central
directory is computed first; the bytes can then be written in parallel, at those
offsets, in any order. Members whose data is large are aligned (the local header's
extra field is padded, as Android's ``zipalign`` does): at a multiple of
:data:`ALIGN`, or at the remainder modulo :data:`ALIGN` the caller asks for (its
array's address, so that the data can be written ``O_DIRECT`` from the array's own
memory). ZIP64 records are used where a size, an offset or the member count needs
them. The result is an ordinary ZIP: Python's ``zipfile`` (and so ``numpy.load``,
zarr's ``ZipStore`` and fsspec's ``zip::`` URLs) reads it and verifies each member's
CRC-32 (of the inflated bytes, for deflated members).

The caller supplies each member's CRC-32 (:mod:`ckptstore.io._checksum`: from ISA-L,
and joined from the CRC-32s of pieces checksummed in parallel with ``crc32_combine``).

Example::

    >>> import io, zipfile
    >>> from ckptstore.io._checksum import crc32_of
    >>> bodies = [b"hello", b"world!"]
    >>> layout = ZipLayout.place(["a.txt", "b.txt"], [5, 6])
    >>> archive = bytearray(layout.total_size)
    >>> crcs = [crc32_of([body]) for body in bodies]  # in any order, in parallel
    >>> for index, (member, body) in enumerate(zip(layout.members, bodies)):
    ...     header = layout.local_header(index, crcs[index])
    ...     archive[member.header_offset : member.data_offset] = header
    ...     archive[member.data_offset : member.end] = body
    >>> archive[layout.directory_offset :] = layout.central_directory(crcs)  # the tail
    >>> zipfile.ZipFile(io.BytesIO(archive)).read("b.txt")
    b'world!'
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import pairwise
from typing import NamedTuple

import numpy as np

__all__ = [
    "ALIGN",
    "ALIGN_FROM",
    "DEFLATED",
    "STORED",
    "ArchiveBounds",
    "UnsafeArchiveError",
    "ZipLayout",
    "check_archive",
]

ALIGN = 4096
"""Data of members of at least ``ALIGN_FROM`` bytes starts at a multiple of this (plus
the member's residue, when :meth:`ZipLayout.place` is given one)."""
ALIGN_FROM = 64 << 10
STORED, DEFLATED = 0, 8
"""ZIP compression methods: stored as is, or raw deflate."""
_U32 = 0xFFFFFFFF
_U16 = 0xFFFF
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01: archives are reproducible
_DOS_TIME = 0
_UTF8_FLAG = 0x800
_PADDING_ID = 0xD935  # zipalign's extra field: ignored by readers
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_END64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")
_CRC = struct.Struct("<I")
_CENTRAL_DTYPE = np.dtype(
    [
        ("signature", "<u4"), ("made_by", "<u2"), ("needed", "<u2"), ("flags", "<u2"),
        ("method", "<u2"), ("time", "<u2"), ("date", "<u2"), ("crc", "<u4"),
        ("compressed", "<u4"), ("size", "<u4"), ("name_length", "<u2"),
        ("extra_length", "<u2"), ("comment_length", "<u2"), ("disk", "<u2"),
        ("internal", "<u2"), ("mode", "<u4"), ("offset", "<u4"),
    ]
)  # fmt: skip
"""``_CENTRAL`` as a numpy record (packed, little-endian): directory entries as columns."""
LOCAL_HEADER_SIZE = _LOCAL.size
CENTRAL_HEADER_SIZE = _CENTRAL.size
END_SIZE = _END.size


# -- the layout ---------------------------------------------------------------------------


class PlacedMember(NamedTuple):
    """A member with its place: local header at ``header_offset``, ``padding`` bytes of
    extra field, data at ``data_offset``."""

    name: str
    encoded: bytes
    size: int
    header_offset: int
    data_offset: int
    padding: int
    flags: int  # general purpose flags: UTF-8 names
    method: int  # STORED or DEFLATED
    inflated_size: int  # the data's size once inflated: ``size``, unless DEFLATED

    @property
    def header_size(self) -> int:
        return self.data_offset - self.header_offset

    @property
    def end(self) -> int:
        return self.data_offset + self.size


@dataclass(frozen=True)
class ZipLayout:
    """Where every byte of an archive goes. Build with :meth:`place`.

    Member ``i``'s place is held column by column (``header_offsets[i]``,
    ``data_offsets[i]``...: an archive of small blobs has tens of thousands of
    members); :attr:`members` gives them as :class:`PlacedMember` rows. ``sizes`` are
    the bytes stored, ``inflated_sizes`` what a reader gets (different only for members
    whose ``methods`` entry is :data:`DEFLATED`)."""

    encoded: tuple[bytes, ...]
    sizes: tuple[int, ...]
    header_offsets: tuple[int, ...]
    data_offsets: tuple[int, ...]
    paddings: tuple[int, ...]
    flags: tuple[int, ...]
    methods: tuple[int, ...]
    inflated_sizes: tuple[int, ...]
    directory_offset: int
    directory_size: int
    total_size: int

    @cached_property
    def members(self) -> tuple[PlacedMember, ...]:
        """Every member's place, in archive order."""
        return tuple(
            map(
                PlacedMember,
                [name.decode() for name in self.encoded],
                self.encoded,
                self.sizes,
                self.header_offsets,
                self.data_offsets,
                self.paddings,
                self.flags,
                self.methods,
                self.inflated_sizes,
            )
        )

    def end(self, index: int) -> int:
        """Where member ``index``'s data ends."""
        return self.data_offsets[index] + self.sizes[index]

    @classmethod
    def place(
        cls,
        names: Sequence[str],
        lengths: Sequence[int],
        residues: Mapping[int, int] | None = None,
        deflated: Mapping[int, int] | None = None,
    ) -> ZipLayout:
        """Place members named ``names`` of ``lengths`` bytes, in this order: offsets by
        cumulative sums (numpy), a scalar step only at each member large enough to be
        aligned. ``residues`` maps a member's index to the remainder modulo
        :data:`ALIGN` its data should start at (default 0), for members that are
        aligned. ``deflated`` maps the index of a member stored deflated (its
        ``lengths`` entry counts the deflated bytes) to its size once inflated; such a
        member is a small document (less than :data:`ALIGN_FROM` bytes either way)."""
        residues = residues or {}
        deflated = deflated or {}
        count = len(names)
        encoded = tuple([name.encode() for name in names])
        sizes = np.fromiter(lengths, dtype=np.int64, count=count)
        headers = LOCAL_HEADER_SIZE + np.fromiter(map(len, encoded), dtype=np.int64, count=count)
        huge = sizes >= _U32
        headers[huge] += 20  # the ZIP64 extra field of the local header
        steps = headers + sizes
        header_offsets = np.empty(count, dtype=np.int64)
        paddings = np.zeros(count, dtype=np.int64)
        offset = 0
        first = 0
        for index in [*np.flatnonzero(sizes >= ALIGN_FROM).tolist(), count]:
            if index > first:  # members first..index-1 follow each other unpadded
                ends = np.cumsum(steps[first:index]) + offset
                header_offsets[first:index] = ends - steps[first:index]
                offset = int(ends[-1])
            if index == count:
                break
            base = offset + int(headers[index])
            # a padding field is at least 4 bytes
            padding = (residues.get(index, 0) - (base + 4)) % ALIGN + 4
            header_offsets[index], paddings[index] = offset, padding
            offset = base + padding + int(sizes[index])
            first = index + 1
        data_offsets = header_offsets + headers + paddings
        flags = tuple([0 if name.isascii() else _UTF8_FLAG for name in encoded])
        methods, inflated_sizes = np.full(count, STORED, dtype=np.int64), sizes.copy()
        if deflated:  # columns, as the offsets: thousands of zarr.json members
            where = np.fromiter(deflated, dtype=np.int64, count=len(deflated))
            inflated = np.fromiter(deflated.values(), dtype=np.int64, count=len(deflated))
            large = (inflated < 0) | (inflated >= ALIGN_FROM) | (sizes[where] >= ALIGN_FROM)
            if large.any():
                name = names[int(where[np.argmax(large)])]
                raise ValueError(f"member {name!r} is too large to be stored deflated")
            methods[where], inflated_sizes[where] = DEFLATED, inflated
        # per member: a fixed part and the name (not the local header's ZIP64 field)
        name_bytes = int(headers.sum()) - LOCAL_HEADER_SIZE * count - 20 * int(huge.sum())
        directory_size = count * CENTRAL_HEADER_SIZE + name_bytes
        layout = cls(
            encoded,
            tuple(sizes.tolist()),
            tuple(header_offsets.tolist()),
            tuple(data_offsets.tolist()),
            tuple(paddings.tolist()),
            flags,
            tuple(methods.tolist()),
            tuple(inflated_sizes.tolist()),
            offset,
            0,
            0,
        )
        for index in np.flatnonzero(huge | (header_offsets >= _U32)).tolist():
            directory_size += len(_central_extra(layout.members[index]))
        tail = directory_size + END_SIZE
        if _needs_zip64_end(count, offset, directory_size):
            tail += _END64.size + _LOCATOR64.size
        return replace(layout, directory_size=directory_size, total_size=offset + tail)

    def local_header(self, index: int, crc: int) -> bytes:
        """The local header (with its extra fields) of member ``index``."""
        return _local_header(self.members[index], crc)

    def local_header_into(
        self, buffer: bytearray | memoryview, at: int, index: int, crc: int = 0
    ) -> int:
        """Write member ``index``'s local header into ``buffer`` at ``at`` with the CRC-32
        ``crc`` (or a zero to set later with :meth:`patch_crc`); returns where the header
        ends."""
        size = self.sizes[index]
        if self.paddings[index] or size >= _U32:
            header = _local_header(self.members[index], crc)
            buffer[at : at + len(header)] = header
            return at + len(header)
        encoded = self.encoded[index]  # the common case: no extra field, packed in place
        _LOCAL.pack_into(
            buffer, at, 0x04034B50, 20, self.flags[index], self.methods[index], _DOS_TIME,
            _DOS_DATE, crc, size, self.inflated_sizes[index], len(encoded), 0,
        )  # fmt: skip
        end = at + LOCAL_HEADER_SIZE + len(encoded)
        buffer[at + LOCAL_HEADER_SIZE : end] = encoded
        return end

    @staticmethod
    def patch_crc(buffer: bytearray | memoryview, header_at: int, crc: int) -> None:
        """Set the CRC-32 of the local header written at ``header_at``."""
        _CRC.pack_into(buffer, header_at + 14, crc)

    def central_directory(self, crcs: Sequence[int]) -> bytes:
        """The central directory and end records, given every member's CRC-32."""
        count = len(self.encoded)
        if count and max(self.sizes) < _U32 and self.header_offsets[-1] < _U32:
            out = bytearray(self._plain_directory(crcs))  # no ZIP64 field: as arrays
        else:
            out = self._directory_entries(crcs)
        start, size = self.directory_offset, self.directory_size
        if _needs_zip64_end(count, start, size):
            end64 = start + size
            out += _END64.pack(
                0x06064B50, _END64.size - 12, 45, 45, 0, 0, count, count, size, start
            )
            out += _LOCATOR64.pack(0x07064B50, 0, end64, 1)
            out += _END.pack(0x06054B50, 0, 0, _U16, _U16, _U32, _U32, 0)
        else:
            out += _END.pack(0x06054B50, 0, 0, count, count, size, start, 0)
        return bytes(out)

    def _plain_directory(self, crcs: Sequence[int]) -> bytes:
        """The directory's entries when no member needs a ZIP64 field: the fixed parts
        filled column by column, then joined with the names."""
        count = len(self.encoded)
        if len(crcs) != count:
            raise ValueError(f"{len(crcs)} CRC-32s for {count} members")
        fixed = np.zeros(count, dtype=_CENTRAL_DTYPE)
        fixed["signature"] = 0x02014B50
        fixed["made_by"] = (3 << 8) | 45  # made by unix, spec 4.5
        fixed["needed"] = 20
        fixed["flags"] = self.flags
        fixed["method"] = self.methods
        fixed["time"] = _DOS_TIME
        fixed["date"] = _DOS_DATE
        fixed["crc"] = crcs
        fixed["compressed"] = self.sizes
        fixed["size"] = self.inflated_sizes
        lengths = np.fromiter(map(len, self.encoded), dtype=np.int64, count=count)
        fixed["name_length"] = lengths
        fixed["mode"] = 0o100644 << 16
        fixed["offset"] = self.header_offsets
        # entry i: its fixed part at starts[i], its name right after
        entry = CENTRAL_HEADER_SIZE + lengths
        starts = np.cumsum(entry) - entry
        out = np.empty(int(entry.sum()), dtype=np.uint8)
        out[(starts[:, None] + np.arange(CENTRAL_HEADER_SIZE)).reshape(-1)] = fixed.view(np.uint8)
        names_before = np.cumsum(lengths) - lengths
        shift = np.repeat(starts + CENTRAL_HEADER_SIZE - names_before, lengths)
        names = np.frombuffer(b"".join(self.encoded), dtype=np.uint8)
        out[shift + np.arange(names.size)] = names
        return out.tobytes()

    def _directory_entries(self, crcs: Sequence[int]) -> bytearray:
        """The directory's entries one by one (ZIP64 fields where needed)."""
        out = bytearray()
        pack = _CENTRAL.pack
        made_by = (3 << 8) | 45  # made by unix, spec 4.5
        mode = 0o100644 << 16
        for member, crc in zip(self.members, crcs, strict=True):
            size = member.size
            offset = member.header_offset
            encoded = member.encoded
            method, inflated_size = member.method, member.inflated_size
            if size < _U32 and offset < _U32:  # the common case
                out += pack(
                    0x02014B50, made_by, 20, member.flags, method, _DOS_TIME, _DOS_DATE,
                    crc, size, inflated_size, len(encoded), 0, 0, 0, 0, mode, offset,
                )  # fmt: skip
                out += encoded
                continue
            extra = _central_extra(member)
            size32 = _U32 if size >= _U32 else size  # deflated members are small
            out += pack(
                0x02014B50,
                made_by,
                45 if extra else 20,
                member.flags,
                method,
                _DOS_TIME,
                _DOS_DATE,
                crc,
                size32,
                _U32 if size >= _U32 else inflated_size,
                len(encoded),
                len(extra),
                0,
                0,
                0,
                mode,
                _U32 if offset >= _U32 else offset,
            )
            out += encoded
            out += extra
        return out


def _local_header(member: PlacedMember, crc: int) -> bytes:
    extra = b""
    size32 = member.size
    if member.size >= _U32:
        extra = struct.pack("<HHQQ", 1, 16, member.size, member.size)
        size32 = _U32
    if member.padding:
        extra += struct.pack("<HH", _PADDING_ID, member.padding - 4) + bytes(member.padding - 4)
    header = _LOCAL.pack(
        0x04034B50,
        45 if extra[:2] == b"\x01\x00" else 20,
        member.flags,
        member.method,
        _DOS_TIME,
        _DOS_DATE,
        crc,
        size32,
        _U32 if member.size >= _U32 else member.inflated_size,
        len(member.encoded),
        len(extra),
    )
    return header + member.encoded + extra


def _central_extra(member: PlacedMember) -> bytes:
    fields = []
    if member.size >= _U32:
        fields += [member.size, member.size]
    if member.header_offset >= _U32:
        fields.append(member.header_offset)
    if not fields:
        return b""
    return struct.pack(f"<HH{len(fields)}Q", 1, 8 * len(fields), *fields)


def _needs_zip64_end(count: int, start: int, size: int) -> bool:
    return count >= _U16 or start >= _U32 or size >= _U32


# -- checking an archive for other readers -------------------------------------------------

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
        ckptstore.io._zip.UnsafeArchiveError: member '../evil' has a '..' segment
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
            raise UnsafeArchiveError(f"member {member.name!r} runs into the central directory")
        spans.append((member.offset, end, member.name))
        _check_sizes(reader, member, data_offset, bounds)
    spans.sort()
    for (_, previous_end, previous), (begin, _, name) in pairwise(spans):
        if begin < previous_end:
            raise UnsafeArchiveError(f"members {previous!r} and {name!r} overlap")
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
            raise UnsafeArchiveError(f"member {name!r} is on another disk")
        if flags & ~_ALLOWED_FLAGS:
            raise UnsafeArchiveError(f"member {name!r} has flags {flags:#x} (encrypted or other)")
        if method not in (STORED, DEFLATED):
            raise UnsafeArchiveError(f"member {name!r} has compression method {method}")
        if compressed > size or offset >= size:
            raise UnsafeArchiveError(f"member {name!r} declares sizes or an offset past the file")
        if name in seen:
            raise UnsafeArchiveError(f"member {name!r} appears twice")
        seen.add(name)
        members.append(_Central(name, raw_name, flags, method, crc, compressed, inflated, offset))
    if position != len(data):
        raise UnsafeArchiveError("the central directory holds more than its members")
    return members


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
            raise UnsafeArchiveError(f"member {name!r} has a malformed extra field")
        field_id, length = struct.unpack_from("<HH", data, position)
        if position + 4 + length > len(data) or field_id in fields:
            raise UnsafeArchiveError(f"member {name!r} has a malformed extra field")
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
                raise UnsafeArchiveError(f"member {name!r} lacks the ZIP64 sizes it declares")
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
            raise UnsafeArchiveError(f"member {name[:200]!r} has {what}")


def _check_local(reader: _WindowReader, member: _Central) -> int:
    """The offset of ``member``'s data, after checking its local header against the
    central directory."""
    fields: tuple[int, ...] = _LOCAL.unpack(reader.read(member.offset, LOCAL_HEADER_SIZE))
    signature, _, flags, method, _, _, crc, compressed, inflated, name_length, extra_length = fields
    if signature != int.from_bytes(_LOCAL_SIGNATURE, "little"):
        raise UnsafeArchiveError(f"no local header where member {member.name!r} should start")
    name_start = member.offset + LOCAL_HEADER_SIZE
    raw_name = reader.read(name_start, name_length)
    extra = _extra_fields(reader.read(name_start + name_length, extra_length), member.name)
    if raw_name != member.raw_name:
        raise UnsafeArchiveError(f"member {member.name!r} has another name in its local header")
    if method != member.method or (flags ^ member.flags) & ~0x6:
        raise UnsafeArchiveError(f"member {member.name!r} has another method or flags locally")
    if not flags & 0x8:  # else they are in a data descriptor after the data
        inflated, compressed, _ = _zip64_values(
            extra.get(_ZIP64_EXTRA_ID, b""), member.name, (inflated, compressed, 0)
        )
        if (crc, compressed, inflated) != (member.crc, member.compressed, member.size):
            raise UnsafeArchiveError(
                f"member {member.name!r} has other sizes or CRC in its local header"
            )
    return name_start + name_length + extra_length


def _check_sizes(
    reader: _WindowReader, member: _Central, data_offset: int, bounds: ArchiveBounds
) -> None:
    if member.method == STORED:
        if member.size != member.compressed:
            raise UnsafeArchiveError(
                f"stored member {member.name!r} declares {member.size} bytes and holds "
                f"{member.compressed}"
            )
        return
    most = min(bounds.max_inflated, max(member.compressed, 1) * bounds.max_ratio)
    if member.size > most:
        raise UnsafeArchiveError(
            f"deflated member {member.name!r} inflates to {member.size} bytes, more than "
            f"{most} (the limit, or {bounds.max_ratio} times its {member.compressed} stored bytes)"
        )
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        inflated = inflater.decompress(reader.read(data_offset, member.compressed), member.size + 1)
    except zlib.error as error:
        raise UnsafeArchiveError(
            f"deflated member {member.name!r} does not inflate ({error})"
        ) from None
    if len(inflated) != member.size or not inflater.eof:
        raise UnsafeArchiveError(
            f"deflated member {member.name!r} does not inflate to its declared {member.size} bytes"
        )
    if zlib.crc32(inflated) != member.crc:
        raise UnsafeArchiveError(f"deflated member {member.name!r} does not match its CRC-32")
