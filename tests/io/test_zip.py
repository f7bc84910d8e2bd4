"""The precomputed ZIP layout: Python's zipfile reads what it lays out (names, sizes,
CRC-32s, aligned data, ZIP64 offsets and member counts), and CRC-32s of pieces combine
into the CRC-32 of the whole."""

from __future__ import annotations

import io
import os
import re
import struct
import tracemalloc
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from ckptstore.io._checksum import crc32_combine, crc32_of
from ckptstore.io._deflate import deflate_raw
from ckptstore.io._zip import (
    ALIGN,
    ALIGN_FROM,
    ArchiveBounds,
    UnsafeArchiveError,
    ZipLayout,
    check_archive,
)


def build(
    contents: dict[str, bytes],
    residues: dict[int, int] | None = None,
    deflated: frozenset[str] = frozenset(),
) -> tuple[ZipLayout, bytes]:
    """An archive of ``contents``, the members named in ``deflated`` stored deflated."""
    stored = [deflate_raw(data) if name in deflated else data for name, data in contents.items()]
    inflated = {i: len(data) for i, (n, data) in enumerate(contents.items()) if n in deflated}
    layout = ZipLayout.place(list(contents), [len(data) for data in stored], residues, inflated)
    out = bytearray(layout.total_size)
    crcs = []
    for index, (member, data) in enumerate(zip(layout.members, contents.values(), strict=True)):
        crc = crc32_of([data])  # of the inflated bytes
        crcs.append(crc)
        header = layout.local_header(index, crc)
        assert len(header) == member.header_size
        out[member.header_offset : member.data_offset] = header
        out[member.data_offset : member.end] = stored[index]
    tail = layout.central_directory(crcs)
    out[layout.directory_offset :] = tail
    assert layout.directory_offset + len(tail) == layout.total_size
    return layout, bytes(out)


def test_zipfile_reads_and_verifies_every_member() -> None:
    contents = {
        "zarr.json": b'{"zarr_format": 3}',
        "w/c.0": os.urandom(ALIGN_FROM + 123),
        "empty": b"",
        "名前/ü.npy": b"unicode names are flagged UTF-8",
    }
    layout, archive = build(contents)
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert opened.testzip() is None  # every CRC-32 checks
        assert opened.namelist() == list(contents)
        for name, data in contents.items():
            info = opened.getinfo(name)
            assert info.compress_type == zipfile.ZIP_STORED
            assert opened.read(name) == data
    assert layout.members[1].data_offset % ALIGN == 0  # large members are aligned
    assert layout.members[0].padding == 0  # small ones are packed tight


@pytest.mark.parametrize("residue", [0, 16, 4095])
def test_large_members_start_at_the_residue_asked_for(residue: int) -> None:
    """The residue of an array's address (for O_DIRECT writes from its memory): only
    large members follow it, and the archive stays an ordinary ZIP."""
    contents = {"a": b"x" * 7, "b": os.urandom(ALIGN_FROM), "c": os.urandom(ALIGN_FROM + 5)}
    layout, archive = build(contents, {1: residue, 2: (residue + 1) % ALIGN})
    assert layout.members[1].data_offset % ALIGN == residue
    assert layout.members[2].data_offset % ALIGN == (residue + 1) % ALIGN
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert opened.testzip() is None
        assert [opened.read(name) for name in contents] == list(contents.values())


def test_deflated_documents_are_inflated_by_zipfile() -> None:
    """Small documents stored deflated (ZIP method 8) among stored members: zipfile
    inflates them and checks their CRC-32 (of the inflated bytes), and the header the
    writers pack in place is the one :meth:`ZipLayout.local_header` builds."""
    document = b'{"zarr_format":3,"node_type":"array","shape":[1024]}' * 3
    contents = {"a/zarr.json": document, "a/c.0": os.urandom(4096), "b/zarr.json": document}
    layout, archive = build(contents, deflated=frozenset({"a/zarr.json", "b/zarr.json"}))
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert opened.testzip() is None
        for name, data in contents.items():
            info = opened.getinfo(name)
            deflated = name.endswith("zarr.json")
            assert info.compress_type == (zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED)
            assert info.file_size == len(data)
            assert (info.compress_size < len(data)) is deflated
            assert opened.read(name) == data
    for index, member in enumerate(layout.members):
        packed = bytearray(member.header_size)
        layout.local_header_into(packed, 0, index, 1234)
        assert bytes(packed) == layout.local_header(index, 1234)


