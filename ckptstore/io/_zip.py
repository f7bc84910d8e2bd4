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

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

import numpy as np

__all__ = [
    "ALIGN",
    "ALIGN_FROM",
    "DEFLATED",
    "STORED",
    "ZipLayout",
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
