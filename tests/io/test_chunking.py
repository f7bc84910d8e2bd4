"""Chunking, property-style: many shapes, dtypes and memory orders, each checked against
the C-order bytes of the array and against the zarr chunk grid."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from ckptstore.io._chunking import array_bytes, array_chunks, chunk_data, grid_chunk_shape

DTYPES = ["u1", "<i2", ">i4", "<f4", "<f8", "<c16", "?", "<U3", "S5", "<M8[s]"]
TARGETS = [1, 7, 16, 64, 256, 4096]


def arrays(seed: int, count: int) -> Iterator[tuple[np.ndarray, int]]:
    """Arrays of random shapes (0-4 dimensions, sizes 0-9) and dtypes in C order, Fortran
    order, transposed, strided and reversed layouts, each with a chunk target."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        ndim = int(rng.integers(0, 5))
        shape = tuple(int(d) for d in rng.integers(0, 10, size=ndim))
        dtype = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
        raw = rng.integers(0, 256, size=max(math.prod(shape), 1) * dtype.itemsize, dtype=np.uint8)
        base = raw[: math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        if dtype.kind == "U":
            base = np.char.mod("%03d", rng.integers(0, 999, size=shape)).astype(dtype)
        elif dtype.kind == "b":  # only 0 and 1 are valid bools
            base = rng.integers(0, 2, size=shape).astype(dtype)
        layout = int(rng.integers(5))
        if layout == 1:
            array = np.asfortranarray(base)
        elif layout == 2:
            array = base.T
        elif layout == 3 and ndim:
            array = np.repeat(base, 2, axis=-1)[..., ::2]
        elif layout == 4 and ndim:
            array = base[..., ::-1]
        else:
            array = base
        yield array, TARGETS[int(rng.integers(len(TARGETS)))]


CASES = list(arrays(seed=20261122, count=400))


def c_bytes(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("batch", range(4))
def test_chunks_concatenate_to_the_c_order_bytes(batch: int) -> None:
    for array, target in CASES[batch::4]:
        itemsize = array.dtype.itemsize
        chunk_shape = grid_chunk_shape(array.shape, itemsize, target)
        chunks = list(array_chunks(array.shape, itemsize, chunk_shape))
        joined = b"".join(chunk_data(array, c, chunk_shape).tobytes() for c in chunks)
        assert joined == c_bytes(array), (array.shape, array.dtype, target)
        position = 0
        for chunk in chunks:
            assert chunk.start == position  # every chunk is one contiguous byte range
            position += chunk.nbytes
            assert 0 < chunk.nbytes <= chunk.padded == math.prod(chunk_shape) * itemsize


@pytest.mark.parametrize("batch", range(4))
def test_chunk_shapes_form_a_valid_zarr_grid(batch: int) -> None:
    for array, target in CASES[batch::4]:
        itemsize = array.dtype.itemsize
        shape = array.shape
        chunk_shape = grid_chunk_shape(shape, itemsize, target)
        assert len(chunk_shape) == len(shape)
        assert all(c >= 1 for c in chunk_shape)
        # (1, ..., 1, k, full, ..., full)
        split = next((a for a, c in enumerate(chunk_shape) if c != 1), len(shape))
        for axis in range(split + 1, len(shape)):
            assert chunk_shape[axis] == max(shape[axis], 1)
        if math.prod(shape) and math.prod(shape) * itemsize > target:
            assert math.prod(chunk_shape) * itemsize <= max(target, itemsize)
        chunks = list(array_chunks(shape, itemsize, chunk_shape))
        expected = math.prod(math.ceil(d / c) for d, c in zip(shape, chunk_shape, strict=True))
        assert len(chunks) == (expected if shape else 1)
        for chunk in chunks:
            region = tuple(
                slice(i * c, min((i + 1) * c, d))
                for i, c, d in zip(chunk.index, chunk_shape, shape, strict=True)
            )
            expected = c_bytes(array[region]) if shape else c_bytes(array)
            data = chunk_data(array, chunk, chunk_shape).tobytes()
            assert data == expected  # what zarr expects in that chunk


def test_small_arrays_are_never_split() -> None:
    assert grid_chunk_shape((10, 10), 8, 800) == (10, 10)
    assert grid_chunk_shape((0, 5), 8, 16) == (1, 5)
    assert grid_chunk_shape((), 8, 1) == ()
    assert grid_chunk_shape((1000, 256), 4, 65536) == (64, 256)
    assert grid_chunk_shape((3, 5, 1000), 8, 4096) == (1, 1, 512)


def test_zero_dimensional_and_empty_arrays() -> None:
    (scalar,) = array_chunks((), 8, ())
    assert (scalar.index, scalar.start, scalar.nbytes, scalar.padded) == ((), 0, 8, 8)
    assert list(array_chunks((0, 4), 8, (1, 4))) == []
    assert list(array_chunks((4, 0), 8, (4, 1))) == []


def test_edge_chunks_are_padded_to_the_full_chunk() -> None:
    chunks = list(array_chunks((10,), 8, (4,)))
    assert [(c.index, c.start, c.nbytes, c.padded) for c in chunks] == [
        ((0,), 0, 32, 32),
        ((1,), 32, 32, 32),
        ((2,), 64, 16, 32),
    ]


def test_contiguous_arrays_are_chunked_without_copies() -> None:
    array = np.arange(1000, dtype=np.float64)
    chunk_shape = grid_chunk_shape(array.shape, 8, 1024)
    for chunk in array_chunks(array.shape, 8, chunk_shape):
        assert np.shares_memory(chunk_data(array, chunk, chunk_shape), array)
    assert np.shares_memory(array_bytes(array), array)
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    assert not np.shares_memory(array_bytes(fortran), fortran)
    assert array_bytes(fortran).tobytes() == c_bytes(fortran)
