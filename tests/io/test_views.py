"""Cutting byte views into pieces without copies: one slice anywhere (``slice_views``,
also exported by ``ckptstore.object_store``), or every window in one pass (``windows``:
checked local reads, the parts of an upload)."""

from __future__ import annotations

from ckptstore.io._views import slice_views, windows
from ckptstore.object_store import slice_views as exported


def test_slices_span_buffers_without_copies() -> None:
    data = bytearray(b"0123456789")
    views = [memoryview(data)[:4], memoryview(data)[4:]]
    assert [bytes(v) for v in slice_views(views, 2, 5)] == [b"23", b"456"]
    assert [bytes(v) for v in slice_views(views, 8, 5)] == [b"89"]
    assert slice_views(views, 10, 5) == []
    assert all(view.obj is data for view in slice_views(views, 0, 10))
    assert exported is slice_views


def test_windows_cut_the_whole_in_order_without_copies() -> None:
    data = bytearray(range(23))
    views = [
        memoryview(data)[:1],
        memoryview(data)[1:9],
        memoryview(data)[9:9],
        memoryview(data)[9:],
    ]
    for size in (1, 4, 5, 23, 100):
        cut = list(windows(views, size))
        assert [sum(v.nbytes for v in w) for w in cut[:-1]] == [size] * (len(cut) - 1)
        assert 0 < sum(v.nbytes for v in cut[-1]) <= size
        assert [b"".join(bytes(v) for v in w) for w in cut] == [
            b"".join(bytes(v) for v in slice_views(views, at, size)) for at in range(0, 23, size)
        ]
        assert all(view.obj is data for window in cut for view in window)
    assert list(windows([], 4)) == []
