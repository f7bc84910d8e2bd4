"""``check_archive``: a ZIP that zarr, numpy or ``zipfile`` may open safely passes
(ckptstore's own and zipfile's, ZIP64 included); forged names, sizes, offsets and
inflation are refused, in bounded memory."""

from __future__ import annotations

import io
import os
import re
import struct
import tracemalloc
import zipfile
from typing import Any

import pytest

from ckptstore.io._deflate import deflate_raw
from ckptstore.io._zip import ZipLayout
from ckptstore.io._zip_check import ArchiveBounds, UnsafeArchiveError, check_archive
from tests.io.test_zip import build

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
    layout = ZipLayout.place(["bomb"], [len(zeros)], deflated={0: 20_000})
    out = bytearray(layout.total_size)
    member = layout.members[0]
    out[: member.data_offset] = layout.local_header(0, 0)
    out[member.data_offset : member.end] = zeros
    out[layout.directory_offset :] = layout.central_directory([0])
    tracemalloc.start()
    with pytest.raises(UnsafeArchiveError, match="does not inflate to its declared 20000 bytes"):
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


def test_a_deflated_member_storing_more_than_deflate_needs_is_refused_unread() -> None:
    _, archive = build({"zarr.json": os.urandom(5000)}, deflated=frozenset({"zarr.json"}))
    forged = patched(archive, (22, "<I", 10), (central(archive) + 24, "<I", 10))
    with pytest.raises(UnsafeArchiveError, match="more than deflate ever needs"):
        check(forged)


def test_a_long_forged_name_is_cut_in_the_message() -> None:
    _, archive = build({"a" * 5000: b"1"})
    with pytest.raises(UnsafeArchiveError) as caught:
        check(renamed(archive, "a" * 5000, "../" + "a" * 4997))
    assert len(str(caught.value)) < 200
