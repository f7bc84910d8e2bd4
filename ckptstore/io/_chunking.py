"""Cutting arrays into chunks that are contiguous byte ranges of their C-order data.

A chunk shape is ``(1, ..., 1, k, full, ..., full)``: whole trailing dimensions, ``k``
steps along one axis, single steps before it. Every chunk is then one contiguous range
of the array's bytes, so a C-contiguous array is written without a single copy, and a
chunk is read straight into place. This is also a valid regular zarr chunk grid.

Example::

    >>> grid_chunk_shape((1000, 256), itemsize=4, target_bytes=65536)
    (64, 256)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product

import numpy as np

from ckptstore._types import Array, ByteArray

__all__ = ["ArrayChunk", "array_bytes", "array_chunks", "chunk_data", "grid_chunk_shape"]


def grid_chunk_shape(shape: tuple[int, ...], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """A chunk shape of at most ``target_bytes`` (or one item row) for ``shape``."""
    if not shape:
        return ()
    if math.prod(shape) * itemsize <= target_bytes:
        return tuple(max(d, 1) for d in shape)
    split = max(a for a in range(len(shape)) if math.prod(shape[a:]) * itemsize > target_bytes)
    row_bytes = math.prod(shape[split + 1 :]) * itemsize
    steps = max(1, target_bytes // row_bytes)
    return (1,) * split + (steps,) + tuple(max(d, 1) for d in shape[split + 1 :])


@dataclass(frozen=True)
class ArrayChunk:
    """One chunk: its grid index, where its data starts in the C-order bytes, how many
    bytes of data it holds and how many a full (padded) chunk has."""

    index: tuple[int, ...]
    start: int
    nbytes: int
    padded: int


def array_chunks(
    shape: tuple[int, ...], itemsize: int, chunk_shape: tuple[int, ...]
) -> Iterator[ArrayChunk]:
    """The chunks of an array in C order (empty for an array with no elements)."""
    if not shape:
        yield ArrayChunk((), 0, itemsize, itemsize)
        return
    if math.prod(shape) == 0:
        return
    split = next((a for a, c in enumerate(chunk_shape) if c != 1), len(shape) - 1)
    inner = math.prod(shape[split + 1 :]) * itemsize
    padded = math.prod(chunk_shape) * itemsize
    strides = [math.prod(shape[a + 1 :]) * itemsize for a in range(len(shape))]
    grid = [math.ceil(d / c) for d, c in zip(shape, chunk_shape, strict=True)]
    for index in product(*(range(g) for g in grid)):
        start = sum(i * c * s for i, c, s in zip(index, chunk_shape, strides, strict=True))
        rows = min(chunk_shape[split], shape[split] - index[split] * chunk_shape[split])
        yield ArrayChunk(index, start, rows * inner, padded)


def array_bytes(array: Array) -> ByteArray:
    """The array's bytes in C order as a 1-D uint8 array: a view when the array is
    C-contiguous, a copy otherwise (unlike :func:`ckptstore.io.byte_view`, which views
    any contiguous buffer as a ``memoryview`` and never copies)."""
    contiguous = np.ascontiguousarray(array)
    return contiguous.reshape(-1).view(np.uint8)


def chunk_data(array: Array, chunk: ArrayChunk, chunk_shape: tuple[int, ...]) -> ByteArray:
    """The bytes of one chunk: a view for C-contiguous arrays, else a copy of just it.
    Subclasses (``np.matrix``, ``np.memmap``) are cut as plain arrays (a matrix stays
    2-D through ``reshape(-1)``)."""
    array = np.asarray(array)
    if array.flags.c_contiguous:
        return array.reshape(-1).view(np.uint8)[chunk.start : chunk.start + chunk.nbytes]
    region = tuple(
        slice(i * c, min((i + 1) * c, d))
        for i, c, d in zip(chunk.index, chunk_shape, array.shape, strict=True)
    )
    return np.ascontiguousarray(array[region]).reshape(-1).view(np.uint8)
