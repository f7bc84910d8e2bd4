"""The closest valid name to a mistyped one, for "did you mean" hints (unknown commands,
options, storage options, plugins).

Example::

    >>> closest("nzp", ["lmdb", "npz", "zarr"])
    'npz'
    >>> closest("parquet", ["lmdb", "npz", "zarr"]) is None
    True
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest"]

CUTOFF = 0.6
"""How alike (difflib's ratio, 0 to 1) a name must be to be suggested."""


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``word``, or ``None`` if none is alike enough."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=CUTOFF)
    return close[0] if close else None
