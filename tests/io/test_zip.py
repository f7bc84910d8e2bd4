"""The precomputed ZIP layout: Python's zipfile reads what it lays out (names, sizes,
CRC-32s, aligned data, ZIP64 offsets and member counts), and CRC-32s of pieces combine
into the CRC-32 of the whole."""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from pathlib import Path

import pytest

from ckptstore.io._checksum import crc32_combine, crc32_of
from ckptstore.io._deflate import deflate_raw
from ckptstore.io._zip import ALIGN, ALIGN_FROM, ZipLayout
from ckptstore.io._zip_check import ArchiveBounds, check_archive


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

        assert check_archive(read, layout.total_size, ArchiveBounds(2, 1 << 20, 1 << 17)) == 2


@pytest.mark.parametrize("split", [0, 1, 4095, 4096, 100_000])
def test_crc32_combine_matches_zlib(split: int) -> None:
    data = os.urandom(100_000)
    head, tail = data[:split], data[split:]
    assert crc32_combine(zlib.crc32(head), zlib.crc32(tail), len(tail)) == zlib.crc32(data)
    assert crc32_of([head, tail]) == zlib.crc32(data)
