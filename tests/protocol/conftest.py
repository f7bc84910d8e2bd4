"""Fixtures of the protocol's tests: what incremental saves read."""

from __future__ import annotations

import pytest

from ckptstore.protocol import _chunks


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the chunks incremental saves hash (read), in order."""
    sizes: list[int] = []
    real = _chunks.xxhash.xxh3_128_hexdigest

    def counted(data: memoryview) -> str:
        sizes.append(data.nbytes)
        return real(data)

    monkeypatch.setattr(_chunks.xxhash, "xxh3_128_hexdigest", counted)
    return sizes
