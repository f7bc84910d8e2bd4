"""Request bodies streamed from the arrays' own memory read back exactly, from any
position, so a retried request sends the whole body again."""

from __future__ import annotations

import io

import numpy as np
from ckptstore_s3.body import PartsReader


def test_reads_the_concatenation_in_pieces_of_any_size() -> None:
    array = np.arange(1000, dtype=np.int32)
    views = [memoryview(b"head"), memoryview(b""), memoryview(array.tobytes()), memoryview(b"!")]
    expected = b"head" + array.tobytes() + b"!"
    reader = PartsReader(views)
    assert len(reader) == len(expected)
    pieces = []
    while piece := reader.read(333):
        pieces.append(piece)
    assert b"".join(pieces) == expected
    assert reader.read() == b""


def test_seek_and_tell_for_content_length_and_retries() -> None:
    reader = PartsReader([memoryview(b"abc"), memoryview(b"defg")])
    assert reader.seek(0, io.SEEK_END) == 7
    assert reader.tell() == 7
    reader.seek(2)
    assert reader.read(3) == b"cde"
    reader.seek(-1, io.SEEK_CUR)
    assert reader.read() == b"efg"
    reader.seek(0)
    target = bytearray(10)
    assert reader.readinto(target) == 7
    assert bytes(target[:7]) == b"abcdefg"
