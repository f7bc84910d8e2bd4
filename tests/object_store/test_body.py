"""Request bodies streamed from the arrays' own memory read back exactly, from any
position, so a retried request sends the whole body again; small bodies are joined,
whole ``bytes`` sent as they are (parts are cut by ``ckptstore.io._views``: tests/io)."""

from __future__ import annotations

import io

import numpy as np

from ckptstore.object_store._body import (
    STREAM_THRESHOLD,
    PartsReader,
    request_body,
)


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


def test_pieces_are_views_of_the_buffers_themselves() -> None:
    first, second = bytearray(b"abcde"), bytearray(b"fgh")
    reader = PartsReader([memoryview(first), memoryview(second)])
    reader.seek(1)
    pieces = list(reader.pieces(3))
    assert [bytes(piece) for piece in pieces] == [b"bcd", b"e", b"fgh"]
    first[1] = ord("B")  # no copy: the piece sees the change
    assert bytes(pieces[0]) == b"Bcd"
    assert reader.tell() == 8
    assert list(reader.pieces(3)) == []


def test_request_bodies() -> None:
    whole = b"x" * 10
    assert request_body([memoryview(whole)]) is whole
    small = request_body([memoryview(b"ab"), memoryview(bytearray(b"cd"))])
    assert small == b"abcd"
    assert isinstance(small, bytes)
    large = np.ones(STREAM_THRESHOLD, dtype=np.uint8)
    streamed = request_body([memoryview(b"h"), memoryview(large)])
    assert isinstance(streamed, PartsReader)
    assert streamed.read() == b"h" + large.tobytes()
