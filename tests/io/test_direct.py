"""Direct I/O planning: the segments of a positional write cover its bytes exactly, in
order, and only whole aligned blocks of large, congruent buffers go ``O_DIRECT``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.io._direct import (
    DIRECT_ALIGN,
    DIRECT_FROM,
    aligned_buffer,
    memory_residue,
    plan_direct,
)

BACKING = np.arange(64 * DIRECT_ALIGN, dtype=np.uint64).view(np.uint8)


def _views(cuts: list[tuple[int, int]]) -> list[memoryview]:
    return [memoryview(BACKING[start : start + size]) for start, size in cuts]


@settings(max_examples=200, deadline=None)
@given(
    offset=st.integers(0, 3 * DIRECT_ALIGN),
    cuts=st.lists(
        st.tuples(st.integers(0, 20 * DIRECT_ALIGN), st.integers(0, 12 * DIRECT_ALIGN)),
        max_size=5,
    ),
    direct_from=st.sampled_from([1, DIRECT_ALIGN, 4 * DIRECT_ALIGN]),
)
def test_segments_cover_the_bytes_in_order_and_direct_ones_are_aligned(
    offset: int, cuts: list[tuple[int, int]], direct_from: int
) -> None:
    views = _views(cuts)
    expected = b"".join(bytes(view) for view in views)
    position = offset
    written = b""
    for at, segment, direct in plan_direct(offset, views, direct_from=direct_from):
        assert at == position  # consecutive, in order
        data = b"".join(bytes(view) for view in segment)
        if direct:
            (view,) = segment
            assert at % DIRECT_ALIGN == 0
            assert memory_residue(view) == 0
            assert view.nbytes % DIRECT_ALIGN == 0
            assert view.nbytes > 0
        else:
            assert data  # no empty segments
        written += data
        position += len(data)
    assert written == expected


def test_a_large_congruent_buffer_goes_direct_but_for_its_unaligned_ends() -> None:
    data = BACKING[100 : 100 + 10 * DIRECT_ALIGN]
    at = 5 * DIRECT_ALIGN + memory_residue(data) - len(b"header")  # data: congruent
    plan = plan_direct(at, [memoryview(b"header"), memoryview(data)], direct_from=DIRECT_ALIGN)
    assert [direct for _, _, direct in plan] == [False, True, False]
    assert plan[0][0] == at  # the header and the buffer's head, buffered together
    assert bytes(plan[0][1][0]) == b"header"
    assert sum(view.nbytes for view in plan[1][1]) == 9 * DIRECT_ALIGN


def test_a_buffer_whose_memory_and_offset_disagree_is_buffered() -> None:
    data = BACKING[: 10 * DIRECT_ALIGN]
    at = memory_residue(data) + 8  # off by 8 bytes
    assert [direct for _, _, direct in plan_direct(at, [memoryview(data)])] == [False]


def test_small_buffers_are_never_direct() -> None:
    data = BACKING[: 2 * DIRECT_ALIGN]
    plan = plan_direct(memory_residue(data), [memoryview(data)], direct_from=4 * DIRECT_ALIGN)
    assert [direct for _, _, direct in plan] == [False]


def test_a_view_shorter_than_its_head_is_never_direct() -> None:
    """Found by the property above: one byte at offset 16 must not become a direct
    segment of negative length."""
    view = memoryview(BACKING[:1])
    assert plan_direct(16, [view], direct_from=1) == [(16, [view], False)]


@given(offset=st.integers(0, 1 << 40))
def test_aligned_buffers_take_the_remainder_of_their_offset(offset: int) -> None:
    buffer = aligned_buffer(offset, DIRECT_FROM)
    assert buffer.nbytes == DIRECT_FROM
    assert not buffer.readonly
    assert memory_residue(buffer) == offset % DIRECT_ALIGN
