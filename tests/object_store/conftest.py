"""Fixtures of the object-store core's tests: a fresh in-memory fake store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from object_store_fakes import FILESYSTEMS, MemoryFilesystem, new_filesystem


@pytest.fixture
def memory() -> Iterator[MemoryFilesystem]:
    """A fake filesystem with an empty bucket ``"bucket"``, forgotten after the test."""
    fs = new_filesystem()
    yield fs
    del FILESYSTEMS[fs.name]
