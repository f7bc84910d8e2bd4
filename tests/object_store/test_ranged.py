"""Ranged downloads ask for exactly the bytes wanted and stream them straight into the
caller's buffers, a bounded piece at a time; a body that ends early is reported."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest

from ckptstore.object_store import _ranged as ranged
from ckptstore.object_store._ranged import fill_targets, range_header, read_all


def test_range_headers() -> None:
    assert range_header(0, None) == {}
    assert range_header(10, None) == {"Range": "bytes=10-"}
    assert range_header(10, 5) == {"Range": "bytes=10-14"}


class Body:
    """A response body; remembers how much each read asked for.

    Example::

        asyncio.run(read_all(Body(b"abc").read))  # b'abc'
    """

    def __init__(self, data: bytes) -> None:
        self.stream = io.BytesIO(data)
        self.asked: list[int | None] = []

    async def read(self, count: int | None) -> bytes:
        self.asked.append(count)
        return self.stream.read(-1 if count is None else count)


def test_the_body_fills_targets_of_any_format_in_bounded_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ranged, "READ_PIECE", 8)
    values = np.arange(6, dtype=np.float32)
    body = Body(b"head" + values.tobytes())
    head, out = bytearray(4), np.zeros(6, dtype=np.float32)
    received = asyncio.run(fill_targets(body.read, [memoryview(head), memoryview(out)]))
    assert received == 28
    assert bytes(head) == b"head"
    assert np.array_equal(out, values)
    assert max(count or 0 for count in body.asked) <= 8


def test_a_short_body_reports_what_arrived() -> None:
    target = bytearray(10)
    assert asyncio.run(fill_targets(Body(b"abc").read, [memoryview(target)])) == 3
    assert bytes(target[:3]) == b"abc"
    assert asyncio.run(read_all(Body(b"everything").read)) == b"everything"


def test_the_declared_size_comes_from_the_content_range_or_a_whole_answer() -> None:
    assert ranged.declared_size("bytes 0-99/4096", 100) == 4096
    assert ranged.declared_size("bytes */4096", None) == 4096
    assert ranged.declared_size("bytes 0-99/*", 100) is None
    assert ranged.declared_size(None, 4096) == 4096  # a whole-object answer
    assert ranged.declared_size(None, None) is None


def test_a_capped_read_stops_one_byte_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged, "READ_PIECE", 4)
    body = Body(b"x" * 1000)
    assert asyncio.run(ranged.read_at_most(body.read, 10)) == b"x" * 11
    assert sum(count or 0 for count in body.asked) == 11  # the rest is never asked for
    assert asyncio.run(ranged.read_at_most(Body(b"abc").read, 10)) == b"abc"
