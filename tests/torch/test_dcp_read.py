"""Which stored pieces a box of a saved chunk needs, and the box cut from them."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

from ckptstore.records import BlobRecord, ChunkRecord
from ckptstore.torch._dcp_read import box_of, covering


def _record(nbytes: int, cuts: list[int], codec: str = "raw") -> BlobRecord:
    edges = [0, *sorted(cuts), nbytes]
    chunks = tuple(
        ChunkRecord("blobs.zarr.zip", 1000 + low, high - low, high - low, 0)
        for low, high in itertools.pairwise(edges)
    )
    return BlobRecord("t#0,0", "|u1", (nbytes,), chunks, codec)


SHAPES = [(64, 48), (7, 5, 3), (300,), (1, 1), (9, 1, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_the_box_comes_from_the_pieces_overlapping_it(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    randomly = random.Random(f"{shape}{dtype}")
    full = (torch.arange(math.prod(shape)) % 251).to(dtype).reshape(shape)
    stored = full.contiguous().view(-1).view(torch.uint8).numpy()
    nbytes = stored.nbytes
    cuts = sorted({randomly.randrange(1, nbytes) for _ in range(min(12, nbytes - 1))})
    record = _record(nbytes, cuts)
    for _ in range(25):
        offsets = [randomly.randrange(size) for size in shape]
        lengths = [
            randomly.randrange(1, size - o + 1) for o, size in zip(offsets, shape, strict=True)
        ]
        partial = covering(record, dtype.itemsize, shape, offsets, lengths)
        start, size = partial.start, partial.record.nbytes
        box = box_of(stored[start : start + size], partial, dtype, shape, offsets, lengths)
        index = tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))
        assert torch.equal(box, full[index])
        # only overlapping pieces: the first ends after the box's first byte, the last
        # starts before its last byte
        strides = [math.prod(shape[axis + 1 :]) for axis in range(len(shape))]
        low = sum(o * s for o, s in zip(offsets, strides, strict=True)) * dtype.itemsize
        last = [o + n - 1 for o, n in zip(offsets, lengths, strict=True)]
        high = (sum(o * s for o, s in zip(last, strides, strict=True)) + 1) * dtype.itemsize
        assert start + partial.record.chunks[0].size > low
        assert start + size - partial.record.chunks[-1].size < high


def test_a_row_range_reads_the_rows_and_at_most_a_piece_on_each_side() -> None:
    shape, itemsize = (4096, 1024), 4
    record = _record(4096 * 1024 * itemsize, list(range(256 << 10, 16 << 20, 256 << 10)))
    partial = covering(record, itemsize, shape, [1024, 0], [1024, 1024])
    assert partial.record.nbytes == 4 << 20  # rows 1024-2047: exactly pieces 16 to 31
    assert partial.first == 16


def test_a_compressed_blob_is_read_whole() -> None:
    record = _record(400, [100, 200], codec="zstd")
    partial = covering(record, 4, (100,), [10], [5])
    assert (partial.first, partial.start, len(partial.record.chunks)) == (0, 0, 3)


def test_a_box_beyond_the_pieces_read_is_refused() -> None:
    record = _record(400, [200])
    partial = covering(record, 4, (100,), [0], [10])
    short = np.zeros(8, np.uint8)
    with pytest.raises(ValueError, match="do not cover"):
        box_of(short, partial, torch.float32, (100,), [0], [10])