def test_a_large_member_is_never_deflated() -> None:
    with pytest.raises(ValueError, match="too large to be stored deflated"):
        ZipLayout.place(["big"], [10], deflated={0: ALIGN_FROM})


def test_a_wrong_crc_is_caught_by_zipfile() -> None:
    _, archive = build({"a": b"hello world"})
    broken = bytearray(archive)
    broken[archive.index(b"hello")] ^= 1
    with zipfile.ZipFile(io.BytesIO(bytes(broken))) as opened, pytest.raises(zipfile.BadZipFile):
        opened.read("a")


def test_zip64_end_records_for_many_members() -> None:
    contents = {f"m{i}": b"" for i in range(70_000)}  # more than a 16-bit count holds
    _, archive = build(contents)
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert len(opened.infolist()) == 70_000


@pytest.mark.parametrize("deflated", [False, True])
def test_zip64_sizes_and_offsets_past_4_gib(tmp_path: Path, deflated: bool) -> None:
    """A member after 4 GiB has its offset in a ZIP64 field, deflated or not."""
    big = (4 << 30) + 10  # a sparse member: zeros never written
    stored = deflate_raw(b"after") if deflated else b"after"
    layout = ZipLayout.place(
        ["big", "after"], [big, len(stored)], deflated={1: 5} if deflated else {}
    )
    zeros = crc32_of([b"\0" * (1 << 20)])
    crc_big, length = 0, 0
    while length < big:  # CRC-32 of 4 GiB of zeros from CRC-32s of 1 MiB pieces
        step = min(1 << 20, big - length)
        crc_big = crc32_combine(
            crc_big, zeros if step == 1 << 20 else zlib.crc32(bytes(step)), step
        )
        length += step
    crcs = [crc_big, crc32_of([b"after"])]
    path = tmp_path / "sparse.zip"
    with open(path, "wb") as out:
        for index, member in enumerate(layout.members):
            out.seek(member.header_offset)
            out.write(layout.local_header(index, crcs[index]))
        out.seek(layout.members[1].data_offset)
        out.write(stored)
        out.seek(layout.directory_offset)
        out.write(layout.central_directory(crcs))
    assert path.stat().st_size == layout.total_size
    with zipfile.ZipFile(path) as opened:
        assert opened.getinfo("big").file_size == big
        assert opened.getinfo("after").header_offset > 1 << 32
        assert opened.getinfo("after").compress_type == (8 if deflated else 0)
        assert opened.read("after") == b"after"
    with open(path, "rb") as archive:  # and the deep check reads its ZIP64 fields alike

        def read(offset: int, length: int) -> bytes:
            archive.seek(offset)
            return archive.read(length)

        assert check_archive(read, layout.total_size, BOUNDS) == 2


@pytest.mark.parametrize("split", [0, 1, 4095, 4096, 100_000])
def test_crc32_combine_matches_zlib(split: int) -> None:
    data = os.urandom(100_000)
    head, tail = data[:split], data[split:]
    assert crc32_combine(zlib.crc32(head), zlib.crc32(tail), len(tail)) == zlib.crc32(data)
    assert crc32_of([head, tail]) == zlib.crc32(data)


# -- check_archive: what other readers may open safely ------------------------------------

BOUNDS = ArchiveBounds(max_members=100_000, max_inflated=64 << 20, max_ratio=1 << 17)


def check(archive: bytes, bounds: ArchiveBounds = BOUNDS) -> int:
    return check_archive(
        lambda offset, length: archive[offset : offset + length], len(archive), bounds
    )


def renamed(archive: bytes, old: str, new: str) -> bytes:
    """``archive`` with member ``old`` renamed ``new`` (as long) in both of its headers."""
    assert len(old) == len(new)
    assert archive.count(old.encode()) == 2
    return archive.replace(old.encode(), new.encode())


def central(archive: bytes) -> int:
    return archive.rindex(b"PK\x01\x02")  # the last member's central directory entry


