"""Reading part of a saved DCP chunk: only the stored pieces that hold the bytes needed,
each checked against its CRC.

A node manifest records every blob as pieces of at most ``chunk_bytes`` (contiguous
ranges of its C-order bytes, each with its own CRC). A box of a saved chunk (what one
``ReadItem`` asks for) lies between its first and last element's bytes, so only the
pieces overlapping that range are read: a *partial record* (:func:`covering`), an
ordinary blob record of those pieces, read through :func:`ckptstore.protocol.read_blobs`
like any other (ranged reads, checksums, bounds). The box is then a strided view of
those bytes (:func:`box_of`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ckptstore.errors import CorruptCheckpointError
from ckptstore.records import BlobRecord, ChunkRecord

__all__ = ["Partial", "box_of", "covering", "in_tensor"]


@dataclass(frozen=True)
class Partial:
    """The pieces ``first`` onwards of a blob, ``record`` (a record of those pieces as
    bytes), starting ``start`` bytes into the blob."""

    record: BlobRecord
    first: int
    start: int


def covering(
    record: BlobRecord,
    itemsize: int,
    shape: Sequence[int],
    offsets: Sequence[int],
    lengths: Sequence[int],
) -> Partial:
    """The pieces of ``record`` (a C-order array of ``shape``) holding the box at
    ``offsets`` of ``lengths`` (all non-empty). A record that is not plain stored pieces
    (compressed, padded) is read whole."""
    strides = _strides(shape)
    low = sum(o * s for o, s in zip(offsets, strides, strict=True)) * itemsize
    last = [o + n - 1 for o, n in zip(offsets, lengths, strict=True)]
    high = (sum(o * s for o, s in zip(last, strides, strict=True)) + 1) * itemsize
    if record.codec != "raw" or any(c.stored != c.size for c in record.chunks):
        return Partial(_as_bytes(record, record.chunks), 0, 0)
    position, first, start, picked = 0, -1, 0, []
    for number, chunk in enumerate(record.chunks):
        end = position + chunk.size
        if end > low and position < high:
            if first < 0:
                first, start = number, position
            picked.append(chunk)
        position = end
    return Partial(_as_bytes(record, picked), max(first, 0), start)


def _as_bytes(record: BlobRecord, chunks: Sequence[ChunkRecord]) -> BlobRecord:
    size = sum(chunk.size for chunk in chunks)
    return replace(record, dtype="|u1", shape=(size,), chunks=tuple(chunks), layout={})


def box_of(
    data: np.ndarray[Any, Any],
    partial: Partial,
    dtype: torch.dtype,
    shape: Sequence[int],
    offsets: Sequence[int],
    lengths: Sequence[int],
) -> torch.Tensor:
    """The box at ``offsets`` of ``lengths`` of the chunk of ``shape``, from ``data``:
    the bytes of ``partial`` as read (a view, copied only if misaligned)."""
    itemsize = dtype.itemsize
    strides = _strides(shape)
    low = sum(o * s for o, s in zip(offsets, strides, strict=True)) * itemsize - partial.start
    last = [o + n - 1 for o, n in zip(offsets, lengths, strict=True)]
    high = (sum(o * s for o, s in zip(last, strides, strict=True)) + 1) * itemsize
    raw = data.reshape(-1)[low : high - partial.start]
    if low < 0 or raw.nbytes != high - partial.start - low:
        raise ValueError("the stored pieces do not cover the bytes the box needs")
    if raw.ctypes.data % itemsize:
        raw = raw.copy()
    flat = torch.from_numpy(raw).view(dtype)
    return flat.as_strided(tuple(lengths), tuple(strides))


def in_tensor(
    error: CorruptCheckpointError, fqn: str, partial: Partial | None
) -> CorruptCheckpointError:
    """``error`` (raised reading ``partial``, or a whole byte entry if ``None``) naming
    the state dict's entry, its chunk numbered as in the stored manifest."""
    first = 0 if partial is None else partial.first
    chunk = None if error.chunk is None else error.chunk + first
    what = "entry" if partial is None else "tensor"
    return CorruptCheckpointError(
        f"{error.detail} ({what} {fqn!r})",
        url=error.url,
        file=error.file,
        blob=error.blob,
        chunk=chunk,
        node=error.node,
        epoch=error.epoch,
    )


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[axis + 1 :]) for axis in range(len(shape))]