def patched(archive: bytes, *edits: tuple[int, str, int]) -> bytes:
    out = bytearray(archive)
    for offset, fmt, value in edits:
        struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_the_archives_ckptstore_and_zipfile_write_pass() -> None:
    _, archive = build(
        {"a/zarr.json": b"{}" * 100, "a/c.0": os.urandom(100_000), "b": b""},
        deflated=frozenset({"a/zarr.json"}),
    )
    assert check(archive) == 3
    _, many = build({f"m{i}": b"" for i in range(70_000)})  # ZIP64 end records
    assert check(many) == 70_000
    for seekable in (True, False):  # not seekable: data descriptors after the data
        buffer = io.BytesIO()
        target = buffer if seekable else _Unseekable(buffer)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as written:
            written.writestr("w.npy", b"x" * 5000)
            with written.open("big", "w", force_zip64=True) as member:
                member.write(b"y" * 10)
        assert check(buffer.getvalue()) == 2


class _Unseekable(io.RawIOBase):
    def __init__(self, buffer: io.BytesIO) -> None:
        self.buffer = buffer

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self.buffer.write(data)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../../x", "'..' segment"),
        ("a/../..", "'..' segment"),
        ("/etc/pw", "absolute path"),
        ("a\\..\\bc", "backslash"),
        ("C:/wind", "drive letter"),
        ("a//b/cd", "empty segment"),
        ("./a/bcd", "'.' segment"),
        ("a\nb/cde", "control character"),
        ("m2", "appears twice"),
    ],
)
def test_unsafe_member_names_are_refused(name: str, reason: str) -> None:
    member = "m1" if name == "m2" else "abcdefg"
    _, archive = build({member: b"1", "m2": b"2"})
    with pytest.raises(UnsafeArchiveError, match=re.escape(reason)):
        check(renamed(archive, member, name))


def test_a_deflated_member_declaring_1_gib_is_refused_unread() -> None:
    _, archive = build({"zarr.json": b"{}" * 100}, deflated=frozenset({"zarr.json"}))
    forged = patched(archive, (22, "<I", 1 << 30), (central(archive) + 24, "<I", 1 << 30))
    with pytest.raises(UnsafeArchiveError, match="inflates to 1073741824 bytes"):
        check(forged)


def test_a_deflated_member_inflating_past_its_declared_size_is_stopped_there() -> None:
    zeros = deflate_raw(bytes(1 << 24))  # 16 MiB of zeros in ~16 KB: within the ratio
    layout = ZipLayout.place(["bomb"], [len(zeros)], deflated={0: 100})
    out = bytearray(layout.total_size)
    member = layout.members[0]
    out[: member.data_offset] = layout.local_header(0, 0)
    out[member.data_offset : member.end] = zeros
    out[layout.directory_offset :] = layout.central_directory([0])
    tracemalloc.start()
    with pytest.raises(UnsafeArchiveError, match="does not inflate to its declared 100 bytes"):
        check(bytes(out))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20


def test_zip64_sizes_of_2_63_are_refused() -> None:
    _, archive = build({"a": b"abc"})
    entry = central(archive)
    zip64 = struct.pack("<HHQQ", 1, 16, 1 << 63, 1 << 63)
    head = bytearray(archive[entry : entry + 46 + 1])
    struct.pack_into("<II", head, 20, 0xFFFFFFFF, 0xFFFFFFFF)  # compressed, size
    struct.pack_into("<H", head, 30, len(zip64))  # extra length
    directory = bytes(head) + zip64
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(directory), entry, 0)
    with pytest.raises(UnsafeArchiveError, match="past the file"):
        check(archive[:entry] + directory + end)


@pytest.mark.parametrize(
    "forgery",
    ["local-name", "offset", "encrypted", "overlap", "truncated", "count", "method"],
)
def test_inconsistent_structures_are_refused(forgery: str) -> None:
    _, archive = build({"m1": b"1" * 10, "m2": b"2" * 10})
    first = archive.index(b"PK\x01\x02")
    second = central(archive)
    end = archive.rindex(b"PK\x05\x06")
    forged = {
        "local-name": lambda: archive.replace(b"m1", b"m3", 1),
        "offset": lambda: patched(archive, (second + 42, "<I", len(archive) - 10)),
        "encrypted": lambda: patched(archive, (6, "<H", 1), (first + 8, "<H", 1)),
        "overlap": lambda: patched(  # m1 claims m2's header as its data
            archive, (18, "<I", 40), (22, "<I", 40), (first + 20, "<I", 40), (first + 24, "<I", 40)
        ),
        "truncated": lambda: archive[:-5],
        "count": lambda: patched(archive, (end + 8, "<H", 3), (end + 10, "<H", 3)),
        "method": lambda: patched(archive, (8, "<H", 12), (first + 10, "<H", 12)),
    }[forgery]()
    with pytest.raises(UnsafeArchiveError):
        check(forged)
